"""The throughput figures of a kernel summary's arm entries (issue 40): achieved TFLOPS where the
operator counts FLOPs (plan.json case `flops`, ops/flops.py) and the arm's own extra peak memory
where the run measured it (plan.json `peak_memory`, timings.csv `peak_bytes`, trial/memory.py).

Both are derived from the raw files, and `kerneltrial verify` derives them again
(kernel/verify/throughput.py): tflops = flops / median ns per call / 1000 (flops per ns are
GFLOP/s), null where the arm has no median; peak_bytes = the largest `peak_bytes` of the arm's
samples in the case, null where the arm has no median or none of its samples was measured.
A case without `flops` leaves tflops unset, and a run without `peak_memory` peak_bytes (neither
is written: rundir/summary_versions.py), so the summaries of older runs are unchanged.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import PEAK_BYTES, TIMINGS
from kerneltrial.rundir.summary_doc import ArmFigures

Peaks = dict[tuple[str, str], int]  # (case, arm) -> the largest measured peak_bytes of its samples


def tflops(flops: int, median_ns: float) -> float:
    """Achieved TFLOPS of `flops` FLOPs per call at `median_ns` per call."""
    return flops / median_ns / 1e3


def peaks_of(plan: dict[str, Any], timings: pd.DataFrame) -> Peaks | None:
    """Each (case, arm)'s largest measured `peak_bytes` (only where some sample has one); None for
    a run without plan.json `peak_memory` (no figure at all)."""
    if "peak_memory" not in plan:
        return None
    if PEAK_BYTES not in timings.columns:
        raise RunDirError(f"plan.json has peak_memory but {TIMINGS} has no {PEAK_BYTES} column (trial/memory.py)")
    try:
        values = pd.to_numeric(timings[PEAK_BYTES])
    except (TypeError, ValueError) as error:
        raise RunDirError(f"{TIMINGS}: column {PEAK_BYTES} is not bytes or empty ({error})") from error
    rows = timings.assign(peak=values).dropna(subset=["peak"])
    return {
        (str(case), str(arm)): int(peak) for (case, arm), peak in rows.groupby(["case", "arm"])["peak"].max().items()
    }


def with_throughput(entry: ArmFigures, case: dict[str, Any], arm: str, peaks: Peaks | None) -> ArmFigures:
    """`entry` with its tflops (a case with `flops`) and peak_bytes (a run with `peak_memory`) set."""
    median = entry.median_ns_per_call
    update: dict[str, float | int | None] = {}
    if case.get("flops") is not None:
        update["tflops"] = None if median is None else tflops(int(case["flops"]), median)
    if peaks is not None:
        update["peak_bytes"] = None if median is None else peaks.get((str(case["case"]), arm))
    return entry.model_copy(update=update) if update else entry
