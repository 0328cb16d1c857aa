"""A kernel run's figures as one CSV table (`kerneltrial export RUN --csv`): a row per (case, arm),
the figures of summary.json and nothing recomputed, for a spreadsheet or a plotting script.
Rows of arms the run did not time (failed correctness, unavailable, implausible, ...) are kept,
with their status and empty figures, so that no arm vanishes from the table."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from kerneltrial.rundir.summary_doc import read_summary

COLUMNS = (
    "case",
    "arm",
    "kind",
    "status",
    "verdict",
    "median_ns_per_call",
    "n_samples",
    "speedup",
    "ci_low",
    "ci_high",
    "gbps",
    "pct_of_copy_ceiling",
    "host_ns_per_call",
    "spread",
    "throttled_samples",
)


def export_csv(run_dir: Path) -> str:
    """The CSV text of `run_dir`'s summary.json, in its case and arm order; `timing` says what the
    times measure (a CPU run: not GPU performance) on every row."""
    summary = read_summary(run_dir)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, "timing"])
    for case in summary.cases:
        for arm, figures in case.arms.items():
            values = figures.model_dump()
            row = [case.case, arm] + ["" if values.get(c) is None else values[c] for c in COLUMNS[2:]]
            writer.writerow([*row, summary.label])
    return out.getvalue()
