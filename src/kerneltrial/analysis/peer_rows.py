"""Our entry point against the peers, case by case: the primitives of PERFORMANCE.md's tables
(analysis/performance.py, the per-run tables; analysis/performance_overview.py, the first page).

- regimes by bytes moved per call: small < 4 MiB, mid 4-64 MiB, large >= 64 MiB (`regime`; a
  case of exactly 4 MiB is mid, of exactly 64 MiB large); 4 MiB is issue 16's "at least 80% of
  copy bandwidth from 4 MB of traffic up", 64 MiB is just above the H200's 60 MiB L2, so large
  traffic cannot be served from cache;
- per case, ours against the fastest timed peer (`best_peer_rows`): the peer of smallest median
  (equal medians: the first in the run's arm order), with the ratio's band from the speedup CIs
  over the control in summary.json (`stats.ratio_interval`);
- per case, our host µs per call against the peer of least host µs (`fastest_host_rows`);
- marks of a figure against a target (`mark_at_least`, `mark_at_most`, `mark_every_case`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kerneltrial import stats
from kerneltrial.rundir.summary_doc import ArmFigures, SummaryCase

OURS = "kerneltrial"  # the exported entry point of every operator
EAGER = "torch_eager"  # the peer every operator has: the host cost a caller pays without a kernel library
TIMED = "timed"  # only timed figures count: implausible or failed arms have no honest median

MIB = 1 << 20
MID_FROM = 4 * MIB  # issue 16: ">= 80% of copy bandwidth from 4 MB of traffic up"
LARGE_FROM = 64 * MIB  # above the H200's 60 MiB L2
REGIMES = ("small", "mid", "large")

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


def geomean_of(values: list[float]) -> float:
    """exp(mean(log(values)))."""
    return float(np.exp(np.mean(np.log(values))))


def speedup_ci(entry: ArmFigures) -> stats.Interval | None:
    """An arm's speedup CI over the control, or None where summary.json has none."""
    if entry.ci_low is None or entry.ci_high is None:
        return None
    return stats.Interval(entry.ci_low, entry.ci_high)


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


def timed_entry(case: SummaryCase, name: str) -> ArmFigures | None:
    """The arm's entry in the case where it was timed with a median; None otherwise."""
    entry = case.arms.get(name)
    return entry if entry is not None and entry.status == TIMED and entry.median_ns_per_call else None


def fastest_peer_interval(peers: list[ArmFigures]) -> stats.Interval | None:
    """An interval for the fastest peer's speedup over the control: [max of the peers' CI lows,
    max of their CI highs]. The fastest is picked by point median, so using only its own CI would
    ignore the pick; this holds whenever every peer's CI does. None when a peer has no CI."""
    cis = [speedup_ci(peer) for peer in peers]
    if any(ci is None for ci in cis):
        return None
    return stats.Interval(max(ci.low for ci in cis if ci), max(ci.high for ci in cis if ci))


def best_peer_rows(cases: list[SummaryCase]) -> list[PeerRow]:
    """Per case with our entry point and some peer timed: ours against the peer of smallest median."""
    rows = []
    for case in cases:
        ours = timed_entry(case, OURS)
        peers = {name: e for name, e in case.arms.items() if e.kind == "peer" and timed_entry(case, name)}
        if ours is None or not peers:
            continue
        best = min(peers, key=lambda name: peers[name].median_ns_per_call or 0.0)
        ours_ci, fastest_ci = speedup_ci(ours), fastest_peer_interval(list(peers.values()))
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


def host_us(entry: ArmFigures | None) -> float | None:
    """Median host µs per call, where no host sample was device-bound (there the device set the pace)."""
    if entry is None or entry.host_ns_per_call is None or entry.device_bound:
        return None
    return entry.host_ns_per_call / 1e3


@dataclass(frozen=True)
class HostRow:
    """One case: our host µs per call against the fastest peer's (the peer of least host µs)."""

    case: str
    ours_us: float
    peer: str
    peer_us: float

    @property
    def ratio(self) -> float:
        """Ours over the peer's: <= 1, ours costs a caller no more host time per call."""
        return self.ours_us / self.peer_us


def fastest_host_rows(cases: list[SummaryCase]) -> list[HostRow]:
    """Per case where ours and some peer have a host figure (`host_us`): ours against the peer of least
    host µs (equal figures: the first in the run's arm order). The fastest by host time, which need not
    be the fastest on the device: a caller outside CUDA graphs pays the host time."""
    rows = []
    for case in cases:
        ours = host_us(case.arms.get(OURS))
        peers = {name: u for name, e in case.arms.items() if e.kind == "peer" and (u := host_us(e)) is not None}
        if ours is None or not peers:
            continue
        best = min(peers, key=peers.__getitem__)
        rows.append(HostRow(case.case, ours, best, peers[best]))
    return rows


def host_cells(rows: list[HostRow]) -> list[str]:
    """Ours / the fastest peer's host µs: geomean over the cases, the worst case (vs which peer), the mark <= 1."""
    if not rows:
        return ["–", "–", UNKNOWN]
    worst = max(rows, key=lambda r: r.ratio)
    return [
        f"{geomean_of([r.ratio for r in rows]):.2f}",
        f"{worst.ratio:.2f} (`{worst.case}` vs `{worst.peer}`)",
        mark_at_most(1.0, worst.ratio),
    ]


def band_text(interval: stats.Interval | None) -> str:
    """ " [low, high]" of a band, or nothing where there is none."""
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
        if timed_entry(case, OURS) is None:
            found.setdefault((case.layout, regime(case.bytes)), []).append(case.case)
    return found


def pct_of_matched(case: SummaryCase, entry: ArmFigures) -> float | None:
    """Our % of the copy of this case's own traffic (None: the run did not measure it)."""
    if case.matched_copy_gbps is None or entry.gbps is None:
        return None
    return 100.0 * entry.gbps / case.matched_copy_gbps


def one_row_case(cases: list[SummaryCase]) -> SummaryCase | None:
    """The small-regime case of fewest rows (leading dimension; then fewest bytes) where our entry
    point was timed; None when the panel has none (a panel of wide rows only says nothing of the floor)."""
    timed = [c for c in cases if regime(c.bytes) == "small" and timed_entry(c, OURS) is not None]
    return min(timed, key=lambda c: (c.shape[0], c.bytes)) if timed else None


def pct_cells(pcts: dict[str, float]) -> tuple[list[str], float | None]:
    """Median and worst-case cells of {case: %}, and the worst value."""
    if not pcts:
        return ["–", "–"], None
    worst = min(pcts, key=pcts.__getitem__)
    return [f"{float(np.median(list(pcts.values()))):.1f}", f"{pcts[worst]:.1f} (`{worst}`)"], pcts[worst]


def copy_pcts(cases: list[SummaryCase]) -> dict[str, float]:
    """{case: our % of the same-size copy's rate} where both were measured."""
    return {
        c.case: pct
        for c in cases
        for e in [timed_entry(c, OURS)]
        if e
        for pct in [pct_of_matched(c, e)]
        if pct is not None
    }
