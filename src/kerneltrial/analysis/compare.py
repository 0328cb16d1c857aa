"""Compare two kernel runs side by side: the same (case, arm) medians in A and in B.

Reads the two summary.json files and, for the change of each (case, arm), both runs' raw
samples (timings.csv). Ratio is median(B) / median(A): above 1 means B took longer. The change
is called as nvbench_compare calls it, under the protocol's noise rule: the unpaired bootstrap
interval of median(A) / median(B) (B's speedup over A; A's bootstrap settings) against A's tie
band: FAST (wholly above 1 + band), SLOW (wholly below 1 - band), SAME (wholly inside the band),
UNSURE (straddles an edge: more samples would tell). Each run's verdict for the (case, arm) is shown beside it (win, tie, loss,
inconclusive, or the status that left it without one: failed correctness, failed while
timed, implausible, ...). Cases or arms present in only one run are listed, never silently
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kerneltrial import stats
from kerneltrial.kernel.report import operator_name, speedup_cell, us_cell
from kerneltrial.kernel.summary_inputs import load_run, unit_series
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


FAST, SLOW, SAME, UNSURE = "FAST", "SLOW", "SAME", "UNSURE"
CHANGE_OF_VERDICT = {stats.WIN: FAST, stats.LOSS: SLOW, stats.TIE: SAME, stats.INCONCLUSIVE: UNSURE}


@dataclass(frozen=True)
class Change:
    """B against A for one (case, arm): B's speedup over A, median(A) / median(B), its unpaired
    bootstrap interval, and the call under the tie band."""

    speedup: float
    ci_low: float
    ci_high: float
    call: str  # FAST, SLOW, SAME or UNSURE


@dataclass(frozen=True)
class ChangeRule:
    """What calls a change: run A's bootstrap settings and the wider of the two tie bands."""

    bootstrap: stats.BootstrapRule
    tie_band: float

    @staticmethod
    def of(a: Summary, b: Summary) -> ChangeRule:
        rule = stats.BootstrapRule(a.bootstrap.resamples, a.bootstrap.seed, a.bootstrap.confidence)
        return ChangeRule(rule, max(a.tie_band, b.tie_band))

    def words(self) -> str:
        b = self.bootstrap
        return (
            f"unpaired bootstrap of median(A) / median(B), {b.resamples} resamples, {100 * b.confidence:g}% "
            f"interval, tie band ±{100 * self.tie_band:g}%"
        )


def change(a: np.ndarray, b: np.ndarray, rule: ChangeRule) -> Change:
    """B against A from both runs' per-call samples of one (case, arm)."""
    ci = stats.bootstrap_ratio_ci(a, b, rule.bootstrap)
    speedup = stats.median(a) / stats.median(b)
    return Change(speedup, ci.low, ci.high, CHANGE_OF_VERDICT[stats.verdict(ci, rule.tie_band)])


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
    change: Change | None = None  # None where either run did not time the arm in the case

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


def compared_rows(a: Summary, b: Summary, samples: tuple[Samples, Samples] | None = None) -> list[ComparedRow]:
    """Rows for every (case, arm) present in both runs, in A's order; with both runs' `samples`,
    each arm timed in both runs carries its change."""
    cases_b = {c.case: c.arms for c in b.cases}
    rule = ChangeRule.of(a, b)
    rows = []
    for case in (c for c in a.cases if c.case in cases_b):
        for arm, entry in case.arms.items():
            other = cases_b[case.case].get(arm)
            if other is None:
                continue
            key = (case.case, arm)
            timed = entry.status == other.status == "timed"
            moved = None
            if samples is not None and timed and key in samples[0] and key in samples[1]:
                moved = change(samples[0][key], samples[1][key], rule)
            verdicts = (verdict_of(entry, arm == a.control), verdict_of(other, arm == b.control))
            rows.append(
                ComparedRow(
                    case.case,
                    arm,
                    entry.median_ns_per_call,
                    other.median_ns_per_call,
                    *verdicts,
                    Speedup.of(entry),
                    Speedup.of(other),
                    speedup_cell(entry),
                    speedup_cell(other),
                    moved,
                )
            )
    return rows


Samples = dict[tuple[str, str], np.ndarray]


def samples_of(run_dir: Path) -> Samples:
    """Per-call ns of every (case, arm) of a run, from its timings.csv."""
    return {key: series.to_numpy() for key, series in unit_series(load_run(run_dir).timings).items()}


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
    rule: ChangeRule

    def changes(self) -> dict[str, int]:
        """How many (case, arm) pairs are FAST, SLOW, SAME and UNSURE."""
        calls = [r.change.call for r in self.rows if r.change is not None]
        return {call: calls.count(call) for call in (FAST, SLOW, SAME, UNSURE)}

    def changes_line(self) -> str:
        counts = ", ".join(f"{n} {call}" for call, n in self.changes().items())
        return f"B against A: {counts} ({self.rule.words()})"


def setting_notes(a: Summary, b: Summary) -> list[str]:
    """What the runs set differently that bears on the change column: the tie bands (the wider
    calls a change), the bootstrap settings (A's are used), and the calls per timed sample of a
    common case (a per-call median of longer samples spreads a sample's fixed cost over more calls)."""
    notes = []
    if a.tie_band != b.tie_band:
        notes.append(f"Note: the tie bands differ ({a.tie_band:g}, {b.tie_band:g}); the wider calls a change.")
    settings = [(s.bootstrap.resamples, s.bootstrap.seed, s.bootstrap.confidence) for s in (a, b)]
    if settings[0] != settings[1]:
        (ra, sa, ca), (rb, sb, cb) = settings
        notes.append(
            f"Note: the bootstrap settings differ (A: {ra} resamples, seed {sa}, {100 * ca:g}%; B: {rb} resamples, "
            f"seed {sb}, {100 * cb:g}%); the change column uses A's, each run's own speedup interval its own."
        )
    calls_b = {c.case: c.calls for c in b.cases}
    differ = [f"`{c.case}` ({c.calls}, {calls_b[c.case]})" for c in a.cases if calls_b.get(c.case, c.calls) != c.calls]
    if differ:
        notes.append(
            "Note: calls per timed sample differ in " + ", ".join(differ) + ": a per-call median from longer "
            "samples spreads each sample's fixed cost over more calls, so part of a change there may be that."
        )
    return notes


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
    notes += setting_notes(summary_a, summary_b)
    for name, summary in (("A", summary_a), ("B", summary_b)):
        notes += [f"**Isolation, run {name}: {w}.**" for w in integrity_lines(summary.warnings)]
    return Comparison(
        summary_a.label,
        summary_b.label,
        notes,
        compared_rows(summary_a, summary_b, (samples_of(Path(a)), samples_of(Path(b)))),
        _only_in(summary_a, summary_b),
        _only_in(summary_b, summary_a),
        ChangeRule.of(summary_a, summary_b),
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
        compared.changes_line(),
        "",
        "| case | arm | median A µs | median B µs | B/A | change | B over A [CI] | speedup A [CI] | speedup B [CI] "
        "| verdict A | verdict B |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in compared.rows:
        ratio = "–" if row.ratio is None else f"{row.ratio:.3f}"
        medians = f"{us_cell(row.median_a_ns, ',.3f')} | {us_cell(row.median_b_ns, ',.3f')}"
        moved = row.change
        changed = (
            "– | –"
            if moved is None
            else f"{moved.call} | {moved.speedup:.3f} [{moved.ci_low:.3f}, {moved.ci_high:.3f}]"
        )
        speedups = f"{row.text_a} | {row.text_b}"
        lines.append(
            f"| `{row.case}` | `{row.arm}` | {medians} | {ratio} | {changed} | {speedups} | {row.verdict_a} "
            f"| {row.verdict_b} |"
        )
    return "\n".join(lines + only_in_lines(compared.only_in_a, compared.only_in_b)) + "\n"


def only_in_lines(only_in_a: list[str], only_in_b: list[str]) -> list[str]:
    """A comparison page's closing lines: what only run A holds, then what only run B holds (none
    where both hold the same)."""
    lines: list[str] = []
    for label, only in (("A", only_in_a), ("B", only_in_b)):
        if only:
            lines += ["", f"Only in {label}: " + ", ".join(only)]
    return lines
