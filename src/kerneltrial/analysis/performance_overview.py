"""PERFORMANCE.md's first page (issue 27, item 5), for a reader: per operator and regime, our
entry point against the fastest peer and against the speed-of-light floor, each figure from one
named run; then the one row against the best peer and the same-size copy. The full per-run
tables (every run and layout, issue 16's targets) are the generated results/PERFORMANCE-runs.md
(analysis/performance.py), which also uses this module's one-row and floor tables per run.

Tie-breaks, all stated on the page:
- the run of a figure: per (operator, regime), the latest current run (provenance.json
  started_at; equal or missing times: the last run directory name in sorted order) in which our
  entry point was timed in a case of that regime;
- the fastest peer of a case: the timed peer of smallest median (equal medians: the first in the
  run's arm order; analysis/peer_rows.py);
- the worst case of a group: the smallest ratio (equal ratios: the first case in the run's order);
- the one-row case: the small-regime case of fewest rows, then fewest bytes, then its case id.
The floor fraction and the same-size copy are point values: the floor is a median of ceiling
samples and the runs keep no interval of an absolute time, only of speedups over the control.
Both are given only for runs timed with CUDA events under a cold L2 (a hot L2 serves traffic
from cache: neither yardstick holds there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kerneltrial import stats
from kerneltrial.analysis.peer_rows import (
    MET,
    MISSED,
    OURS,
    REGIMES,
    UNKNOWN,
    PeerRow,
    band_text,
    best_peer_rows,
    copy_pcts,
    fastest_host_rows,
    geomean_of,
    host_cells,
    one_row_case,
    pct_cells,
    regime,
    timed_entry,
)
from kerneltrial.kernel.floor import TORCH_ADD, case_floor_ns, fraction_of_floor, run_floor
from kerneltrial.kernel.report import markdown_table, num_cell, operator_name, optional_provenance
from kerneltrial.rundir.summary_doc import Summary, SummaryCase, read_summary

# The one row against a copy of its own bytes, timed the same way in the same run: issue 16's
# "within 15% of the launch floor" carried over to that copy (a trivial kernel that launches
# once and moves the same bytes), the yardstick of a case whose time is mostly the launch.
ONE_ROW_MARGIN = 0.15
RUNS_FILE = "results/PERFORMANCE-runs.md"  # beside PERFORMANCE.md; `kerneltrial performance --runs-out`


@dataclass(frozen=True)
class CurrentRun:
    """A current kernel run in which our entry point was timed."""

    run_dir: Path
    summary: Summary
    started_at: str  # provenance.json started_at; "" when the run has none

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def op(self) -> str:
        return operator_name(self.run_dir, self.summary)

    @property
    def cold(self) -> bool:
        """Timed with CUDA events under a cold L2: the floor and the same-size copy apply."""
        return self.summary.l2 == "cold" and self.summary.backend == "cuda-events"


def current_runs(run_dirs: list[Path]) -> list[CurrentRun]:
    """The runs among `run_dirs` (kernel runs, not superseded) in which our entry point was timed."""
    runs = []
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        if any(timed_entry(c, OURS) for c in summary.cases):
            provenance = optional_provenance(run_dir)
            runs.append(CurrentRun(Path(run_dir), summary, provenance.started_at if provenance else ""))
    return runs


def in_regime(run: CurrentRun, where: str) -> list[SummaryCase]:
    return [c for c in run.summary.cases if regime(c.bytes) == where]


def pick_run(runs: list[CurrentRun], op: str, where: str) -> CurrentRun | None:
    """The run a figure of (op, regime) comes from (module docstring: the latest, then by name)."""
    candidates = [r for r in runs if r.op == op and any(timed_entry(c, OURS) for c in in_regime(r, where))]
    return max(candidates, key=lambda r: (r.started_at, r.name), default=None)


# ---------------------------------------------------------------- figures of a group of cases


def floor_pcts(run: CurrentRun, cases: list[SummaryCase]) -> dict[str, float]:
    """{case: our % of the speed-of-light floor} where ours is timed and the run has a floor."""
    found = {}
    for case in cases:
        ours = timed_entry(case, OURS)
        fraction = fraction_of_floor(case_floor_ns(run.summary, case), ours.median_ns_per_call if ours else None)
        if fraction is not None:
            found[case.case] = 100.0 * fraction
    return found


def floor_note(run: CurrentRun) -> str:
    """Which launch floor the run's floor uses, where it is not the Triton one."""
    figures = run_floor(run.summary.ceilings)
    return f" ({TORCH_ADD} floor)" if figures and figures.launch == TORCH_ADD and not run.summary.records_floor else ""


def ahead_behind(rows: list[PeerRow]) -> str:
    """Cases whose band is above 1 (ours faster) / below 1 (ours slower); a case without a band by its point value."""
    bands = [r.interval or stats.Interval(r.ratio, r.ratio) for r in rows]
    return f"{sum(b.low > 1 for b in bands)} / {sum(b.high < 1 for b in bands)}"


def peer_cells(rows: list[PeerRow]) -> list[str]:
    """Geomean ratio [band], worst case [band] (case vs peer), cases ahead / behind."""
    if not rows:
        return ["–", "–", "–"]
    intervals = [r.interval for r in rows if r.interval is not None]
    band = stats.geomean_interval(intervals) if len(intervals) == len(rows) else None
    worst = min(rows, key=lambda r: r.ratio)
    return [
        f"{geomean_of([r.ratio for r in rows]):.3f}{band_text(band)}",
        f"{worst.ratio:.3f}{band_text(worst.interval)} (`{worst.case}` vs `{worst.peer}`)",
        ahead_behind(rows),
    ]


def regime_row(run: CurrentRun, where: str) -> list[str]:
    cases = in_regime(run, where)
    timed = [c for c in cases if timed_entry(c, OURS)]
    untimed = len(cases) - len(timed)
    floor = pct_cells(floor_pcts(run, timed))[0] if run.cold else ["–", "–"]
    copy = pct_cells(copy_pcts(timed))[0] if run.cold else ["–", "–"]
    floor_cell = "–" if floor[0] == "–" else f"{floor[0]}, worst {floor[1]}{floor_note(run)}"
    return [
        f"`{run.op}`",
        where,
        f"`{run.name}`",
        str(len(timed)) + (f" (ours not timed: {untimed})" if untimed else ""),
        *peer_cells(best_peer_rows(timed)),
        *host_cells(fastest_host_rows(timed))[:2],
        floor_cell,
        "–" if copy[0] == "–" else f"{copy[0]}, worst {copy[1]}",
    ]


# ---------------------------------------------------------------- the one row


def one_row(label: str, run: CurrentRun) -> list[str] | None:
    """Our one-row case against the best peer and against the copy of its own bytes (+ ONE_ROW_MARGIN)."""
    case = one_row_case(run.summary.cases)
    if case is None:
        return None
    ours = timed_entry(case, OURS)
    ours_ns = ours.median_ns_per_call if ours else None
    peer = next(iter(best_peer_rows([case])), None)
    moved = case.bytes - case.bytes % 2  # the copy's traffic (trial/runner.py run_ceilings)
    copy_ns = moved / case.matched_copy_gbps if case.matched_copy_gbps and run.cold else None
    ratio = ours_ns / copy_ns if ours_ns and copy_ns else None
    return [
        label,
        f"`{case.case}`",
        num_cell(ours_ns / 1e3 if ours_ns else None, ".2f"),
        "–" if peer is None else f"{peer.peer_ns / 1e3:.2f} (`{peer.peer}`)",
        "–" if peer is None else f"{peer.ratio:.3f}{band_text(peer.interval)}",
        num_cell(copy_ns / 1e3 if copy_ns else None, ".2f"),
        num_cell(ratio, ".2f"),
        UNKNOWN if ratio is None else MET if ratio <= 1 + ONE_ROW_MARGIN else MISSED,
    ]


ONE_ROW_HEADER = [
    "operator (run)",
    "case (fewest rows)",
    "ours µs",
    "best peer µs",
    "best peer / ours [band]",
    "same-size copy µs",
    "ours / copy",
    f"<= {1 + ONE_ROW_MARGIN:g}",
]
ONE_ROW_TEXT = (
    "The small-regime case of fewest rows (then fewest bytes, then case id; runs without a small case are left "
    "out): our median against the fastest peer's in that case (> 1: ours is faster; band as above) and against a "
    "copy of the case's own bytes timed the same way in the same run (ceilings.csv `copy_matched`, runs from issue "
    f"16 on, cold L2 only), with a stated margin: ours within {100 * ONE_ROW_MARGIN:.0f}% of that copy (issue 16's "
    "launch-floor margin, carried over to a trivial kernel that moves the same bytes). Medians in µs."
)


def floor_rows(label: str, run: CurrentRun) -> list[list[str]]:
    """Per layout and regime of one run: our % of the speed-of-light floor, median and worst case."""
    if not run.cold:
        return []
    rows = []
    layouts = list(dict.fromkeys(c.layout for c in run.summary.cases))
    for layout in layouts:
        for where in REGIMES:
            cases = [c for c in in_regime(run, where) if c.layout == layout]
            pcts = floor_pcts(run, cases)
            if pcts:
                median, worst = pct_cells(pcts)[0]
                rows.append([label, f"`{layout}`", where, str(len(pcts)), median, worst + floor_note(run)])
    return rows


FLOOR_HEADER = ["operator (run)", "layout", "regime", "cases", "median % of floor", "worst % of floor"]


def floor_model_text() -> str:
    return (
        "Speed-of-light floor of a case (kernel/floor.py): the run's Triton launch floor (ceilings.csv "
        "`triton_launch`, the median of one-element Triton kernel calls) + the case's bytes / the run's 1 GiB copy "
        "rate (ceilings.csv `copy`, median GB/s). % of floor = 100 x floor / our median: 100 is a kernel at the "
        "floor; it can pass 100 (read-mostly traffic streams faster than a copy). Runs from before the Triton "
        "floor use torch's one-element `add_` instead, marked. Point values: the floor is a median of ceiling "
        "samples and the runs keep no interval of an absolute time."
    )


# ---------------------------------------------------------------- the page


def overview_page(run_dirs: list[Path]) -> list[str]:
    """The first page: per operator and regime, then the one row (nothing where ours was never timed)."""
    runs = current_runs(run_dirs)
    if not runs:
        return []
    picked = [
        (op, where, run)
        for op in sorted({r.op for r in runs})
        for where in REGIMES
        if (run := pick_run(runs, op, where)) is not None
    ]
    unfrozen = sorted({run.name for _, _, run in picked if run.summary.frozen_at is None})
    one_rows = [
        row
        for op in sorted({r.op for r in runs})
        if (run := pick_run(runs, op, "small")) is not None
        if (row := one_row(f"`{op}` (`{run.name}`)", run)) is not None
    ]
    confidences = {run.summary.bootstrap.confidence for _, _, run in picked}
    lines = [
        "## Overview: per operator and regime",
        "",
        f"Our entry point (`{OURS}`) against the fastest peer and against the speed-of-light floor. How to read it:",
        "",
        "- Run: each row comes from one run, the latest current run in which ours was timed in that regime "
        "(provenance started_at; equal times: the last run name).",
        "- Regime, by bytes moved per call: small < 4 MiB, mid 4-64 MiB, large >= 64 MiB; layouts pooled.",
        "- Ratio = the fastest timed peer's median / ours, per case: > 1, ours is faster. The fastest peer is the "
        "timed peer of smallest median (equal medians: the first in the run's arm order). Bands come from the "
        "paired-bootstrap CIs over the control, as in the per-run tables: they hold whenever every CI does"
        + (f" (confidence {', '.join(f'{c:g}' for c in sorted(confidences))})." if confidences else "."),
        "- Worst case: the smallest ratio (ties: the first case). Ahead / behind: cases whose band is above / "
        "below 1 (a case without a band: its point value).",
        "- Host µs, ours / the fastest peer's: per case, our median host µs per call (what a caller outside CUDA "
        "graphs is blocked per call) over that of the peer of least host µs in the case, device-bound cases left out "
        "(the per-run tables in results/PERFORMANCE-runs.md give the figures and the mark); <= 1: ours costs no more.",
        "- " + floor_model_text(),
        "- % of same-size copy, the sanity column: our GB/s over a copy of each case's own bytes timed the same way "
        "(runs from issue 16 on). Both percentages: median over the regime's cases, then the worst case; cold-L2 "
        "CUDA-event runs only.",
    ]
    if unfrozen:
        lines.append(
            f"- {len(unfrozen)} of the runs above were not frozen (settings not preregistered): see Preregistration."
        )
    lines += [
        "",
        *markdown_table(
            ["operator", "regime", "run", "cases", "vs fastest peer: geomean [band]", "worst case [band]"]
            + ["ahead / behind", "host µs, ours / fastest peer's: geomean", "worst case"]
            + ["% of floor: median, worst", "% of same-size copy: median, worst"],
            [regime_row(run, where) for _, where, run in picked],
        ),
        "",
    ]
    if one_rows:
        lines += ["### One row: ours against the best peer and the same-size copy", "", ONE_ROW_TEXT, ""]
        lines += markdown_table(ONE_ROW_HEADER, one_rows) + [""]
    return lines
