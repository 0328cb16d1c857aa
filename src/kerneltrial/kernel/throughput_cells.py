"""The throughput cells of a kernel run's case table (issue 40, kernel/summary_throughput.py):
achieved TFLOPS where the operator counts FLOPs, and each arm's own extra peak memory where the
run records it, with the reason a figure is missing (trial/memory.py says why each is)."""

from __future__ import annotations

from kerneltrial.rundir.summary_doc import ArmFigures, Summary

MIB = 2**20
PEAK_NOTE = (
    "TFLOPS = the operator's FLOPs per call (ops/flops.py says what is counted) / the median time. "
    "Extra peak MiB = the most a call of the arm allocated beyond what was allocated when it started "
    "(torch.cuda.max_memory_allocated around each timed call), the largest over its samples."
)


def with_tflops(summary: Summary) -> bool:
    """Whether some case has a FLOP count (the TFLOPS column)."""
    return any(case.flops is not None for case in summary.cases)


def with_peak(summary: Summary) -> bool:
    """Whether the run records peak memory (plan.json `peak_memory`: its arm entries hold `peak_bytes`)."""
    return any("peak_bytes" in e.model_fields_set for c in summary.cases for e in c.arms.values())


def tflops_cell(entry: ArmFigures) -> str:
    """Achieved TFLOPS, three significant digits (a CPU run's are tiny); – without a figure."""
    return "–" if entry.tflops is None else format(entry.tflops, ".3g")


def not_measured(summary: Summary, arm: str) -> str:
    """Why the run has no peak memory figure of `arm` (trial/memory.py)."""
    if not summary.is_gpu:
        return "not measured on CPU"
    if summary.backend == "cuda-graph":
        return "not measured under CUDA-graph replay"
    if summary.isolation is not None and arm in summary.isolation.arms:
        return "not measured (isolated arm)"
    return "–"


def peak_cell(summary: Summary, arm: str, entry: ArmFigures) -> str:
    """The arm's extra peak MiB; – where it has no median, else the reason it was not measured."""
    if entry.peak_bytes is not None:
        return f"{entry.peak_bytes / MIB:,.3g}"
    return "–" if entry.median_ns_per_call is None else not_measured(summary, arm)
