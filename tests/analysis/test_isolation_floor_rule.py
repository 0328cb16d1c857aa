"""The harness's floor under an isolated arm's claim (kernel/bounds.py, rundir/integrity_notes.py),
judged on timings rows alone: an honest arm with one sample stalled outside its clock is not
implausible (the CI failure of two samples, one stalled), nor one whose long samples all leave twice
the reference's round trip outside its clock, nor one with two of six samples loaded (the CI failure
of session 19); a worker that shaves every sample, half of four, or two of six to nothing with the
rest at their floors, is; the summary's rule and verify's are one function."""

from __future__ import annotations

import pandas as pd

from kerneltrial.kernel.bounds import floor_of
from kerneltrial.rundir.integrity_notes import WALL_SLACK, floor_share, implausibly_under

CALLS = 8
ROUNDTRIP_NS = 559_000.0  # the CI run's reference round trip in that case
TIE_BAND = 0.02  # the protocol's default


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
    # the CI failure: an honest 106 ms sample, and one whose answer waited 18 ms longer outside the
    # arm's clock, below its floor alone
    assert judged([106.0, 107.0], [106.8, 125.0]) == (False, 1)


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


def test_two_samples_must_be_under_and_one_alone_is_judged() -> None:
    below = 1.0, 2.0  # a median claim below its median floor
    assert implausibly_under(*below, 1, 1) and not implausibly_under(*below, 1, 5)
    assert implausibly_under(*below, 2, 2) and implausibly_under(*below, 2, 8)


# slow_rmsnorm's claims in ms, 6 samples of 32-42 ms on a 2-core machine (docs/NOTES.md, session 19)
HONEST_MS = [33.1, 40.9, 32.4, 37.2, 41.6, 40.2]


def test_an_honest_arm_with_long_samples_and_two_of_six_loaded_is_not_implausible() -> None:
    idle = [1.2] * 6  # twice the reference's round trip outside the clock, in every sample
    assert judged(HONEST_MS, [c + g for c, g in zip(HONEST_MS, idle, strict=True)]) == (False, 0)
    loaded = [0.8, 0.6, 0.7, 5.6, 8.5, 2.9]  # two samples near a fifth of their wall clock
    implausible, under = judged(HONEST_MS, [c + g for c, g in zip(HONEST_MS, loaded, strict=True)])
    assert under == 1 and not implausible


def test_shaving_two_of_six_to_nothing_and_claiming_the_rest_at_their_floors_is_implausible() -> None:
    # the review's attack on a rule of half the samples: the two largest floors' samples at 1 ns, the
    # others 1 us above their own floors; the median claim is then the two lowest floors' mean
    walls = [c + 0.8 for c in HONEST_MS]
    floors = [floor_share(TIE_BAND) * w - ROUNDTRIP_NS / 1e6 for w in walls]
    deepest = sorted(range(6), key=lambda i: floors[i])[-2:]
    claims = [1e-6 if i in deepest else f + 1e-3 for i, f in enumerate(floors)]
    assert judged(claims, walls) == (True, 2)


def test_shaving_every_sample_past_the_slack_is_implausible_and_inside_it_is_not() -> None:
    walls = [c + 0.8 for c in HONEST_MS]
    past, inside = 1 - TIE_BAND - WALL_SLACK - 0.03, 1 - TIE_BAND - WALL_SLACK + 0.03
    assert judged([past * w for w in walls], walls) == (True, 6)
    assert judged([inside * w for w in walls], walls) == (False, 0)
