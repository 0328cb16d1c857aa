"""The harness's bound on isolated arms' own clocks (summary/7, plan.json `checks` 3).

An isolated arm times its calls in its own process (trial/worker.py); the harness measures the
wall clock around the same sample, from the request it sends to the answer it reads (timings.csv
`wall_ns`). The arm's figure is what is published; the bound is what the harness can vouch for:
an arm that controls its process can claim any time up to it (docs/CHECKS.md, "Checks: what each defeats, and what a kernel can still do"). The
summary puts both side by side for every (case, isolated arm) that was timed, and warns where the
claim is far inside the bound; then it warns of every `user:` arm left in kerneltrial's process and
of the sandbox's missing pieces (rundir/integrity_notes.py).

The floor (plan.json `roundtrip`, issue 35 item 2; host clock only): after each round that timed an
isolated arm, kerneltrial's own torch formula in a trusted worker of its own was timed on the same
unit (roundtrip.csv); its wall clock less its own claim is what a sample costs beside its calls.
With `roundtrip_ns` the case's round trip (the median of the reference's plus ROUNDTRIP_SPREADS
median absolute deviations, rundir/integrity_notes.py: no single sample sets it), the floor of one
sample of an arm is (1 - tie_band - WALL_SLACK) * wall_ns - roundtrip_ns (integrity_notes.floor_share;
the slack is what an honest arm's longer and busier samples cost beyond the reference's): the harness
vouches that the arm's calls took at least that. An arm whose median claim per call (the published
figure) is below its median floor per call, with at least MIN_UNDER samples under theirs
(integrity_notes.implausibly_under), is implausible (it has no speedup), so what an arm reports can
move its figure by at most the tie band, the slack and the round trip, and one shaved sample's rank
(with 2 samples, one sample's lie halved: docs/CHECKS.md).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from kerneltrial import stats
from kerneltrial.rundir.integrity_notes import (
    FAR_INSIDE,
    ROUNDTRIP_SPREADS,
    far_inside_warning,
    floor_share,
    integrity_warnings,
)
from kerneltrial.rundir.summary_doc import IsolationBound, IsolationFigures


def roundtrips(roundtrip: pd.DataFrame | None) -> dict[str, float]:
    """Each case's reference round trip (roundtrip.csv wall_ns - ns): their median plus
    ROUNDTRIP_SPREADS median absolute deviations (none without the file)."""
    if roundtrip is None or roundtrip.empty:
        return {}
    cost = (pd.to_numeric(roundtrip["wall_ns"]) - pd.to_numeric(roundtrip["ns"])).astype(float)
    found = {}
    for case, values in cost.groupby(roundtrip["case"]):
        center = stats.median(values.to_numpy())
        spread = stats.median(abs(values.to_numpy() - center))
        found[str(case)] = center + ROUNDTRIP_SPREADS * spread
    return found


def floor_of(rows: pd.DataFrame, roundtrip_ns: float, tie_band: float) -> tuple[float, int]:
    """The median floor per call of a (case, arm)'s timings rows, and how many rows claim less than
    their own floor (module docstring)."""
    wall = pd.to_numeric(rows["wall_ns"]).to_numpy(dtype=float)
    floors = floor_share(tie_band) * wall - roundtrip_ns
    under = int((rows["ns"].to_numpy(dtype=float) < floors).sum())
    return stats.median(floors / rows["calls"].to_numpy(dtype=float)), under


def isolation_figures(
    plan: dict[str, Any], timings: pd.DataFrame, warnings: list[str], roundtrip: pd.DataFrame | None = None
) -> IsolationFigures:
    """summary.json `isolation`: the arms (plan `isolated`), FAR_INSIDE and one bound per timed (case,
    isolated arm), in plan order of cases and arms; medians over the (case, arm)'s timings rows of
    ns / calls (claimed) and wall_ns / calls (bound); ratio = bound / claimed; and, where the case
    has round trips, its round trip and the floor (module docstring)."""
    costs = roundtrips(roundtrip)
    isolated = [str(a) for a in plan.get("isolated", [])]
    bounds = []
    for case in plan["cases"]:
        for arm in isolated:
            rows = timings[(timings["case"] == case["case"]) & (timings["arm"] == arm)]
            if rows.empty:
                continue
            claimed = stats.median((rows["ns"] / rows["calls"]).to_numpy(dtype=float))
            bound = stats.median((pd.to_numeric(rows["wall_ns"]) / rows["calls"]).to_numpy(dtype=float))
            ratio = bound / claimed if claimed > 0 else None
            cost = costs.get(str(case["case"]))
            # unset, not null, without a round trip: a run from before it writes no such keys (summary_json)
            floor_figures = {}
            if cost is not None:
                floor, under = floor_of(rows, cost, float(plan["tie_band"]))
                floor_figures = {"roundtrip_ns": cost, "floor_ns_per_call": floor, "under_samples": under}
            bounds.append(
                IsolationBound(
                    case=str(case["case"]),
                    arm=arm,
                    samples=len(rows),
                    claimed_ns_per_call=claimed,
                    bound_ns_per_call=bound,
                    ratio=ratio,
                    **floor_figures,
                )
            )
            if claimed > 0 and bound > FAR_INSIDE * claimed:
                warnings.append(far_inside_warning(str(case["case"]), arm, claimed, bound))
    warnings.extend(integrity_warnings(plan))
    return IsolationFigures(arms=isolated, far_inside=FAR_INSIDE, bounds=bounds)
