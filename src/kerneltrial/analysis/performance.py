"""PERFORMANCE.md and its per-run tables: `write_performance_md` writes the first page
(analysis/performance_overview.py: per operator and regime; then which current runs were
preregistered, one table: whether each run's protocol was frozen, said nowhere else; then the
model-level trials) and results/PERFORMANCE-runs.md (RUNS_FILE: the overview against issue 16's
targets run by run, each current run's section, then the superseded runs).

Every figure is drawn from summary.json (no raw file is read). The per-run overview separates
what one geomean over a hand-picked panel hides (issue 16, item 5):
- regimes by bytes moved per call (analysis/peer_rows.py `regime`) and layouts as each
  protocol names them (contiguous, row_strided, qkv_slice, row_gate, ...);
- intervals, not only point ratios: per case the ratio of two speedups over the control, each
  with its paired bootstrap CI from summary.json (`stats.ratio_interval`), and per group the
  geomean band of those (`stats.geomean_interval`);
- each figure beside its target with a mark (`mark_at_least`, `mark_at_most`);
- the speed-of-light floor and the one row against the best peer and the same-size copy
  (analysis/performance_overview.py, kernel/floor.py).
A run whose ERRATA.md has a line `Superseded by: RUN` (and, optionally, `Reason: ...`) is an
earlier run: it is listed, with its successor and reason, under "Earlier runs" instead of in the
overview and the per-run sections; its successor must be among the run directories given, so
that no figure silently disappears.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from kerneltrial import stats
from kerneltrial.analysis.model_report import performance_section
from kerneltrial.analysis.peer_rows import (
    EAGER,
    LARGE_FROM,
    MID_FROM,
    MISSED,
    OURS,
    REGIMES,
    PeerRow,
    band_text,
    best_peer_rows,
    copy_pcts,
    fastest_host_rows,
    geomean_of,
    host_cells,
    host_us,
    mark_at_least,
    mark_at_most,
    mark_every_case,
    pct_cells,
    regime,
    timed_entry,
    untimed_cases,
)
from kerneltrial.analysis.performance_overview import (
    FLOOR_HEADER,
    ONE_ROW_HEADER,
    ONE_ROW_MARGIN,
    ONE_ROW_TEXT,
    RUNS_FILE,
    CurrentRun,
    floor_model_text,
    floor_rows,
    one_row,
    overview_page,
)
from kerneltrial.analysis.replication import replication_section
from kerneltrial.kernel.report import (
    errata,
    errata_field,
    freeze_record,
    markdown_table,
    num_cell,
    operator_name,
    optional_provenance,
    run_section,
    superseded_by,
)
from kerneltrial.kernel.summary_schemas import UNFROZEN_WARNING
from kerneltrial.publication import titled
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.integrity_notes import integrity_lines
from kerneltrial.rundir.layout import ERRATA_REASON, kind_of
from kerneltrial.rundir.summary_doc import Summary, SummaryCase, read_summary

# issue 16's targets
GEOMEAN_TARGET = 1.10  # geomean over the fastest installed peer
WORST_TARGET = 0.95  # no case below
COPY_TARGET = 80.0  # % of copy bandwidth, from 4 MB up
HOST_TARGET_US = 15.0  # host µs per call, and at most torch eager's


# ---------------------------------------------------------------- per case
def _groups(keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(layout, regime) keys in layout order of first appearance, regimes small to large."""
    layouts = list(dict.fromkeys(layout for layout, _ in keys))
    present = set(keys)
    return [(layout, r) for layout in layouts for r in REGIMES if (layout, r) in present]


def device_rows(run: str, rows: list[PeerRow], untimed: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """Per (layout, regime): cases, geomean ratio with its band, worst case, each against its target;
    a group with a case where ours is not timed is missed whatever its ratios."""
    body = []
    for layout, where in _groups([(r.layout, regime(r.bytes)) for r in rows] + list(untimed)):
        group = [r for r in rows if r.layout == layout and regime(r.bytes) == where]
        missing = untimed.get((layout, where), [])
        if not group:
            body.append([run, f"`{layout}`", where, f"0 (ours not timed: {len(missing)})", "–", MISSED, "–", MISSED])
            continue
        geomean = geomean_of([r.ratio for r in group])
        intervals = [r.interval for r in group if r.interval is not None]
        band = stats.geomean_interval(intervals) if len(intervals) == len(group) else None
        worst = min(group, key=lambda r: r.ratio)
        body.append(
            [
                run,
                f"`{layout}`",
                where,
                str(len(group)) + (f" (ours not timed: {len(missing)})" if missing else ""),
                f"{geomean:.3f}{band_text(band)}",
                MISSED if missing else mark_at_least(GEOMEAN_TARGET, geomean, band),
                f"{worst.ratio:.3f}{band_text(worst.interval)} (`{worst.case}` vs `{worst.peer}`)",
                MISSED if missing else mark_every_case(WORST_TARGET, group),
            ]
        )
    return body


def bandwidth_row(run: str, layout: str, cases: list[SummaryCase], cold: bool = True) -> list[str] | None:
    """Our % of copy bandwidth in the mid and large regimes of one layout (median and worst case),
    against the 1 GiB copy and against the copy of each case's own traffic. The size-matched copy
    is timed one call at a time, as cases are only under a cold L2 (`cold`); in a hot-L2 or
    graph run it is left out."""
    cells, worst_all = [], None
    for where in ("mid", "large"):
        timed = [
            (c, e)
            for c in cases
            if c.layout == layout and regime(c.bytes) == where
            for e in [timed_entry(c, OURS)]
            if e
        ]
        big = {c.case: e.pct_of_copy_ceiling for c, e in timed if e.pct_of_copy_ceiling is not None}
        if not big:
            cells += ["0", "–", "–"]
            continue
        big_cells, worst = pct_cells(big)
        worst_all = worst if worst_all is None else min(worst_all, worst)
        cells += [str(len(big)), *big_cells]
    if worst_all is None:
        return None
    big_cases = [c for c in cases if c.layout == layout and regime(c.bytes) != "small"]
    matched = copy_pcts(big_cases) if cold else {}
    matched_cells, matched_worst = pct_cells(matched)
    return [
        run,
        f"`{layout}`",
        *cells,
        mark_at_least(COPY_TARGET, worst_all),
        *matched_cells,
        mark_at_least(COPY_TARGET, matched_worst),
    ]


def host_row(run: str, cases: list[SummaryCase]) -> list[str] | None:
    ours = [u for c in cases if (u := host_us(c.arms.get(OURS))) is not None]
    if not ours:
        return None
    pairs = [
        (a, b) for c in cases if (a := host_us(c.arms.get(OURS))) is not None and (b := host_us(c.arms.get(EAGER)))
    ]
    ratios = [a / b for a, b in pairs]
    eager = float(np.median([b for _, b in pairs])) if pairs else None
    return [
        run,
        str(len(ours)),
        f"{float(np.median(ours)):.1f} ({max(ours):.1f})",
        num_cell(eager, ".1f"),
        f"{geomean_of(ratios):.2f} ({max(ratios):.2f})" if ratios else "–",
        mark_at_most(1.0, max(ratios) if ratios else None),
        mark_at_most(HOST_TARGET_US, max(ours)),
        *host_cells(fastest_host_rows(cases)),
    ]


# ---------------------------------------------------------------- the overview


def _run_cell(run_dir: Path, summary: Summary) -> str:
    """The operator and run, marked where the run has errata (whether its protocol was frozen
    is said once per run, in `preregistration_table`)."""
    return f"`{operator_name(run_dir, summary)}` (`{Path(run_dir).name}`)" + (" (errata)" if errata(run_dir) else "")


def preregistration_table(run_dirs: list[Path]) -> list[str]:
    """The one place PERFORMANCE.md says whether each current kernel run's protocol was frozen
    before it ran (its settings, panel included, preregistered), so no figure repeats it."""
    rows, frozen = [], 0
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        recorded, frozen_at = freeze_record(run_dir, summary)
        frozen += frozen_at is not None
        state = f"frozen at {frozen_at}" if frozen_at else "**not frozen**" if recorded else "not recorded (older run)"
        rows.append([f"`{Path(run_dir).name}`", f"`{operator_name(run_dir, summary)}`", state])
    return [
        "## Preregistration",
        "",
        f"{frozen} of {len(rows)} current kernel runs had their protocol frozen (`kerneltrial protocol freeze`) "
        "before they ran; the others' settings, panel included, were not preregistered. Said here once per run, "
        "not beside each figure.",
        "",
        *markdown_table(["run", "operator", "protocol"], rows),
        "",
    ]


def isolation_table(run_dirs: list[Path]) -> list[str]:
    """The current kernel runs whose verdicts rest on less than the whole isolation (a `user:` arm
    in kerneltrial's process, isolated arms without a sandbox piece: rundir/integrity_notes.py);
    nothing when there are none."""
    rows = [[f"`{Path(d).name}`", note] for d in run_dirs for note in integrity_lines(read_summary(d).warnings)]
    if not rows:
        return []
    return [
        "## Isolation",
        "",
        'These runs\' verdicts rest on less than the whole isolation (docs/CHECKS.md, "The sandbox"):',
        "",
        *markdown_table(["run", "what was missing"], rows),
        "",
    ]


@dataclass
class OverviewRows:
    """The overview's table rows over the current runs (`overview_rows`)."""

    device: list[list[str]] = field(default_factory=list)
    bandwidth: list[list[str]] = field(default_factory=list)
    floor: list[list[str]] = field(default_factory=list)
    one: list[list[str]] = field(default_factory=list)
    host: list[list[str]] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)  # runs without a host stage
    confidences: set[float] = field(default_factory=set)


def overview_rows(run_dirs: list[Path]) -> OverviewRows:
    """Every overview row of the runs in which our entry point was timed."""
    rows = OverviewRows()
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        if not any(timed_entry(c, OURS) for c in summary.cases):
            continue
        run = _run_cell(run_dir, summary)
        rows.confidences.add(summary.bootstrap.confidence)
        rows.device += device_rows(run, best_peer_rows(summary.cases), untimed_cases(summary.cases))
        layouts = list(dict.fromkeys(c.layout for c in summary.cases))
        cold = summary.l2 == "cold" and summary.backend == "cuda-events"
        rows.bandwidth += [row for layout in layouts if (row := bandwidth_row(run, layout, summary.cases, cold))]
        current = CurrentRun(Path(run_dir), summary, "")
        rows.floor += floor_rows(run, current)
        rows.one += [row for row in (one_row(run, current),) if row]
        row = host_row(run, summary.cases)
        if row:
            rows.host.append(row)
        else:
            rows.unmeasured.append(run)
    return rows


def overview_table(run_dirs: list[Path]) -> list[str]:
    """Our entry point against issue 16's targets, per run: device time vs the fastest peer by
    layout and regime, % of copy bandwidth and of the speed-of-light floor, one row vs the best peer
    and the same-size copy (analysis/performance_overview.py), host cost."""
    rows = overview_rows(run_dirs)
    if not (rows.device or rows.bandwidth or rows.one):
        return []
    lines = _overview_intro()
    lines += _device_section(rows) if rows.device else []
    lines += _bandwidth_section(rows) if rows.bandwidth else []
    if rows.floor:
        lines += ["### Speed-of-light floor", "", floor_model_text(), ""]
        lines += [*markdown_table(FLOOR_HEADER, rows.floor), ""]
    if rows.one:
        lines += ["### One row against the best peer and the same-size copy", "", ONE_ROW_TEXT, ""]
        lines += [*markdown_table(ONE_ROW_HEADER, rows.one), ""]
    return lines + (_host_section(rows) if rows.host else [])


def _overview_intro() -> list[str]:
    return [
        "## Overview: `kerneltrial` against issue 16's targets",
        "",
        f"Targets (issue 16): geomean >= {GEOMEAN_TARGET:g} over the fastest installed peer and no case below "
        f"{WORST_TARGET:g}; >= {COPY_TARGET:g}% of copy bandwidth from 4 MB of traffic up; one row within "
        f"{100 * ONE_ROW_MARGIN:.0f}% of a trivial kernel moving its bytes (the same-size copy); host cost per call at most torch "
        f"eager's and at most {HOST_TARGET_US:g} µs. Marks: met, **missed**, unresolved (the band straddles the "
        "target), – (not measured).",
        "",
        f"Regimes by bytes moved per call: small < 4 MiB ({MID_FROM:,} B, the issue's 4 MB threshold), mid 4-64 MiB, "
        f"large >= 64 MiB ({LARGE_FROM:,} B, above the H200's 60 MiB L2). Layouts as each protocol names them.",
        "",
    ]


def _device_section(rows: OverviewRows) -> list[str]:
    return [
        "### Device time against the fastest peer",
        "",
        "Ratio = the fastest timed peer's median / our entry point's median, per case (> 1: ours is faster); "
        "the fastest peer is the one with the smallest median in that case. Band of a case: [our speedup's CI low "
        "/ the largest CI high among the peers, our CI high / the largest CI low among the peers], from the "
        "paired-bootstrap CIs over the control in summary.json (the runs keep no bootstrap of ours against a "
        "peer); it holds whenever our CI and every peer's CI do, so for k peers at confidence c its coverage is "
        "at least 1 - (k + 1)(1 - c) (Bonferroni), whatever their dependence. Band of a geomean: the geomeans of "
        "the cases' lower and upper bounds, which holds whenever every case's band does: for n cases, at least "
        "1 - n(k + 1)(1 - c), a weak guarantee for large groups; read it as the range the noise of the run "
        "allows, not as a 95% interval. The worst-case mark is met only when every case's band is at or above "
        "the target and missed when some case's band is below it. A case where our entry point is not timed "
        "is left out of the ratios and marks its group missed. A group without a band for every case is "
        f"marked on its point value. Confidence of the runs' CIs: {', '.join(f'{c:g}' for c in sorted(rows.confidences))}.",
        "",
        *markdown_table(
            ["operator (run)", "layout", "regime", "cases", "geomean [band]", f">= {GEOMEAN_TARGET:g}"]
            + ["worst case [band]", f">= {WORST_TARGET:g}"],
            rows.device,
        ),
        "",
    ]


def _bandwidth_section(rows: OverviewRows) -> list[str]:
    return [
        "### Bandwidth from 4 MiB up",
        "",
        "Our entry point's % of the copy ceiling measured in the same run (a 1 GiB copy): median over the "
        "regime's cases, and the worst case; the mark is on the worst of mid and large (target >= "
        f"{COPY_TARGET:g}%). Then the same against a copy of each case's own traffic, timed the same way in the "
        "same run (runs from issue 16 on): a copy of a few MB reaches a fraction of the 1 GiB copy's rate "
        "(`results/h200-midsize`), so only this column says what a kernel leaves on the table.",
        "",
        *markdown_table(
            ["operator (run)", "layout", "mid cases", "mid median %", "mid worst %"]
            + ["large cases", "large median %", "large worst %", f">= {COPY_TARGET:g}% of 1 GiB copy"]
            + ["median % of same-size copy", "worst % of same-size copy", f">= {COPY_TARGET:g}%"],
            rows.bandwidth,
        ),
        "",
    ]


def _host_section(rows: OverviewRows) -> list[str]:
    return [
        "### Host cost per call",
        "",
        "Median host µs per call over the cases whose host samples were not device-bound (there the device, not "
        "the host, set the pace): median over cases (worst); torch_eager's median over the cases where both "
        "were measured; ours / torch_eager per case, geomean (worst); then ours / the fastest peer's per case, the "
        "fastest peer being the one of least host µs in that case (issue 37's target: no higher than it), geomean "
        "and worst case." + (f" Runs without a host stage: {', '.join(rows.unmeasured)}." if rows.unmeasured else ""),
        "",
        *markdown_table(
            ["operator (run)", "cases", "ours µs (worst)", "torch_eager µs", "ours / torch_eager (worst)"]
            + ["<= torch_eager", f"<= {HOST_TARGET_US:g} µs"]
            + ["ours / fastest peer: geomean", "worst case", "<= fastest peer"],
            rows.host,
        ),
        "",
    ]


# ---------------------------------------------------------------- earlier runs and the document


def check_successors(run_dirs: list[Path]) -> None:
    """Every superseded run leads, through its successors, to a current run among `run_dirs`
    (so no figure silently leaves PERFORMANCE.md); run directory names must be unique."""
    by_name = {d.name: d for d in run_dirs}
    if len(by_name) != len(run_dirs):
        raise RunDirError("two run directories share a name; `Superseded by:` could not tell them apart")
    for run_dir in run_dirs:
        seen, step = [run_dir.name], superseded_by(run_dir)
        while step is not None:
            if step not in by_name:
                raise RunDirError(
                    f"{run_dir}: superseded by {step!r}, which is not among the run directories given; "
                    "pass that run too"
                )
            if step in seen:
                raise RunDirError(f"{run_dir}: `Superseded by:` lines form a cycle ({' -> '.join(seen + [step])})")
            seen.append(step)
            step = superseded_by(by_name[step])


def wall_seconds(run_dir: Path) -> float | None:
    """Seconds from provenance.json started_at to finished_at (None when either is missing)."""
    record = optional_provenance(run_dir)
    if record is None or record.finished_at is None:
        return None
    try:
        started, finished = datetime.fromisoformat(record.started_at), datetime.fromisoformat(record.finished_at)
    except ValueError:
        return None
    return (finished - started).total_seconds()


def earlier_runs_table(earlier: list[Path], by_name: dict[str, Path]) -> list[str]:
    """The superseded runs: successor, reason, start time, and the wall time of each beside its
    successor's (what a change of method, e.g. the timed checks, costs per panel)."""
    body = []
    for run_dir in earlier:
        provenance = optional_provenance(run_dir)
        started = provenance.started_at[:16] if provenance else "-"
        successor = superseded_by(run_dir)
        mine, theirs = wall_seconds(run_dir), wall_seconds(by_name[successor]) if successor in by_name else None
        ratio = f"{theirs / mine:.2f}" if mine and theirs else "-"
        body.append(
            [
                f"`{Path(run_dir).name}`",
                f"`{operator_name(run_dir, read_summary(run_dir))}`",
                f"`{successor}`",
                errata_field(run_dir, ERRATA_REASON) or "-",
                started,
                num_cell(mine, ".0f"),
                num_cell(theirs, ".0f"),
                ratio,
            ]
        )
    return (
        [
            "## Earlier runs (superseded)",
            "",
            "Committed and verified in CI like every run, but replaced by the named run; each one's "
            "ERRATA.md says why. Wall time: provenance.json started_at to finished_at.",
            "",
        ]
        + markdown_table(
            ["run", "operator", "superseded by", "reason", "started", "wall s", "successor's wall s", "ratio"], body
        )
        + [""]
    )


def _without_freeze_warning(summary: Summary) -> Summary:
    """The summary without its "not frozen" warning: `preregistration_table` says it."""
    return summary.model_copy(update={"warnings": [w for w in summary.warnings if w != UNFROZEN_WARNING]})


def write_performance_md(
    run_dirs: list[Path], out: Path, runs_out: Path | None = None, unverified: bool = False
) -> Path:
    """Render PERFORMANCE.md (`out`): the first page (analysis/performance_overview.py) and the
    model-level trials; and the per-run tables (`runs_out`, default RUNS_FILE beside `out`): issue
    16's overview per run, a section per current run, then the table of superseded runs. Returns `out`.
    `unverified`: the titles and every run's heading say the runs were not required to verify."""
    if not run_dirs:
        raise RunDirError("no run directories given; pass at least one")
    run_dirs = sorted((Path(d) for d in run_dirs), key=lambda d: d.name)  # one order, whatever the shell's glob gives
    current = [d for d in run_dirs if superseded_by(d) is None]
    earlier = [d for d in run_dirs if superseded_by(d) is not None]
    models = [d for d in current if kind_of(d) == "model"]
    current = [d for d in current if d not in models]
    check_successors(run_dirs)
    out = Path(out)
    runs_out = out.parent / RUNS_FILE if runs_out is None else Path(runs_out)
    intro = (
        "Generated by `kerneltrial performance` from committed run directories; medians are per call, "
        "speedup = median(control) / median(arm) with a paired bootstrap CI. "
        "Runs labelled NOT GPU performance were timed on a CPU."
    )
    link = relative_link(runs_out, out.parent)
    page = [
        titled("# Performance", unverified),
        "",
        f"{intro} Every run's tables (each layout, issue 16's targets, per case): [{link}]({link}).",
        "",
    ]
    page += overview_page(current)
    page += preregistration_table(current)
    page += replication_section(current)
    page += isolation_table(current)
    if models:
        page += [
            "## Model level",
            "",
            "Whole-model trials (`kerneltrial model`): tokens/s of a prefill pass or one decode step per arm.",
            "",
        ]
        for d in models:
            page += performance_section(d, unverified) + [""]
    runs = [titled("# Performance: every run", unverified), "", f"{intro} The first page is [PERFORMANCE.md]"
            f"({relative_link(out, runs_out.parent)}).", ""]  # fmt: skip
    runs += overview_table(current)
    for d in current:
        runs += run_section(d, _without_freeze_warning(read_summary(d)), level=2, unverified=unverified, freeze=False)
        runs += [""]
    if earlier:
        runs += earlier_runs_table(earlier, {d.name: d for d in run_dirs})
    out.write_text("\n".join(page))
    runs_out.parent.mkdir(parents=True, exist_ok=True)
    runs_out.write_text("\n".join(runs))
    return out


def relative_link(target: Path, start: Path) -> str:
    """`target` relative to the folder `start`, with forward slashes (a markdown link)."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
