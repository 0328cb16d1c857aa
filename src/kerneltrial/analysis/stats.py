"""Statistics for kernel trials: pure functions, no file access.

Every rule here is the one written in docs/DESIGN.md ("Run directory: exact format",
Statistics). `analysis/verify.py` re-implements the same rules independently, so any
change here must be a change to the contract first.

Units: a per-sample time is `ns / calls` (nanoseconds per call); GB/s is bytes per
nanosecond (1e9 bytes / 1e9 ns), so `gbps = bytes / ns_per_call`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import gmean

WIN, TIE, LOSS = "win", "tie", "loss"


@dataclass(frozen=True)
class BootstrapRule:
    """The preregistered bootstrap parameters (plan.json `bootstrap`)."""

    resamples: int
    seed: int
    confidence: float


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class ArmAggregate:
    """Summary of one arm's speedups over the cases where it was timed against the control."""

    n_cases: int
    geomean: float | None
    geomean_ci: Interval | None
    mean: float | None
    worst: float | None
    worst_case: str | None
    wins: int
    ties: int
    losses: int


@dataclass(frozen=True)
class Gate:
    """A parsed gate rule: `no_loss`, `geomean>=X`, or both joined by ` and `."""

    rule: str
    no_loss: bool
    min_geomean: float | None


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    reasons: list[str]


def median(values: Sequence[float] | np.ndarray) -> float:
    """Median of per-call times (numpy's definition: mean of the two middle values when even)."""
    if len(values) == 0:
        raise ValueError("median of no samples: the (case, arm) has no timing rows")
    return float(np.median(np.asarray(values, dtype=float)))


def speedup(control_median: float, arm_median: float) -> float:
    """Speedup of an arm over the control: median(control) / median(arm); >1 means faster."""
    return control_median / arm_median


def _percentile_interval(stats: np.ndarray, confidence: float) -> Interval:
    low, high = np.quantile(stats, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(float(low), float(high))


def bootstrap_speedup_ci(control: np.ndarray, arm: np.ndarray, rule: BootstrapRule) -> Interval:
    """Paired percentile bootstrap CI of median(control) / median(arm).

    `control[i]` and `arm[i]` are the per-call times of the same (seed, round) unit, units
    sorted by (seed, round). A fresh generator seeded with `rule.seed` draws the resample
    indices, so the CI is reproducible from the raw rows alone.
    """
    control = np.asarray(control, dtype=float)
    arm = np.asarray(arm, dtype=float)
    if control.shape != arm.shape or control.ndim != 1 or control.size == 0:
        raise ValueError(
            f"paired bootstrap needs two equal-length, non-empty 1-D arrays; got shapes {control.shape} and {arm.shape}"
        )
    n = control.size
    rng = np.random.default_rng(rule.seed)
    idx = rng.integers(0, n, size=(rule.resamples, n))
    ratios = np.median(control[idx], axis=1) / np.median(arm[idx], axis=1)
    return _percentile_interval(ratios, rule.confidence)


def verdict(ci: Interval, tie_band: float) -> str:
    """`win` if the CI lies wholly above 1 + tie_band, `loss` if wholly below 1 - tie_band, else `tie`."""
    if ci.low > 1 + tie_band:
        return WIN
    if ci.high < 1 - tie_band:
        return LOSS
    return TIE


def gbps(bytes_per_call: float, ns_per_call: float) -> float:
    """Achieved bandwidth in GB/s (bytes per nanosecond)."""
    return bytes_per_call / ns_per_call


def ceiling_gbps(bytes_per_sample: Sequence[float], ns_per_sample: Sequence[float]) -> float | None:
    """A bandwidth ceiling: the median of per-sample GB/s; None when there are no samples."""
    if len(ns_per_sample) == 0:
        return None
    rates = np.asarray(bytes_per_sample, dtype=float) / np.asarray(ns_per_sample, dtype=float)
    return float(np.median(rates))


def pct_of_ceiling(achieved_gbps: float, ceiling: float) -> float:
    return 100.0 * achieved_gbps / ceiling


def geomean_ci(speedups: Sequence[float], rule: BootstrapRule) -> Interval:
    """Percentile bootstrap CI of the geometric mean, resampling cases.

    Same rng rule as the per-case CI: `idx = default_rng(seed).integers(0, k, (resamples, k))`;
    each resample's geometric mean is exp(mean(log speedup[idx])); the CI is taken on those.
    """
    logs = np.log(np.asarray(speedups, dtype=float))
    k = logs.size
    rng = np.random.default_rng(rule.seed)
    idx = rng.integers(0, k, size=(rule.resamples, k))
    return _percentile_interval(np.exp(logs[idx].mean(axis=1)), rule.confidence)


def aggregate_arm(
    cases: Sequence[str], speedups: Sequence[float], verdicts: Sequence[str], rule: BootstrapRule
) -> ArmAggregate:
    """Geometric mean (with CI), arithmetic mean, worst case and verdict counts of one arm.

    The three sequences are aligned: one entry per case in which the arm has a speedup.
    """
    if not (len(cases) == len(speedups) == len(verdicts)):
        raise ValueError("cases, speedups and verdicts must be aligned (same length)")
    counts = {v: list(verdicts).count(v) for v in (WIN, TIE, LOSS)}
    if not speedups:
        return ArmAggregate(0, None, None, None, None, None, counts[WIN], counts[TIE], counts[LOSS])
    worst_index = int(np.argmin(speedups))
    return ArmAggregate(
        n_cases=len(speedups),
        geomean=float(gmean(np.asarray(speedups, dtype=float))),
        geomean_ci=geomean_ci(speedups, rule),
        mean=float(np.mean(speedups)),
        worst=float(speedups[worst_index]),
        worst_case=cases[worst_index],
        wins=counts[WIN],
        ties=counts[TIE],
        losses=counts[LOSS],
    )


_GEOMEAN_TERM = re.compile(r"geomean>=(\d+(?:\.\d+)?)")


def parse_gate(rule: str) -> Gate:
    """Parse a preregistered gate: `no_loss`, `geomean>=X`, or both joined by ` and `."""
    fix = "use 'no_loss', 'geomean>=X' (e.g. 'geomean>=1.02'), or both joined by ' and '"
    no_loss = False
    min_geomean: float | None = None
    terms = [term.strip() for term in rule.split(" and ")]
    if len(terms) != len(set(terms)):
        raise ValueError(f"gate {rule!r} repeats a term; {fix}")
    for term in terms:
        match = _GEOMEAN_TERM.fullmatch(term)
        if term == "no_loss":
            no_loss = True
        elif match and min_geomean is None and float(match.group(1)) > 0:
            min_geomean = float(match.group(1))
        else:
            raise ValueError(f"unknown gate term {term!r} in gate {rule!r}; {fix}")
    return Gate(rule=rule, no_loss=no_loss, min_geomean=min_geomean)


def gate_verdict(gate: Gate, aggregate: ArmAggregate, failed_correctness_cases: int) -> GateVerdict:
    """Apply the gate to one arm. An arm that failed correctness in any case fails the gate."""
    reasons: list[str] = []
    if failed_correctness_cases:
        reasons.append(f"failed correctness in {failed_correctness_cases} case(s)")
    if gate.no_loss and aggregate.losses:
        reasons.append(f"no_loss: {aggregate.losses} loss(es)")
    if gate.min_geomean is not None:
        if aggregate.geomean is None:
            reasons.append(f"geomean>={gate.min_geomean:g}: no case timed against the control")
        elif not aggregate.geomean >= gate.min_geomean:
            reasons.append(f"geomean>={gate.min_geomean:g}: geomean is {aggregate.geomean:.4f}")
    return GateVerdict(passed=not reasons, reasons=reasons)


# ---------------------------------------------------------------- noise: clocks, spread, calibration

AA_PREFIX, SLOW_PREFIX = "aa:", "slow:"
CALIBRATION_DEFAULTS = {"injected_slowdown": 0.03, "max_false_positive_rate": 0.05, "min_power": 0.9}
NOMINAL_FACTOR = 1.5  # a slowed case counts toward power at nominal when realized <= this x injected_slowdown


def relative_spread(values: Sequence[float] | np.ndarray) -> float:
    """Run-to-run spread of per-sample times: (p90 - p10) / median, numpy's default quantiles."""
    if len(values) == 0:
        raise ValueError("spread of no samples: the (case, arm) has no timing rows")
    array = np.asarray(values, dtype=float)
    p10, p90 = np.quantile(array, [0.1, 0.9])
    return float((p90 - p10) / np.median(array))


def throttle_threshold(max_sm_mhz: float | None, throttle_fraction: float) -> float | None:
    """SM clock (MHz) below which a sample counts as throttled; None when the maximum is unknown."""
    return None if max_sm_mhz is None else throttle_fraction * max_sm_mhz


def is_throttled(sm_mhz: float | None, threshold_mhz: float | None) -> bool:
    """A sample is throttled when its SM clock is known and strictly below the threshold."""
    return sm_mhz is not None and threshold_mhz is not None and sm_mhz < threshold_mhz


def calibration_base(arm: str) -> tuple[str, str] | None:
    """('aa' or 'slow', base arm) for a calibration arm name, else None."""
    for prefix in (AA_PREFIX, SLOW_PREFIX):
        if arm.startswith(prefix):
            return prefix[:-1], arm[len(prefix):]
    return None


@dataclass(frozen=True)
class AACalibration:
    """An A/A arm over the cases where it has a verdict against the control."""

    n_cases: int
    not_tie: int
    false_positive_rate: float | None  # not_tie / n_cases
    mean_ci_width: float | None  # mean of (ci_high - ci_low)


@dataclass(frozen=True)
class SlowCalibration:
    """A slowed arm over the cases where it has a verdict against the control.

    The injected delay is a separate kernel launch, so the slowdown it really causes (the
    realized slowdown, median(slow) / median(base) - 1) can be much larger than nominal.
    `power_at_nominal` counts only the cases realized at most NOMINAL_FACTOR x nominal.
    """

    n_cases: int
    losses: int
    power: float | None  # losses / n_cases
    realized_min: float | None = None
    realized_max: float | None = None
    nominal_cases: int = 0  # cases whose realized slowdown <= NOMINAL_FACTOR x injected_slowdown
    power_at_nominal: float | None = None  # losses among those / nominal_cases


def aa_calibration(verdicts: Sequence[str], cis: Sequence[Interval]) -> AACalibration:
    if len(verdicts) != len(cis):
        raise ValueError("verdicts and CIs must be aligned (same length)")
    n = len(verdicts)
    not_tie = sum(v != TIE for v in verdicts)
    if not n:
        return AACalibration(0, 0, None, None)
    return AACalibration(n, not_tie, not_tie / n, float(np.mean([ci.high - ci.low for ci in cis])))


def realized_slowdown(arm_median: float, base_median: float) -> float:
    """The slowdown a slowed arm really had in a case: median(slow) / median(base) - 1."""
    return arm_median / base_median - 1


def slow_calibration(verdicts: Sequence[str], realized: Sequence[float | None] | None = None,
                     injected_slowdown: float = CALIBRATION_DEFAULTS["injected_slowdown"]) -> SlowCalibration:
    """Power over all compared cases, and over the cases realized near the nominal slowdown.

    `realized` is aligned with `verdicts` (None where the base arm has no median).
    """
    realized = [None] * len(verdicts) if realized is None else list(realized)
    if len(realized) != len(verdicts):
        raise ValueError("verdicts and realized slowdowns must be aligned (same length)")
    n = len(verdicts)
    losses = sum(v == LOSS for v in verdicts)
    known = [r for r in realized if r is not None]
    near = [v for v, r in zip(verdicts, realized) if r is not None and r <= NOMINAL_FACTOR * injected_slowdown]
    return SlowCalibration(
        n, losses, losses / n if n else None,
        realized_min=min(known) if known else None, realized_max=max(known) if known else None,
        nominal_cases=len(near), power_at_nominal=sum(v == LOSS for v in near) / len(near) if near else None,
    )


def calibration_passed(
    aa: Sequence[AACalibration], slow: Sequence[SlowCalibration], max_false_positive_rate: float, min_power: float
) -> bool:
    """Every A/A arm's false-positive rate <= the maximum and every slowed arm's power >= the minimum.

    An arm with no compared case has no rate and fails; no calibration arm at all fails too.
    """
    if not aa and not slow:
        return False
    return all(a.false_positive_rate is not None and a.false_positive_rate <= max_false_positive_rate for a in aa) \
        and all(s.power is not None and s.power >= min_power for s in slow)
