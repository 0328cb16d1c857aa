"""Correctness coverage, one timing row per expected (case, seed, round, arm), rounds per case,
and the interleaving order of each (case, seed, round) unit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kerneltrial.kernel.verify.rows import Sample, TimedChecks, as_list, rounds_of, unit_order
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.layout import PARTIAL_LAYOUT_KINDS  # the only arm kinds plan.json may give `layouts`


def correctness_outcome(
    plan: dict[str, Any], rows: list[dict[str, Any]], result: VerifyResult
) -> dict[tuple[str, str], str]:
    """Per (case, available arm): 'passed', 'failed' or 'unchecked'; records the coverage check."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((str(row["case"]), row["arm"]), []).append(row)
    seeds = set(as_list(plan["seeds"]))
    available = [a for a in plan["arms"] if a["available"]]
    outcome: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    partial = [a["name"] for a in plan["arms"] if "layouts" in a and a.get("kind") not in PARTIAL_LAYOUT_KINDS]
    if partial:
        problems.append(
            f"arm(s) {partial} have `layouts` but only a peer may skip layouts; the plan is not the runner's"
        )
    for plan_case in plan["cases"]:
        case = str(plan_case["case"])
        # a peer whose `layouts` exclude the case's is not checked there, like an unavailable one
        for arm in [
            a["name"]
            for a in available
            if "layouts" not in a
            or a.get("kind") not in PARTIAL_LAYOUT_KINDS
            or plan_case.get("layout") in a["layouts"]
        ]:
            checks = by_key.get((case, arm), [])
            if not checks:
                outcome[(case, arm)] = "unchecked"
                problems.append(f"case {case} arm {arm}: no correctness check")
            elif all(c["passed"] is True for c in checks):
                outcome[(case, arm)] = "passed"
                missing = seeds - {int(c["seed"]) for c in checks}
                if missing:
                    problems.append(f"case {case} arm {arm}: no correctness check for seed(s) {sorted(missing)}")
            else:
                outcome[(case, arm)] = "failed"
    stray = sorted(set(by_key) - set(outcome))
    if stray:
        problems.append(f"correctness rows for unknown or unavailable (case, arm): {stray}")
    result.add(
        "correctness coverage",
        problems,
        f"{len(rows)} checks; {sum(v == 'failed' for v in outcome.values())} (case, arm) failed",
    )
    return outcome


def check_rows(
    plan: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    result: VerifyResult,
    timed: TimedChecks | None,
) -> None:
    """One timing row per (case, seed, round, timed arm); with timed checks, none from the unit where
    an arm raised on (it was dropped from the case)."""
    rounds = {str(c["case"]): rounds_of(plan, c) for c in plan["cases"]}
    order = unit_order(plan)
    raised = timed.raised if timed else {}
    expected = {
        (case, seed, rnd, arm)
        for (case, arm), state in outcome.items()
        if state == "passed"
        for seed in as_list(plan["seeds"])
        for rnd in rounds[case]
        if (case, arm) not in raised or order(seed, rnd) < order(*raised[(case, arm)])
    }
    counts: dict[tuple[str, int, int, str], int] = {}
    for s in samples:
        counts[(s.case, s.seed, s.round, s.arm)] = counts.get((s.case, s.seed, s.round, s.arm), 0) + 1
    missing = sorted(expected - set(counts))
    unexpected = sorted(set(counts) - expected)
    duplicated = sorted(key for key, n in counts.items() if n > 1)
    problems = [
        f"{label} (case, seed, round, arm) rows: {len(keys)}, e.g. {keys[:3]}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("duplicated", duplicated))
        if keys
    ]
    calls = {str(c["case"]): int(c["calls"]) for c in plan["cases"]}
    wrong_calls = [s for s in samples if calls.get(s.case) is not None and s.calls != calls[s.case]]
    if wrong_calls:
        problems.append(f"{len(wrong_calls)} row(s) with calls different from plan, e.g. {wrong_calls[0]}")
    bad_ns = [s for s in samples if not (s.ns > 0 and math.isfinite(s.ns))]
    if bad_ns:
        problems.append(f"{len(bad_ns)} row(s) with non-positive or non-finite ns, e.g. {bad_ns[0]}")
    result.add("timing rows", problems, f"{len(samples)} rows, each expected (case, seed, round, arm) exactly once")
    result.add(
        "rounds per case",
        _rounds_problems(plan),
        "rounds per case: " + ", ".join(f"{case} {len(r)}" for case, r in rounds.items()),
    )

    failed_but_timed = sorted({(s.case, s.arm) for s in samples if outcome.get((s.case, s.arm)) == "failed"})
    result.add(
        "correctness consistency",
        [f"arm {arm} failed correctness in case {case} but has timing rows" for case, arm in failed_but_timed],
        "no arm is timed in a case where it failed correctness",
    )


def _rounds_problems(plan: dict[str, Any]) -> list[str]:
    """A case may run more rounds than planned only under the preregistered noise rule, up to max_rounds."""
    planned = len(as_list(plan["rounds"]))
    rule = plan.get("noise_rule") or {}
    problems = []
    for case in plan["cases"]:
        n = len(rounds_of(plan, case))
        if n < planned:
            problems.append(f"case {case['case']}: {n} rounds, fewer than the planned {planned}")
        elif n > planned and rule.get("target_ci_width") is None:
            problems.append(
                f"case {case['case']}: {n} rounds but {planned} planned and no noise rule "
                "(noise_rule.target_ci_width) allows extra rounds"
            )
        elif n > planned and rule.get("max_rounds") is not None and n > int(rule["max_rounds"]):
            problems.append(f"case {case['case']}: {n} rounds exceed the noise rule's max_rounds {rule['max_rounds']}")
    return problems


def check_order(
    plan: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    result: VerifyResult,
    timed: TimedChecks | None,
) -> None:
    """Interleaving evidence: in each (case, seed, round) unit the timed arms hold positions 0..k-1,
    and, with plan `order_seed`, exactly the order its seeded generator gives. With timed checks the
    arms of a unit are those still in the case there (a timing row, or the raise that dropped the
    arm): the raising arm keeps its position and has no row at it."""
    arm_order = [a["name"] for a in plan["arms"]]
    case_index = {str(c["case"]): i for i, c in enumerate(plan["cases"])}
    case_arms = {case: [arm for arm in arm_order if outcome.get((case, arm)) == "passed"] for case in case_index}
    raised_in = timed.raised_in() if timed else {}
    units: dict[tuple[str, int, int], list[Sample]] = {unit: [] for unit in raised_in}
    for s in samples:
        units.setdefault((s.case, s.seed, s.round), []).append(s)
    order_seed = plan.get("order_seed")
    bad_positions, bad_order = [], []
    for (case, seed, rnd), rows in sorted(units.items()):
        raised = raised_in.get((case, seed, rnd), [])
        here = {s.arm for s in rows} | set(raised)
        arms = case_arms.get(case, []) if timed is None else [arm for arm in arm_order if arm in here]
        positions = sorted(s.position for s in rows)
        if (
            len(set(positions)) != len(positions)
            or len(positions) != len(arms) - len(raised)
            or not all(0 <= p < len(arms) for p in positions)
        ):
            bad_positions.append(
                f"({case}, {seed}, {rnd}) positions {positions} for {len(arms)} timed arm(s)"
                + (f" ({len(raised)} raised)" if raised else "")
            )
            continue
        if order_seed is None or sorted([*(s.arm for s in rows), *raised]) != sorted(arms) or case not in case_index:
            continue  # an incomplete unit already fails the timing-rows check
        permutation = np.random.default_rng([int(order_seed), case_index[case], seed, rnd]).permutation(len(arms))
        expected = {arms[i]: position for position, i in enumerate(permutation)}
        wrong = [
            f"{s.arm} at {s.position}, seeded order puts it at {expected[s.arm]}"
            for s in rows
            if expected[s.arm] != s.position
        ]
        if wrong:
            bad_order.append(f"({case}, {seed}, {rnd}): " + ", ".join(wrong))
    problems = (
        [f"{len(bad_positions)} unit(s) whose positions are not 0..k-1, e.g. {bad_positions[:3]}"]
        if bad_positions
        else []
    )
    if bad_order:
        problems.append(f"{len(bad_order)} unit(s) not in the order of order_seed {order_seed}, e.g. {bad_order[:3]}")
    result.add(
        "interleaving order",
        problems,
        f"{len(units)} (case, seed, round) units, positions 0..k-1"
        + ("" if order_seed is None else f", each in the seeded order of order_seed {order_seed}"),
    )
