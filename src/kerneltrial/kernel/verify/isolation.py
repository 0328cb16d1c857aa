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
  rundir/integrity_notes.py's).
"""

from __future__ import annotations

import csv
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneltrial.rundir.integrity_notes import FAR_INSIDE, far_inside_warning, integrity_warnings

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


def _recomputed(
    plan: dict[str, Any], rows: list[dict[str, str]], isolated: list[str], median: Callable[[list[float]], float]
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
    if problems:
        return problems, ""
    bounds, warnings = _recomputed(plan, rows, isolated, median)
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
    return problems, f"{len(isolated)} isolated arm(s); {len(bounds)} bound(s) recomputed, {far} far inside and warned"
