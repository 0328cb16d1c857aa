"""PERFORMANCE.md's Track 2 reading of a model run (analysis/model_report.py track2_lines)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kerneltrial.analysis.model_report import ours_against, served_reading, spread_of, track2_lines
from kerneltrial.rundir.model_summary_doc import ModelArm, ModelCase, PairedRatio

BAND = 0.02


def ratio(speedup: float, low: float, high: float, verdict: str = "win") -> PairedRatio:
    return PairedRatio(speedup=speedup, ci=(low, high), verdict=verdict, rounds=11)


def arm(**vs: PairedRatio) -> ModelArm:
    return ModelArm(median_ns=1e6, samples=11, tokens_per_s=1.0, attribution=None, **vs)


def test_a_peer_against_kerneltrial_is_turned_round_and_its_verdict_called_again():
    ours = ours_against(ratio(1.25, 1.0, 2.0, "inconclusive"), BAND)  # the peer faster than ours
    assert ours.speedup == pytest.approx(0.8) and ours.ci == pytest.approx((0.5, 1.0))
    assert ours.verdict == "inconclusive"
    # inside the band one way, not the other: (1.0, 1.0202) straddles 1.02; its turn (0.9802, 1.0) is a tie
    assert ours_against(ratio(1.01, 1.0, 1.0202, "inconclusive"), BAND).verdict == "tie"
    assert ours_against(ratio(1.1, 1.05, 1.2, "win"), BAND).verdict == "loss"


@pytest.mark.parametrize(
    ("phase", "low", "high", "spread", "says"),
    [
        ("decode", 1.02, 1.05, 0.0, "ahead of flaggems by more than"),
        ("decode", 1.02, 1.05, 0.011, "undecided"),  # the spread between identical arms eats the gain
        ("decode", 0.99, 1.005, 0.0, "not ahead"),
        ("decode", 0.99, 1.005, 0.011, "undecided"),  # the spread widens the uncertain zone both ways
        ("prefill", 0.995, 1.0, 0.011, "undecided"),
        ("prefill", 0.95, 0.98, 0.011, "undecided"),
        ("decode", 1.0, 1.03, 0.0, "undecided"),
        ("prefill", 0.995, 1.0, 0.0, "within flaggems' + 1%"),
        ("prefill", 0.95, 0.98, 0.0, "the TTFT gate may fail"),
        ("prefill", 0.98, 1.0, 0.0, "undecided"),
    ],
)
def test_the_reading_clears_the_band_and_the_spread(phase, low, high, spread, says):
    assert says in served_reading(phase, ratio((low + high) / 2, low, high), spread)


def test_the_spread_is_how_far_two_identical_arms_came_apart():
    assert spread_of(ratio(1.011, 1.008, 1.014)) == pytest.approx(0.014)  # the interval's far end
    assert spread_of(ratio(0.985, 0.98, 0.99)) == pytest.approx(1 / 0.98 - 1)
    assert spread_of(None) == 0.0


def test_a_run_with_e_arms_gets_one_row_per_case_and_one_without_gets_none():
    arms = {
        "eager": arm(),
        "E3": arm(vs_eager=ratio(1.2, 1.1, 1.3), vs_kerneltrial=ratio(1.0, 0.999, 1.001, "tie")),
        "kerneltrial": arm(vs_eager=ratio(1.2, 1.1, 1.3)),
        "flaggems": arm(vs_kerneltrial=ratio(0.9, 0.88, 0.92, "loss")),  # ours 1.09-1.14x flaggems
    }
    case = ModelCase(phase="decode", mode="graph", tokens_per_call=1, arms=arms)
    lines = track2_lines(SimpleNamespace(cases={"decode-b1-graph": case}), BAND, "5.0.2")
    (row,) = [line for line in lines if line.startswith("| decode-b1-graph")]
    assert "E3 1.200 [1.100, 1.300] win" in row and "1.111 [1.087, 1.136] win" in row
    assert "ahead of flaggems by more than" in row
    assert any("FlagGems 5.0.2 through kerneltrial's adapter" in line for line in lines)
    no_e = ModelCase(phase="decode", tokens_per_call=1, arms={"eager": arm(), "kerneltrial": arm()})
    assert track2_lines(SimpleNamespace(cases={"d": no_e}), BAND, None) == []
