"""PERFORMANCE.md: which current runs were preregistered (one table: whether each run's protocol
was frozen, said nowhere else), the overview against issue 16's targets, each current run's
section, the model-level trials, then the superseded runs.

Every figure is drawn from summary.json (no raw file is read). The overview separates what
one geomean over a hand-picked panel hides (issue 16, item 5):
- regimes by bytes moved per call: small < 4 MiB, mid 4-64 MiB, large >= 64 MiB (`regime`);
  4 MiB is the issue's "at least 80% of copy bandwidth from 4 MB of traffic up", 64 MiB is
  just above the H200's 60 MiB L2, so large traffic cannot be served from cache;
- layouts as each protocol names them (contiguous, row_strided, qkv_slice, row_gate, ...);
- intervals, not only point ratios: per case the ratio of two speedups over the control, each
  with its paired bootstrap CI from summary.json (`stats.ratio_interval`), and per group the
  geomean band of those (`stats.geomean_interval`);
- each figure beside its target with a mark (`mark_at_least`, `mark_at_most`).
A run whose ERRATA.md has a line `Superseded by: RUN` (and, optionally, `Reason: ...`) is an
earlier run: it is listed, with its successor and reason, under "Earlier runs" instead of in the
overview and the per-run sections; its successor must be among the run directories given, so
that no figure silently disappears.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from kerneltrial.analysis import stats
from kerneltrial.analysis.model_report import performance_section
from kerneltrial.analysis.report import (
    REASON,
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
from kerneltrial.analysis.summary import UNFROZEN_WARNING
from kerneltrial.rundir.documents import ArmFigures, Ceilings, Summary, SummaryCase, read_summary
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import kind_of

OURS = "kerneltrial"  # the exported entry point of every operator
EAGER = "torch_eager"  # the peer every operator has: the host cost a caller pays without a kernel library
TIMED = "timed"  # only timed figures count: implausible or failed arms have no honest median

MIB = 1 << 20
MID_FROM = 4 * MIB  # issue 16: ">= 80% of copy bandwidth from 4 MB of traffic up"
LARGE_FROM = 64 * MIB  # above the H200's 60 MiB L2
REGIMES = ("small", "mid", "large")

# issue 16's targets
GEOMEAN_TARGET = 1.10  # geomean over the fastest installed peer
WORST_TARGET = 0.95  # no case below
COPY_TARGET = 80.0  # % of copy bandwidth, from 4 MB up
FLOOR_TARGET = 1.15  # one row within 15% of the launch floor
HOST_TARGET_US = 15.0  # host µs per call, and at most torch eager's

MET, MISSED, UNRESOLVED, UNKNOWN = "met", "**missed**", "unresolved", "–"


def regime(nbytes: int) -> str:
    """small, mid or large by bytes moved per call (boundaries in the module docstring)."""
    return "small" if nbytes < MID_FROM else "mid" if nbytes < LARGE_FROM else "large"


def mark_at_least(target: float, value: float | None, interval: stats.Interval | None = None) -> str:
    """met / missed against `value >= target`; with an interval, unresolved when it straddles the target."""
    if value is None:
        return UNKNOWN
    if interval is None:
        return MET if value >= target else MISSED
    return MET if interval.low >= target else MISSED if interval.high < target else UNRESOLVED


def mark_at_most(target: float, value: float | None) -> str:
    """met / missed against `value <= target`."""
    return UNKNOWN if value is None else MET if value <= target else MISSED


def _geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def _ci(entry: ArmFigures) -> stats.Interval | None:
    """An arm's speedup CI over the control, or None where summary.json has none."""
    if entry.ci_low is None or entry.ci_high is None:
        return None
    return stats.Interval(entry.ci_low, entry.ci_high)


# ---------------------------------------------------------------- per case


@dataclass(frozen=True)
class PeerRow:
    """One case: our entry point's median against the fastest timed peer's."""

    case: str
    layout: str
    bytes: int
    ours: float
    peer: str
    peer_ns: float
    pct: float | None  # our % of the copy ceiling
    interval: stats.Interval | None  # of the ratio; None where either arm has no CI over the control

    @property
    def ratio(self) -> float:
        """The peer's median over ours: > 1, ours is faster."""
        return self.peer_ns / self.ours


def _timed(case: SummaryCase, name: str) -> ArmFigures | None:
    entry = case.arms.get(name)
    return entry if entry is not None and entry.status == TIMED and entry.median_ns_per_call else None


def _fastest_peer_interval(peers: list[ArmFigures]) -> stats.Interval | None:
    """An interval for the fastest peer's speedup over the control: [max of the peers' CI lows,
    max of their CI highs]. The fastest is picked by point median, so using only its own CI would
    ignore the pick; this holds whenever every peer's CI does. None when a peer has no CI."""
    cis = [_ci(peer) for peer in peers]
    if any(ci is None for ci in cis):
        return None
    return stats.Interval(max(ci.low for ci in cis if ci), max(ci.high for ci in cis if ci))


def best_peer_rows(cases: list[SummaryCase]) -> list[PeerRow]:
    """Per case with our entry point and some peer timed: ours against the peer of smallest median."""
    rows = []
    for case in cases:
        ours = _timed(case, OURS)
        peers = {name: e for name, e in case.arms.items() if e.kind == "peer" and _timed(case, name)}
        if ours is None or not peers:
            continue
        best = min(peers, key=lambda name: peers[name].median_ns_per_call or 0.0)
        ours_ci, fastest_ci = _ci(ours), _fastest_peer_interval(list(peers.values()))
        interval = stats.ratio_interval(ours_ci, fastest_ci) if ours_ci and fastest_ci else None
        rows.append(
            PeerRow(
                case.case,
                case.layout,
                case.bytes,
                ours.median_ns_per_call or 0.0,
                best,
                peers[best].median_ns_per_call or 0.0,
                ours.pct_of_copy_ceiling,
                interval,
            )
        )
    return rows


def _groups(keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(layout, regime) keys in layout order of first appearance, regimes small to large."""
    layouts = list(dict.fromkeys(layout for layout, _ in keys))
    present = set(keys)
    return [(layout, r) for layout in layouts for r in REGIMES if (layout, r) in present]


def _band(interval: stats.Interval | None) -> str:
    return "" if interval is None else f" [{interval.low:.3f}, {interval.high:.3f}]"


def mark_every_case(target: float, rows: list[PeerRow]) -> str:
    """ "No case below target" over every case's band (its point value where it has none): met when
    every case's low is at or above the target, missed when some case's high is below it."""
    bands = [r.interval or stats.Interval(r.ratio, r.ratio) for r in rows]
    if all(b.low >= target for b in bands):
        return MET
    return MISSED if any(b.high < target for b in bands) else UNRESOLVED


def untimed_cases(cases: list[SummaryCase]) -> dict[tuple[str, str], list[str]]:
    """Per (layout, regime): the cases where our entry point has no timed median (it failed, was
    implausible, or was not run): they are not in the ratios, and their group cannot meet a target."""
    found: dict[tuple[str, str], list[str]] = {}
    for case in cases:
        if _timed(case, OURS) is None:
            found.setdefault((case.layout, regime(case.bytes)), []).append(case.case)
    return found


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
        geomean = _geomean([r.ratio for r in group])
        intervals = [r.interval for r in group if r.interval is not None]
        band = stats.geomean_interval(intervals) if len(intervals) == len(group) else None
        worst = min(group, key=lambda r: r.ratio)
        body.append(
            [
                run,
                f"`{layout}`",
                where,
                str(len(group)) + (f" (ours not timed: {len(missing)})" if missing else ""),
                f"{geomean:.3f}{_band(band)}",
                MISSED if missing else mark_at_least(GEOMEAN_TARGET, geomean, band),
                f"{worst.ratio:.3f}{_band(worst.interval)} (`{worst.case}` vs `{worst.peer}`)",
                MISSED if missing else mark_every_case(WORST_TARGET, group),
            ]
        )
    return body


def _pct_of_matched(case: SummaryCase, entry: ArmFigures) -> float | None:
    """Our % of the copy of this case's own traffic (None: the run did not measure it)."""
    if case.matched_copy_gbps is None or entry.gbps is None:
        return None
    return 100.0 * entry.gbps / case.matched_copy_gbps


def _pct_cells(pcts: dict[str, float]) -> tuple[list[str], float | None]:
    """Median and worst-case cells of {case: %}, and the worst value."""
    if not pcts:
        return ["–", "–"], None
    worst = min(pcts, key=pcts.__getitem__)
    return [f"{float(np.median(list(pcts.values()))):.1f}", f"{pcts[worst]:.1f} (`{worst}`)"], pcts[worst]


def bandwidth_row(run: str, layout: str, cases: list[SummaryCase], cold: bool = True) -> list[str] | None:
    """Our % of copy bandwidth in the mid and large regimes of one layout (median and worst case),
    against the 1 GiB copy and against the copy of each case's own traffic. The size-matched copy
    is timed one call at a time, as cases are only under a cold L2 (`cold`); in a hot-L2 or
    graph run it is left out."""
    cells, worst_all = [], None
    for where in ("mid", "large"):
        timed = [
            (c, e) for c in cases if c.layout == layout and regime(c.bytes) == where for e in [_timed(c, OURS)] if e
        ]
        big = {c.case: e.pct_of_copy_ceiling for c, e in timed if e.pct_of_copy_ceiling is not None}
        if not big:
            cells += ["0", "–", "–"]
            continue
        big_cells, worst = _pct_cells(big)
        worst_all = worst if worst_all is None else min(worst_all, worst)
        cells += [str(len(big)), *big_cells]
    if worst_all is None:
        return None
    matched = {
        c.case: pct
        for c in cases
        if c.layout == layout and regime(c.bytes) != "small"
        for e in [_timed(c, OURS)]
        if e
        for pct in [_pct_of_matched(c, e) if cold else None]
        if pct is not None
    }
    matched_cells, matched_worst = _pct_cells(matched)
    return [
        run,
        f"`{layout}`",
        *cells,
        mark_at_least(COPY_TARGET, worst_all),
        *matched_cells,
        mark_at_least(COPY_TARGET, matched_worst),
    ]


def one_row_case(cases: list[SummaryCase]) -> SummaryCase | None:
    """The small-regime case of fewest rows (leading dimension; then fewest bytes) where our entry
    point was timed; None when the panel has none (a panel of wide rows only says nothing of the floor)."""
    timed = [c for c in cases if regime(c.bytes) == "small" and _timed(c, OURS) is not None]
    return min(timed, key=lambda c: (c.shape[0], c.bytes)) if timed else None


def launch_floor(ceilings: Ceilings) -> tuple[float, str] | None:
    """The run's launch floor and which: the Triton kernel's where measured, else torch's `add_`."""
    if ceilings.triton_launch_floor_ns is not None:
        return ceilings.triton_launch_floor_ns, "Triton"
    if ceilings.launch_floor_ns is not None:
        return ceilings.launch_floor_ns, "torch `add_`, no Triton floor in this run"
    return None


def floor_row(run: str, summary: Summary) -> list[str] | None:
    case, floor = one_row_case(summary.cases), launch_floor(summary.ceilings)
    if case is None:
        return None
    ours = case.arms[OURS].median_ns_per_call or 0.0
    ratio = None if floor is None else ours / floor[0]
    floor_cell = "–" if floor is None else f"{floor[0] / 1e3:.2f} ({floor[1]})"
    return [
        run,
        f"`{case.case}`",
        f"{ours / 1e3:.2f}",
        floor_cell,
        num_cell(ratio, ".2f"),
        mark_at_most(FLOOR_TARGET, ratio),
    ]


def _host_us(entry: ArmFigures | None) -> float | None:
    """Median host µs per call, where no host sample was device-bound (there the device set the pace)."""
    if entry is None or entry.host_ns_per_call is None or entry.device_bound:
        return None
    return entry.host_ns_per_call / 1e3


def host_row(run: str, cases: list[SummaryCase]) -> list[str] | None:
    ours = [u for c in cases if (u := _host_us(c.arms.get(OURS))) is not None]
    if not ours:
        return None
    pairs = [
        (a, b) for c in cases if (a := _host_us(c.arms.get(OURS))) is not None and (b := _host_us(c.arms.get(EAGER)))
    ]
    ratios = [a / b for a, b in pairs]
    eager = float(np.median([b for _, b in pairs])) if pairs else None
    return [
        run,
        str(len(ours)),
        f"{float(np.median(ours)):.1f} ({max(ours):.1f})",
        num_cell(eager, ".1f"),
        f"{_geomean(ratios):.2f} ({max(ratios):.2f})" if ratios else "–",
        mark_at_most(1.0, max(ratios) if ratios else None),
        mark_at_most(HOST_TARGET_US, max(ours)),
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


def overview_table(run_dirs: list[Path]) -> list[str]:
    """Our entry point against issue 16's targets, per run: device time vs the fastest peer by
    layout and regime, % of copy bandwidth, one row vs the launch floor, host cost."""
    device, bandwidth, floor, host, unmeasured, confidences = [], [], [], [], [], set()
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        if not any(_timed(c, OURS) for c in summary.cases):
            continue
        run = _run_cell(run_dir, summary)
        confidences.add(summary.bootstrap.confidence)
        device += device_rows(run, best_peer_rows(summary.cases), untimed_cases(summary.cases))
        layouts = list(dict.fromkeys(c.layout for c in summary.cases))
        cold = summary.l2 == "cold" and summary.backend == "cuda-events"
        bandwidth += [row for layout in layouts if (row := bandwidth_row(run, layout, summary.cases, cold))]
        floor += [row for row in (floor_row(run, summary),) if row]
        row = host_row(run, summary.cases)
        if row:
            host.append(row)
        else:
            unmeasured.append(run)
    if not (device or bandwidth or floor):
        return []
    lines = [
        "## Overview: `kerneltrial` against issue 16's targets",
        "",
        f"Targets (issue 16): geomean >= {GEOMEAN_TARGET:g} over the fastest installed peer and no case below "
        f"{WORST_TARGET:g}; >= {COPY_TARGET:g}% of copy bandwidth from 4 MB of traffic up; one row within "
        f"{100 * (FLOOR_TARGET - 1):.0f}% of a trivial kernel's launch floor; host cost per call at most torch "
        f"eager's and at most {HOST_TARGET_US:g} µs. Marks: met, **missed**, unresolved (the band straddles the "
        "target), – (not measured).",
        "",
        f"Regimes by bytes moved per call: small < 4 MiB ({MID_FROM:,} B, the issue's 4 MB threshold), mid 4-64 MiB, "
        f"large >= 64 MiB ({LARGE_FROM:,} B, above the H200's 60 MiB L2). Layouts as each protocol names them.",
        "",
    ]
    if device:
        lines += [
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
            f"marked on its point value. Confidence of the runs' CIs: {', '.join(f'{c:g}' for c in sorted(confidences))}.",
            "",
            *markdown_table(
                ["operator (run)", "layout", "regime", "cases", "geomean [band]", f">= {GEOMEAN_TARGET:g}"]
                + ["worst case [band]", f">= {WORST_TARGET:g}"],
                device,
            ),
            "",
        ]
    if bandwidth:
        lines += [
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
                bandwidth,
            ),
            "",
        ]
    if floor:
        lines += [
            "### One row against the launch floor",
            "",
            "The small-regime case of fewest rows (leading dimension; runs without a small case are left out) "
            "against the run's launch floor: the median of one-element "
            "Triton kernel launches (ceilings.csv `triton_launch`, what our entry points' launches cost at least) "
            "where the run measured it, else torch's one-element `add_` (`launch`), as named. Medians in µs.",
            "",
            *markdown_table(
                ["operator (run)", "case (fewest rows)", "ours µs", "floor µs", "ours / floor", f"<= {FLOOR_TARGET:g}"],
                floor,
            ),
            "",
        ]
    if host:
        lines += [
            "### Host cost per call",
            "",
            "Median host µs per call over the cases whose host samples were not device-bound (there the device, not "
            "the host, set the pace): median over cases (worst); torch_eager's median over the cases where both "
            "were measured; ours / torch_eager per case, geomean (worst)."
            + (f" Runs without a host stage: {', '.join(unmeasured)}." if unmeasured else ""),
            "",
            *markdown_table(
                ["operator (run)", "cases", "ours µs (worst)", "torch_eager µs", "ours / torch_eager (worst)"]
                + ["<= torch_eager", f"<= {HOST_TARGET_US:g} µs"],
                host,
            ),
            "",
        ]
    return lines


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
                errata_field(run_dir, REASON) or "-",
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


def write_performance_md(run_dirs: list[Path], out: Path) -> Path:
    """Render one markdown file covering several run directories (e.g. PERFORMANCE.md):
    the overview and a section per current run, then the table of superseded runs."""
    if not run_dirs:
        raise RunDirError("no run directories given; pass at least one")
    run_dirs = sorted((Path(d) for d in run_dirs), key=lambda d: d.name)  # one order, whatever the shell's glob gives
    current = [d for d in run_dirs if superseded_by(d) is None]
    earlier = [d for d in run_dirs if superseded_by(d) is not None]
    models = [d for d in current if kind_of(d) == "model"]
    current = [d for d in current if d not in models]
    check_successors(run_dirs)
    sections = [run_section(d, _without_freeze_warning(read_summary(d)), level=2, freeze=False) for d in current]
    lines = [
        "# Performance",
        "",
        "Generated by `kerneltrial performance` from committed run directories; medians are per call, "
        "speedup = median(control) / median(arm) with a paired bootstrap CI. "
        "Runs labelled NOT GPU performance were timed on a CPU.",
        "",
    ]
    lines += preregistration_table(current)
    lines += overview_table(current)
    for section in sections:
        lines += section + [""]
    if models:
        lines += [
            "## Model level",
            "",
            "Whole-model trials (`kerneltrial model`): tokens/s of a prefill pass or one decode step per arm.",
            "",
        ]
        for d in models:
            lines += performance_section(d) + [""]
    if earlier:
        lines += earlier_runs_table(earlier, {d.name: d for d in run_dirs})
    out = Path(out)
    out.write_text("\n".join(lines))
    return out
