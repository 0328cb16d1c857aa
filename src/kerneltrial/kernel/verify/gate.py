"""Per-arm aggregates (geomean and its bootstrap interval, wins, ties, losses, disqualifications)
and the gate, its reasons recomputed word for word."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kerneltrial.kernel.verify.arithmetic import diff, gate_terms, percentile_ci, resample_indices
from kerneltrial.kernel.verify.contract import AGGREGATE_FIELDS, CHECKED_AGGREGATE_FIELDS, Contract
from kerneltrial.rundir.checks import VerifyResult

FAILED_WHILE_TIMED, IMPLAUSIBLE = "failed while timed", "implausible"
NOT_COMPARED = "not compared with the control"  # timed, but the control has no timing in the case


def check_aggregates(
    plan: dict[str, Any],
    summary: dict[str, Any],
    control: str | None,
    speedups: dict[str, list[tuple[str, float, str]]],
    disqualified: dict[str, dict[str, list[tuple[str, str]]]],
    correctness: list[dict[str, Any]],
    bootstrap: dict[str, Any],
    result: VerifyResult,
    contract: Contract,
) -> None:
    """Per-arm aggregates and the gate. Schema 4: the gate fails an arm disqualified in any case (failed
    correctness, failed while timed, implausible), and its reasons are recomputed word for word."""
    no_loss, floor = gate_terms(plan["gate"])
    compared = [a["name"] for a in plan["arms"] if a["available"] and a["name"] != control]
    recorded = summary.get("aggregates", {})
    recorded_gate = summary.get("gate", {}).get("arms", {})
    extra = sorted(set(recorded) - set(compared)) + sorted(set(recorded_gate) - set(compared))
    result.add(
        "aggregate arms",
        [f"summary has aggregates/gate for arms not compared: {extra}"] if extra else [],
        f"compared arms {compared}",
    )
    recomputed_passed: list[str] = []
    for name in compared:
        rows = speedups.get(name, [])
        causes = disqualified.get(name, {})
        figures = _aggregate(rows, len(causes.get("failed correctness", [])), bootstrap)
        reasons = _rule_reasons(figures, no_loss, floor)
        fields = AGGREGATE_FIELDS
        if contract.checked:
            fields = CHECKED_AGGREGATE_FIELDS
            figures.update(
                inconclusive=[v for _, _, v in rows].count("inconclusive"),
                failed_while_timed=len(causes.get(FAILED_WHILE_TIMED, [])),
                implausible=len(causes.get(IMPLAUSIBLE, [])),
                ulp_hist=_ulp_sum(correctness, name),
            )
            reasons = [
                f"{cause} in {len(hits)} case(s) (first: {hits[0][0]}: {hits[0][1]})"
                for cause in ("failed correctness", FAILED_WHILE_TIMED, IMPLAUSIBLE, NOT_COMPARED)
                if (hits := causes.get(cause))
            ] + reasons
        elif figures["failed_correctness"]:
            reasons.insert(0, f"failed correctness in {figures['failed_correctness']} case(s)")
        problems = diff(f"arm {name}", recorded.get(name, {}), figures, fields)
        passed = not reasons
        if passed:
            recomputed_passed.append(name)
        recorded_passed = recorded_gate.get(name, {}).get("passed")
        if recorded_passed is not passed:
            problems.append(f"arm {name} gate: summary {recorded_passed!r} != recomputed {passed}")
        if contract.checked and recorded_gate.get(name, {}).get("reasons") != reasons:
            problems.append(
                f"arm {name} gate reasons: summary {recorded_gate.get(name, {}).get('reasons')!r} != "
                f"recomputed {reasons!r}"
            )
        shown = f"geomean {figures['geomean']:.4f}" if figures["geomean"] is not None else "no speedups"
        counts = f"{figures['wins']}W/{figures['ties']}T/{figures['losses']}L" + (
            f"/{figures['inconclusive']}I" if contract.checked else ""
        )
        result.add(f"aggregates arm={name}", problems, f"{shown}, {counts}, gate {'pass' if passed else 'fail'}")
    gate = summary.get("gate", {})
    result.add(
        "gate",
        []
        if gate.get("passed_arms") == recomputed_passed and gate.get("rule") == plan["gate"]
        else [
            f"summary gate rule {gate.get('rule')!r}, passed_arms {gate.get('passed_arms')} != "
            f"recomputed rule {plan['gate']!r}, passed_arms {recomputed_passed}"
        ],
        f"rule {plan['gate']!r}: passed {recomputed_passed}",
    )


def _rule_reasons(figures: dict[str, Any], no_loss: bool, floor: float | None) -> list[str]:
    """Why an arm fails the gate's own terms (no_loss counts losses only, never inconclusive verdicts)."""
    reasons = []
    if no_loss and figures["losses"]:
        reasons.append(f"no_loss: {figures['losses']} loss(es)")
    if floor is not None and figures["geomean"] is None:
        reasons.append(f"geomean>={floor:g}: no case timed against the control")
    elif floor is not None and figures["geomean"] < floor:
        reasons.append(f"geomean>={floor:g}: geomean is {figures['geomean']:.4f}")
    return reasons


def _ulp_sum(correctness: list[dict[str, Any]], arm: str) -> list[int] | None:
    """Element-wise sum of the arm's correctness `ulp_hist` rows (rows without one skipped); None if none has one."""
    hists = [row["ulp_hist"] for row in correctness if row.get("arm") == arm and isinstance(row.get("ulp_hist"), list)]
    return [sum(column) for column in zip(*hists, strict=False)] if hists else None


def _aggregate(rows: list[tuple[str, float, str]], failed: int, bootstrap: dict[str, Any]) -> dict[str, Any]:
    verdicts = [v for _, _, v in rows]
    figures: dict[str, Any] = dict.fromkeys(AGGREGATE_FIELDS)
    figures.update(
        n_cases=len(rows),
        wins=verdicts.count("win"),
        ties=verdicts.count("tie"),
        losses=verdicts.count("loss"),
        failed_correctness=failed,
    )
    if not rows:
        return figures
    values = [s for _, s, _ in rows]
    logs = np.log(np.array(values))
    idx = resample_indices(int(bootstrap["seed"]), int(bootstrap["resamples"]), len(values))
    low, high = percentile_ci(np.exp(logs[idx].sum(axis=1) / len(values)), float(bootstrap["confidence"]))
    worst_case, worst, _ = min(rows, key=lambda row: row[1])
    figures.update(
        geomean=math.exp(math.fsum(math.log(v) for v in values) / len(values)),
        geomean_ci_low=low,
        geomean_ci_high=high,
        mean=math.fsum(values) / len(values),
        worst=worst,
        worst_case=worst_case,
    )
    return figures
