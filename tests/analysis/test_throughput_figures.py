"""Achieved TFLOPS and peak memory per arm (issue 40, item 4): the operators' FLOP counts
(ops/flops.py), plan.json case `flops` and `peak_memory`, timings.csv `peak_bytes` (trial/memory.py),
the summary's tflops and peak_bytes (kernel/summary_throughput.py), their re-derivation by verify
(kernel/verify/throughput.py) and the report's columns."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rundir_factory import C1, C2, RunSpec, seal, write_checked_run

from kerneltrial.kernel.report import report_text
from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.ops import flops
from kerneltrial.ops.catalog import SPECS
from kerneltrial.ops.spec import Case
from kerneltrial.rundir.summary_doc import read_summary
from kerneltrial.trial import memory
from kerneltrial.trial.rounds import TIMING_COLUMNS, timing_columns
from kerneltrial.trial.timing import Hooks, timer_for


def _check(path: Path, name: str) -> tuple[bool, bool, str]:
    (check,) = [c for c in verify_run_dir(path).checks if c.name == name]
    return check.ok, check.applicable, check.detail


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# ---------------------------------------------------------------- FLOP counts


def test_flop_counts_follow_their_docstrings() -> None:
    assert flops.rmsnorm(Case((4, 64))) == 4 * 256 + 3 * 4
    assert flops.rmsnorm_pair(Case((2, 3, 128))) == 2 * (4 * 768 + 3 * 6)
    assert flops.fused_add_rmsnorm(Case((4, 64))) == 5 * 256 + 3 * 4
    assert flops.gemma_fused_add_rmsnorm(Case((4, 64))) == 6 * 256 + 3 * 4
    assert flops.silu_and_mul(Case((3, 10))) == 6 * 15
    assert flops.sigmoid_gate_mul(Case((5, 8))) == 5 * 40
    assert flops.sigmoid_gate_mul(Case((5, 8), layout="row_gate")) == 4 * 5 + 40
    assert flops.softcap_row_argmax(Case((2, 100))) == 3 * 200
    assert flops.rotary(Case((3, 16, 2, 128))) == 3 * 3 * 18 * 128


def test_every_builtin_operator_counts_flops_on_its_panels() -> None:
    for spec in SPECS:
        op = spec.operator
        assert op.flops is not None, op.name
        assert all(op.flops(c) > 0 for c in op.small_cases + op.gpu_cases), op.name


# ---------------------------------------------------------------- a real CPU run


def test_a_cpu_run_records_flops_and_no_peak_memory(cpu_run: Path) -> None:
    plan = json.loads((cpu_run / "plan.json").read_text())
    assert plan["peak_memory"] is False  # host clock: not measured
    assert [c["flops"] for c in plan["cases"]] == [4 * 256 + 3 * 4]
    with (cpu_run / "timings.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(r["peak_bytes"] == "" for r in rows)
    summary = read_summary(cpu_run)
    (case,) = summary.cases
    assert case.flops == 1036
    for entry in case.arms.values():
        assert entry.median_ns_per_call is not None and entry.tflops == pytest.approx(
            1036 / entry.median_ns_per_call / 1e3
        )
        assert entry.peak_bytes is None and "peak_bytes" in entry.model_fields_set
    assert _check(cpu_run, "achieved TFLOPS")[:2] == (True, True)
    assert _check(cpu_run, "peak memory") == (True, True, "not measured here")
    text = report_text(cpu_run)
    assert "| TFLOPS | extra peak MiB |" in text and "not measured on CPU" in text


def test_an_edited_tflops_figure_is_refused(copy_of: Callable[[str], Path]) -> None:
    path = copy_of("edited-tflops")
    summary = path / "summary.json"
    _edit_json(summary, lambda s: s["cases"][0]["arms"]["control"].update(tflops=1.0))
    ok, _, detail = _check(path, "achieved TFLOPS")
    assert not ok and "arm control tflops: summary 1.0 != recomputed" in detail


def test_an_edited_flop_count_is_refused(copy_of: Callable[[str], Path]) -> None:
    path = copy_of("edited-flops")
    _edit_json(path / "summary.json", lambda s: s["cases"][0].update(flops=2072))
    ok, _, detail = _check(path, "achieved TFLOPS")
    assert not ok and "flops: summary 2072 != recomputed 1036" in detail


# ---------------------------------------------------------------- synthetic runs


def test_without_flops_or_peak_memory_both_checks_are_not_applicable(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    assert _check(path, "achieved TFLOPS")[:2] == (True, False)
    assert _check(path, "peak memory")[:2] == (True, False)
    data = json.loads((path / "summary.json").read_text())
    assert all("tflops" not in e and "peak_bytes" not in e for c in data["cases"] for e in c["arms"].values())
    assert "TFLOPS" not in report_text(path) and "peak MiB" not in report_text(path)


def test_a_tflops_claim_without_flops_is_refused(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    _edit_json(path / "summary.json", lambda s: s["cases"][0]["arms"]["ctrl"].update(tflops=3.0))
    ok, applicable, detail = _check(path, "achieved TFLOPS")
    assert applicable and not ok and "has tflops but the run has no data it comes from" in detail


PEAKS = {"ctrl": 1 << 20, "fast": 3 << 19, "slow": 1 << 21}


def _peak_run(path: Path) -> Path:
    """A GPU run of CUDA events with plan.json `peak_memory` and a peak_bytes per sample: the arm's
    base figure plus the sample's round (so the largest is the last round's)."""
    write_checked_run(path, RunSpec(is_gpu=True, backend="cuda-events"))
    _edit_json(path / "plan.json", lambda plan: plan.update(peak_memory=True))
    with (path / "timings.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    with (path / "timings.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "peak_bytes"])
        writer.writeheader()
        writer.writerows(r | {"peak_bytes": PEAKS[r["arm"]] + int(r["round"])} for r in rows)
    write_summary(path, overwrite=True)
    return seal(path)


def test_peak_memory_is_the_largest_sample_and_verified(tmp_path: Path) -> None:
    path = _peak_run(tmp_path / "run")
    cases = {c.case: c for c in read_summary(path).cases}
    assert cases[C1].arms["ctrl"].peak_bytes == PEAKS["ctrl"] + 4  # rounds 0..4
    assert cases[C2].arms["slow"].peak_bytes is None  # failed correctness: no figure
    assert cases[C1].arms["peer"].peak_bytes is None  # unavailable
    ok, applicable, detail = _check(path, "peak memory")
    assert ok and applicable and "5 (case, arm) peak(s)" in detail
    assert "| extra peak MiB |" in report_text(path)


def test_an_edited_peak_is_refused(tmp_path: Path) -> None:
    path = _peak_run(tmp_path / "run")
    wanted = PEAKS["fast"] + 4
    _edit_json(path / "summary.json", lambda s: s["cases"][0]["arms"]["fast"].update(peak_bytes=wanted // 2))
    ok, _, detail = _check(path, "peak memory")
    assert not ok and f"arm fast peak_bytes: summary {wanted // 2} != recomputed {wanted}" in detail


def test_a_raised_peak_row_is_refused(tmp_path: Path) -> None:
    path = _peak_run(tmp_path / "run")
    timings = path / "timings.csv"
    text = timings.read_text()
    first = text.splitlines()[1]
    timings.write_text(text.replace(first, first.rsplit(",", 1)[0] + ",999999999", 1))
    ok, _, detail = _check(path, "peak memory")
    assert not ok and "recomputed 999999999" in detail


def test_peak_rows_where_nothing_is_measured_are_refused(tmp_path: Path) -> None:
    path = _peak_run(tmp_path / "run")
    _edit_json(path / "plan.json", lambda plan: plan.update(isolated=["fast"]))
    ok, _, detail = _check(path, "peak memory")
    assert not ok and "arm=fast has peak_bytes" in detail and "but it is not measured here" in detail
    path = _peak_run(tmp_path / "cpu")
    _edit_json(path / "plan.json", lambda plan: plan.update(peak_memory=False))
    ok, _, detail = _check(path, "peak memory")
    assert not ok and "plan.json peak_memory False != True" in detail


# ---------------------------------------------------------------- the harness


def test_peak_memory_is_measured_only_where_it_can_be() -> None:
    assert not memory.measured(timer_for("host-clock", False, False))
    assert not memory.measured(replace(timer_for("host-clock", False, False), name="cuda-graph", is_gpu=True))
    assert memory.measured(replace(timer_for("host-clock", False, False), name="cuda-events", is_gpu=True))


def test_a_run_from_before_keeps_its_timing_columns() -> None:
    assert timing_columns({}) == TIMING_COLUMNS
    assert timing_columns({"peak_memory": False}) == [*TIMING_COLUMNS, "peak_bytes"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_peak_of_a_call_is_its_own_allocation() -> None:
    kept: list[torch.Tensor] = []
    seen: list[int] = []
    peak = memory.PeakMemory(
        Hooks(before=lambda j: kept.append(torch.empty(1 << 20, device="cuda")), after=seen.append)
    )
    hooks = peak.hooks
    for j in range(3):
        hooks.before(j)  # the harness's allocation before the call: outside the window
        scratch = torch.empty((j + 1) << 18, dtype=torch.float32, device="cuda")  # the call's own: (j + 1) MiB
        del scratch
        hooks.after(j)
    assert seen == [0, 1, 2] and peak.most == 3 << 20
