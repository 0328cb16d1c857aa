"""The harness's floor under an isolated arm's claim (kernel/bounds.py, rundir/integrity_notes.py),
judged on timings rows alone: an honest arm with one sample stalled outside its clock is not
implausible (the CI failure of two samples, one stalled), a worker that shaves every sample, or
half of four, is; the summary's rule and verify's are one function."""

from __future__ import annotations

import pandas as pd

from kerneltrial.kernel.bounds import floor_of
from kerneltrial.rundir.integrity_notes import implausibly_under

CALLS = 8
ROUNDTRIP_NS = 559_000.0  # the CI run's reference round trip in that case
TIE_BAND = 0.05


def rows(claims_ms: list[float], walls_ms: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ns": [c * 1e6 for c in claims_ms],
            "wall_ns": [w * 1e6 for w in walls_ms],
            "calls": [CALLS] * len(claims_ms),
        }
    )


def judged(claims_ms: list[float], walls_ms: list[float]) -> tuple[bool, int]:
    timed = rows(claims_ms, walls_ms)
    floor, under = floor_of(timed, ROUNDTRIP_NS, TIE_BAND)
    claimed = float((timed["ns"] / timed["calls"]).median())
    return implausibly_under(claimed, floor, under, len(timed)), under


def test_one_stalled_sample_of_two_is_not_an_under_claim() -> None:
    # an honest 106 ms sample, and one whose answer waited 18 ms longer outside the arm's clock
    implausible, under = judged([106.0, 107.0], [106.8, 125.0])
    assert under == 1
    assert not implausible


def test_a_worker_shaving_every_sample_is_implausible() -> None:
    true_ms = [106.0, 107.0, 105.5]
    implausible, under = judged([0.55 * t for t in true_ms], [t + 0.6 for t in true_ms])
    assert (implausible, under) == (True, 3)


def test_shaving_half_of_four_samples_moves_the_median_and_is_implausible() -> None:
    true_ms = [106.0, 107.0, 105.5, 106.5]
    claims = [0.1 * true_ms[0], 0.1 * true_ms[1], true_ms[2], true_ms[3]]
    implausible, under = judged(claims, [t + 0.6 for t in true_ms])
    assert (implausible, under) == (True, 2)


def test_a_single_sample_is_judged_alone() -> None:
    assert judged([50.0], [106.6]) == (True, 1)
    assert judged([106.0], [106.6]) == (False, 0)
