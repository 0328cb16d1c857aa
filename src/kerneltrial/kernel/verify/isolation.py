"""verify's check of isolated arms (plan.json `checks` 3), recomputed independently: the csv module
and verify's own median, nothing of kerneltrial.stats, kernel.summary or kernel.bounds (only the
warnings' wording and FAR_INSIDE, rundir/integrity_notes.py).

- plan.json `isolated` is what protocol.toml's `isolate` names (user: every `user:` arm; all: every
  arm but `aa:`/`slow:` copies; none; or the list itself);
- every timings.csv row of an isolated arm carries the harness's wall bound (`wall_ns`, an integer)
  and claims no more than it; no row of an arm that ran in kerneltrial's process carries one;
- summary.json `isolation` holds, per timed (case, isolated arm), the medians of ns / calls and
  wall_ns / calls and their ratio, and `warnings` names every claim more than FAR_INSIDE times
  inside its bound, every `user:` arm left in kerneltrial's process and the sandbox's missing
  pieces (plan.json `sandbox`, which a run with isolated arms must hold; the wording is
  rundir/integrity_notes.py's);
- with plan.json `roundtrip`, roundtrip.csv's rows are integers with a claim within their wall
  clock, two for every (case, seed, round) where an isolated arm was timed, and each bound's round
  trip (the median of the case's wall_ns - ns plus ROUNDTRIP_SPREADS median absolute deviations),
  median floor and count of samples below their floor ((1 - tie_band - WALL_SLACK) * wall_ns - round trip) are
  recomputed; an arm whose median claim is below its median floor is implausible
  (`under_claim_reasons`, which kernel/verify/figures.py applies); plan.json `floor_rule`, where
  the runner wrote it, is this install's rule (rundir/integrity_notes.py `FloorRule`).
"""

from __future__ import annotations

import csv
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneltrial.rundir.integrity_notes import (
    FAR_INSIDE,
    ROUNDTRIP_SPREADS,
    far_inside_warning,
    floor_rule_problems,
    floor_share,
    implausibly_under,
    integrity_warnings,
    under_claim_reason,
)
from kerneltrial.rundir.layout import ROUNDTRIP_SAMPLES

REL_TOL = 1e-9
CALIBRATION = ("aa:", "slow:")


def protocol_isolated(protocol: dict[str, Any]) -> list[str] | None:
    """The arms protocol.toml's `isolate` names, or None when it is not one of its forms."""
    arms = [protocol.get("control", "control"), *protocol.get("candidates", [])]
    isolate = protocol.get("isolate", "user")
    if isolate == "user":
        return [a for a in arms if a.startswith("user:")]
    if isolate == "all":
        return [a for a in arms if not a.startswith(CALIBRATION)]
    if isolate == "none":
        return []
    return list(isolate) if isinstance(isolate, list) else None


def _row_problems(number: int, row: dict[str, str], isolated: set[str]) -> list[str]:
    where = f"timings.csv line {number} ({row.get('case')}, seed {row.get('seed')}, round {row.get('round')})"
    arm, wall = row.get("arm"), (row.get("wall_ns") or "").strip()
    if arm not in isolated:
        return [f"{where}: arm {arm} ran in kerneltrial's process but has a wall bound {wall}"] if wall else []
    if not wall:
        return [f"{where}: isolated arm {arm} has no harness wall bound (missing harness row)"]
    try:
        bound, claimed = int(wall), float(row["ns"])
    except (KeyError, ValueError):
        return [f"{where}: isolated arm {arm}: unparsable ns {row.get('ns')!r} or wall_ns {wall!r}"]
    if claimed > bound:
        return [
            f"{where}: isolated arm {arm} claims {claimed:.0f} ns, more than the harness's wall bound of {bound} ns "
            "around the same sample"
        ]
    return []


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=REL_TOL)
    return a == b


def roundtrip_costs(
    run_dir: Path, plan: dict[str, Any], median: Callable[[list[float]], float]
) -> tuple[dict[str, float], list[str]]:
    """Each case's round trip from roundtrip.csv (plan.json `roundtrip`; none without it): the median
    of wall_ns - ns plus ROUNDTRIP_SPREADS median absolute deviations; and the problems of its rows:
    integers, a claim within its wall clock, a case of the plan, and ROUNDTRIP_SAMPLES of them for
    every (case, seed, round) in which an isolated arm was timed."""
    if not plan.get("roundtrip"):
        return {}, []
    path = run_dir / "roundtrip.csv"
    if not path.is_file():
        return {}, [f"plan.json roundtrip is {plan['roundtrip']!r} but roundtrip.csv is missing"]
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    cases, trips, problems = {str(c["case"]) for c in plan["cases"]}, {}, []
    per_unit: dict[tuple[str, str, str], int] = {}
    for number, row in enumerate(rows, 2):
        try:
            ns, wall = int(row["ns"]), int(row["wall_ns"])
        except (KeyError, TypeError, ValueError):
            problems.append(f"roundtrip.csv line {number}: unparsable ns {row.get('ns')!r} or wall_ns")
            continue
        if row.get("case") not in cases or ns > wall or ns < 0:
            problems.append(f"roundtrip.csv line {number}: case {row.get('case')!r}, ns {ns}, wall_ns {wall}")
            continue
        trips.setdefault(row["case"], []).append(float(wall - ns))
        key = (row["case"], row.get("seed", ""), row.get("round", ""))
        per_unit[key] = per_unit.get(key, 0) + 1
    problems += _missing_trips(run_dir, plan, per_unit)
    costs = {}
    for case, values in trips.items():
        center = median(values)
        costs[case] = center + ROUNDTRIP_SPREADS * median([abs(v - center) for v in values])
    return costs, problems


def _missing_trips(run_dir: Path, plan: dict[str, Any], per_unit: dict[tuple[str, str, str], int]) -> list[str]:
    """Every (case, seed, round) with an isolated arm's timings row has ROUNDTRIP_SAMPLES round trips
    (the reference is timed first in each round, so a killed and resumed run keeps them)."""
    isolated = set(plan.get("isolated") or [])
    with (run_dir / "timings.csv").open(newline="") as handle:
        units = sorted({(r["case"], r["seed"], r["round"]) for r in csv.DictReader(handle) if r["arm"] in isolated})
    short = [u for u in units if per_unit.get(u, 0) < ROUNDTRIP_SAMPLES]
    return [
        f"roundtrip.csv has {per_unit.get(u, 0)} round trip(s) of ({u[0]}, seed {u[1]}, round {u[2]}), where an "
        f"isolated arm was timed; the runner writes {ROUNDTRIP_SAMPLES}"
        for u in short[:5]
    ] + ([f"... and {len(short) - 5} more such units"] if len(short) > 5 else [])


def _floor(mine: list[dict[str, str]], cost: float | None, tie_band: float, median: Callable) -> dict[str, Any]:
    if cost is None:
        return {}  # a run without a round trip records no floor
    floors = [(floor_share(tie_band) * int(r["wall_ns"]) - cost, float(r["ns"]), int(r["calls"])) for r in mine]
    return {
        "roundtrip_ns": cost,
        "floor_ns_per_call": median([f / calls for f, _, calls in floors]),
        "under_samples": sum(ns < f for f, ns, _ in floors),
    }


def _recomputed(
    plan: dict[str, Any],
    rows: list[dict[str, str]],
    isolated: list[str],
    median: Callable[[list[float]], float],
    costs: dict[str, float],
) -> tuple[list[dict[str, Any]], list[str]]:
    bounds, warnings = [], []
    for case in plan["cases"]:
        for arm in isolated:
            mine = [r for r in rows if r["case"] == case["case"] and r["arm"] == arm]
            if not mine:
                continue
            claimed = median([float(r["ns"]) / int(r["calls"]) for r in mine])
            bound = median([int(r["wall_ns"]) / int(r["calls"]) for r in mine])
            bounds.append(
                {
                    "case": str(case["case"]),
                    "arm": arm,
                    "samples": len(mine),
                    "claimed_ns_per_call": claimed,
                    "bound_ns_per_call": bound,
                    "ratio": bound / claimed if claimed > 0 else None,
                }
                | _floor(mine, costs.get(str(case["case"])), float(plan["tie_band"]), median)
            )
            if claimed > 0 and bound > FAR_INSIDE * claimed:
                warnings.append(far_inside_warning(str(case["case"]), arm, claimed, bound))
    return bounds, warnings


def isolation_problems(
    run_dir: Path, plan: dict[str, Any], summary: dict[str, Any], median: Callable[[list[float]], float]
) -> tuple[list[str], str]:
    """(problems, what was checked) of the check `isolation bounds`."""
    isolated = plan.get("isolated")
    names = [a.get("name") for a in plan.get("arms", [])]
    if not isinstance(isolated, list) or not all(isinstance(a, str) and a in names for a in isolated):
        return [f"plan.json isolated {isolated!r} is not a list of the plan's arms"], ""
    problems = []
    if isolated and "sandbox" in plan and not isinstance(plan["sandbox"], dict):
        problems.append(
            f"plan.json sandbox is {plan['sandbox']!r} but arms {isolated} ran isolated: the runner records "
            "the sandbox of every run with isolated arms"
        )
    wanted = protocol_isolated(tomllib.loads((run_dir / "protocol.toml").read_text()))
    if wanted != isolated:
        problems.append(f"plan.json isolated {isolated} is not what protocol.toml's isolate names ({wanted})")
    with (run_dir / "timings.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for number, row in enumerate(rows, 2):
        problems += _row_problems(number, row, set(isolated))
    costs, roundtrip_problems = roundtrip_costs(run_dir, plan, median)
    problems += roundtrip_problems + floor_rule_problems(plan)
    if problems:
        return problems, ""
    bounds, warnings = _recomputed(plan, rows, isolated, median, costs)
    recorded = summary.get("isolation") or {}
    if recorded.get("arms") != isolated or recorded.get("far_inside") != FAR_INSIDE:
        problems.append(f"summary isolation arms/far_inside {recorded.get('arms')}/{recorded.get('far_inside')}")
    listed = recorded.get("bounds")
    if not isinstance(listed, list) or len(listed) != len(bounds):
        problems.append(f"summary isolation lists {len(listed or [])} bounds, the rows give {len(bounds)}")
    else:
        for got, want in zip(listed, bounds, strict=True):
            wrong = [k for k in want if not _close(got.get(k) if isinstance(got, dict) else None, want[k])]
            if wrong:
                problems.append(
                    f"summary isolation bound of {want['case']} {want['arm']}: {wrong} differ from the rows"
                )
    warnings += integrity_warnings(plan)
    problems += [f"summary warnings lack {w!r}" for w in warnings if w not in summary.get("warnings", [])]
    far = sum(w in summary.get("warnings", []) for w in warnings)
    floors = sum(b.get("floor_ns_per_call") is not None for b in bounds)
    return problems, (
        f"{len(isolated)} isolated arm(s); {len(bounds)} bound(s) recomputed, {far} far inside and warned; "
        f"{floors} floor(s) from {plan.get('roundtrip')!r}'s round trips"
    )


def under_claim_reasons(
    run_dir: Path, plan: dict[str, Any], median: Callable[[list[float]], float]
) -> dict[tuple[str, str], str]:
    """(case, isolated arm) -> why it is implausible: its median claim below its median floor with
    enough samples under theirs (rundir/integrity_notes.py's rule and wording); empty without plan.json `roundtrip`
    or where roundtrip.csv or timings.csv is unreadable (the check `isolation bounds` names that)."""
    costs, problems = roundtrip_costs(run_dir, plan, median)
    if not costs or problems:
        return {}
    with (run_dir / "timings.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    found = {}
    for case, cost in costs.items():
        for arm in plan.get("isolated") or []:
            mine = [r for r in rows if r["case"] == case and r["arm"] == arm]
            if not mine:
                continue
            try:
                figures = _floor(mine, cost, float(plan["tie_band"]), median)
                claimed = median([float(r["ns"]) / int(r["calls"]) for r in mine])
            except (KeyError, TypeError, ValueError):
                continue
            if implausibly_under(claimed, figures["floor_ns_per_call"], figures["under_samples"], len(mine)):
                found[(case, arm)] = under_claim_reason(
                    figures["under_samples"], len(mine), claimed, figures["floor_ns_per_call"], cost
                )
    return found
