"""kernel.verify: passes on a good run directory, fails and names the problem on tampered ones."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from rundir_factory import C1, C2, C3, C4, RunSpec, write_run_dir

import kerneltrial.kernel.git_history as git_history_module
import kerneltrial.kernel.integrity as integrity_module
import kerneltrial.kernel.links as links_module
import kerneltrial.kernel.provenance_checks as provenance_checks_module
import kerneltrial.kernel.schema_requirements as schema_requirements_module
import kerneltrial.kernel.verify as verify_module
import kerneltrial.replicates.record as replicates_module
from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.errors import RunDirError
from tests.kt import run_cli


def _failed(run_dir: Path) -> dict[str, str]:
    return {check.name: check.detail for check in verify_run_dir(run_dir).failures}


def _edit_timings(run_dir: Path, edit) -> None:
    path = run_dir / "timings.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")


def test_good_run_passes(run_dir: Path) -> None:
    result = verify_run_dir(run_dir)
    assert result.ok, result.failures
    names = [check.name for check in result.checks]
    assert "timing rows" in names and f"figures case={C2} arm=fast" in names and "aggregates arm=slow" in names


def test_changed_timing_value_fails(run_dir: Path) -> None:
    # fast in c1 takes 780..820 ns/call, median 800; tripling one 800 moves the median to 805.
    def slow_down(lines: list[str]) -> list[str]:
        row = next(i for i, line in enumerate(lines) if line.startswith(f"{C1},") and line.endswith(",fast,10,8000.0"))
        lines[row] = lines[row].replace(",8000.0", ",24000.0")
        return lines

    _edit_timings(run_dir, slow_down)
    failed = _failed(run_dir)
    assert "timings.csv hashes to" in failed["raw files unchanged since summary"]
    assert "median_ns_per_call: summary 800.0 != recomputed 805.0" in failed[f"figures case={C1} arm=fast"]


def test_figures_are_recomputed_not_only_hashed(run_dir: Path) -> None:
    # A summary rewritten to match edited raw files passes the hash check but not the figures.
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    _edit_timings(run_dir, lambda lines: [line.replace(",fast,10,8000.0", ",fast,10,24000.0") for line in lines])
    summary["inputs_sha256"]["timings.csv"] = hashlib.sha256((run_dir / "timings.csv").read_bytes()).hexdigest()
    path.write_text(json.dumps(summary))
    failed = _failed(run_dir)
    assert "raw files unchanged since summary" not in failed
    assert f"figures case={C1} arm=fast" in failed


def test_deleted_row_fails(run_dir: Path) -> None:
    _edit_timings(run_dir, lambda lines: lines[:5] + lines[6:])
    failed = _failed(run_dir)
    assert "missing (case, seed, round, arm) rows: 1" in failed["timing rows"]
    assert any("n_samples: summary 10 != recomputed 9" in detail for detail in failed.values())


def test_duplicated_row_fails(run_dir: Path) -> None:
    _edit_timings(run_dir, lambda lines: lines + [lines[3]])
    assert "duplicated (case, seed, round, arm) rows: 1" in _failed(run_dir)["timing rows"]


def test_edited_summary_figure_fails(run_dir: Path) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["cases"][1]["arms"]["fast"]["speedup"] = 1.2500001
    summary["aggregates"]["fast"]["wins"] = 1
    path.write_text(json.dumps(summary))
    failed = _failed(run_dir)
    assert "speedup: summary 1.2500001 != recomputed 1.25" in failed[f"figures case={C2} arm=fast"]
    assert "wins" in failed["aggregates arm=fast"]


def test_changed_protocol_fails(run_dir: Path) -> None:
    (run_dir / "protocol.toml").write_text('op = "rmsnorm"\ntie_band = 0.05\n')
    failed = _failed(run_dir)
    assert {"protocol hash in provenance.json", "protocol hash in plan.json", "protocol hash in summary.json"} <= set(
        failed
    )


def test_timed_arm_that_failed_correctness_fails(run_dir: Path) -> None:
    _edit_timings(run_dir, lambda lines: lines + [f"{C2},0,0,9,slow,10,9000.0"])
    failed = _failed(run_dir)
    assert f"slow failed correctness in case {C2}" in failed["correctness consistency"]
    assert "unexpected" in failed["timing rows"]


def test_timed_arm_without_a_correctness_check_fails(run_dir: Path) -> None:
    path = run_dir / "correctness.jsonl"
    rows = [
        line for line in path.read_text().splitlines() if '"arm": "fast"' not in line or f'"case": "{C1}"' not in line
    ]
    path.write_text("\n".join(rows) + "\n")
    assert f"case {C1} arm fast: no correctness check" in _failed(run_dir)["correctness coverage"]


def test_not_a_run_dir_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="not a directory"):
        verify_run_dir(tmp_path / "nowhere")
    with pytest.raises(RunDirError, match="missing provenance.json"):
        verify_run_dir(tmp_path)


def test_the_cli_sends_serving_runs_to_the_serving_verifier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "provenance.json").write_text(json.dumps({"kind": "serving"}))
    fake = types.ModuleType("kerneltrial.serving.verify")

    def fake_verify(problems: list[str]) -> Callable[[Path, bool], VerifyResult]:
        def verify(path: Path, regrade: bool) -> VerifyResult:
            result = VerifyResult(path)
            result.add("summary figures", problems if path == tmp_path else ["wrong path"], "every figure matches")
            return result

        return verify

    fake.verify_serving_run = fake_verify([])
    monkeypatch.setitem(sys.modules, "kerneltrial.serving.verify", fake)
    passed = run_cli("verify", str(tmp_path))
    assert passed.exit_code == 0 and "ok   summary figures: every figure matches" in passed.output
    fake.verify_serving_run = fake_verify(["ttft p50 differs", "row 3 missing"])
    failed = run_cli("verify", str(tmp_path))
    assert failed.exit_code == 1 and "FAIL summary figures: ttft p50 differs; row 3 missing" in failed.output


def test_the_kernel_verifier_refuses_a_serving_run(tmp_path: Path) -> None:
    (tmp_path / "provenance.json").write_text(json.dumps({"kind": "serving"}))
    with pytest.raises(RunDirError, match="a serving run directory, not a kernel one"):
        verify_run_dir(tmp_path)


VERIFY_PACKAGE = Path(verify_module.__file__).parent  # kernel/verify/: one module per check family
INDEPENDENT_FILES = [
    *sorted(VERIFY_PACKAGE.glob("*.py")),
    *(
        Path(module.__file__)
        for module in (
            integrity_module,
            links_module,
            replicates_module,
            schema_requirements_module,
            provenance_checks_module,
            git_history_module,
        )
    ),
]


@pytest.mark.parametrize("path", INDEPENDENT_FILES, ids=lambda path: path.name)
def test_verify_is_independent_of_stats_and_summary(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert not [name for name in imported if "stats" in name or "summary" in name or "pandas" in name]
    ours = {
        name
        for name in imported
        if name.startswith("kerneltrial.") and not name.startswith(("kerneltrial.rundir", "kerneltrial.kernel.verify."))
    }  # the verifier's own modules are each checked here too
    assert ours <= {
        "kerneltrial.kernel.derived",  # report.md against the renderers' output: a page check, no figure
        "kerneltrial.kernel.integrity",
        "kerneltrial.kernel.integrity.package_digest",
        "kerneltrial.kernel.git_history.package_at",
        "kerneltrial.kernel.schema_requirements",
        "kerneltrial.kernel.provenance_checks",
        "kerneltrial.kernel.links",
        "kerneltrial.publication.titled",  # the UNVERIFIED mark of a page title
        "kerneltrial.kernel.report.report_text",  # report.md rendered again to compare (a page, no figure)
        "kerneltrial.kernel.plots.figure_png",  # an added figure drawn again to compare (kernel/derived.py)
        "kerneltrial.kernel.report.write_report",  # replicates: `report` writes each run's page (not verify)
        "kerneltrial.kernel.verify.check_written_after",  # replicates: each run's kernel checks
        "kerneltrial.kernel.verify.verify_run_dir",
    }
    assert not [name for name in imported if name.startswith(("kerneltrial.trial", "kerneltrial.ops"))]


def test_verify_2000_rows_benchmark(tmp_path: Path, report_benchmark: Callable[[str, float], None]) -> None:
    """Times verify on 2,000 rows and reports it (about 0.25 s on an idle core); a time limit would
    fail on a loaded or slow machine without anything being wrong, so only the result is asserted."""
    spec = RunSpec(
        cases=[C1, C2, C3, C4], seeds=[0, 1, 2, 3], rounds=25, resamples=10_000, failures=set()
    )  # 4 cases x 5 timed arms x 4 seeds x 25 rounds = 2,000 rows
    spec.arms = spec.arms[:3] + [
        {"name": f"cand{i}", "kind": "candidate", "available": True, "reason": None} for i in range(2)
    ]
    path = write_run_dir(tmp_path / "run", spec)
    assert len((path / "timings.csv").read_text().splitlines()) == 2001
    write_summary(path)
    start = time.perf_counter()
    result = verify_run_dir(path)
    elapsed = time.perf_counter() - start
    assert result.ok, result.failures
    report_benchmark("verify_2000_rows_s", elapsed)


def test_flipped_gate_verdict_fails(run_dir: Path) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["gate"]["arms"]["slow"]["passed"] = True
    summary["gate"]["passed_arms"] = ["fast", "slow"]
    path.write_text(json.dumps(summary))
    failed = _failed(run_dir)
    assert "arm slow gate: summary True != recomputed False" in failed["aggregates arm=slow"]
    assert "gate" in failed


# ---------------------------------------------------------------- plan.json against protocol.toml


def _protocol_failure(tmp_path: Path, edit) -> str:
    """Write a run whose protocol.toml was edited (plan.json unchanged), return the protocol check's detail."""
    path = write_run_dir(tmp_path / "run", RunSpec(protocol_edit=edit))
    write_summary(path)
    failed = _failed(path)
    assert list(failed) == ["plan matches protocol"], failed  # the hashes agree: only the contents differ
    return failed["plan matches protocol"]


def test_plan_matches_protocol(run_dir: Path) -> None:
    check = next(c for c in verify_run_dir(run_dir).checks if c.name == "plan matches protocol")
    assert check.ok and "2 case ids" in check.detail


@pytest.mark.parametrize(
    ("edit", "text"),
    [
        (
            lambda p: p.update(candidates=["slow", "fast", "peer"]),
            "arms: plan.json has ['ctrl', 'fast', 'slow', 'peer'], protocol.toml says ['ctrl', 'slow', 'fast', 'peer']",
        ),
        (lambda p: p.pop("control"), "arms: plan.json has ['ctrl', "),  # the protocol's default control is 'control'
        (
            lambda p: p["cases"][1].update(layout="qkv_slice"),
            f"cases: plan.json has ['{C1}', '{C2}'], protocol.toml says ['{C1}', '2x64/qkv_slice/bfloat16']",
        ),
        (lambda p: p["cases"][0].update(dtype="float32"), "1x64/contiguous/float32"),
        (lambda p: p["cases"][0].update(shape=[1, 65]), "1x65/contiguous/bfloat16"),
        (lambda p: p.update(seeds=[0, 2]), "seeds: plan.json has [0, 1], protocol.toml says [0, 2]"),
        (lambda p: p.update(rounds=6), "rounds: plan.json has 5, protocol.toml says 6"),
        (lambda p: p.pop("rounds"), "rounds: plan.json has 5, protocol.toml says 7"),  # default 7
        (lambda p: p.update(tie_band=0.03), "tie_band: plan.json has 0.02, protocol.toml says 0.03"),
        (
            lambda p: p.update(gate="no_loss"),
            "gate: plan.json has 'no_loss and geomean>=1.02', protocol.toml says 'no_loss'",
        ),
        (
            lambda p: p.update(bootstrap_resamples=1000),
            "bootstrap.resamples: plan.json has 2000, protocol.toml says 1000",
        ),
        (lambda p: p.pop("bootstrap_seed"), "bootstrap.seed: plan.json has 7, protocol.toml says 20261129"),
        (lambda p: p.update(confidence=0.9), "bootstrap.confidence: plan.json has 0.95, protocol.toml says 0.9"),
        (lambda p: p.update(l2="hot"), "l2: plan.json has 'cold', protocol.toml says 'hot'"),
        (lambda p: p.update(op="silu_and_mul"), "op: plan.json has 'rmsnorm', protocol.toml says 'silu_and_mul'"),
    ],
)
def test_plan_that_differs_from_protocol_fails_naming_the_field(tmp_path: Path, edit, text: str) -> None:
    assert text in _protocol_failure(tmp_path, edit)


def test_protocol_defaults_fill_absent_keys(tmp_path: Path) -> None:
    # layout and dtype default to contiguous and bfloat16; l2 to cold; tie band to 0.02
    def strip(protocol: dict) -> None:
        for case in protocol["cases"]:
            case.pop("layout")
            case.pop("dtype")
        protocol.pop("l2")
        protocol.pop("tie_band")

    path = write_run_dir(tmp_path / "run", RunSpec(protocol_edit=strip))
    write_summary(path)
    assert verify_run_dir(path).ok


def test_noise_settings_are_compared_where_plan_has_them(tmp_path: Path) -> None:
    spec = RunSpec(
        clocks={"max_sm_mhz": 2000, "throttle_fraction": 0.5}, protocol_edit=lambda p: p.update(throttle_fraction=0.8)
    )
    path = write_run_dir(tmp_path / "run", spec)
    write_summary(path)
    assert (
        "clocks.throttle_fraction: plan.json has 0.5, protocol.toml says 0.8" in _failed(path)["plan matches protocol"]
    )


def test_unparsable_protocol_is_a_failed_check(run_dir: Path) -> None:
    text = (run_dir / "protocol.toml").read_bytes() + b"rounds = = 3\n"
    (run_dir / "protocol.toml").write_bytes(text)
    assert "protocol.toml is not valid TOML" in _failed(run_dir)["plan matches protocol"]


# ---------------------------------------------------------------- interleaving order


def _unit_rows(lines: list[str], prefix: str) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith(prefix)]


def _swap_positions(path: Path, prefix: str) -> None:
    """Swap the `position` of the first two rows of the unit whose rows start with `prefix`; rewrite summary."""

    def edit(lines: list[str]) -> list[str]:
        first, second = _unit_rows(lines, prefix)[:2]
        a, b = lines[first].split(","), lines[second].split(",")
        a[3], b[3] = b[3], a[3]
        lines[first], lines[second] = ",".join(a), ",".join(b)
        return lines

    _edit_timings(path, edit)
    write_summary(path, overwrite=True)


def test_seeded_order_is_recomputed(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run", RunSpec(order_seed=3))
    write_summary(path)
    result = verify_run_dir(path)
    assert result.ok, result.failures
    check = next(c for c in result.checks if c.name == "interleaving order")
    assert check.detail == "20 (case, seed, round) units, positions 0..k-1, each in the seeded order of order_seed 3"
    # default_rng([3, 0, 0, 0]).permutation(3) == [2, 1, 0]: slow first, then fast, then ctrl
    lines = (path / "timings.csv").read_text().splitlines()
    unit = {line.split(",")[4]: int(line.split(",")[3]) for line in lines if line.startswith(f"{C1},0,0,")}
    assert unit == {"slow": 0, "fast": 1, "ctrl": 2}


def test_rows_out_of_the_seeded_order_fail(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run", RunSpec(order_seed=3))
    _swap_positions(path, f"{C1},0,0,")
    failed = _failed(path)
    assert list(failed) == ["interleaving order"]
    assert (
        f"1 unit(s) not in the order of order_seed 3, e.g. ['({C1}, 0, 0): slow at 1, seeded order puts it at 0, "
        "fast at 0, seeded order puts it at 1']" in failed["interleaving order"]
    )


def test_without_order_seed_only_positions_are_checked(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run")
    _swap_positions(path, f"{C1},0,0,")  # still positions 0..2: nothing to recompute the order from
    assert verify_run_dir(path).ok


@pytest.mark.parametrize("position", ["3", "1"])  # beyond k - 1 = 2; a repeated position
def test_positions_must_be_0_to_k_minus_1(tmp_path: Path, position: str) -> None:
    path = write_run_dir(tmp_path / "run")

    def edit(lines: list[str]) -> list[str]:
        row = next(i for i, line in enumerate(lines) if line.startswith(f"{C1},1,2,") and line.split(",")[3] == "0")
        fields = lines[row].split(",")
        fields[3] = position
        lines[row] = ",".join(fields)
        return lines

    _edit_timings(path, edit)
    write_summary(path)
    detail = _failed(path)["interleaving order"]
    assert f"1 unit(s) whose positions are not 0..k-1, e.g. ['({C1}, 1, 2) positions" in detail
    assert "for 3 timed arm(s)" in detail
