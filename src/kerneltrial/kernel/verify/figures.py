"""The figures of each (case, arm) recomputed from timings.csv: status, median, bandwidth, speedup
and its bootstrap interval, verdict, spread; the run header, clocks and ceilings around them. The
speedups and verdicts they give feed calibration.py and gate.py, the medians throughput.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kerneltrial.kernel.verify.arithmetic import diff, median_of, percentile_ci, resample_indices, row_medians, spread
from kerneltrial.kernel.verify.calibration import check_calibration
from kerneltrial.kernel.verify.ceilings import (
    Limits,
    ceiling_median,
    check_floor,
    check_matched_copies,
    check_plausibility,
    check_triton_floor,
    limits_of,
)
from kerneltrial.kernel.verify.contract import FIGURE_FIELDS, Contract
from kerneltrial.kernel.verify.gate import FAILED_WHILE_TIMED, IMPLAUSIBLE, NOT_COMPARED, check_aggregates
from kerneltrial.kernel.verify.rows import Sample, TimedChecks, as_list, clock_threshold, is_throttled, rounds_of
from kerneltrial.kernel.verify.throughput import check_peak_memory, check_tflops
from kerneltrial.rundir.checks import VerifyResult

# correctness outcome of a (case, arm) -> its status in summary.json ("passed" without rows is "not timed")
STATUS_OF = {"passed": "timed", "failed": "failed correctness", "unchecked": "not timed", "unavailable": "unavailable"}
CLOCK_FIELDS = ("max_sm_mhz", "throttle_fraction", "threshold_mhz", "samples_with_clock", "throttled_samples")


@dataclass(frozen=True)
class ArmState:
    """What the raw rows say of one (case, arm): its status and the samples its figures come from."""

    status: str
    times: dict[tuple[int, int], float] | None = None  # per-call ns by unit: timed or implausible
    messages: list[str] | None = None  # failed while timed: the failing timed checks' messages
    reason: str | None = None  # implausible: why


def _arm_state(
    case: dict[str, Any],
    name: str,
    outcome: dict[tuple[str, str], str],
    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]],
    timed: TimedChecks | None,
    limits: Limits | None,
    under: dict[tuple[str, str], str],
) -> ArmState:
    case_id = str(case["case"])
    state = outcome.get((case_id, name), "unavailable")
    if state != "passed":
        return ArmState(STATUS_OF[state])
    failures = timed.failures(case_id, name) if timed else []
    if failures:
        return ArmState(FAILED_WHILE_TIMED, messages=failures)
    times = per_unit.get((case_id, name))
    if not times:
        return ArmState("not timed")
    if limits is not None:
        median = median_of(list(times.values()))
        reason = limits.reason(float(case["bytes"]) / median, median)
        if reason:
            return ArmState(IMPLAUSIBLE, times, reason=reason)
    if (case_id, name) in under:  # an isolated arm's claims below the harness's floor (verify/isolation.py)
        return ArmState(IMPLAUSIBLE, times, reason=under[(case_id, name)])
    return ArmState("timed", times)


def _first_failures(correctness: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """The first failed correctness check's message of each (case, arm), in file order."""
    first: dict[tuple[str, str], str] = {}
    for row in correctness:
        if row.get("passed") is not True:
            first.setdefault((str(row["case"]), row["arm"]), row.get("message") or "failed")
    return first


PerUnit = dict[tuple[str, str], dict[tuple[int, int], float]]  # (case, arm) -> (seed, round) -> ns per call


@dataclass
class Tally:
    """What the per-arm figures of every case hand to the checks after them (calibration, aggregates)."""

    speedups: dict[str, list[tuple[str, float, str]]] = field(default_factory=dict)  # arm -> (case, speedup, verdict)
    intervals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # arm -> (ci_low, ci_high)
    disqualified: dict[str, dict[str, list[tuple[str, str]]]] = field(
        default_factory=dict
    )  # arm -> status -> [(case, first reason)]
    medians: dict[tuple[str, str], float | None] = field(default_factory=dict)
    spread_warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FigureInputs:
    """What the figures of one (case, arm) are recomputed from."""

    plan: dict[str, Any]
    recorded_cases: dict[str, dict[str, Any]]  # summary.json cases by case id
    outcome: dict[tuple[str, str], str]
    per_unit: PerUnit
    throttled: dict[tuple[str, str], int]
    copy: float | None
    limits: Limits | None  # schema 4: the plausibility limits
    first_failure: dict[tuple[str, str], str]
    timed: TimedChecks | None
    contract: Contract
    control: str | None
    under: dict[tuple[str, str], str]  # isolated arms below the harness's floor: why (verify/isolation.py)


def check_figures(
    plan: dict[str, Any],
    summary: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    ceiling_rows: list[dict[str, str]],
    correctness: list[dict[str, Any]],
    result: VerifyResult,
    contract: Contract,
    timed: TimedChecks | None,
    under: dict[tuple[str, str], str] | None = None,
) -> None:
    """Every figure of summary.json: the run header, clocks, ceilings, each case's and arm's figures,
    then the calibration and the aggregates they feed."""
    control = _check_header(plan, summary, contract, result)
    per_unit, throttled = _per_unit(plan, samples)
    if contract.clocks:
        check_clocks(plan, summary, samples, result)
    copy = _check_ceilings(plan, summary, ceiling_rows, per_unit, contract, result)
    recorded_cases = {str(c.get("case")): c for c in summary.get("cases", [])}
    plan_cases = [str(c["case"]) for c in plan["cases"]]
    result.add(
        "summary cases",
        []
        if list(recorded_cases) == plan_cases
        else [f"summary cases {list(recorded_cases)} != plan cases {plan_cases}"],
        f"{len(plan_cases)} cases",
    )
    limits = limits_of(plan, ceiling_rows) if contract.checked else None
    inputs = FigureInputs(
        plan,
        recorded_cases,
        outcome,
        per_unit,
        throttled,
        copy,
        limits,
        _first_failures(correctness),
        timed,
        contract,
        control,
        under or {},
    )
    tally = Tally()
    for case in plan["cases"]:
        _check_case(inputs, case, tally, result)
    if contract.clocks:
        missing = [w for w in tally.spread_warnings if w not in summary.get("warnings", [])]
        result.add(
            "spread warnings",
            [f"summary warnings lack {w!r}" for w in missing],
            f"{len(tally.spread_warnings)} case(s) with control spread above the tie band, each warned",
        )
        medians = tally.medians if contract.realized else None
        check_calibration(plan, summary, tally.speedups, tally.intervals, medians, result, contract)
    check_aggregates(
        plan, summary, control, tally.speedups, tally.disqualified, correctness, plan["bootstrap"], result, contract
    )
    check_tflops(plan, summary, tally.medians, result)
    check_peak_memory(plan, summary, samples, tally.medians, result)


def _check_header(
    plan: dict[str, Any], summary: dict[str, Any], contract: Contract, result: VerifyResult
) -> str | None:
    """`run header`: backend, device, control (and schema 4's `exact`) as plan.json says; returns the control."""
    control = next((a["name"] for a in plan["arms"] if a["kind"] == "control"), None)
    header = {"backend": plan["backend"], "is_gpu": plan["is_gpu"], "control": control}
    if contract.checked:
        header["exact"] = plan.get("exact")
    result.add(
        "run header",
        diff("summary", summary, header, tuple(header))
        + (
            []
            if plan["is_gpu"] or "NOT GPU" in str(summary.get("label"))
            else [f"label {summary.get('label')!r} does not say NOT GPU for a non-GPU run"]
        ),
        f"backend {plan['backend']}, is_gpu {plan['is_gpu']}, control {control}",
    )
    return control


def _per_unit(plan: dict[str, Any], samples: list[Sample]) -> tuple[PerUnit, dict[tuple[str, str], int]]:
    """ns per call of each (case, arm) by (seed, round) unit, and how many of its samples were throttled."""
    per_unit: PerUnit = {}
    throttled: dict[tuple[str, str], int] = {}
    _, _, threshold = clock_threshold(plan)
    for s in samples:
        per_unit.setdefault((s.case, s.arm), {})[(s.seed, s.round)] = s.ns / s.calls
        throttled[(s.case, s.arm)] = throttled.get((s.case, s.arm), 0) + is_throttled(s, threshold)
    return per_unit, throttled


def _check_ceilings(
    plan: dict[str, Any],
    summary: dict[str, Any],
    ceiling_rows: list[dict[str, str]],
    per_unit: PerUnit,
    contract: Contract,
    result: VerifyResult,
) -> float | None:
    """`ceilings` and the checks read from ceilings.csv (launch floors, copies, the speed-of-light
    floor, schema 4's plausibility); returns the copy ceiling, GB/s."""
    copy = ceiling_median(ceiling_rows, "copy")
    recorded_ceilings = summary.get("ceilings", {})
    result.add(
        "ceilings",
        diff(
            "ceilings",
            recorded_ceilings,
            {"copy_gbps": copy, "read_gbps": ceiling_median(ceiling_rows, "read")},
            ("copy_gbps", "read_gbps"),
        ),
        f"copy {copy} GB/s median",
    )
    check_triton_floor(recorded_ceilings, ceiling_rows, result)
    check_matched_copies(plan, summary, ceiling_rows, result)
    check_floor(plan, summary, ceiling_rows, per_unit, contract, result)
    if contract.checked:
        check_plausibility(plan, summary, ceiling_rows, result)
    return copy


def _check_case(inputs: FigureInputs, case: dict[str, Any], tally: Tally, result: VerifyResult) -> None:
    """A case's header (schema 2 on) and the figures of each of its arms."""
    plan, case_id = inputs.plan, str(case["case"])
    if inputs.contract.clocks:
        n_rounds = len(rounds_of(plan, case))
        result.add(
            f"case header case={case_id}",
            diff(
                f"case {case_id}",
                inputs.recorded_cases.get(case_id, {}),
                {
                    "rounds": n_rounds,
                    "units_planned": n_rounds * len(as_list(plan["seeds"])),
                    "injected_delay_ns": case.get("injected_delay_ns"),
                },
                ("rounds", "units_planned", "injected_delay_ns"),
            ),
            f"{n_rounds} rounds",
        )
    states = {
        a["name"]: _arm_state(
            case, a["name"], inputs.outcome, inputs.per_unit, inputs.timed, inputs.limits, inputs.under
        )
        for a in plan["arms"]
    }
    for arm in plan["arms"]:
        _check_arm(inputs, case, arm["name"], states, tally, result)


def _check_arm(
    inputs: FigureInputs,
    case: dict[str, Any],
    name: str,
    states: dict[str, ArmState],
    tally: Tally,
    result: VerifyResult,
) -> None:
    """One arm's figures in one case against the summary; what they give is added to `tally`."""
    case_id, control, state = str(case["case"]), inputs.control, states[name]
    control_times = states[control].times if control in states and states[control].status == "timed" else None
    band, bootstrap = float(inputs.plan["tie_band"]), inputs.plan["bootstrap"]
    first = {
        "failed correctness": inputs.first_failure.get((case_id, name)),
        IMPLAUSIBLE: state.reason,
        FAILED_WHILE_TIMED: (state.messages or [None])[0],
    }
    if state.status in first:
        tally.disqualified.setdefault(name, {}).setdefault(state.status, []).append((case_id, str(first[state.status])))
    compared = control_times if name != control and state.status == "timed" else None
    figures = _arm_figures(case, state.times, compared, inputs.copy, bootstrap, band, inputs.contract)
    if inputs.contract.checked and name != control and state.status == "timed" and figures["speedup"] is None:
        control_status = states[control].status if control in states else "absent"
        tally.disqualified.setdefault(name, {}).setdefault(NOT_COMPARED, []).append(
            (case_id, f"no verdict against the control (control: {control_status})")
        )
    figures["throttled_samples"] = inputs.throttled.get((case_id, name), 0) if state.times else 0
    figures["spread"] = spread(list(state.times.values())) if state.times else None
    tally.medians[(case_id, name)] = figures["median_ns_per_call"]
    if figures["speedup"] is not None:
        tally.speedups.setdefault(name, []).append((case_id, figures["speedup"], figures["verdict"]))
        tally.intervals.setdefault(name, []).append((figures["ci_low"], figures["ci_high"]))
    if name == control and figures["spread"] is not None and figures["spread"] > band:
        tally.spread_warnings.append(
            f"case {case_id}: control run-to-run spread {100 * figures['spread']:.1f}% "
            f"exceeds the tie band {100 * band:g}%"
        )
    recorded = inputs.recorded_cases.get(case_id, {}).get("arms", {})
    result.add(
        f"figures case={case_id} arm={name}",
        _entry_problems(
            f"case {case_id} arm {name}", recorded.get(name, {}), figures, state, inputs.contract.figure_fields
        ),
        _describe(figures, state.status),
    )


def check_clocks(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], result: VerifyResult) -> None:
    top, fraction, threshold = clock_threshold(plan)
    flagged = sum(is_throttled(s, threshold) for s in samples)
    figures = {
        "max_sm_mhz": top,
        "throttle_fraction": fraction,
        "threshold_mhz": threshold,
        "samples_with_clock": sum(s.sm_mhz is not None for s in samples),
        "throttled_samples": flagged,
    }
    problems = diff("clocks", summary.get("clocks") or {}, figures, CLOCK_FIELDS)
    if flagged and not any(
        w.startswith(f"{flagged} of {len(samples)} timing samples were throttled") and f"{threshold:g} MHz" in w
        for w in summary.get("warnings", [])
    ):
        problems.append(
            f"summary warnings do not say {flagged} of {len(samples)} samples were throttled below {threshold:g} MHz"
        )
    result.add(
        "clocks",
        problems,
        f"{figures['samples_with_clock']} samples with a clock reading, {flagged} "
        f"throttled (threshold {threshold} MHz)",
    )


def _entry_problems(
    where: str, entry: dict[str, Any], figures: dict[str, Any], state: ArmState, fields: tuple[str, ...]
) -> list[str]:
    problems = diff(where, entry, figures, fields)
    if entry.get("status") != state.status:
        problems.append(f"{where} status: summary {entry.get('status')!r} != {state.status!r}")
    if state.reason is not None and entry.get("reason") != state.reason:
        problems.append(f"{where} reason: summary {entry.get('reason')!r} != recomputed {state.reason!r}")
    if state.messages is not None and entry.get("messages") != state.messages:
        problems.append(
            f"{where} messages: summary {entry.get('messages')!r} != the failed timed checks' {state.messages!r}"
        )
    return problems


def _describe(figures: dict[str, Any], status: str) -> str:
    if figures["speedup"] is not None:
        return (
            f"speedup {figures['speedup']:.4f} [{figures['ci_low']:.4f}, {figures['ci_high']:.4f}] {figures['verdict']}"
        )
    if figures["median_ns_per_call"] is not None:
        return f"{status}, median {figures['median_ns_per_call']:.1f} ns/call"
    return status


def _arm_figures(
    case: dict[str, Any],
    times: dict[tuple[int, int], float] | None,
    control_times: dict[tuple[int, int], float] | None,
    copy: float | None,
    bootstrap: dict[str, Any],
    band: float,
    contract: Contract,
) -> dict[str, Any]:
    figures: dict[str, Any] = dict.fromkeys(FIGURE_FIELDS)
    figures.update(n_samples=0, throttled_samples=0)
    if not times:
        return figures
    med = median_of(list(times.values()))
    figures.update(median_ns_per_call=med, n_samples=len(times), gbps=float(case["bytes"]) / med)
    if copy is not None:
        figures["pct_of_copy_ceiling"] = 100.0 * figures["gbps"] / copy
    if control_times:
        units = sorted(set(times) & set(control_times))
        figures["ci_units"] = len(units)
        if units:
            figures["speedup"] = median_of(list(control_times.values())) / med
            c = np.array([control_times[u] for u in units])
            a = np.array([times[u] for u in units])
            idx = resample_indices(int(bootstrap["seed"]), int(bootstrap["resamples"]), len(units))
            low, high = percentile_ci(row_medians(c[idx]) / row_medians(a[idx]), float(bootstrap["confidence"]))
            figures.update(ci_low=low, ci_high=high, verdict=contract.verdict(low, high, band))
    return figures
