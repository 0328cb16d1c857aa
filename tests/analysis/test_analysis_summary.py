"""kernel.summary on synthetic run directories (see conftest.py for the known timings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rundir_factory import C1, RunSpec, write_checked_run, write_run_dir

from kerneltrial.kernel.summary import build_document, build_summary, write_summary
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import json_text
from kerneltrial.rundir.summary_doc import read_summary, summary_json
from kerneltrial.rundir.summary_versions import SUMMARY_V1, SUMMARY_V3, SUMMARY_V4, SUMMARY_V7

COPY_CEILING = 8e6 / 4200  # median of the copy rates 8e6/4000 ... 8e6/4400


def test_per_case_figures(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    c1 = summary["cases"][0]["arms"]
    assert c1["ctrl"]["median_ns_per_call"] == 1000.0
    assert c1["ctrl"]["speedup"] is None  # the control is not compared with itself
    assert c1["fast"]["median_ns_per_call"] == 800.0
    assert c1["fast"]["n_samples"] == 10 and c1["fast"]["ci_units"] == 10
    assert c1["fast"]["speedup"] == 1.25
    assert c1["fast"]["ci_low"] <= 1.25 <= c1["fast"]["ci_high"]
    assert c1["fast"]["verdict"] == "win"
    assert c1["fast"]["gbps"] == 5000.0
    assert math.isclose(c1["fast"]["pct_of_copy_ceiling"], 100 * 5000 / COPY_CEILING, rel_tol=1e-12)
    assert math.isclose(c1["slow"]["speedup"], 1000 / 1100, rel_tol=1e-12)
    assert c1["slow"]["verdict"] == "loss"  # regressions are kept
    assert summary["ceilings"]["copy_gbps"] == COPY_CEILING
    assert summary["ceilings"]["copy_samples"] == 5 and summary["ceilings"]["read_samples"] == 4


def test_failed_and_unavailable_arms(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    c2 = summary["cases"][1]["arms"]
    assert c2["slow"]["status"] == "failed correctness"
    assert c2["slow"]["speedup"] is None
    assert c2["slow"]["messages"] == [f"max_rel 0.25 > rtol 0.016 at seed {s}" for s in (0, 1)]
    assert c2["peer"]["status"] == "unavailable"
    assert c2["peer"]["reason"] == "liger_kernel not installed"
    assert "peer" not in summary["aggregates"]


def test_aggregates_and_gate(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    fast, slow = summary["aggregates"]["fast"], summary["aggregates"]["slow"]
    assert math.isclose(fast["geomean"], 1.25, rel_tol=1e-12)
    assert (fast["wins"], fast["ties"], fast["losses"], fast["n_cases"]) == (2, 0, 0, 2)
    assert (slow["losses"], slow["failed_correctness"], slow["worst_case"]) == (1, 1, C1)
    assert summary["gate"]["passed_arms"] == ["fast"]
    assert summary["gate"]["arms"]["slow"]["passed"] is False
    assert any("failed correctness" in r for r in summary["gate"]["arms"]["slow"]["reasons"])


def test_header_labels_cpu_runs(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["is_gpu"] is False and summary["backend"] == "host-clock"
    assert "NOT GPU performance" in summary["label"]
    assert any("NOT GPU" in w for w in summary["warnings"])
    assert len(summary["protocol_sha256"]) == 64


def test_too_few_units_and_incomplete_run_warn(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run", RunSpec(rounds=2))
    lines = (path / "timings.csv").read_text().splitlines()
    (path / "timings.csv").write_text("\n".join(lines[:-1]) + "\n")  # a run killed before its last row
    warnings = build_summary(path)["warnings"]
    assert any("only" in w and "units" in w for w in warnings)
    assert any("fewer than the 4 planned" in w for w in warnings)


def test_write_summary_refuses_to_overwrite(run_dir: Path) -> None:
    with pytest.raises(RunDirError, match="already exists"):
        write_summary(run_dir)
    assert write_summary(run_dir, overwrite=True) == run_dir / "summary.json"


def test_missing_file_and_bad_gate(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run", RunSpec(gate="geomean>1.02"))
    with pytest.raises(ValueError, match="'geomean>1.02'"):
        build_summary(path)
    (path / "timings.csv").unlink()
    with pytest.raises(RunDirError, match="missing timings.csv"):
        build_summary(path)


def test_changed_protocol_is_refused(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run")
    (path / "protocol.toml").write_text("edited after the run started\n")
    with pytest.raises(RunDirError, match="protocol_sha256"):
        build_summary(path)


def test_duplicate_timing_rows_are_refused(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run")
    lines = (path / "timings.csv").read_text().splitlines()
    (path / "timings.csv").write_text("\n".join(lines + [lines[1]]) + "\n")
    with pytest.raises(RunDirError, match="duplicate"):
        build_summary(path)


def test_timing_labels() -> None:
    from kerneltrial.kernel.summary_inputs import timing_label

    assert timing_label("cuda-events", True) == "CUDA events on GPU"
    assert "CUDA graphs" in timing_label("cuda-graph", True)
    assert "NOT GPU performance" in timing_label("host-clock", False)
    assert "NOT GPU performance" in timing_label("cuda-events", False)


def test_gpu_run_has_no_cpu_warning_and_uses_the_plan_label(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path / "run")
    plan = json.loads((path / "plan.json").read_text())
    plan.update(backend="cuda-events", is_gpu=True, timing_label="CUDA events on NVIDIA H200")
    (path / "plan.json").write_text(json.dumps(plan))
    summary = build_summary(path)
    assert summary["label"] == "CUDA events on NVIDIA H200" and summary["is_gpu"] is True
    assert not any("NOT GPU" in w for w in summary["warnings"])


@pytest.mark.parametrize("kind", ["summary/3", "summary/4", "summary/7"])
def test_one_model_writes_and_reads_the_summary(kind: str, tmp_path: Path, cpu_run: Path) -> None:
    """The writer builds the reader's `Summary`: read back, it is the model built, and serialised in its
    version's shape it is the file's bytes (summary/3 and /4: synthetic runs; /7: a real CPU run)."""
    run = {
        "summary/3": lambda: write_run_dir(tmp_path / "v3"),
        "summary/4": lambda: write_checked_run(tmp_path / "v4"),
        "summary/7": lambda: cpu_run,
    }[kind]()
    if not (run / "summary.json").is_file():
        write_summary(run)
    built, read = build_document(run), read_summary(run)
    assert built.schema_ == {"summary/3": SUMMARY_V3, "summary/4": SUMMARY_V4, "summary/7": SUMMARY_V7}[kind]
    assert read == built
    assert json_text(summary_json(read)) == (run / "summary.json").read_text()


def test_summaries_are_written_in_the_versions_kerneltrial_writes(run_dir: Path) -> None:
    old = read_summary(run_dir).model_copy(update={"schema_": SUMMARY_V1})
    with pytest.raises(RunDirError, match=r"summary schema 'kerneltrial.summary/1': kerneltrial writes .*summary/3"):
        summary_json(old)


def test_a_new_run_names_its_provenance_schema_and_old_runs_read_without_one(cpu_run: Path) -> None:
    from kerneltrial.rundir.documents import PROVENANCE_V1, read_plan, read_provenance
    from tests.conftest import REPO

    first = REPO / "results" / "archive" / "h200" / "fused_add_rmsnorm"  # the first committed run
    assert read_provenance(cpu_run).schema_ == PROVENANCE_V1
    assert read_plan(cpu_run).floor is not None  # the current plan reads whole
    assert read_provenance(first).schema_ is None and read_plan(first).schema_ is None
