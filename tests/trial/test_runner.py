"""End to end on the CPU: protocol -> run -> verify -> report; resume after SIGKILL; no overwrite."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kerneltrial.kernel.report import write_report
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.trial import timing
from kerneltrial.trial.runner import RunError, run_trial
from tests.conftest import REPO
from tests.kt import write_protocol

PROTOCOL = """
name = "cpu-e2e"
op = "rmsnorm"
control = "control"
candidates = ["packed_r4_w4", "user:wrong_rmsnorm"]
impl_modules = ["{module}"]
seeds = [0, 1]
rounds = {rounds}
warmup = 1
calls_per_sample = 1
l2 = "hot"
[[cases]]
shape = [4, 64]
[[cases]]
shape = [3, 200]
layout = "row_strided"
"""
WRONG = REPO / "tests" / "fixtures" / "wrong_rmsnorm.py"


def timing_keys(run: Path) -> list[tuple[str, str, str, str]]:
    with (run / "timings.csv").open() as handle:
        return [(r["case"], r["seed"], r["round"], r["arm"]) for r in csv.DictReader(handle)]


def test_end_to_end(tmp_path):
    run = run_trial(write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3), tmp_path / "run")
    keys = timing_keys(run)
    # 2 cases x 2 seeds x 3 rounds x 2 arms that passed; the wrong kernel is never timed.
    assert len(keys) == len(set(keys)) == 24
    assert not any(arm == "user:wrong_rmsnorm" for *_, arm in keys)
    failed = [json.loads(line) for line in (run / "correctness.jsonl").read_text().splitlines()]
    assert any(r["arm"] == "user:wrong_rmsnorm" and not r["passed"] for r in failed)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["is_gpu"] is False and "NOT GPU" in plan["timing_label"]
    result = verify_run_dir(run)
    assert result.ok, result.failures
    with (run / "ceilings.csv").open() as handle:
        kinds = [r["kind"] for r in csv.DictReader(handle)]
    assert {kind: kinds.count(kind) for kind in set(kinds)} == {
        "copy": 10,
        "read": 10,
        "launch": 10,
        "triton_launch": 10,
        "copy_matched": 20,  # one copy of each case's traffic: 4x64 and 3x200 rmsnorm rows
    }
    floor = next(c for c in result.checks if c.name == "triton launch floor")
    assert floor.applicable and "the median of 10 one-element Triton launches" in floor.detail
    matched = next(c for c in result.checks if c.name == "size-matched copies")
    assert matched.ok and matched.applicable and "2 sizes, 20 samples" in matched.detail
    assert all(case["matched_copy_gbps"] > 0 for case in json.loads((run / "summary.json").read_text())["cases"])
    report = write_report(run)
    text = report.read_text()
    assert "NOT GPU performance" in text and "packed_r4_w4" in text
    record = json.loads((run / "provenance.json").read_text())
    assert record["finished_at"]
    assert record["lead"] == {
        "samples_retaken": 0,
        "samples_retaken_throttled": 0,
        "samples_retaken_throttled_by_arm": {},
        "samples_kept_behind": 0,
        "sessions": "all",
        "final_cycles_per_call": timing.LEAD_CYCLES_PER_CALL,
    }  # the host clock spins nothing


def test_finished_run_is_never_overwritten(tmp_path):
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3)
    run = run_trial(protocol, tmp_path / "run")
    before = (run / "timings.csv").read_bytes()
    with pytest.raises(RunError, match="never overwritten"):
        run_trial(protocol, run)
    with pytest.raises(RunError, match="never overwritten"):
        run_trial(protocol, run, resume=True)
    assert (run / "timings.csv").read_bytes() == before


@pytest.mark.slow
def test_sigkill_then_resume_completes_rows(tmp_path):
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=12)
    out = tmp_path / "run"
    code = f"from pathlib import Path; from kerneltrial.trial.runner import run_trial; run_trial(Path({str(protocol)!r}), Path({str(out)!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        timings = out / "timings.csv"
        if timings.exists() and len(timings.read_text().splitlines()) > 10:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    partial = timing_keys(out)
    assert 0 < len(partial) < 96, "the kill must land mid-run"
    with pytest.raises(RunError, match="--resume"):
        run_trial(protocol, out)
    run_trial(protocol, out, resume=True)
    keys = timing_keys(out)
    assert len(keys) == len(set(keys)) == 96
    assert set(partial) <= set(keys)
    assert verify_run_dir(out).ok


def test_provenance_records_freeze_and_module_hashes(tmp_path):
    from kerneltrial.trial import protocol as proto

    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3)
    proto.freeze(protocol)
    run = run_trial(protocol, tmp_path / "run")
    record = json.loads((run / "provenance.json").read_text())
    assert record["freeze"]["sha256"] == sha256_file(protocol)
    [(spec, digest)] = record["impl_modules"].items()
    assert spec.endswith("wrong_rmsnorm.py") and len(digest) == 64


def test_resume_refuses_a_changed_kernel_module(tmp_path):
    module = tmp_path / "wrong_rmsnorm.py"
    module.write_text(WRONG.read_text())
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=module, rounds=3)
    out = tmp_path / "run"
    run = run_trial(protocol, out)
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["finished_at"] = None  # as if killed before the end
    (run / "provenance.json").write_text(json.dumps(provenance))
    module.write_text(module.read_text() + "\n# edited\n")
    with pytest.raises(RunError, match="kernel module changed"):
        run_trial(protocol, out, resume=True)


@pytest.mark.parametrize(
    ("planted", "named"),
    [({"hostname": "other-host"}, "host other-host"), ({"device": {"uuid": "GPU-planted"}}, "GPU GPU-planted")],
)
def test_resume_refuses_another_chip_or_host(tmp_path, planted, named):
    """A run started on another GPU (its recorded uuid) or host is never continued here: its
    rows would come from two chips (a fleet unit is resumed wherever Ray puts it)."""
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3)
    run = run_trial(protocol, tmp_path / "run")
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["finished_at"] = None  # as if killed before the end
    provenance["hostname"] = planted.get("hostname", provenance["hostname"])
    provenance["device"] |= planted.get("device", {})
    (run / "provenance.json").write_text(json.dumps(provenance))
    before = (run / "timings.csv").read_bytes()
    with pytest.raises(RunError, match=f"{named}.*start a new run directory"):
        run_trial(protocol, run, resume=True)
    assert (run / "timings.csv").read_bytes() == before


def test_resume_after_the_summary_was_written_finishes(tmp_path):
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3)
    run = run_trial(protocol, tmp_path / "run")
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["finished_at"] = None  # killed between summary.json and the provenance update
    (run / "provenance.json").write_text(json.dumps(provenance))
    run_trial(protocol, run, resume=True)
    assert json.loads((run / "provenance.json").read_text())["finished_at"]
    assert verify_run_dir(run).ok


def test_a_declared_source_commit_wins_over_a_stale_git(monkeypatch, tmp_path):
    """A tree copied to a GPU machine may carry the .git of an earlier commit: the sender's
    KERNELTRIAL_SOURCE_COMMIT is recorded as the commit, git's own view beside it."""
    from kerneltrial.rundir import provenance

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("KERNELTRIAL_SOURCE_COMMIT", raising=False)
    assert provenance.git_state(tmp_path)["commit"] is None  # not a repository
    own = provenance.git_state(repo)
    assert len(own["source_sha256"]) == 64 and "git_head" not in own
    monkeypatch.setenv("KERNELTRIAL_SOURCE_COMMIT", "abc1234")
    declared = provenance.git_state(repo)
    assert declared["commit"] == "abc1234" and declared["dirty"] is None
    assert declared["source"] == "KERNELTRIAL_SOURCE_COMMIT"
    assert (declared["git_head"], declared["git_dirty"]) == (own["commit"], own["dirty"])


def test_source_digest_changes_with_any_package_file(tmp_path):
    from kerneltrial.rundir import provenance

    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = provenance.source_digest(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert provenance.source_digest(tmp_path) != first


def _drop_arm_checks(run: Path, arm: str, case_prefix: str = "") -> None:
    """Planted: delete an arm's correctness rows (in cases starting with `case_prefix`), rebuild the
    summary and re-seal, as a careful forger would."""
    from kerneltrial.kernel.summary import write_summary
    from tests.analysis.rundir_factory import seal

    correctness = run / "correctness.jsonl"
    kept = [
        line
        for line in correctness.read_text().splitlines()
        if not (json.loads(line)["arm"] == arm and json.loads(line)["case"].startswith(case_prefix))
    ]
    correctness.write_text("\n".join(kept) + "\n")
    write_summary(run, overwrite=True)
    seal(run)


def test_a_peer_that_takes_only_some_layouts_is_unavailable_in_the_others(tmp_path, monkeypatch):
    """A peer that takes only contiguous rows (e.g. FlagGems' fused add, SGLang's kernels) is neither
    checked nor timed on strided rows; plan.json records its layouts, so verify does not miss its checks
    there, and still catches checks missing where it does take the layout (planted)."""
    from kerneltrial.ops.registry import get_op, load_builtin_ops

    load_builtin_ops()
    monkeypatch.setattr(get_op("rmsnorm").impl("torch_eager"), "layouts", ("contiguous",))
    both = PROTOCOL.replace('"packed_r4_w4", ', '"packed_r4_w4", "torch_eager", ')
    path = write_protocol(tmp_path / "p.toml", both, module=WRONG, rounds=3)
    run = run_trial(path, tmp_path / "run")
    plan = json.loads((run / "plan.json").read_text())
    assert next(a for a in plan["arms"] if a["name"] == "torch_eager")["layouts"] == ["contiguous"]
    assert not any(a == "torch_eager" and c.startswith("3x200") for c, _, _, a in timing_keys(run))
    strided = json.loads((run / "summary.json").read_text())["cases"][1]
    assert strided["arms"]["torch_eager"]["status"] == "unavailable"
    assert strided["arms"]["torch_eager"]["reason"] == "does not take layout 'row_strided'"
    result = verify_run_dir(run)
    assert result.ok, result.failures

    _drop_arm_checks(run, "torch_eager")  # planted: also the checks where it does take the layout
    coverage = next(c for c in verify_run_dir(run).checks if c.name == "correctness coverage")
    assert not coverage.ok and "case 4x64/contiguous/bfloat16 arm torch_eager: no correctness check" in coverage.detail


def test_a_candidate_may_not_declare_widths(tmp_path, monkeypatch):
    """Declared widths bound the extra shapes the gate draws for an arm (ops/spec.py `draws_extra`):
    a candidate declaring the panel's widths would never meet another width, so the runner refuses it."""
    from kerneltrial.ops.registry import Case, get_op, load_builtin_ops

    load_builtin_ops()
    impl = get_op("rmsnorm").impl("packed_r4_w4")
    monkeypatch.setattr(impl, "widths", (200,))
    assert not impl.draws_extra(Case((3, 896))) and impl.supports(Case((3, 896)))
    with pytest.raises(RunError, match=r"candidate arm 'packed_r4_w4' declares widths \(200,\); only a peer may"):
        run_trial(write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3), tmp_path / "refused")
    assert not (tmp_path / "refused" / "timings.csv").exists()


def test_a_candidate_may_not_skip_layouts(tmp_path, monkeypatch):
    """A candidate unavailable in a case would leave the gate there: the runner refuses one that takes only
    some layouts, and verify catches a plan that gives a candidate `layouts` to hide a failed case (planted:
    the failing case's checks deleted, the summary rebuilt, the directory re-sealed)."""
    from kerneltrial.ops.registry import get_op, load_builtin_ops

    load_builtin_ops()
    impl = get_op("rmsnorm").impl("packed_r4_w4")
    monkeypatch.setattr(impl, "layouts", ("contiguous",))
    with pytest.raises(RunError, match="candidate arm 'packed_r4_w4' takes only layouts contiguous; only a peer"):
        run_trial(write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3), tmp_path / "refused")
    monkeypatch.setattr(impl, "layouts", None)

    run = run_trial(write_protocol(tmp_path / "p.toml", PROTOCOL, module=WRONG, rounds=3), tmp_path / "run")
    plan_path = run / "plan.json"
    plan = json.loads(plan_path.read_text())
    next(a for a in plan["arms"] if a["name"] == "packed_r4_w4")["layouts"] = ["contiguous"]
    plan_path.write_text(json.dumps(plan))
    _drop_arm_checks(run, "packed_r4_w4", "3x200")
    coverage = next(c for c in verify_run_dir(run).checks if c.name == "correctness coverage")
    assert not coverage.ok
    assert "arm(s) ['packed_r4_w4'] have `layouts` but only a peer may skip layouts" in coverage.detail
    assert "case 3x200/row_strided/bfloat16 arm packed_r4_w4: no correctness check" in coverage.detail
