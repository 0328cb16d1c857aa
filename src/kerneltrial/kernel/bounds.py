"""The harness's bound on isolated arms' own clocks (summary/7, plan.json `checks` 3).

An isolated arm times its calls in its own process (trial/worker.py); the harness measures the
wall clock around the same sample, from the request it sends to the answer it reads (timings.csv
`wall_ns`). The arm's figure is what is published; the bound is what the harness can vouch for:
an arm that controls its process can claim any time up to it (docs/CHECKS.md, "Checks: what each defeats, and what a kernel can still do"). The
summary puts both side by side for every (case, isolated arm) that was timed, and warns where the
claim is far inside the bound; then it warns of every `user:` arm left in kerneltrial's process and
of the sandbox's missing pieces (rundir/integrity_notes.py).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from kerneltrial import stats
from kerneltrial.rundir.documents import IsolationBound, IsolationFigures
from kerneltrial.rundir.integrity_notes import FAR_INSIDE, far_inside_warning, integrity_warnings


def isolation_figures(plan: dict[str, Any], timings: pd.DataFrame, warnings: list[str]) -> IsolationFigures:
    """summary.json `isolation`: the arms (plan `isolated`), FAR_INSIDE and one bound per timed (case,
    isolated arm), in plan order of cases and arms; medians over the (case, arm)'s timings rows of
    ns / calls (claimed) and wall_ns / calls (bound); ratio = bound / claimed."""
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
            bounds.append(
                IsolationBound(
                    case=str(case["case"]),
                    arm=arm,
                    samples=len(rows),
                    claimed_ns_per_call=claimed,
                    bound_ns_per_call=bound,
                    ratio=ratio,
                )
            )
            if claimed > 0 and bound > FAR_INSIDE * claimed:
                warnings.append(far_inside_warning(str(case["case"]), arm, claimed, bound))
    warnings.extend(integrity_warnings(plan))
    return IsolationFigures(arms=isolated, far_inside=FAR_INSIDE, bounds=bounds)
