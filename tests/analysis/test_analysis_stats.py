"""kerneltrial.stats against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kerneltrial import stats
from kerneltrial.gate_rule import parse_gate
from kerneltrial.stats import BootstrapRule, Interval

RULE = BootstrapRule(resamples=1000, seed=7, confidence=0.95)


def test_median_odd_and_even() -> None:
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_median_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no timing rows"):
        stats.median([])


def test_speedup_and_bandwidth() -> None:
    assert stats.speedup(1000.0, 800.0) == 1.25
    assert stats.gbps(4_000_000, 1000.0) == 4000.0
    assert stats.pct_of_ceiling(500.0, 2000.0) == 25.0


def test_ceiling_is_median_of_per_sample_rates() -> None:
    # rates 2000, 1600, 4000 GB/s -> median 2000; with an even count the rule differs from
    # bytes / median(ns): rates 2000 and 4000 give 3000, while 8e6 / 3000 ns would give 2666.7
    assert stats.ceiling_gbps([8e6] * 3, [4000, 5000, 2000]) == 2000.0
    assert stats.ceiling_gbps([8e6] * 2, [4000, 2000]) == 3000.0  # (2000 + 4000) / 2
    assert stats.ceiling_gbps([], []) is None


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (1.02, 1.5, "tie"),  # exactly on the upper band edge is not a win
        (1.0201, 1.5, "win"),
        (0.5, 0.98, "tie"),  # exactly on the lower band edge is not a loss
        (0.5, 0.9799, "loss"),
        (0.97, 1.03, "tie"),
    ],
)
def test_three_way_verdict_at_band_edges(low: float, high: float, expected: str) -> None:
    # the summary/1-3 rule: whatever is neither a win nor a loss is a tie
    assert stats.three_way_verdict(Interval(low, high), tie_band=0.02) == expected


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.99, 1.01, "tie"),  # inside [0.98, 1.02]
        (0.98, 1.02, "tie"),  # the band's own edges are inside it
        (0.90, 1.09, "inconclusive"),  # straddles both edges: neither equal nor different
        (1.02, 1.5, "inconclusive"),  # on the upper edge and above it: not a win, not inside the band
        (0.5, 0.98, "inconclusive"),
        (0.97, 1.01, "inconclusive"),  # straddles the lower edge only
        (1.0201, 1.5, "win"),
        (0.5, 0.9799, "loss"),
    ],
)
def test_verdict_tie_only_inside_the_band(low: float, high: float, expected: str) -> None:
    assert stats.verdict(Interval(low, high), tie_band=0.02) == expected


def test_aggregate_counts_inconclusive_apart() -> None:
    agg = stats.aggregate_arm(["a", "b", "c"], [1.0, 1.01, 1.3], ["inconclusive", "tie", "win"], RULE)
    assert (agg.wins, agg.ties, agg.losses, agg.inconclusive) == (1, 1, 0, 1)


def test_bootstrap_is_paired_over_units() -> None:
    # Units vary 3x between each other, but within each unit the arm is exactly twice as fast:
    # a paired bootstrap gives [2, 2]; an unpaired one would not.
    control = np.array([100.0, 300.0, 200.0, 150.0, 250.0, 120.0])
    ci = stats.bootstrap_speedup_ci(control, control / 2, RULE)
    assert ci == Interval(2.0, 2.0)


def test_bootstrap_follows_the_contract_rng_rule() -> None:
    control = np.array([10.0, 12.0, 11.0, 15.0, 9.0])
    arm = np.array([8.0, 9.5, 10.0, 9.0, 8.5])
    rng = np.random.default_rng(RULE.seed)
    idx = rng.integers(0, 5, size=(RULE.resamples, 5))
    ratios = np.median(control[idx], axis=1) / np.median(arm[idx], axis=1)
    expected = np.quantile(ratios, [0.025, 0.975])
    ci = stats.bootstrap_speedup_ci(control, arm, RULE)
    assert (ci.low, ci.high) == (expected[0], expected[1])
    assert stats.bootstrap_speedup_ci(control, arm, RULE) == ci  # fresh generator: same draw every call
    assert ci.low < 1.25 < ci.high


def test_bootstrap_rejects_unpaired_input() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        stats.bootstrap_speedup_ci(np.array([1.0, 2.0]), np.array([1.0]), RULE)


def test_aggregate_hand_computed() -> None:
    agg = stats.aggregate_arm(["a", "b", "c"], [2.0, 0.5, 1.0], ["win", "loss", "tie"], RULE)
    assert math.isclose(agg.geomean, 1.0, rel_tol=1e-12)
    assert math.isclose(agg.mean, 3.5 / 3, rel_tol=1e-12)
    assert (agg.worst, agg.worst_case) == (0.5, "b")
    assert (agg.wins, agg.ties, agg.losses, agg.n_cases) == (1, 1, 1, 3)
    assert agg.geomean_ci.low < 1.0 < agg.geomean_ci.high
    assert agg.geomean_ci.low >= 0.5 and agg.geomean_ci.high <= 2.0


def test_geomean_of_two_and_ci_of_constant_speedups() -> None:
    assert math.isclose(stats.aggregate_arm(["a", "b"], [1.0, 4.0], ["tie", "win"], RULE).geomean, 2.0)
    assert stats.geomean_ci([1.25, 1.25, 1.25], RULE) == Interval(1.25, 1.25)


def test_aggregate_without_cases() -> None:
    agg = stats.aggregate_arm([], [], [], RULE)
    assert agg.n_cases == 0 and agg.geomean is None and agg.geomean_ci is None


@pytest.mark.parametrize(
    ("rule", "no_loss", "floor"),
    [
        ("no_loss", True, None),
        ("geomean>=1.02", False, 1.02),
        ("no_loss and geomean>=1.02", True, 1.02),
        ("geomean>=1 and no_loss", True, 1.0),
        ("no_loss and  geomean>=1.05 ", True, 1.05),  # the protocol schema strips terms too
    ],
)
def test_parse_gate(rule: str, no_loss: bool, floor: float | None) -> None:
    gate = parse_gate(rule)
    assert (gate.no_loss, gate.min_geomean, gate.rule) == (no_loss, floor, rule)


@pytest.mark.parametrize(
    "rule",
    [
        "",
        "No_loss",
        "no_loss and",
        "no_loss and no_loss",
        "geomean>1.02",
        "geomean>=abc",
        "no_loss,geomean>=1.02",
        "geomean>=1.02 and geomean>=1.05",
        "geomean>=0",
    ],
)
def test_parse_gate_rejects_and_names_the_string(rule: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_gate(rule)
    assert repr(rule) in str(error.value)
    assert "no_loss" in str(error.value)  # says what is accepted


def _agg(geomean: float | None, losses: int) -> stats.ArmAggregate:
    return stats.ArmAggregate(3, geomean, None, geomean, geomean, "a", 1, 2 - losses, losses)


def test_gate_verdict() -> None:
    both = parse_gate("no_loss and geomean>=1.02")
    assert stats.gate_verdict(both, _agg(1.02, 0), 0).passed  # exactly at the floor passes
    fail = stats.gate_verdict(both, _agg(1.019, 1), 0)
    assert not fail.passed and len(fail.reasons) == 2
    assert not stats.gate_verdict(both, _agg(1.5, 0), failed_correctness_cases=1).passed
    assert not stats.gate_verdict(both, _agg(None, 0), 0).passed
    assert stats.gate_verdict(parse_gate("no_loss"), _agg(0.9, 0), 0).passed


def test_ratio_interval_holds_whenever_both_intervals_do() -> None:
    # ours 1.2 [1.1, 1.3] over the control, the peer 1.0 [0.8, 1.25]: ours / peer in [1.1/1.25, 1.3/0.8]
    ratio = stats.ratio_interval(Interval(1.1, 1.3), Interval(0.8, 1.25))
    assert math.isclose(ratio.low, 0.88) and math.isclose(ratio.high, 1.625)
    for a in (1.1, 1.2, 1.3):
        for b in (0.8, 1.0, 1.25):
            assert ratio.low <= a / b <= ratio.high
    with pytest.raises(ValueError, match="positive bounds"):
        stats.ratio_interval(Interval(0.0, 1.0), Interval(1.0, 2.0))


def test_geomean_interval_is_the_geomean_of_the_bounds() -> None:
    band = stats.geomean_interval([Interval(0.5, 2.0), Interval(2.0, 8.0)])
    assert math.isclose(band.low, 1.0) and math.isclose(band.high, 4.0)
    single = stats.geomean_interval([Interval(0.9, 1.1)])
    assert math.isclose(single.low, 0.9) and math.isclose(single.high, 1.1)
    with pytest.raises(ValueError, match="at least one"):
        stats.geomean_interval([])
