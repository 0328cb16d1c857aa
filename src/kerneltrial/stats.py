"""Statistics for kernel trials: pure functions, no file access.

Every rule here is the one written in docs/VERIFY.md ("Statistics"). `kernel/verify/` re-implements
the same rules independently, so any
change here must be a change to the contract first.

Units: a per-sample time is `ns / calls` (nanoseconds per call); GB/s is bytes per
nanosecond (1e9 bytes / 1e9 ns), so `gbps = bytes / ns_per_call`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.stats import gmean

from kerneltrial.gate_rule import Gate

WIN, TIE, LOSS, INCONCLUSIVE = "win", "tie", "loss", "inconclusive"


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
    inconclusive: int = 0  # always 0 under the summary/1-3 verdict rule


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


def bootstrap_ratio_ci(a: np.ndarray, b: np.ndarray, rule: BootstrapRule) -> Interval:
    """Unpaired percentile bootstrap CI of median(a) / median(b): `a` and `b` are per-call times
    of one (case, arm) in two runs, which share no unit, so each is resampled on its own; a fresh
    generator seeded with `rule.seed` draws the indices (reproducible from the raw rows)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or b.ndim != 1 or a.size == 0 or b.size == 0:
        raise ValueError(f"an unpaired bootstrap needs two non-empty 1-D arrays; got shapes {a.shape} and {b.shape}")
    rng = np.random.default_rng(rule.seed)
    index_a = rng.integers(0, a.size, size=(rule.resamples, a.size))
    index_b = rng.integers(0, b.size, size=(rule.resamples, b.size))
    ratios = np.median(a[index_a], axis=1) / np.median(b[index_b], axis=1)
    return _percentile_interval(ratios, rule.confidence)


def three_way_verdict(ci: Interval, tie_band: float) -> str:
    """The summary/1-3 rule: `win` if the CI lies wholly above 1 + tie_band, `loss` if wholly
    below 1 - tie_band, else `tie` (a CI straddling a band edge was called a tie)."""
    if ci.low > 1 + tie_band:
        return WIN
    if ci.high < 1 - tie_band:
        return LOSS
    return TIE


def verdict(ci: Interval, tie_band: float) -> str:
    """The summary/4 rule: `win` and `loss` as before; `tie` only when the CI lies inside
    [1 - tie_band, 1 + tie_band]; a CI that straddles a band edge is `inconclusive`."""
    called = three_way_verdict(ci, tie_band)
    if called == TIE and not (1 - tie_band <= ci.low and ci.high <= 1 + tie_band):
        return INCONCLUSIVE
    return called


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
    counts = {v: list(verdicts).count(v) for v in (WIN, TIE, LOSS, INCONCLUSIVE)}
    if not speedups:
        return ArmAggregate(
            0, None, None, None, None, None, counts[WIN], counts[TIE], counts[LOSS], counts[INCONCLUSIVE]
        )
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
        inconclusive=counts[INCONCLUSIVE],
    )


@dataclass(frozen=True)
class Disqualification:
    """The cases (in plan order) in which an arm was disqualified for one cause, with the first one's reason."""

    cause: str  # "failed correctness", "failed while timed" or "implausible"
    cases: tuple[str, ...]
    first_reason: str

    def reason(self) -> str:
        """E.g. `implausible in 2 case(s) (first: 1x64/contiguous/bfloat16: implausible: ...)`."""
        return f"{self.cause} in {len(self.cases)} case(s) (first: {self.cases[0]}: {self.first_reason})"


def gate_verdict(gate: Gate, aggregate: ArmAggregate, failed_correctness_cases: int) -> GateVerdict:
    """The summary/1-3 gate. An arm that failed correctness in any case fails the gate."""
    reasons: list[str] = []
    if failed_correctness_cases:
        reasons.append(f"failed correctness in {failed_correctness_cases} case(s)")
    reasons += _rule_reasons(gate, aggregate)
    return GateVerdict(passed=not reasons, reasons=reasons)


def gate_verdict_v4(gate: Gate, aggregate: ArmAggregate, disqualified: Sequence[Disqualification]) -> GateVerdict:
    """The summary/4 gate: an arm disqualified in any case (failed correctness, failed while
    timed, implausible) fails it, each cause named with its count and first case; then the rule."""
    reasons = [d.reason() for d in disqualified if d.cases] + _rule_reasons(gate, aggregate)
    return GateVerdict(passed=not reasons, reasons=reasons)


def _rule_reasons(gate: Gate, aggregate: ArmAggregate) -> list[str]:
    """Why an arm fails the gate's own terms (`no_loss` counts losses only, never inconclusive verdicts)."""
    reasons: list[str] = []
    if gate.no_loss and aggregate.losses:
        reasons.append(f"no_loss: {aggregate.losses} loss(es)")
    if gate.min_geomean is not None:
        if aggregate.geomean is None:
            reasons.append(f"geomean>={gate.min_geomean:g}: no case timed against the control")
        elif not aggregate.geomean >= gate.min_geomean:
            reasons.append(f"geomean>={gate.min_geomean:g}: geomean is {aggregate.geomean:.4f}")
    return reasons


# ---------------------------------------------------------------- plausibility (summary/4)


@dataclass(frozen=True)
class PlausibilityLimits:
    """The limits beyond which a median cannot be real work (docs/VERIFY.md, "Statistics").

    None where a limit does not apply: not a CUDA-events GPU run, L2 hot (a hot L2 may beat
    the DRAM ceiling honestly) or no ceiling measured, no launch samples.
    """

    bandwidth_margin: float  # plan.json plausibility.bandwidth_margin
    launch_floor_fraction: float  # plan.json plausibility.launch_floor_fraction
    ceiling_gbps: float | None  # max(copy, read) ceiling of the run
    launch_floor_ns: float | None  # median of the run's empty-kernel launches

    @property
    def bandwidth_limit_gbps(self) -> float | None:
        return None if self.ceiling_gbps is None else self.ceiling_gbps * (1 + self.bandwidth_margin)

    @property
    def time_limit_ns(self) -> float | None:
        return None if self.launch_floor_ns is None else self.launch_floor_fraction * self.launch_floor_ns


def ratio_interval(numerator: Interval, denominator: Interval) -> Interval:
    """An interval for a / b from one interval for a and one for b: [a.low / b.high, a.high / b.low].
    It holds whenever both do, so two intervals at confidence c give one at >= 1 - 2(1 - c)
    (Bonferroni), whatever their dependence (two speedups over the same control are dependent)."""
    if not (numerator.low > 0 and denominator.low > 0):
        raise ValueError(f"a ratio interval needs positive bounds, got {numerator} / {denominator}")
    return Interval(numerator.low / denominator.high, numerator.high / denominator.low)


def geomean_interval(intervals: Sequence[Interval]) -> Interval:
    """An interval for the geometric mean of n quantities from one interval each: the geomean of the
    lower bounds and of the upper bounds. The geomean is increasing in every quantity, so the
    interval contains it whenever every per-quantity interval contains its quantity: no
    independence assumed, and wider than a joint interval would be (the noise of n cases partly
    cancels in their geomean; here it is taken at its worst in every case at once)."""
    if not intervals:
        raise ValueError("the geomean interval of no intervals is undefined; pass at least one")
    return Interval(
        float(gmean([i.low for i in intervals])),
        float(gmean([i.high for i in intervals])),
    )


def launch_floor(ns_per_launch: Sequence[float]) -> float | None:
    """The launch floor: median ns of one empty-kernel call (ceilings.csv `launch` rows); None without rows."""
    return None if len(ns_per_launch) == 0 else median(ns_per_launch)


def bandwidth_implausibility(achieved_gbps: float, limits: PlausibilityLimits) -> str | None:
    """The reason an arm's bandwidth cannot be real work, or None when it is within the limit."""
    limit, ceiling = limits.bandwidth_limit_gbps, limits.ceiling_gbps
    if limit is None or ceiling is None or not achieved_gbps > limit:
        return None
    return (
        f"implausible: {achieved_gbps:.0f} GB/s is {100 * achieved_gbps / ceiling:.0f}% of the best ceiling "
        f"measured in this run ({ceiling:.0f} GB/s); more than {100 * limits.bandwidth_margin:g}% above it "
        "cannot be real work"
    )


def launch_floor_implausibility(median_ns: float, limits: PlausibilityLimits) -> str | None:
    """The reason an arm's time per call cannot be real work, or None when it is above the limit."""
    limit, floor = limits.time_limit_ns, limits.launch_floor_ns
    if limit is None or floor is None or not median_ns < limit:
        return None
    return (
        f"implausible: {median_ns:.0f} ns per call is below {limits.launch_floor_fraction:g} x the launch floor "
        f"measured in this run ({floor:.0f} ns): no kernel can run that fast"
    )


def implausibility(achieved_gbps: float, median_ns: float, limits: PlausibilityLimits) -> str | None:
    """Every reason an arm's figures cannot be real work, joined with '; ' (bandwidth first); None if plausible."""
    reasons = [
        r
        for r in (bandwidth_implausibility(achieved_gbps, limits), launch_floor_implausibility(median_ns, limits))
        if r is not None
    ]
    return "; ".join(reasons) or None


ULP_BINS = ("0", "(0, 1]", "(1, 2]", "(2, 4]", "(4, 16]", ">16")  # correctness.jsonl `ulp_hist` bins


def ulp_hist_sum(hists: Sequence[Sequence[int] | None]) -> list[int] | None:
    """Element-wise sum of correctness rows' `ulp_hist` (rows without one skipped); None when none has one."""
    present = [list(h) for h in hists if h is not None]
    if not present:
        return None
    wrong = [h for h in present if len(h) != len(ULP_BINS)]
    if wrong:
        raise ValueError(
            f"ulp_hist {wrong[0]} has {len(wrong[0])} bins; the contract has {len(ULP_BINS)}: "
            f"{', '.join(ULP_BINS)} ulps"
        )
    return [int(sum(column)) for column in zip(*present, strict=True)]


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
            return prefix[:-1], arm[len(prefix) :]
    return None


@dataclass(frozen=True)
class AACalibration:
    """An A/A arm over the cases where it has a verdict against the control.

    A false positive is a win or a loss: a difference claimed between an arm and its copy.
    Under the summary/4 verdict a CI straddling a band edge is `inconclusive`, which claims
    nothing, so it is counted apart (summary/1-3 wrote `not_tie`, which equals `false_positives`
    there: their verdicts are win, tie or loss).
    """

    n_cases: int
    false_positives: int
    false_positive_rate: float | None  # false_positives / n_cases
    mean_ci_width: float | None  # mean of (ci_high - ci_low)
    inconclusive: int = 0


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
    claimed = sum(v in (WIN, LOSS) for v in verdicts)
    inconclusive = sum(v == INCONCLUSIVE for v in verdicts)
    if not n:
        return AACalibration(0, 0, None, None)
    return AACalibration(n, claimed, claimed / n, float(np.mean([ci.high - ci.low for ci in cis])), inconclusive)


def realized_slowdown(arm_median: float, base_median: float) -> float:
    """The slowdown a slowed arm really had in a case: median(slow) / median(base) - 1."""
    return arm_median / base_median - 1


def slow_calibration(
    verdicts: Sequence[str],
    realized: Sequence[float | None] | None = None,
    injected_slowdown: float = CALIBRATION_DEFAULTS["injected_slowdown"],
) -> SlowCalibration:
    """Power over all compared cases, and over the cases realized near the nominal slowdown.

    `realized` is aligned with `verdicts` (None where the base arm has no median).
    """
    realized = [None] * len(verdicts) if realized is None else list(realized)
    if len(realized) != len(verdicts):
        raise ValueError("verdicts and realized slowdowns must be aligned (same length)")
    n = len(verdicts)
    losses = sum(v == LOSS for v in verdicts)
    known = [r for r in realized if r is not None]
    near = [
        v for v, r in zip(verdicts, realized, strict=True) if r is not None and r <= NOMINAL_FACTOR * injected_slowdown
    ]
    return SlowCalibration(
        n,
        losses,
        losses / n if n else None,
        realized_min=min(known) if known else None,
        realized_max=max(known) if known else None,
        nominal_cases=len(near),
        power_at_nominal=sum(v == LOSS for v in near) / len(near) if near else None,
    )


def calibration_passed(
    aa: Sequence[AACalibration], slow: Sequence[SlowCalibration], max_false_positive_rate: float, min_power: float
) -> bool:
    """Every A/A arm's false-positive rate <= the maximum and every slowed arm's power >= the minimum.

    An arm with no compared case has no rate and fails; no calibration arm at all fails too.
    """
    if not aa and not slow:
        return False
    return all(
        a.false_positive_rate is not None and a.false_positive_rate <= max_false_positive_rate for a in aa
    ) and all(s.power is not None and s.power >= min_power for s in slow)


# --- paired ratios over a few units (serving launches, model-trial rounds) ---------------


@dataclass(frozen=True)
class Ratio:
    """A paired ratio over n rounds: the geometric mean of per-round ratios and its t interval
    (None below two rounds)."""

    estimate: float
    interval: Interval | None
    n: int


def t_half_width(values: Sequence[float], confidence: float) -> float | None:
    """Half-width of the Student-t interval of the mean of `values` (None below two values)."""
    n = len(values)
    if n < 2:
        return None
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)


def paired_ratio(num: Sequence[float], den: Sequence[float], confidence: float) -> Ratio:
    """The ratio num/den over aligned rounds, on the log scale (see the module docstring)."""
    if len(num) != len(den) or not num:
        raise ValueError(f"paired ratio needs aligned, non-empty rounds; got {len(num)} and {len(den)} values")
    bad = [v for v in (*num, *den) if not v > 0]
    if bad:
        raise ValueError(f"a ratio of figures needs positive figures, got {bad[0]}")
    logs = [math.log(a / b) for a, b in zip(num, den, strict=True)]
    mean = math.fsum(logs) / len(logs)
    half = t_half_width(logs, confidence)
    interval = None if half is None else Interval(math.exp(mean - half), math.exp(mean + half))
    return Ratio(math.exp(mean), interval, len(logs))
