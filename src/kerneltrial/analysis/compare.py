"""Compare two kernel runs side by side: the same (case, arm) medians in A and in B.

Reads only the two summary.json files. Ratio is median(B) / median(A): above 1 means
B took longer. Each run's verdict for the (case, arm) is shown beside it (win, tie, loss,
inconclusive, or the status that left it without one: failed correctness, failed while
timed, implausible, ...). Cases or arms present in only one run are listed, never silently
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kerneltrial.kernel.report import operator_name, speedup_cell, us_cell
from kerneltrial.publication import titled
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.integrity_notes import integrity_lines
from kerneltrial.rundir.summary_doc import ArmFigures, Summary, read_summary


@dataclass(frozen=True)
class Speedup:
    """A timed arm's speedup over its run's control, with the CI."""

    value: float
    ci_low: float
    ci_high: float

    @staticmethod
    def of(entry: ArmFigures) -> Speedup | None:
        if entry.speedup is None or entry.ci_low is None or entry.ci_high is None:
            return None
        return Speedup(entry.speedup, entry.ci_low, entry.ci_high)


@dataclass(frozen=True)
class ComparedRow:
    case: str
    arm: str
    median_a_ns: float | None
    median_b_ns: float | None
    verdict_a: str
    verdict_b: str
    speedup_a: Speedup | None
    speedup_b: Speedup | None
    text_a: str  # the speedup with its CI as the report writes it, or "–"
    text_b: str

    @property
    def ratio(self) -> float | None:
        if self.median_a_ns is None or self.median_b_ns is None:
            return None
        return self.median_b_ns / self.median_a_ns


def _medians(summary: Summary) -> dict[str, dict[str, float | None]]:
    return {c.case: {arm: e.median_ns_per_call for arm, e in c.arms.items()} for c in summary.cases}


def verdict_of(entry: ArmFigures, is_control: bool) -> str:
    """The verdict of a timed arm ("control" for the control), else its status."""
    if entry.status != "timed":
        return entry.status
    return "control" if is_control else entry.verdict or "–"


def compared_rows(a: Summary, b: Summary) -> list[ComparedRow]:
    """Rows for every (case, arm) present in both runs, in A's order."""
    cases_b = {c.case: c.arms for c in b.cases}
    return [
        ComparedRow(
            case.case,
            arm,
            entry.median_ns_per_call,
            cases_b[case.case][arm].median_ns_per_call,
            verdict_of(entry, arm == a.control),
            verdict_of(cases_b[case.case][arm], arm == b.control),
            Speedup.of(entry),
            Speedup.of(cases_b[case.case][arm]),
            speedup_cell(entry),
            speedup_cell(cases_b[case.case][arm]),
        )
        for case in a.cases
        if case.case in cases_b
        for arm, entry in case.arms.items()
        if arm in cases_b[case.case]
    ]


def _only_in(first: Summary, second: Summary) -> list[str]:
    medians_first, medians_second = _medians(first), _medians(second)
    notes = [f"case `{case}`" for case in medians_first if case not in medians_second]
    notes += [
        f"arm `{arm}` in case `{case}`"
        for case, arms in medians_first.items()
        if case in medians_second
        for arm in arms
        if arm not in medians_second[case]
    ]
    return notes


@dataclass(frozen=True)
class Comparison:
    label_a: str
    label_b: str
    notes: list[str]  # different timing backends or protocols
    rows: list[ComparedRow]
    only_in_a: list[str]
    only_in_b: list[str]


def comparison(a: Path, b: Path) -> Comparison:
    """Run directories `a` and `b` (both need summary.json) of one operator side by side;
    RunDirError for runs of two operators (their cases cannot mean the same)."""
    summary_a, summary_b = read_summary(Path(a)), read_summary(Path(b))
    op_a, op_b = operator_name(Path(a), summary_a), operator_name(Path(b), summary_b)
    if op_a != op_b:
        raise RunDirError(f"{a} is a run of {op_a}, {b} of {op_b}: compare two runs of the same operator")
    notes = []
    if summary_a.is_gpu != summary_b.is_gpu or summary_a.backend != summary_b.backend:
        notes.append("**Warning: the runs used different timing backends; their times are not comparable.**")
    if summary_a.protocol_sha256 != summary_b.protocol_sha256:
        notes.append("Note: the runs follow different protocols (protocol_sha256 differs).")
    for name, summary in (("A", summary_a), ("B", summary_b)):
        notes += [f"**Isolation, run {name}: {w}.**" for w in integrity_lines(summary.warnings)]
    return Comparison(
        summary_a.label,
        summary_b.label,
        notes,
        compared_rows(summary_a, summary_b),
        _only_in(summary_a, summary_b),
        _only_in(summary_b, summary_a),
    )


def compare_runs(a: Path, b: Path, unverified: bool = False) -> str:
    """The markdown comparison of `a` and `b` (see `comparison`); `unverified`: the title says the
    runs were not required to verify."""
    compared = comparison(a, b)
    lines = [
        titled("# Kernel runs compared", unverified),
        "",
        f"A: `{a}` ({compared.label_a})",
        f"B: `{b}` ({compared.label_b})",
        "",
    ]
    for note in compared.notes:
        lines += [note, ""]
    lines += [
        "| case | arm | median A µs | median B µs | B/A | speedup A [CI] | speedup B [CI] | verdict A | verdict B |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in compared.rows:
        ratio = "–" if row.ratio is None else f"{row.ratio:.3f}"
        medians = f"{us_cell(row.median_a_ns, ',.3f')} | {us_cell(row.median_b_ns, ',.3f')}"
        speedups = f"{row.text_a} | {row.text_b}"
        lines.append(
            f"| `{row.case}` | `{row.arm}` | {medians} | {ratio} | {speedups} | {row.verdict_a} | {row.verdict_b} |"
        )
    for label, notes in (("Only in A", compared.only_in_a), ("Only in B", compared.only_in_b)):
        if notes:
            lines += ["", f"{label}: " + ", ".join(notes)]
    return "\n".join(lines) + "\n"
