"""rundir: the run directory's files, its kind, and the typed readers of every committed version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerneltrial.rundir import provenance
from kerneltrial.rundir.documents import read_plan, read_provenance
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import csv_appender, read_csv, read_json, read_jsonl, trim_partial_line, write_json
from kerneltrial.rundir.layout import kind_of
from kerneltrial.rundir.summary_doc import read_summary
from tests.conftest import REPO

RESULTS = REPO / "results"
RUNS = sorted(  # kernel runs: model runs have their own reader (tests/rundir/test_model_summary_doc.py)
    path.parent
    for path in RESULTS.rglob("summary.json")
    if json.loads((path.parent / "provenance.json").read_text()).get("kind") != "model"
)
MODEL_RUNS = sorted(path.parent for path in RESULTS.rglob("attribution.csv"))
# one committed run of each document version (tests/rundir keeps them apart)
FIRST = RESULTS / "archive" / "h200" / "fused_add_rmsnorm"  # no order_seed, no freeze record, summary/3
CALIBRATION_FIRST = RESULTS / "archive" / "h200" / "calibration"  # the same, with a calibration section
FROZEN = RESULTS / "archive" / "h200" / "rmsnorm-r2"  # order_seed and the freeze record
LEAD = RESULTS / "archive" / "h200" / "fused_add_rmsnorm-s2"  # the lead-check counts
CHECKED = RESULTS / "archive" / "h200-planted" / "rmsnorm-cheats-r1"  # timed checks: plan checks, summary/4


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / run.name
    target.mkdir()
    for name in ("plan.json", "provenance.json", "summary.json"):
        (target / name).write_bytes((run / name).read_bytes())
    return target


# ---------------------------------------------------------------- files


def test_write_json_replaces_in_one_step(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert read_json(path) == {"a": 2} and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_read_json_names_a_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="missing plan.json"):
        read_json(tmp_path / "plan.json")
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(RunDirError, match="plan.json: not valid JSON"):
        read_json(tmp_path / "plan.json")


def test_read_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    assert read_jsonl(path) == []
    path.write_text('{"a": 1}\n\n{"a": 2}\n{broken\n')
    with pytest.raises(RunDirError, match="runs.jsonl line 4 is not JSON"):
        read_jsonl(path)
    trim_partial_line(path.with_name("none.jsonl"))  # a missing file is left alone
    path.write_text('{"a": 1}\n{"a": 2}\n{"a"')  # a killed writer's half line
    trim_partial_line(path)
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_csv_appender_writes_the_header_once_and_flushes_each_row(tmp_path: Path) -> None:
    path = tmp_path / "timings.csv"
    with csv_appender(path, ["case", "ns"]) as append:
        append(["a", 1])
        assert read_csv(path) == [{"case": "a", "ns": "1"}]  # on disk before the file is closed
    with csv_appender(path, ["case", "ns"]) as append:
        append(["b", None])
    assert read_csv(path) == [{"case": "a", "ns": "1"}, {"case": "b", "ns": ""}]


def test_nvidia_smi_without_nvidia_smi_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provenance.nvidia_smi(("name",)) is None and provenance.clocks() is None


def test_nvidia_smi_reads_one_record_per_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 570.1'\necho 'NVIDIA H200, 570.1'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provenance.nvidia_smi(("name", "driver_version")) == [{"name": "NVIDIA H200", "driver_version": "570.1"}] * 2


# ---------------------------------------------------------------- kind_of


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.name)
def test_every_committed_run_is_a_kernel_run(run: Path) -> None:
    assert kind_of(run) == "kernel"


def test_the_committed_model_runs_are_model_runs() -> None:
    assert MODEL_RUNS and all(kind_of(run) == "model" for run in MODEL_RUNS)


def test_kind_of_reads_provenance_and_falls_back_on_the_files(tmp_path: Path) -> None:
    (tmp_path / "provenance.json").write_text(json.dumps({"kind": "serving"}))
    assert kind_of(tmp_path) == "serving"
    (tmp_path / "provenance.json").write_text(json.dumps({"protocol_sha256": "x"}))  # no kind
    (tmp_path / "runs.jsonl").write_text("")
    assert kind_of(tmp_path) == "serving"
    (tmp_path / "runs.jsonl").unlink()
    (tmp_path / "timings.csv").write_text("")
    assert kind_of(tmp_path) == "kernel"


def test_kind_of_refuses_what_it_cannot_tell(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="not a directory"):
        kind_of(tmp_path / "nowhere")
    with pytest.raises(RunDirError, match="missing provenance.json"):
        kind_of(tmp_path)
    (tmp_path / "provenance.json").write_text(json.dumps({"kind": "graph"}))
    with pytest.raises(RunDirError, match="kind 'graph' is not 'kernel', 'serving' or 'model'"):
        kind_of(tmp_path)
    (tmp_path / "provenance.json").write_text("{}")
    with pytest.raises(RunDirError, match='has no kind .* neither timings.csv .* add "kind"'):
        kind_of(tmp_path)
    (tmp_path / "timings.csv").write_text("")
    (tmp_path / "launches.jsonl").write_text("")
    with pytest.raises(RunDirError, match="holds both"):
        kind_of(tmp_path)


# ---------------------------------------------------------------- documents


@pytest.mark.parametrize("run", RUNS, ids=lambda run: f"{run.parent.name}/{run.name}")
def test_every_committed_document_reads(run: Path) -> None:
    plan, record, summary = read_plan(run), read_provenance(run), read_summary(run)
    assert plan.protocol_sha256 == record.protocol_sha256 == summary.protocol_sha256
    assert [a.name for a in plan.arms] == [a.name for a in summary.arms]


def test_the_first_runs_are_adapted() -> None:
    plan, record, summary = read_plan(FIRST), read_provenance(FIRST), read_summary(FIRST)
    assert (plan.order_seed, plan.checks, plan.exact, plan.plausibility, plan.frozen_at) == (None, 0, False, None, None)
    assert not record.records_freeze and record.freeze is None and record.impl_modules == {} and record.lead is None
    assert summary.timed_checks is None and summary.plausibility is None
    assert all(a.inconclusive is None and a.ulp_hist is None for a in summary.aggregates.values())


def test_summary3_calibration_counts_not_tie_as_false_positives() -> None:
    raw = json.loads((CALIBRATION_FIRST / "summary.json").read_text())["calibration"]["arms"]
    arms = read_summary(CALIBRATION_FIRST).calibration.arms  # type: ignore[union-attr]
    aa = [name for name, figures in raw.items() if figures["kind"] == "aa"]
    assert aa and all(arms[n].false_positives == raw[n]["not_tie"] and arms[n].inconclusive is None for n in aa)


def test_later_versions_read_as_written() -> None:
    assert read_provenance(FROZEN).records_freeze and read_plan(FROZEN).order_seed == 0
    assert read_provenance(LEAD).lead is not None
    plan, summary = read_plan(CHECKED), read_summary(CHECKED)
    assert plan.checks == 1 and plan.plausibility is not None
    assert summary.timed_checks is not None and summary.timed_checks.failed > 0


def test_readers_refuse_unknown_versions_and_bad_fields(tmp_path: Path) -> None:
    run = _copy(CHECKED, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"schema": "kerneltrial.summary/0"}))
    with pytest.raises(RunDirError, match="schema 'kerneltrial.summary/0'; reports read kerneltrial.summary/1"):
        read_summary(run)
    summary["cases"][0]["arms"]["control"]["n_samples"] = "many"
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RunDirError, match=r"summary.json: cases.0.arms.control.n_samples: Input should be"):
        read_summary(run)
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps(plan | {"surprise": 1}))
    with pytest.raises(RunDirError, match="plan.json: surprise: Extra inputs are not permitted"):
        read_plan(run)
    (run / "provenance.json").write_text("[]")
    with pytest.raises(RunDirError, match="not a JSON object"):
        read_provenance(run)


def test_summary1_and_summary2_are_adapted(tmp_path: Path) -> None:
    run = _copy(CALIBRATION_FIRST, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    slow = [name for name, figures in summary["calibration"]["arms"].items() if figures["kind"] == "slow"]
    for name in slow:  # what summary/2 lacked
        for key in ("realized_slowdown", "realized_min", "realized_max", "power_at_nominal"):
            del summary["calibration"]["arms"][name][key]
    (run / "summary.json").write_text(json.dumps(summary | {"schema": "kerneltrial.summary/2"}))
    second = read_summary(run)
    assert second.records_spreads and second.calibration is not None
    assert all(second.calibration.arms[n].realized_min is None for n in slow)
    for key in ("clocks", "noise_rule", "calibration"):  # what summary/1 lacked
        del summary[key]
    for case in summary["cases"]:
        del case["rounds"], case["injected_delay_ns"]
        for entry in case["arms"].values():
            del entry["throttled_samples"], entry["spread"]
    (run / "summary.json").write_text(json.dumps(summary | {"schema": "kerneltrial.summary/1"}))
    first = read_summary(run)
    assert not first.records_spreads and first.clocks is None and first.calibration is None
    assert all(case.rounds is None for case in first.cases)
