"""The figures of each case of a kernel summary (every arm's status, median, speedup and CI) and
of each arm over the cases (aggregates and the gate), as the typed records of rundir/summary_doc.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from kerneltrial import gate_rule, stats
from kerneltrial.kernel.floor import fraction_of_floor
from kerneltrial.kernel.summary_inputs import case_rounds, count, planned_units, takes_layout
from kerneltrial.kernel.summary_schemas import (
    FAILED,
    FAILED_WHILE_TIMED,
    IMPLAUSIBLE,
    NOT_TIMED,
    TIMED,
    UNAVAILABLE,
    CheckCounts,
    HostFigures,
    SchemaV3,
    statuses,
)
from kerneltrial.kernel.summary_throughput import Peaks, with_throughput
from kerneltrial.rundir.summary_doc import Aggregate, ArmFigures, Gate, GateArm, SummaryCase

MIN_UNITS = 10  # fewer (seed, round) units than this and a case's CI gets a warning


@dataclass(frozen=True)
class CaseInputs:
    """What every case's figures are computed from: one run, parsed once (kernel/summary.py)."""

    plan: dict[str, Any]
    series: dict[tuple[str, str], pd.Series]  # per-call ns by (seed, round) of each (case, arm)
    throttled: dict[tuple[str, str], int]  # throttled samples of each (case, arm)
    checks: dict[tuple[str, str], list[dict[str, Any]]]  # correctness rows of each (case, arm)
    control: str
    copy_ceiling: float | None
    matched: dict[int, float]  # GB/s of the copy of each case's traffic (none: not measured)
    rule: stats.BootstrapRule
    schema: SchemaV3
    warnings: list[str]  # appended to, in the order the figures are computed
    peaks: Peaks | None = None  # measured peak memory (kernel/summary_throughput.py); None: not recorded


def _untimed(
    kind: str, status: str, host: HostFigures, reason: str | None = None, messages: list[str] | None = None
) -> ArmFigures:
    """An arm entry without figures (unavailable, failed, not timed)."""
    return ArmFigures(
        kind=kind,
        status=status,
        median_ns_per_call=None,
        n_samples=0,
        ci_units=None,
        speedup=None,
        ci_low=None,
        ci_high=None,
        verdict=None,
        gbps=None,
        pct_of_copy_ceiling=None,
        throttled_samples=0,
        spread=None,
        messages=messages or [],
        reason=reason,
        host_ns_per_call=host.ns_per_call,
        host_samples=host.samples,
        host_behind=host.behind,
        fraction_of_floor=None,
    )


def _arm_entry(inputs: CaseInputs, arm: dict[str, Any], case: dict[str, Any], floor: float | None) -> ArmFigures:
    """Status and per-arm figures of one (case, arm), speedup excluded."""
    case_id, name, kind = str(case["case"]), arm["name"], arm["kind"]
    host = inputs.schema.host_figures(case_id, name)
    checks = inputs.checks.get((case_id, name), [])
    times = inputs.series.get((case_id, name))
    if not arm["available"]:
        return _untimed(kind, UNAVAILABLE, host, reason=arm.get("reason"))
    if not takes_layout(arm, case):
        return _untimed(kind, UNAVAILABLE, host, reason=f"does not take layout {case['layout']!r}")
    if not checks:
        return _untimed(kind, NOT_TIMED, host, reason="no correctness check recorded")
    if not all(row["passed"] for row in checks):
        return _untimed(
            kind, FAILED, host, messages=[row.get("message") or "failed" for row in checks if not row["passed"]]
        )
    timed_failures = inputs.schema.timed_failures(case_id, name)
    if timed_failures:
        return _untimed(kind, FAILED_WHILE_TIMED, host, messages=timed_failures)
    if times is None:
        return _untimed(kind, NOT_TIMED, host, reason="passed correctness but has no timing rows")
    median = stats.median(times.to_numpy())
    achieved = stats.gbps(case["bytes"], median)
    reason = inputs.schema.implausibility(achieved, median) or inputs.schema.under_claim(case_id, name, median)
    ceiling = inputs.copy_ceiling
    return _untimed(kind, TIMED if reason is None else IMPLAUSIBLE, host, reason=reason).model_copy(
        update={
            "median_ns_per_call": median,
            "n_samples": int(times.size),
            "gbps": achieved,
            "pct_of_copy_ceiling": None if ceiling is None else stats.pct_of_ceiling(achieved, ceiling),
            "throttled_samples": inputs.throttled.get((case_id, name), 0),
            "spread": stats.relative_spread(times.to_numpy()),
            "fraction_of_floor": fraction_of_floor(floor, median),
        }
    )


def _with_speedup(
    inputs: CaseInputs, entry: ArmFigures, control: pd.Series, arm: pd.Series, case_id: str, name: str
) -> ArmFigures:
    """The timed arm's entry with its speedup over the control and the CI over their shared units."""
    paired = control.index.intersection(arm.index).sort_values()
    if len(paired) == 0:
        inputs.warnings.append(f"case {case_id}: arm {name} shares no (seed, round) unit with the control; no CI")
        return entry.model_copy(update={"ci_units": 0})
    if len(paired) < MIN_UNITS:
        inputs.warnings.append(f"case {case_id}: arm {name} has only {len(paired)} units (< {MIN_UNITS}); CI is rough")
    assert entry.median_ns_per_call is not None  # a timed entry
    ci = stats.bootstrap_speedup_ci(control.loc[paired].to_numpy(), arm.loc[paired].to_numpy(), inputs.rule)
    return entry.model_copy(
        update={
            "ci_units": len(paired),
            "speedup": stats.speedup(stats.median(control.to_numpy()), entry.median_ns_per_call),
            "ci_low": ci.low,
            "ci_high": ci.high,
            "verdict": inputs.schema.verdict(ci, inputs.plan["tie_band"]),
        }
    )


def case_summary(inputs: CaseInputs, case: dict[str, Any]) -> SummaryCase:
    """One case of summary.json: every arm's entry, and the case's warnings appended to `inputs.warnings`."""
    case_id, control, warnings = str(case["case"]), inputs.control, inputs.warnings
    floor = inputs.schema.case_floor(int(case["bytes"]))
    arms: dict[str, ArmFigures] = {}
    for arm in inputs.plan["arms"]:
        name = arm["name"]
        entry = arms[name] = _arm_entry(inputs, arm, case, floor)
        if entry.status == NOT_TIMED:
            warnings.append(f"case {case_id}: arm {name} not timed: {entry.reason}")
        if entry.status in (FAILED, UNAVAILABLE, NOT_TIMED) and (case_id, name) in inputs.series:
            warnings.append(f"case {case_id}: arm {name} is {entry.status} but has timing rows; ignored")

    timed = {name: inputs.series[(case_id, name)] for name, e in arms.items() if e.status == TIMED}
    if control not in timed:
        warnings.append(_untimed_control_warning(case_id, control, arms[control].status))
    else:
        for name, times in timed.items():
            if name != control:
                arms[name] = _with_speedup(inputs, arms[name], timed[control], times, case_id, name)
    _case_warnings(inputs, case, arms, timed)
    arms = {name: with_throughput(entry, case, name, inputs.peaks) for name, entry in arms.items()}
    return SummaryCase(
        case=case_id,
        shape=case.get("shape"),
        layout=case.get("layout"),
        dtype=case.get("dtype"),
        bytes=case["bytes"],
        **({"flops": case["flops"]} if case.get("flops") is not None else {}),
        **_matched_copy(inputs.matched, int(case["bytes"])),
        floor_ns=floor,
        calls=case["calls"],
        rounds=case_rounds(inputs.plan, case),
        units_planned=planned_units(inputs.plan, case),
        injected_delay_ns=case.get("injected_delay_ns"),
        arms=arms,
    )


def _matched_copy(matched: dict[int, float], case_bytes: int) -> dict[str, float | None]:
    """A case's `matched_copy_gbps` (its traffic rounded down to even, as the runner copies it);
    unset, so not written, for a run without `copy_matched` rows."""
    return {"matched_copy_gbps": matched.get(case_bytes - case_bytes % 2)} if matched else {}


def _case_warnings(
    inputs: CaseInputs, case: dict[str, Any], arms: dict[str, ArmFigures], timed: dict[str, pd.Series]
) -> None:
    """The control's spread against the tie band, the rounds run and the units timed."""
    case_id, band = str(case["case"]), inputs.plan["tie_band"]
    spread = arms[inputs.control].spread if inputs.control in arms else None
    if spread is not None and spread > band:
        inputs.warnings.append(
            f"case {case_id}: control run-to-run spread {100 * spread:.1f}% exceeds the tie band {100 * band:g}%"
        )
    _check_rounds(inputs.plan, case_id, case_rounds(inputs.plan, case), inputs.warnings)
    units = planned_units(inputs.plan, case)
    short = [name for name, times in timed.items() if times.size < units]
    if short:
        inputs.warnings.append(
            f"case {case_id}: arm(s) {short} have fewer than the {units} planned (seed, round) units"
        )


def _untimed_control_warning(case_id: str, control: str, status: str) -> str:
    """No speedups in a case whose control has no usable times (its times may exist: implausible)."""
    state = f"is {status}" if status in (IMPLAUSIBLE, FAILED_WHILE_TIMED) else "was not timed"
    return f"case {case_id}: control {control} {state}; no speedups for this case"


def _check_rounds(plan: dict[str, Any], case_id: str, rounds: int, warnings: list[str]) -> None:
    """Rounds beyond the plan's are legitimate only when the preregistered noise rule added them."""
    planned = count(plan["rounds"])
    rule = plan.get("noise_rule") or {}
    if rounds < planned:
        warnings.append(f"case {case_id}: plan.json says {rounds} rounds, fewer than the planned {planned}")
    elif rounds > planned and rule.get("target_ci_width") is None:
        warnings.append(
            f"case {case_id}: {rounds} rounds run but only {planned} planned and no noise rule "
            "(target_ci_width) allows more"
        )
    elif rule.get("max_rounds") is not None and rounds > planned and rounds > int(rule["max_rounds"]):
        warnings.append(
            f"case {case_id}: {rounds} rounds run, more than the noise rule's max_rounds {rule['max_rounds']}"
        )


def aggregates_and_gate(
    cases: list[SummaryCase], plan: dict[str, Any], control: str, rule: stats.BootstrapRule, schema: SchemaV3
) -> tuple[dict[str, Aggregate], Gate]:
    """Each compared arm's figures over the cases, and the gate's verdict on it."""
    gate = gate_rule.parse_gate(plan["gate"])
    aggregates: dict[str, Aggregate] = {}
    verdicts: dict[str, GateArm] = {}
    for arm in plan["arms"]:
        name = arm["name"]
        if name == control or not arm["available"]:
            continue
        timed = [c for c in cases if c.arms[name].speedup is not None]
        agg = stats.aggregate_arm(
            [c.case for c in timed],
            [c.arms[name].speedup for c in timed],
            [c.arms[name].verdict for c in timed],
            rule,
        )
        aggregates[name] = _aggregate(agg, len(statuses(cases, name, FAILED)), schema.check_counts(name, cases, agg))
        result = schema.gate_verdict(gate, agg, name, cases)
        verdicts[name] = GateArm(passed=result.passed, reasons=result.reasons)
    passed = [name for name, v in verdicts.items() if v.passed]
    return aggregates, Gate(rule=gate.rule, arms=verdicts, passed_arms=passed)


def _aggregate(agg: stats.ArmAggregate, failed: int, counts: CheckCounts) -> Aggregate:
    ci = agg.geomean_ci
    return Aggregate(
        n_cases=agg.n_cases,
        geomean=agg.geomean,
        geomean_ci_low=ci.low if ci else None,
        geomean_ci_high=ci.high if ci else None,
        mean=agg.mean,
        worst=agg.worst,
        worst_case=agg.worst_case,
        wins=agg.wins,
        ties=agg.ties,
        losses=agg.losses,
        failed_correctness=failed,
        inconclusive=counts.inconclusive,
        failed_while_timed=counts.failed_while_timed,
        implausible=counts.implausible,
        ulp_hist=counts.ulp_hist,
    )
