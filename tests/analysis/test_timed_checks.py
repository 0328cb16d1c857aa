"""Runs of the timed-check contract (plan.json `"checks": 1`, summary/4): summary, verify, report.

The synthetic runs come from rundir_factory.py (ctrl ~1000 ns, fast ~800 ns, slow ~1100 ns per
call in C1, twice that in C2). Ceilings of every synthetic run: copy 8e6 / 4200 ns = 1904.76
GB/s (median of 5), read: median of 4000, 3809.52, 3636.36, 3478.26 = 3722.94 GB/s, so the best
ceiling is 3722.94 GB/s and 15% above it is 4281.39 GB/s; the checked runs' launch floor is
400 ns (median of 380..420), half of it 200 ns.

Planted defects: each tampered run directory must fail verify with the named check and its
message; positive runs must pass verify, so the figures asserted here are the ones verify
recomputes independently.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rundir_factory import (
    C1,
    C2,
    SOURCE,
    RunSpec,
    default_per_call,
    seal,
    write_checked_run,
    write_run_dir,
    write_source_archive,
)

from kerneltrial.analysis.compare import compare_runs
from kerneltrial.analysis.performance import write_performance_md
from kerneltrial.analysis.performance_overview import RUNS_FILE
from kerneltrial.kernel import integrity
from kerneltrial.kernel.report import write_report
from kerneltrial.kernel.summary import build_summary, write_summary
from kerneltrial.kernel.verify import CHECKED_RUN_CHECKS, verify_run_dir
from kerneltrial.rundir.errors import RunDirError
from tests.kt import run_cli

CHEAT = {"name": "cheat", "kind": "candidate", "available": True, "reason": None}
GPU = {"is_gpu": True, "backend": "cuda-events"}
RAISE = "raised while timed: RuntimeError: CUDA error: an illegal memory access"
WRONG = "wrong result while timed: max_rel 0.3 > rtol 0.016"


def _summary(path: Path) -> dict[str, Any]:
    return json.loads((path / "summary.json").read_text())


def _failed(path: Path) -> dict[str, str]:
    return {check.name: check.detail for check in verify_run_dir(path).failures}


def _ok(path: Path) -> Path:
    result = verify_run_dir(path)
    assert result.ok, result.failures
    return path


def _edit_summary(path: Path, edit) -> dict[str, str]:
    """Edit summary.json (and reseal, so that only the figure checks can object); return verify's failures."""
    summary = _summary(path)
    edit(summary)
    (path / "summary.json").write_text(json.dumps(summary))
    seal(path)
    return _failed(path)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _rebuild(path: Path) -> dict[str, str]:
    """After editing raw files: rewrite summary.json and the manifest as a forger would; return failures."""
    write_summary(path, overwrite=True)
    seal(path)
    return _failed(path)


def _cheat_per_call(case: str, arm: str, seed: int, rnd: int) -> float:
    """`cheat` moves 1e6 bytes in 10.5 ns: 95,238 GB/s, 50 x the copy ceiling of 1904.76 GB/s."""
    return 1e6 / (50 * 8e6 / 4200) if arm == "cheat" else default_per_call(case, arm, seed, rnd)


@pytest.fixture
def checked(tmp_path: Path) -> Path:
    """A checked CPU run: fast raises in C1 at (seed 1, round 2); slow fails a timed check in C1 at
    (seed 0, round 3) and correctness in C2."""
    spec = RunSpec(raises={(C1, "fast"): (1, 2)}, timed_failures={(C1, "slow", 0, 3): WRONG})
    return _ok(write_checked_run(tmp_path / "checked", spec))


@pytest.fixture
def cheat(tmp_path: Path) -> Path:
    """A GPU run (cuda-events, cold L2) with an arm at 50 x the copy ceiling; launch floor 1 ns so
    that only the bandwidth limit applies."""
    spec = RunSpec(
        arms=[*RunSpec().arms[:3], CHEAT],
        failures=set(),
        bytes_per_call=1_000_000,
        per_call=_cheat_per_call,
        launch_ns=[1.0] * 5,
        **GPU,
    )
    return _ok(write_checked_run(tmp_path / "cheat", spec))


@pytest.fixture
def tie_band_run(tmp_path: Path) -> Path:
    """Tie band 0.25: fast's speedup 1.25 has a CI around 1.25 in both cases (inconclusive), slow's
    0.909 lies inside [0.75, 1.25] in C1 (tie)."""
    return _ok(write_checked_run(tmp_path / "band", RunSpec(tie_band=0.25)))


# ---------------------------------------------------------------- summary/4 figures


def test_failed_while_timed_statuses_counts_and_gate(checked: Path) -> None:
    summary = _summary(checked)
    assert summary["schema"] == "kerneltrial.summary/4"
    c1, c2 = (case["arms"] for case in summary["cases"])
    assert c1["fast"]["status"] == "failed while timed" and c1["fast"]["messages"] == [RAISE]
    assert c1["slow"]["status"] == "failed while timed" and c1["slow"]["messages"] == [WRONG]
    assert c1["slow"]["median_ns_per_call"] is None and c1["slow"]["speedup"] is None  # figures null
    assert c2["fast"]["status"] == "timed" and c2["fast"]["verdict"] == "win"
    # C1: 3 arms x 10 units, less fast's 2 units after its raise at (1, 2) (the raise has its row) = 28;
    # C2: ctrl and fast x 10 units = 20
    assert summary["timed_checks"] == {"rows": 48, "failed": 2}
    fast, slow = summary["aggregates"]["fast"], summary["aggregates"]["slow"]
    assert (fast["failed_while_timed"], fast["implausible"], fast["inconclusive"]) == (1, 0, 0)
    assert (slow["failed_correctness"], slow["failed_while_timed"]) == (1, 1)
    assert summary["gate"]["arms"]["fast"]["reasons"] == [f"failed while timed in 1 case(s) (first: {C1}: {RAISE})"]
    assert summary["gate"]["arms"]["slow"]["reasons"] == [
        f"failed correctness in 1 case(s) (first: {C2}: max_rel 0.25 > rtol 0.016 at seed 0)",
        f"failed while timed in 1 case(s) (first: {C1}: {WRONG})",
        "geomean>=1.02: no case timed against the control",
    ]
    assert summary["gate"]["passed_arms"] == []


def test_ulp_hist_is_summed_per_arm(checked: Path) -> None:
    aggregates = _summary(checked)["aggregates"]
    # fast: 2 cases x 2 seeds of [900, 100, 20, 4, 0, 0]; slow: two of those and two [0, 0, 0, 0, 24, 1000]
    assert aggregates["fast"]["ulp_hist"] == [3600, 400, 80, 16, 0, 0]
    assert aggregates["slow"]["ulp_hist"] == [1800, 200, 40, 8, 48, 2000]


def test_cheating_arm_at_50x_the_copy_ceiling_is_implausible(cheat: Path) -> None:
    summary = _summary(cheat)
    reason = (
        "implausible: 95238 GB/s is 2558% of the best ceiling measured in this run (3723 GB/s); "
        "more than 15% above it cannot be real work"
    )  # 95238 / 3722.94 = 25.58
    for case in summary["cases"]:
        entry = case["arms"]["cheat"]
        assert entry["status"] == "implausible" and entry["reason"] == reason
        assert entry["median_ns_per_call"] == pytest.approx(10.5) and entry["n_samples"] == 10  # figures kept
        assert entry["speedup"] is None and entry["verdict"] is None and entry["ci_low"] is None
    assert summary["plausibility"]["bandwidth_limit_gbps"] == pytest.approx(3722.943722943723 * 1.15)
    assert summary["aggregates"]["cheat"]["implausible"] == 2
    assert summary["gate"]["arms"]["cheat"]["reasons"][0] == f"implausible in 2 case(s) (first: {C1}: {reason})"
    assert "cheat" not in summary["gate"]["passed_arms"] and "fast" in summary["gate"]["passed_arms"]
    assert summary["cases"][0]["arms"]["fast"]["status"] == "timed"  # 1250 GB/s is plausible


def test_arm_below_the_launch_floor_is_implausible(tmp_path: Path) -> None:
    def per_call(case: str, arm: str, seed: int, rnd: int) -> float:
        return 150.0 if (case, arm) == (C1, "fast") else default_per_call(case, arm, seed, rnd)

    path = _ok(
        write_checked_run(tmp_path / "run", RunSpec(failures=set(), bytes_per_call=1000, per_call=per_call, **GPU))
    )
    summary = _summary(path)
    reason = (
        "implausible: 150 ns per call is below 0.5 x the launch floor measured in this run (400 ns): "
        "no kernel can run that fast"
    )
    assert (summary["cases"][0]["arms"]["fast"]["status"], summary["cases"][0]["arms"]["fast"]["reason"]) == (
        "implausible",
        reason,
    )
    assert summary["cases"][1]["arms"]["fast"]["status"] == "timed"  # 1600 ns in C2
    assert summary["ceilings"]["launch_floor_ns"] == 400.0 and summary["plausibility"]["time_limit_ns"] == 200.0
    assert not summary["gate"]["arms"]["fast"]["passed"]
    assert summary["gate"]["arms"]["fast"]["reasons"][0] == f"implausible in 1 case(s) (first: {C1}: {reason})"
    assert "or below 200 ns per call (0.5 x the launch floor)" in write_report(path).read_text()


def test_plausibility_is_judged_only_for_cuda_events_on_a_gpu(tmp_path: Path) -> None:
    arms = [*RunSpec().arms[:3], CHEAT]
    cpu = _ok(write_checked_run(tmp_path / "cpu", RunSpec(arms=arms, failures=set(), per_call=_cheat_per_call)))
    summary = _summary(cpu)
    assert summary["plausibility"]["applied"] is False and summary["plausibility"]["bandwidth_limit_gbps"] is None
    assert summary["cases"][0]["arms"]["cheat"]["status"] == "timed"
    # hot L2: a hot cache may beat the DRAM ceiling honestly, so only the launch floor is judged
    hot = _ok(
        write_checked_run(
            tmp_path / "hot",
            RunSpec(arms=arms, failures=set(), bytes_per_call=1_000_000, per_call=_cheat_per_call, l2="hot", **GPU),
        )
    )
    summary = _summary(hot)
    assert summary["plausibility"]["bandwidth_limit_gbps"] is None
    assert summary["cases"][0]["arms"]["cheat"]["reason"].startswith("implausible: 10 ns per call is below 0.5 x")


def test_an_implausible_control_leaves_no_speedups(tmp_path: Path) -> None:
    arms = [{**CHEAT, "name": "ctrl", "kind": "control"}, *RunSpec().arms[1:3]]
    spec = RunSpec(
        arms=arms,
        failures=set(),
        bytes_per_call=1_000_000,
        launch_ns=[1.0] * 5,
        **GPU,
        per_call=lambda case, arm, seed, rnd: _cheat_per_call(case, "cheat" if arm == "ctrl" else arm, seed, rnd),
    )
    summary = _summary(_ok(write_checked_run(tmp_path / "run", spec)))
    assert summary["cases"][0]["arms"]["ctrl"]["status"] == "implausible"
    assert summary["cases"][0]["arms"]["fast"]["speedup"] is None
    assert f"case {C1}: control ctrl is implausible; no speedups for this case" in summary["warnings"]
    # An arm cannot pass `no_loss` by getting the control excluded: no verdict fails the gate.
    reason = (
        "not compared with the control in 2 case(s) (first: "
        + C1
        + ": no verdict against the control (control: implausible))"
    )
    assert summary["gate"]["arms"]["fast"]["reasons"][0] == reason
    assert summary["gate"]["passed_arms"] == []


def test_a_ci_straddling_the_band_is_inconclusive_and_tie_only_inside(tie_band_run: Path, tmp_path: Path) -> None:
    summary = _summary(tie_band_run)
    fast = [case["arms"]["fast"] for case in summary["cases"]]
    assert all(e["ci_low"] < 1.25 < e["ci_high"] and e["verdict"] == "inconclusive" for e in fast)
    slow = summary["cases"][0]["arms"]["slow"]
    assert 0.75 <= slow["ci_low"] and slow["ci_high"] <= 1.25 and slow["verdict"] == "tie"
    agg = summary["aggregates"]["fast"]
    assert (agg["wins"], agg["ties"], agg["losses"], agg["inconclusive"]) == (0, 0, 0, 2)
    assert summary["gate"]["arms"]["fast"]["passed"]  # no_loss counts losses only
    # the same raw rows without `checks`: the summary/3 rule calls both ties
    old = write_run_dir(tmp_path / "old", RunSpec(tie_band=0.25))
    assert [c["arms"]["fast"]["verdict"] for c in build_summary(old)["cases"]] == ["tie", "tie"]


def test_unfrozen_protocol_is_warned_and_verifies(tmp_path: Path) -> None:
    path = _ok(write_checked_run(tmp_path / "run", RunSpec(frozen_at=None)))
    summary = _summary(path)
    assert summary["frozen_at"] is None
    assert "the protocol was not frozen before the run: its settings were not preregistered" in summary["warnings"]
    assert _summary(_ok(write_checked_run(tmp_path / "frozen")))["frozen_at"] == "2025-01-01T00:00:00+00:00"


NO_LAUNCH = "ceilings.csv has no launch samples; the launch-floor plausibility check was not applied"


def test_gpu_run_without_launch_samples_warns(tmp_path: Path) -> None:
    path = _ok(write_checked_run(tmp_path / "run", RunSpec(launch_ns=[], bytes_per_call=1000, **GPU)))
    summary = _summary(path)
    assert summary["ceilings"]["launch_floor_ns"] is None and summary["plausibility"]["time_limit_ns"] is None
    assert NO_LAUNCH in summary["warnings"]
    assert _edit_summary(path, lambda s: s["warnings"].remove(NO_LAUNCH)) == {
        "plausibility": f"summary warnings lack {NO_LAUNCH!r}"
    }


def test_checked_run_needs_its_timed_checks_and_a_known_version(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run", RunSpec(checks=1))
    (path / "timed_checks.jsonl").unlink()
    with pytest.raises(RunDirError, match="has no timed_checks.jsonl"):
        build_summary(path)
    plan = json.loads((path / "plan.json").read_text())
    (path / "plan.json").write_text(json.dumps(plan | {"checks": 2}))
    with pytest.raises(RunDirError, match="checks 2"):
        build_summary(path)


# ---------------------------------------------------------------- verify: planted defects


def _hide_the_timed_failure(run: Path) -> None:
    """Flip the failed timed check of slow in C1 to passed."""
    path = run / "timed_checks.jsonl"
    rows = _jsonl(path)
    next(r for r in rows if r["message"] == WRONG).update(passed=True, message="")
    _write_jsonl(path, rows)


def test_flipped_timed_check_fails(checked: Path) -> None:
    _hide_the_timed_failure(checked)
    failed = _failed(checked)
    assert "timed_checks.jsonl hashes to" in failed["raw files unchanged since summary"]
    assert "timed_checks.jsonl hashes to" in failed["manifest"]
    assert (
        f"case {C1} arm slow status: summary 'failed while timed' != 'timed'" in failed[f"figures case={C1} arm=slow"]
    )
    assert "summary timed_checks failed: summary 2 != recomputed 1" in failed["timed checks"]


def test_a_self_consistent_forgery_is_beyond_verify(checked: Path) -> None:
    # rows, summary and manifest rewritten together: every figure follows from the (forged) rows.
    # docs/VERIFY.md, "What verify can and cannot prove": independent replication is the answer.
    _hide_the_timed_failure(checked)
    assert _rebuild(checked) == {}


def test_a_passed_flag_flipped_to_false_without_a_message_fails(checked: Path) -> None:
    path = checked / "timed_checks.jsonl"
    rows = _jsonl(path)
    next(r for r in rows if r["arm"] == "ctrl").update(passed=False)
    _write_jsonl(path, rows)
    failed = _rebuild(checked)
    assert (
        "failed timed checks whose message has no contract prefix, or a raise that passed: 1" in failed["timed checks"]
    )


def test_timing_row_without_a_timed_check_fails(checked: Path) -> None:
    path = checked / "timed_checks.jsonl"
    rows = _jsonl(path)
    dropped = next(r for r in rows if r["arm"] == "ctrl" and r["case"] == C2)
    _write_jsonl(path, [r for r in rows if r is not dropped])
    failed = _rebuild(checked)
    assert (
        f"timing rows without a timed check: 1, e.g. [('{C2}', {dropped['seed']}, {dropped['round']}, 'ctrl')]"
        in failed["timed checks"]
    )


def test_values_seed_must_be_shared_by_a_unit(checked: Path) -> None:
    path = checked / "timed_checks.jsonl"
    rows = _jsonl(path)
    next(r for r in rows if r["arm"] == "ctrl").update(values_seed=99)
    _write_jsonl(path, rows)
    assert "units whose arms got different values_seed: 1" in _rebuild(checked)["timed checks"]


def test_an_arm_that_raised_and_reappears_fails(tmp_path: Path) -> None:
    path = _ok(write_checked_run(tmp_path / "run", RunSpec(failures=set())))
    checks = _jsonl(path / "timed_checks.jsonl")
    next(r for r in checks if (r["case"], r["seed"], r["round"], r["arm"]) == (C1, 0, 2, "fast")).update(
        passed=False, message=RAISE
    )
    _write_jsonl(path / "timed_checks.jsonl", checks)
    lines = (path / "timings.csv").read_text().splitlines()
    (path / "timings.csv").write_text(
        "\n".join(line for line in lines if not line.startswith(f"{C1},0,2,") or ",fast," not in line) + "\n"
    )
    failed = _rebuild(path)
    assert (
        f"arm fast raised while timed in ({C1}, 0, 2) but has rows in 7 later unit(s), e.g. [(0, 3), (0, 4), "
        "(1, 0)]" in failed["dropped arms"]
    )
    assert "unexpected (case, seed, round, arm) rows: 7" in failed["timing rows"]


def _unit_where_fast_is_not_last() -> tuple[int, int]:
    """A (seed, round) of C1 whose seeded order over ctrl, fast, slow does not put fast last."""
    for seed in (0, 1):
        for rnd in range(5):
            order = [["ctrl", "fast", "slow"][i] for i in np.random.default_rng([0, 0, seed, rnd]).permutation(3)]
            if order.index("fast") < 2:
                return seed, rnd
    raise AssertionError("no such unit")


def test_the_raising_arm_keeps_its_position_in_the_round_order(tmp_path: Path) -> None:
    seed, rnd = _unit_where_fast_is_not_last()
    path = _ok(write_checked_run(tmp_path / "run", RunSpec(failures=set(), raises={(C1, "fast"): (seed, rnd)})))

    def renumber(lines: list[str]) -> list[str]:  # positions 0..1 over the two arms left: the raiser's slot closed
        unit = sorted(
            (i for i, line in enumerate(lines) if line.startswith(f"{C1},{seed},{rnd},")),
            key=lambda i: int(lines[i].split(",")[3]),
        )
        for position, i in enumerate(unit):
            fields = lines[i].split(",")
            fields[3] = str(position)
            lines[i] = ",".join(fields)
        return lines

    timings = path / "timings.csv"
    timings.write_text("\n".join(renumber(timings.read_text().splitlines())) + "\n")
    failed = _rebuild(path)
    assert list(failed) == ["interleaving order"]
    assert f"({C1}, {seed}, {rnd}): " in failed["interleaving order"]


def test_a_raise_in_a_round_the_noise_rule_added_drops_the_arm_from_later_units_only(tmp_path: Path) -> None:
    # rounds 0-4 of every seed ran before the added round 5; seed 1's round 5 ran after seed 0's
    spec = RunSpec(
        failures=set(),
        case_rounds={C1: 6},
        raises={(C1, "fast"): (0, 5)},
        noise_rule={"target_ci_width": 0.01, "max_rounds": 8, "time_budget_s": 600.0},
    )
    path = _ok(write_checked_run(tmp_path / "run", spec))
    lines = (path / "timings.csv").read_text().splitlines()
    assert any(line.startswith(f"{C1},1,4,") and ",fast," in line for line in lines)
    assert not any(line.startswith(f"{C1},1,5,") and ",fast," in line for line in lines)


def test_file_changed_after_the_run_fails_the_manifest(checked: Path) -> None:
    provenance = json.loads((checked / "provenance.json").read_text())
    (checked / "provenance.json").write_text(json.dumps(provenance | {"hostname": "elsewhere"}))
    detail = _failed(checked)["manifest"]
    assert "provenance.json hashes to" in detail and "the file changed after the run" in detail


def test_unlisted_file_fails_the_manifest_but_report_and_errata_do_not(checked: Path) -> None:
    (checked / "ERRATA.md").write_text("A note written after the run.\n")
    write_report(checked)  # after ERRATA.md: the report quotes it
    _ok(checked)
    (checked / "extra_timings.csv").write_text("case,seed\n")
    (checked / "figures").mkdir()
    (checked / "figures" / "speedup.png").write_bytes(b"png")  # only top-level figures are report output
    (checked / "win.png").write_bytes(b"png")  # and only the figures of report and plot
    assert _failed(checked) == {
        "manifest": "['extra_timings.csv', 'figures/speedup.png', 'win.png'] not in manifest.json: "
        "added after the run (only report.md, ERRATA.md, speedup.png, verdicts.png, ceiling.png, size.png may be)"
    }


def test_missing_manifest_fails(checked: Path) -> None:
    (checked / "manifest.json").unlink()
    assert _failed(checked) == {
        "required files": "manifest.json is missing (a run of checks 1 writes it)",
        "manifest": "manifest.json is missing: a run with timed checks writes it last, over every file of the run",
    }


def test_source_archive_that_does_not_match_the_digest_fails(checked: Path) -> None:
    with tarfile.open(checked / "source.tar.gz", "w:gz") as archive:
        for rel, data in sorted({**SOURCE, "trial/runner.py": b"print('another runner')\n"}.items()):
            info = tarfile.TarInfo(f"kerneltrial/{rel}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    seal(checked)
    failed = _failed(checked)
    assert list(failed) == ["source archive"]
    assert "the archived source is not the source the run recorded" in failed["source archive"]


def test_archive_digest_orders_paths_as_pathlib_does(tmp_path: Path) -> None:
    # "analysis.py" sorts before "stats.py" as a string ('.' < '/') but after it as a path
    # (component "analysis" < "analysis.py"): provenance.source_digest sorts paths
    files = {**SOURCE, "analysis.py": b"X = 1\n", "ops-extra.py": b"Y = 2\n", "ops/a.py": b""}
    digest = write_source_archive(tmp_path / "source.tar.gz", files)  # digest by provenance.source_digest
    assert integrity.archive_source_digest(tmp_path / "source.tar.gz") == digest


def test_source_archive_with_a_foreign_member_fails(checked: Path) -> None:
    with tarfile.open(checked / "source.tar.gz", "w:gz") as archive:
        info = tarfile.TarInfo("etc/passwd")
        archive.addfile(info, io.BytesIO(b""))
    seal(checked)
    assert "member 'etc/passwd' is not a .py file under kerneltrial/" in _failed(checked)["source archive"]


def test_plan_frozen_at_that_disagrees_with_provenance_fails(checked: Path) -> None:
    provenance = json.loads((checked / "provenance.json").read_text())
    provenance["freeze"]["frozen_at"] = "2025-02-01T00:00:00+00:00"
    (checked / "provenance.json").write_text(json.dumps(provenance))
    seal(checked)
    assert _failed(checked) == {
        "protocol freeze": "plan.json frozen_at '2025-01-01T00:00:00+00:00' != "
        "provenance.json freeze.frozen_at '2025-02-01T00:00:00+00:00'"
    }


def test_freeze_record_of_another_protocol_fails(checked: Path) -> None:
    provenance = json.loads((checked / "provenance.json").read_text())
    provenance["freeze"]["sha256"] = "0" * 64
    (checked / "provenance.json").write_text(json.dumps(provenance))
    seal(checked)
    assert "the frozen protocol is not the one that ran" in _failed(checked)["protocol freeze"]


def test_provenance_without_versions_and_end_fails(checked: Path) -> None:
    provenance = json.loads((checked / "provenance.json").read_text())
    del provenance["versions"]["triton"]
    provenance["finished_at"] = None
    (checked / "provenance.json").write_text(json.dumps(provenance))
    seal(checked)
    assert _failed(checked) == {
        "provenance": "versions lack ['triton']; finished_at is missing: the run did not record it"
    }


def test_implausible_arm_that_the_summary_calls_timed_fails(cheat: Path) -> None:
    def edit(summary: dict[str, Any]) -> None:
        summary["cases"][0]["arms"]["cheat"].update(status="timed", reason=None)

    detail = _edit_summary(cheat, edit)[f"figures case={C1} arm=cheat"]
    assert f"case {C1} arm cheat status: summary 'timed' != 'implausible'" in detail
    assert f"case {C1} arm cheat reason: summary None != recomputed 'implausible: 95238 GB/s" in detail


def test_summary_that_calls_an_inconclusive_ci_a_tie_fails(tie_band_run: Path) -> None:
    def edit(summary: dict[str, Any]) -> None:
        summary["cases"][0]["arms"]["fast"]["verdict"] = "tie"
        summary["aggregates"]["fast"].update(ties=1, inconclusive=1)

    failed = _edit_summary(tie_band_run, edit)
    assert (
        f"case {C1} arm fast verdict: summary 'tie' != recomputed 'inconclusive'"
        in failed[f"figures case={C1} arm=fast"]
    )
    assert "arm fast ties: summary 1 != recomputed 0" in failed["aggregates arm=fast"]


def test_gate_that_lets_an_implausible_arm_pass_fails(cheat: Path) -> None:
    def edit(summary: dict[str, Any]) -> None:
        summary["gate"]["arms"]["cheat"] = {"passed": True, "reasons": []}
        summary["gate"]["passed_arms"].append("cheat")

    failed = _edit_summary(cheat, edit)
    assert "arm cheat gate: summary True != recomputed False" in failed["aggregates arm=cheat"]
    assert (
        "arm cheat gate reasons: summary [] != recomputed ['implausible in 2 case(s)" in failed["aggregates arm=cheat"]
    )
    assert "gate" in failed


@pytest.mark.parametrize(
    ("edit", "check", "text"),
    [
        (
            lambda s: s["aggregates"]["slow"].update(ulp_hist=[1800, 200, 40, 8, 48, 1999]),
            "aggregates arm=slow",
            "arm slow ulp_hist: summary [1800, 200, 40, 8, 48, 1999] != recomputed [1800, 200, 40, 8, 48, 2000]",
        ),
        (
            lambda s: s["aggregates"]["fast"].update(failed_while_timed=0),
            "aggregates arm=fast",
            "arm fast failed_while_timed: summary 0 != recomputed 1",
        ),
        (
            lambda s: s["cases"][0]["arms"]["slow"].update(messages=["wrong result while timed: fine"]),
            f"figures case={C1} arm=slow",
            "messages: summary ['wrong result while timed: fine'] != the failed timed",
        ),
        (
            lambda s: s.update(frozen_at="2026-01-01T00:00:00+00:00"),
            "summary frozen_at",
            "summary frozen_at: summary '2026-01-01T00:00:00+00:00' != recomputed '2025-01-01T00:00:00+00:00'",
        ),
        (
            lambda s: s.update(timed_checks={"rows": 51, "failed": 0}),
            "timed checks",
            "summary timed_checks failed: summary 0 != recomputed 2",
        ),
        (
            lambda s: s["ceilings"].update(launch_floor_ns=380.0),
            "plausibility",
            "ceilings launch_floor_ns: summary 380.0 != recomputed 400.0",
        ),
        (lambda s: s.update(exact=True), "run header", "summary exact: summary True != recomputed False"),
    ],
)
def test_edited_summary_figures_of_a_checked_run_fail(checked: Path, edit, check: str, text: str) -> None:
    assert text in _edit_summary(checked, edit)[check]


def test_dropped_unfrozen_warning_fails(tmp_path: Path) -> None:
    path = _ok(write_checked_run(tmp_path / "run", RunSpec(frozen_at=None)))
    failed = _edit_summary(
        path,
        lambda s: s["warnings"].remove(
            "the protocol was not frozen before the run: its settings were not preregistered"
        ),
    )
    assert failed == {
        "summary frozen_at": "summary warnings lack 'the protocol was not frozen before the run: its "
        "settings were not preregistered'"
    }


def test_edited_plausibility_limit_fails(cheat: Path) -> None:
    failed = _edit_summary(cheat, lambda s: s["plausibility"].update(bandwidth_limit_gbps=1e9))
    assert "plausibility bandwidth_limit_gbps: summary 1000000000.0 != recomputed 4281.38" in failed["plausibility"]


def test_ulp_histograms_are_required_and_exact_means_zero_ulps(tmp_path: Path) -> None:
    path = _ok(write_checked_run(tmp_path / "run"))
    rows = _jsonl(path / "correctness.jsonl")
    del rows[0]["ulp_hist"]
    _write_jsonl(path / "correctness.jsonl", rows)
    assert '1 correctness row(s) without a 6-bin ulp_hist, e.g. ["' in _rebuild(path)["ulp histograms"]
    # the factory's passed rows have elements 1-16 ulps off: 2 cases x 2 seeds x 3 arms, less slow's 2 failed rows
    exact = write_checked_run(tmp_path / "exact", RunSpec(exact=True))
    assert "10 passed row(s) of an exact run with elements off the reference" in _failed(exact)["ulp histograms"]


def test_plan_contract_fields_are_checked(checked: Path) -> None:
    plan = json.loads((checked / "plan.json").read_text())
    del plan["frozen_at"]
    plan["plausibility"] = {"bandwidth_margin": "wide"}
    (checked / "plan.json").write_text(json.dumps(plan))  # build_summary refuses such a plan: no rebuild
    detail = _failed(checked)["plan contract fields"]
    assert "plausibility {'bandwidth_margin': 'wide'} lacks non-negative numbers" in detail
    assert "frozen_at 'absent' is not a time or null" in detail


def test_plausibility_settings_must_be_the_protocols(tmp_path: Path) -> None:
    # the protocol does not set them, so plan.json must hold the defaults (0.15, 0.5)
    path = write_checked_run(
        tmp_path / "run", RunSpec(plausibility={"bandwidth_margin": 5.0, "launch_floor_fraction": 0.5})
    )
    assert (
        "plausibility.bandwidth_margin: plan.json has 5.0, protocol.toml says 0.15"
        in _failed(path)["plan matches protocol"]
    )


def test_schema_must_match_the_plan(checked: Path, run_dir: Path) -> None:
    failed = _edit_summary(checked, lambda s: s.update(schema="kerneltrial.summary/3"))
    assert (
        "summary schema 'kerneltrial.summary/3' is not kerneltrial.summary/4, which a plan with checks 1 needs"
        in failed["summary schema"]
    )
    summary = _summary(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary | {"schema": "kerneltrial.summary/4"}))
    assert "a schema-4 summary needs plan.json checks 1" in _failed(run_dir)["summary schema"]


def test_old_runs_list_the_new_checks_as_not_applicable(run_dir: Path) -> None:
    result = verify_run_dir(run_dir)
    assert result.ok
    skipped = [c.name for c in result.checks if not c.applicable]
    assert skipped == [
        "source commit",  # the factory's commit abc123 is not in this checkout's history
        "throttle re-takes",  # no per-arm re-take counts
        *CHECKED_RUN_CHECKS,
        "triton launch floor",
        "size-matched copies",
        "speed-of-light floor",
        "achieved TFLOPS",  # no case flops (issue 40)
        "peak memory",  # no plan peak_memory (issue 40)
        "host cost",
        "isolation bounds",
        "report.md",
        "ERRATA.md",
        "figures added",
    ]
    assert all(c.ok and c.detail.startswith("not applicable") for c in result.checks if not c.applicable)
    output = run_cli("verify", run_dir).output
    assert "n/a  manifest: not applicable: plan.json has no `checks`" in output
    assert output.splitlines()[-1].endswith(f"({len(CHECKED_RUN_CHECKS) + 12} not applicable to this run)")


# ---------------------------------------------------------------- report, PERFORMANCE.md, compare


def test_report_shows_timed_checks_statuses_ulps_and_freeze(checked: Path) -> None:
    report = write_report(checked).read_text()
    assert "- protocol frozen at 2025-01-01T00:00:00+00:00" in report
    assert "- timed checks: 48 timing samples, the last call of each checked on fresh values; 2 failed" in report
    assert "- plausibility: not judged (not a GPU run timed with CUDA events)" in report
    assert f"**failed while timed** in 1 sample(s): {RAISE} |" in report
    assert (
        "| arm | geomean [CI] | mean | worst case | wins/ties/losses/inconclusive | failed correctness | failed while timed | "
        "implausible |" in report
    )
    assert (
        "| `fast` | 1.250 [1.250, 1.250] | 1.250 | 1.250 (`2x64/contiguous/bfloat16`) | 1/0/0/0 | 0 | 1 | 0 |" in report
    )
    assert "| `slow` | 1,800 | 200 | 40 | 8 | 48 | 2,000 |" in report
    assert "launch floor 400 ns (median of 5 empty launches)" in report


def test_report_names_the_first_of_many_failed_samples(tmp_path: Path) -> None:
    failures = {(C1, "fast", 0, rnd): f"{WRONG} at round {rnd}" for rnd in range(3)}
    path = _ok(write_checked_run(tmp_path / "run", RunSpec(timed_failures=failures)))
    assert f"**failed while timed** in 3 sample(s): {WRONG} at round 0 (and 2 more) |" in write_report(path).read_text()


def test_report_of_an_implausible_arm_and_an_unfrozen_run(cheat: Path, tmp_path: Path) -> None:
    report = write_report(cheat).read_text()
    assert "**implausible**: 95238 GB/s is 2558% of the best ceiling measured in this run (3723 GB/s)" in report
    assert "- plausibility: implausible above 4,281.4 GB/s (15% over the best ceiling) or below " in report
    unfrozen = _ok(write_checked_run(tmp_path / "unfrozen", RunSpec(frozen_at=None)))
    assert "- **NOT FROZEN**: the protocol was not frozen before the run" in write_report(unfrozen).read_text()


def test_old_reports_take_the_freeze_from_provenance(run_dir: Path) -> None:
    assert "freeze" not in json.loads((run_dir / "provenance.json").read_text())
    report = write_report(run_dir).read_text()
    assert "FROZEN" not in report and "frozen at" not in report and "wins/ties/losses" in report
    provenance = json.loads((run_dir / "provenance.json").read_text())
    (run_dir / "provenance.json").write_text(json.dumps(provenance | {"freeze": None, "impl_modules": {}}))
    assert "- **NOT FROZEN**" in write_report(run_dir).read_text()


def test_performance_md_shows_inconclusive_counts(tie_band_run: Path, tmp_path: Path) -> None:
    write_performance_md([tie_band_run], tmp_path / "PERFORMANCE.md")
    text = (tmp_path / RUNS_FILE).read_text()
    assert "| wins/ties/losses/inconclusive |" in text and "| 0/0/0/2 |" in text


def test_compare_shows_verdicts_including_inconclusive(tie_band_run: Path, cheat: Path) -> None:
    text = compare_runs(tie_band_run, cheat)
    assert (
        "| median A µs | median B µs | B/A | change | B over A [CI] | speedup A [CI] | speedup B [CI] | verdict A"
        in text
    )
    fast = next(line for line in text.splitlines() if line.startswith(f"| `{C1}` | `fast` |"))
    assert fast.startswith(f"| `{C1}` | `fast` | 0.800 | 0.800 | 1.000 | SAME | 1.000 [") and fast.endswith(
        "| inconclusive | win |"
    )
    (ctrl,) = [line for line in text.splitlines() if line.startswith(f"| `{C1}` | `ctrl` | 1.000 | 1.000 | 1.000 | ")]
    assert ctrl.endswith("| – | – | control | control |")  # the control's change is called; it has no speedup
