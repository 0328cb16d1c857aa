"""The organisers' script's CSVs, written for every serving run (issue 36, item 7).

benchmark_throughput_serve.py (serving/official.py) runs against one server and writes
`benchmark_results/raw_runs_<timestamp>.csv` (one row per run, with its "Run Status" SUCCESS or
FAILED) and `summary_<timestamp>.csv` (per case, the mean of the runs after the first SKIP_FIRST,
rounded to 2 decimals; a case with a FAILED counted run is left out). A kerneltrial launch is one
such server, so each launch gets its pair: `benchmark_results/NN-ARM/raw_runs_<timestamp>.csv` and
`summary_<timestamp>.csv`, in the script's columns, with its timestamp format (the run's start).

The script reads each figure from the client's printout, where vLLM prints the counts as integers
and every other figure with 2 decimals; the cells here are kerneltrial's figures of the run
(recomputed from the raw file, serving/metrics.py) given the same way. A run is SUCCESS when its
status is `ok`: every request completed, with every output token asked for (serving/completeness.py),
which the script's rule (successful requests == num_prompts) does not check. A case whose runs did
not all run (the trial stopped in it) has no summary row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

from kerneltrial.rundir.files import csv_appender
from kerneltrial.serving.bench import Case
from kerneltrial.serving.official import FAILED, RAW_COLUMNS, SKIP_FIRST, SUCCESS, SUMMARY_COLUMNS

RESULTS_DIR = "benchmark_results"  # the script's output_dir
STAMP_FORMAT = "%Y%m%d_%H%M%S"  # the script's timestamp in the file names
RAW_FILE, SUMMARY_FILE = "raw_runs_{timestamp}.csv", "summary_{timestamp}.csv"  # the script's file names
DIGITS = 2  # vLLM prints every figure but the counts with 2 decimals; the script rounds its means to 2
# the script's metric columns (official.METRIC_COLUMNS) -> the run figure it reads (runs.jsonl, serving/metrics.py)
FIGURES = {
    "Benchmark Duration (s)": "duration",
    "Total Input Tokens": "total_input_tokens",
    "Total Output Tokens": "total_output_tokens",
    "Req/s": "request_throughput",
    "Output tok/s": "output_throughput",
    "Peak Output tok/s": "max_output_tokens_per_s",
    "Total tok/s": "total_token_throughput",
    "Mean TTFT (ms)": "mean_ttft_ms",
    "Median TTFT (ms)": "median_ttft_ms",
    "P99 TTFT (ms)": "p99_ttft_ms",
    "Mean TPOT (ms)": "mean_tpot_ms",
    "Median TPOT (ms)": "median_tpot_ms",
    "P99 TPOT (ms)": "p99_tpot_ms",
    "Mean ITL (ms)": "mean_itl_ms",
    "Median ITL (ms)": "median_itl_ms",
    "P99 ITL (ms)": "p99_itl_ms",
}
COUNTS = frozenset({"total_input_tokens", "total_output_tokens"})  # printed by vLLM as integers


def stamp(when: datetime | None = None) -> str:
    """The script's timestamp (local time, `20260102_030405`)."""
    return (when or datetime.now()).strftime(STAMP_FORMAT)


def printed(value: Any, count: bool) -> float | None:
    """A figure as the script reads it from vLLM's printout: a count as a float of the integer, any
    other figure rounded to 2 decimals; None where the run has none (the script's regex found none)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(int(value)) if count else round(float(value), DIGITS)


@dataclass(frozen=True)
class ScriptRun:
    """One run as a row of raw_runs_<timestamp>.csv."""

    case: Case
    successful: float | None  # "Successful Requests": the requests vLLM's client counted as successful
    status: str  # "Run Status": SUCCESS or FAILED
    figures: tuple[float | None, ...]  # the metric columns, in official.METRIC_COLUMNS order

    def cells(self) -> list[float | int | str | None]:
        return [*self.case.as_list(), self.successful, self.status, *self.figures]


@dataclass(frozen=True)
class ScriptSummary:
    """One case as a row of summary_<timestamp>.csv: the mean of its counted runs."""

    case: Case
    figures: tuple[float | None, ...]

    def cells(self) -> list[float | int | None]:
        return [*self.case.as_list(), *self.figures]


def script_run(case: Case, row: Mapping[str, Any]) -> ScriptRun:
    """A runs.jsonl row in the script's terms (a run whose client failed has no figures: all empty)."""
    figures = tuple(printed(row.get(key), key in COUNTS) for key in FIGURES.values())
    status = SUCCESS if row.get("status") == "ok" else FAILED
    return ScriptRun(case, printed(row.get("completed"), count=True), status, figures)


def summarise(case: Case, runs: Sequence[ScriptRun], repeats: int) -> ScriptSummary | None:
    """The script's summary row of a case (run_test_case, average_metrics): the runs after the first
    SKIP_FIRST, each figure's mean over the runs that have it, rounded to 2 decimals. None, as the
    script skips it, when a counted run FAILED; None also when fewer than `repeats` runs ran."""
    counted = runs[SKIP_FIRST:]
    if len(runs) < repeats or any(r.status != SUCCESS for r in counted):
        return None
    columns = zip(*(r.figures for r in counted), strict=True)
    means = tuple(_mean([v for v in values if v is not None]) for values in columns)
    return ScriptSummary(case, means)


def _mean(values: list[float]) -> float | None:
    return round(mean(values), DIGITS) if values else None


def write_launch(folder: Path, when: str, runs: Sequence[ScriptRun], repeats: int) -> None:
    """One launch's raw_runs and (when a case qualifies) summary CSVs, in the script's columns."""
    folder.mkdir(parents=True, exist_ok=True)
    with csv_appender(folder / RAW_FILE.format(timestamp=when), list(RAW_COLUMNS)) as append:
        for run in runs:
            append(run.cells())
    cases = list(dict.fromkeys(r.case for r in runs))
    rows = [s for c in cases if (s := summarise(c, [r for r in runs if r.case == c], repeats)) is not None]
    if not rows:
        return  # the script writes its summary file with its first row
    with csv_appender(folder / SUMMARY_FILE.format(timestamp=when), list(SUMMARY_COLUMNS)) as append:
        for summary in rows:
            append(summary.cells())


def write_run(out: Path, when: str, cases: Iterable[Case], repeats: int, rows: Sequence[Mapping[str, Any]]) -> None:
    """Every launch's CSVs of a serving run, from its runs.jsonl rows (in the order they ran)."""
    by_id = {c.id: c for c in cases}
    launches = dict.fromkeys((r["launch"], r["arm"]) for r in rows)
    for launch, arm in launches:
        mine = [r for r in rows if (r["launch"], r["arm"]) == (launch, arm)]
        runs = [script_run(by_id[r["case"]], r) for r in mine]
        write_launch(out / RESULTS_DIR / f"{launch:02d}-{arm}", when, runs, repeats)
