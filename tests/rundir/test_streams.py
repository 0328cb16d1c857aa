"""Seed freshness compares the streams seeds derive (rundir/streams.py), not the numbers."""

from __future__ import annotations

import pytest

from kerneltrial.rundir import streams

BOUNDS = streams.Bounds(rounds=20, calls=100)
INVERSE = pow(streams.ROUNDS_PER_SEED, -1, 1 << streams.STREAM_BITS)  # ROUNDS_PER_SEED * INVERSE = 1 mod 2**32


@pytest.mark.parametrize(
    ("a", "b", "how"),
    [
        (0, 2**32, "equal modulo 2**32"),
        (-1, 2**32 - 1, "equal modulo 2**32"),
        (7919, 0, "gate stream 0 of seed 7919 is gate stream 1 of seed 0"),
        (streams.values_seed(3, 5), 3, "gate stream 0 of seed"),  # a gate seed that is a timed unit's values
        (5 + INVERSE, 5, "timed value sets of seed"),  # every unit of one is a unit of the other, a round apart
        (5 + streams.CALL_STRIDE * INVERSE, 5, "timed value sets of seed"),  # a call apart
    ],
)
def test_seeds_that_draw_the_same_values_share_a_stream(a, b, how):
    assert how in streams.shared_stream(a, b, BOUNDS)
    assert streams.shared_stream(b, a, BOUNDS)


def test_distinct_small_seeds_share_no_stream():
    assert streams.shared_streams(range(10, 40), range(10), BOUNDS) == []
    assert [seed for seed, _ in streams.shared_streams([3, 2**32 + 4], [4], BOUNDS)] == [2**32 + 4]


def test_a_plans_bounds_cover_its_noise_rule_rounds_and_calls():
    plan = {"rounds": 7, "noise_rule": {"max_rounds": 30}, "cases": [{"calls": 16, "rounds": 9}, {"calls": 400}]}
    assert streams.plan_bounds(plan) == streams.Bounds(30, 400)
