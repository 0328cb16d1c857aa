"""PERFORMANCE.md's Track 2 reading of a model run (analysis/model_report.py track2_lines)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kerneltrial.analysis.model_report import ours_against, served_reading, track2_lines
from kerneltrial.rundir.model_summary_doc import ModelArm, ModelCase, PairedRatio


def ratio(speedup: float, low: float, high: float, verdict: str = "win") -> PairedRatio:
    return PairedRatio(speedup=speedup, ci=(low, high), verdict=verdict, rounds=11)


def arm(**vs: PairedRatio) -> ModelArm:
    return ModelArm(median_ns=1e6, samples=11, tokens_per_s=1.0, attribution=None, **vs)


def test_a_peer_against_kerneltrial_is_turned_round():
    ours = ours_against(ratio(1.25, 1.0, 2.0, "win"))  # the peer faster than ours
    assert ours.speedup == pytest.approx(0.8) and ours.ci == pytest.approx((0.5, 1.0)) and ours.verdict == "loss"


@pytest.mark.parametrize(
    ("phase", "low", "high", "says"),
    [
        ("decode", 1.02, 1.05, "gain above the 1% band is possible"),
        ("decode", 0.99, 1.005, "no served throughput gain"),
        ("decode", 1.0, 1.03, "undecided"),
        ("prefill", 0.995, 1.0, "TTFT within"),
        ("prefill", 0.95, 0.98, "TTFT gate would fail"),
        ("prefill", 0.98, 1.0, "undecided"),
    ],
)
def test_the_reading_follows_the_interval_against_flaggems(phase, low, high, says):
    assert says in served_reading(phase, ratio((low + high) / 2, low, high))


def test_a_run_with_e_arms_gets_one_row_per_case_and_one_without_gets_none():
    arms = {
        "eager": arm(),
        "E3": arm(vs_eager=ratio(1.2, 1.1, 1.3)),
        "kerneltrial": arm(vs_eager=ratio(1.2, 1.1, 1.3)),
        "flaggems": arm(vs_kerneltrial=ratio(0.9, 0.88, 0.92, "loss")),  # ours 1.09-1.14x flaggems
    }
    case = ModelCase(phase="decode", mode="graph", tokens_per_call=1, arms=arms)
    lines = track2_lines(SimpleNamespace(cases={"decode-b1-graph": case}))
    (row,) = [line for line in lines if line.startswith("| decode-b1-graph")]
    assert "E3 1.200 [1.100, 1.300] win" in row and "1.111 [1.087, 1.136] win" in row
    assert "possible" in row
    no_e = ModelCase(phase="decode", tokens_per_call=1, arms={"eager": arm(), "kerneltrial": arm()})
    assert track2_lines(SimpleNamespace(cases={"d": no_e})) == []
