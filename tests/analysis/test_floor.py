"""The speed-of-light floor (issue 27, item 3; kernel/floor.py): summary/6 records each case's
floor and each arm's fraction of it, verify recomputes both from ceilings.csv and timings.csv, and
older runs (every committed one) read and verify without them, their floor computed from the
ceilings they hold. Planted run directories: an edited fraction, a summary without the floor
relabelled summary/5, a plan naming another model, and an old run claiming floor figures."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import pytest
from rundir_factory import seal, write_checked_run

from kerneltrial.kernel.floor import TORCH_ADD, TRITON, case_floor_ns, floor_ns, fraction_of_floor, run_floor
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.layout import FLOOR_MODEL
from kerneltrial.rundir.summary_doc import Ceilings, read_summary
from kerneltrial.trial.runner import run_trial
from tests.conftest import REPO
from tests.kt import write_protocol

# one xdist worker for the whole module: its module-scoped fixture (trial) is built once,
# not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("analysis/test_floor")

CHECK = "speed-of-light floor"
PROTOCOL = """
name = "floor"
op = "rmsnorm"
candidates = ["packed_r4_w4"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
host_samples = 2
[[cases]]
shape = [4, 64]
[[cases]]
shape = [3, 200]
layout = "row_strided"
"""


def checks(path: Path) -> dict[str, tuple[bool, bool, str]]:
    return {c.name: (c.ok, c.applicable, c.detail) for c in verify_run_dir(path).checks}


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run on the CPU (the runner writes plan.json `floor` and a summary/6)."""
    root = tmp_path_factory.mktemp("floor")
    write_protocol(root / "p.toml", PROTOCOL)
    return run_trial(root / "p.toml", root / "run")


def copy_of(trial: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trial, tmp_path / "run"))


# ---------------------------------------------------------------- the arithmetic


def test_the_floor_is_one_launch_plus_the_bytes_at_the_copy_rate() -> None:
    assert floor_ns(3000.0, 4000.0, 8_000_000) == 3000.0 + 2000.0  # 8 MB at 4000 GB/s (bytes per ns)
    assert floor_ns(None, 4000.0, 8) is None and floor_ns(3000.0, None, 8) is None
    assert fraction_of_floor(5000.0, 10_000.0) == 0.5 and fraction_of_floor(5000.0, None) is None


def test_an_old_run_uses_its_triton_floor_else_torchs_named() -> None:
    base = {"copy_gbps": 4000.0, "copy_samples": 5, "read_gbps": None, "read_samples": 0}
    triton = run_floor(Ceilings(**base, launch_floor_ns=3500.0, triton_launch_floor_ns=3200.0))
    assert triton is not None and (triton.launch_ns, triton.launch) == (3200.0, TRITON)
    torch_add = run_floor(Ceilings(**base, launch_floor_ns=3500.0))
    assert torch_add is not None and (torch_add.launch_ns, torch_add.launch) == (3500.0, TORCH_ADD)
    assert run_floor(Ceilings(**base)) is None  # no launch floor at all (before timed checks)
    assert run_floor(Ceilings(**{**base, "copy_gbps": None}, launch_floor_ns=3500.0)) is None


def test_a_committed_summary_5_reads_without_the_floor_and_computes_it_from_its_ceilings() -> None:
    run = REPO / "results" / "h200" / "rmsnorm-panel"
    summary = read_summary(run)
    assert not summary.records_floor
    case = summary.cases[0]
    assert case.floor_ns is None and all(e.fraction_of_floor is None for e in case.arms.values())
    ceilings = summary.ceilings
    assert ceilings.triton_launch_floor_ns and ceilings.copy_gbps
    assert case_floor_ns(summary, case) == ceilings.triton_launch_floor_ns + case.bytes / ceilings.copy_gbps


# ---------------------------------------------------------------- a real run


def test_a_new_run_records_the_floor_and_verifies(trial: Path) -> None:
    assert json.loads((trial / "plan.json").read_text())["floor"] == FLOOR_MODEL
    summary = read_summary(trial)
    assert summary.schema_ == "kerneltrial.summary/7" and summary.records_floor
    rows = list(csv.DictReader((trial / "ceilings.csv").open()))
    launch = statistics.median(float(r["ns"]) for r in rows if r["kind"] == "triton_launch")
    rate = statistics.median(int(r["bytes"]) / float(r["ns"]) for r in rows if r["kind"] == "copy")
    for case in summary.cases:
        assert case.floor_ns == pytest.approx(launch + case.bytes / rate, rel=1e-12)
        for entry in case.arms.values():
            if entry.median_ns_per_call is None:
                assert entry.fraction_of_floor is None
            else:
                assert entry.fraction_of_floor == pytest.approx(case.floor_ns / entry.median_ns_per_call, rel=1e-12)
    assert any(e.fraction_of_floor for c in summary.cases for e in c.arms.values())
    ok, applicable, detail = checks(trial)[CHECK]
    assert ok and applicable and "per case and arm" in detail
    assert verify_run_dir(trial).ok, [c for c in verify_run_dir(trial).checks if not c.ok]


def test_an_edited_fraction_is_caught(trial: Path, tmp_path: Path) -> None:
    path = copy_of(trial, tmp_path)
    case = read_summary(path).cases[0].case

    def inflate(summary: dict) -> None:
        entry = summary["cases"][0]["arms"]["packed_r4_w4"]
        entry["fraction_of_floor"] = 0.99

    edit_json(path / "summary.json", inflate)
    ok, _, detail = checks(path)[CHECK]
    assert not ok and f"case {case} arm packed_r4_w4 fraction_of_floor: summary 0.99 != recomputed" in detail


def test_a_summary_relabelled_5_without_the_floor_is_caught(trial: Path, tmp_path: Path) -> None:
    path = copy_of(trial, tmp_path)

    def downgrade(summary: dict) -> None:
        summary["schema"] = "kerneltrial.summary/5"
        for case in summary["cases"]:
            del case["floor_ns"]
            for entry in case["arms"].values():
                del entry["fraction_of_floor"]

    edit_json(path / "summary.json", downgrade)
    found = checks(path)
    ok, _, detail = found["summary schema"]
    assert not ok and "is not kerneltrial.summary/7, which a plan with checks 3 and host and floor needs" in detail
    ok, _, detail = found[CHECK]
    assert not ok and "floor_ns: summary None != recomputed" in detail


def test_a_plan_naming_another_model_is_caught(trial: Path, tmp_path: Path) -> None:
    path = copy_of(trial, tmp_path)
    edit_json(path / "plan.json", lambda plan: plan.update(floor={"launch": "launch", "rate": "read"}))
    ok, _, detail = checks(path)[CHECK]
    assert not ok and f"plan.json floor {{'launch': 'launch', 'rate': 'read'}} is not {FLOOR_MODEL}" in detail


# ---------------------------------------------------------------- older runs


def test_an_old_run_lists_the_check_as_not_applicable(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    ok, applicable, detail = checks(path)[CHECK]
    assert ok and not applicable and "plan.json has no `floor`" in detail
    assert verify_run_dir(path).ok


def test_an_old_run_claiming_floor_figures_is_caught(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    edit_json(path / "summary.json", lambda summary: summary["cases"][0].update(floor_ns=1234.0))
    seal(path)
    ok, _, detail = checks(path)[CHECK]
    assert not ok and "have floor figures but plan.json has no `floor`" in detail
