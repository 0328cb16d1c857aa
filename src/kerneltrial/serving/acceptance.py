"""The acceptance rule of a serving trial, written once: the trial's verdict, the report and
verify all call these pure functions (no file access).

Launches are the unit. Per arm and case, the figure of one launch is the mean over its kept
runs (the warm-up rule). Every round launches every arm once (launch order: counterbalanced
reversed-pair blocks, `order.launch_order`), so a round pairs the arms. Per round r the log
ratio d_r = ln(arm_r / against_r) of total tok/s and of mean TTFT; over the n rounds both arms
ran, the estimate is exp(mean d) (the geometric mean of the per-round ratios) and the interval
exp(mean d -+ t_{(1+c)/2, n-1} sd(d) / sqrt(n)) (Student t on the paired log ratios).

Why this interval, for the 2-6 launches per arm a serving trial affords: launch-to-launch noise
is multiplicative (a slow host slows every request), so ratios are judged on the log scale where
it is additive and the interval for the inverse ratio (labels swapped) is the inverse interval;
pairing by round removes what the arms share in a round (drift, host load) and the blocks
(A B then B A) cancel a linear drift from the mean; the t interval is exact for normal log ratios
and honest about its few degrees of freedom (t = 12.7 at n = 2), where a bootstrap over 2-6
launches has a handful of distinct resamples and is far too narrow (kernel trials use a bootstrap
over hundreds of (seed, round) units: stats.py). A candidate is accepted only when, in
every case, the gain's lower bound exceeds the noise band and the TTFT ratio's upper bound is at
most ttft_ratio_max (each a one-sided test at (1 - confidence) / 2; requiring every case is an
intersection-union test, no multiplicity correction is needed), the accuracy gate passed (when
set) and no dispatch proof of the two arms is invalid. With fewer than MIN_ROUNDS paired rounds
there is no interval and the verdict is INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kerneltrial.stats import Ratio, paired_ratio

ACCEPTED, REJECTED, INCONCLUSIVE = "ACCEPTED", "REJECTED", "INCONCLUSIVE"
MIN_ROUNDS = 2  # paired rounds (launches per arm) for an interval: one degree of freedom
METHOD = "paired Student-t interval on per-round log ratios (launches as the unit)"


@dataclass(frozen=True)
class Rule:
    """The protocol's [acceptance] keys (plan.json `acceptance`)."""

    noise_band: float
    ttft_ratio_max: float
    confidence: float


@dataclass(frozen=True)
class LaunchFigure:
    """One launch of one arm in one case: means over the launch's kept runs."""

    round: int
    throughput: float  # total tok/s
    ttft_ms: float  # mean TTFT


@dataclass(frozen=True)
class CaseComparison:
    """One case, arm against `against`: status "ok", "FAILED" (a side has no figures) or
    "INCONCLUSIVE" (too few paired rounds for an interval)."""

    case: str
    status: str
    throughput: Ratio | None  # arm / against, total tok/s
    ttft: Ratio | None  # arm / against, mean TTFT
    throughput_ok: bool  # lower bound of the gain above the noise band
    ttft_ok: bool  # upper bound of the TTFT ratio at most ttft_ratio_max

    @property
    def gain(self) -> float | None:
        return None if self.throughput is None else self.throughput.estimate - 1.0


@dataclass(frozen=True)
class GateCheck:
    """A gate beside the figures (accuracy, a dispatch proof): passed, or the reason it did not."""

    passed: bool
    reason: str


def accuracy_check(
    accuracy: float | None, errors: int, passed: bool, gate: float, lower_end: float | None = None
) -> GateCheck:
    """The MATH-500 gate of the arm judged (accuracy None: not measured); `lower_end`: the
    interval's lower end, which the lower_bound rule holds against the gate."""
    shown = "not measured" if accuracy is None else f"{accuracy:.3f} ({errors} errors)"
    if accuracy is not None and lower_end is not None:
        shown = f"{accuracy:.3f} ({errors} errors), its interval's lower end {lower_end:.3f},"
    return GateCheck(passed, f"accuracy {shown} below the gate {gate}")


def dispatch_check(role: str, arm: str, valid: bool | None, reason: str) -> GateCheck:
    """An arm's proof of dispatch: only an invalid proof fails (None: not applicable, e.g. an external server)."""
    return GateCheck(valid is not False, f"{role} {arm}: dispatch proof invalid ({reason})")


@dataclass(frozen=True)
class Verdict:
    arm: str
    against: str
    cases: tuple[CaseComparison, ...]
    reasons: tuple[str, ...]
    verdict: str  # ACCEPTED, REJECTED or INCONCLUSIVE

    @property
    def accepted(self) -> bool:
        return self.verdict == ACCEPTED


def compare_case(
    case: str, arm: Sequence[LaunchFigure] | None, against: Sequence[LaunchFigure] | None, rule: Rule
) -> CaseComparison:
    """One case: the figures of the two arms (None when a side failed), paired by round."""
    if not arm or not against:
        return CaseComparison(case, "FAILED", None, None, False, False)
    mine = {f.round: f for f in arm}
    theirs = {f.round: f for f in against}
    rounds = sorted(mine.keys() & theirs.keys())
    if not rounds:
        return CaseComparison(case, "FAILED", None, None, False, False)
    tput = paired_ratio([mine[r].throughput for r in rounds], [theirs[r].throughput for r in rounds], rule.confidence)
    ttft = paired_ratio([mine[r].ttft_ms for r in rounds], [theirs[r].ttft_ms for r in rounds], rule.confidence)
    if tput.interval is None or ttft.interval is None:
        return CaseComparison(case, INCONCLUSIVE, tput, ttft, False, False)
    return CaseComparison(
        case,
        "ok",
        tput,
        ttft,
        tput.interval.low - 1.0 > rule.noise_band,
        ttft.interval.high <= rule.ttft_ratio_max,
    )


def case_reasons(c: CaseComparison, rule: Rule) -> list[str]:
    """Why a case does not support acceptance (empty when it does)."""
    if c.throughput is None or c.ttft is None:
        return [f"{c.case}: a run failed or is missing"]
    tput, ttft = c.throughput.interval, c.ttft.interval
    if tput is None or ttft is None:
        return [
            f"{c.case}: {c.throughput.n} launch(es) per arm give no interval; at least {MIN_ROUNDS} launches per "
            f"arm are needed (rounds >= {MIN_ROUNDS}; an even number completes the A B / B A blocks)"
        ]
    out = []
    if not c.throughput_ok:
        out.append(
            f"{c.case}: total tok/s gain {c.throughput.estimate - 1:+.2%} [{tput.low - 1:+.2%}, {tput.high - 1:+.2%}]: "
            f"lower bound not above the noise band {rule.noise_band:.2%}"
        )
    if not c.ttft_ok:
        out.append(
            f"{c.case}: mean TTFT ratio {c.ttft.estimate:.4f} [{ttft.low:.4f}, {ttft.high:.4f}]: upper bound above "
            f"{rule.ttft_ratio_max}"
        )
    return out


def judge(arm: str, against: str, cases: Sequence[CaseComparison], checks: Sequence[GateCheck], rule: Rule) -> Verdict:
    """REJECTED when a case failed, an interval missed its bound or a check failed; else
    INCONCLUSIVE when a case has too few launches for an interval; else ACCEPTED."""
    short = [r for c in cases if c.status == INCONCLUSIVE for r in case_reasons(c, rule)]
    decisive = [r for c in cases if c.status != INCONCLUSIVE for r in case_reasons(c, rule)]
    decisive += [c.reason for c in checks if not c.passed]
    verdict = REJECTED if decisive else INCONCLUSIVE if short else ACCEPTED
    return Verdict(arm, against, tuple(cases), tuple(short + decisive), verdict)


def case_record(c: CaseComparison) -> dict[str, object]:
    """summary.json's entry of a case (`acceptance.cases[case]`)."""

    def bounds(r: Ratio | None, shift: float) -> tuple[float | None, float | None]:
        if r is None or r.interval is None:
            return None, None
        return r.interval.low - shift, r.interval.high - shift

    gain_low, gain_high = bounds(c.throughput, 1.0)
    ttft_low, ttft_high = bounds(c.ttft, 0.0)
    return {
        "status": c.status,
        "rounds": c.throughput.n if c.throughput else 0,
        "gain": c.gain,
        "gain_low": gain_low,
        "gain_high": gain_high,
        "ttft_ratio": c.ttft.estimate if c.ttft else None,
        "ttft_ratio_low": ttft_low,
        "ttft_ratio_high": ttft_high,
        "throughput_ok": c.throughput_ok,
        "ttft_ok": c.ttft_ok,
    }
