"""The input streams a seed derives, and whether two seeds share one.

A protocol seed s is not used once: the gate draws its checked inputs from s, its warm-up,
fresh-buffer, same-buffer and extra-shape values from s plus the offsets below, and each timed
(seed, round) unit draws value set j from `values_seed(s, round) + j * CALL_STRIDE`. Each of
these integers seeds a generator (ops/inputs.py `generator`, salted by the run's inputs seed),
and a CPU generator keeps only the low 32 bits of an integer seed: seeds 0 and 2**32 draw the
same values, and seed 7919 draws as its checked inputs the fresh-buffer values of seed 0.
A confirmation must draw inputs no exploratory run drew (under the same inputs seed), so
freshness compares these integers modulo 2**32, not the seed numbers (`shared_stream`).

Torch-free: the protocol check, `run` and `verify` (kernel/links.py) all use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STREAM_BITS = 32  # what a CPU generator keeps of an integer seed (mt19937's seed)
FRESH_SEED_OFFSET = 7919  # the gate's new inputs in fresh buffers
SAME_BUFFERS_SEED_OFFSET = 104729  # the gate's new values written into the same buffers
WARMUP_SEED_OFFSET = 1_000_004  # the gate's unchecked calls before the checked one
EXTRA_SEED_OFFSET = 3_000_017  # extra shape k of a gate check: seed + this + k * EXTRA_STRIDE
EXTRA_STRIDE = 1_000_003  # wide, so that seeds less than 7919 apart share none of the gate's streams
EXTRA_SHAPES_MAX = 8  # extra shapes of one gate check, at most (ops/inputs.py `extra_cases`)


def extra_seed(seed: int, k: int) -> int:
    """Seed of the values of extra shape k of the gate check of `seed`."""
    return seed + EXTRA_SEED_OFFSET + k * EXTRA_STRIDE


GATE_OFFSETS = (
    0,
    FRESH_SEED_OFFSET,
    SAME_BUFFERS_SEED_OFFSET,
    WARMUP_SEED_OFFSET,
    *(extra_seed(0, k) for k in range(EXTRA_SHAPES_MAX)),
)
VALUES_SEED_BASE = 1_000_000_007  # far from the gate's integers
ROUNDS_PER_SEED = 10_007  # values_seed is unique per (seed, round) below this many rounds
CALL_STRIDE = 100_000_007  # value set j of a unit: values_seed + j * CALL_STRIDE (unique below 10**4 seeds)
AUTO_CALLS_LIMIT = 1000  # calls per sample that calls_per_sample = "auto" chooses at most


@dataclass(frozen=True)
class Bounds:
    """How far a run's timed streams reach: rounds per (case, seed), noise-rule rounds included,
    and calls per sample."""

    rounds: int
    calls: int

    def wider(self, other: Bounds) -> Bounds:
        return Bounds(max(self.rounds, other.rounds), max(self.calls, other.calls))


def plan_bounds(plan: dict[str, Any]) -> Bounds:
    """The Bounds of a run from its plan.json."""
    cases = plan.get("cases", [])
    noise = plan.get("noise_rule") or {}
    rounds = max(
        [int(plan.get("rounds", 0)), int(noise.get("max_rounds") or 0)] + [int(c.get("rounds", 0)) for c in cases]
    )
    return Bounds(max(rounds, 1), max([1] + [int(c.get("calls", 0)) for c in cases]))


def values_seed(seed: int, round_index: int) -> int:
    """Seed of the fresh input values of one (seed, round) unit, the same for every arm."""
    return VALUES_SEED_BASE + ROUNDS_PER_SEED * seed + round_index


def _centred(value: int) -> int:
    """`value` modulo 2**STREAM_BITS, in (-2**(STREAM_BITS-1), 2**(STREAM_BITS-1)]."""
    modulus = 1 << STREAM_BITS
    v = value % modulus
    return v - modulus if v > modulus // 2 else v


def _gate_and_gate(a: int, b: int) -> str:
    for i, x in enumerate(GATE_OFFSETS):
        for j, y in enumerate(GATE_OFFSETS):
            if _centred(a + x - b - y) == 0:
                return f"gate stream {i} of seed {a} is gate stream {j} of seed {b}"
    return ""


def _gate_and_timed(a: int, b: int, rounds: int, calls: int) -> str:
    """A gate stream of `a` equal to a value set of a timed unit of `b`."""
    for i, x in enumerate(GATE_OFFSETS):
        for j in range(calls):
            r = (a + x - values_seed(b, 0) - j * CALL_STRIDE) % (1 << STREAM_BITS)
            if r < rounds:
                return f"gate stream {i} of seed {a} is value set {j} of round {r} of seed {b}"
    return ""


def _timed_and_timed(a: int, b: int, rounds: int, calls: int) -> str:
    for dj in range(-(calls - 1), calls):
        dr = _centred(ROUNDS_PER_SEED * (a - b) + dj * CALL_STRIDE)
        if abs(dr) < rounds:
            return f"the timed value sets of seed {a} are those of seed {b}, {dr} round(s) and {dj} call(s) apart"
    return ""


def shared_stream(a: int, b: int, bounds: Bounds) -> str:
    """How seeds `a` and `b` draw the same values ('' when they never do): a gate or timed
    stream of one equal to one of the other modulo 2**STREAM_BITS, for runs within `bounds`."""
    if _centred(a - b) == 0:
        return f"seeds {a} and {b} are equal modulo 2**{STREAM_BITS} (a CPU generator's seed)"
    return (
        _gate_and_gate(a, b)
        or _gate_and_timed(a, b, bounds.rounds, bounds.calls)
        or _gate_and_timed(b, a, bounds.rounds, bounds.calls)
        or _timed_and_timed(a, b, bounds.rounds, bounds.calls)
    )


def shared_streams(seeds: Iterable[int], used: Iterable[int], bounds: Bounds) -> list[tuple[int, str]]:
    """(seed, how) for each seed of `seeds` that draws the inputs of a seed of `used`."""
    used = list(used)
    found = []
    for seed in seeds:
        how = next((h for other in used if (h := shared_stream(seed, other, bounds))), "")
        if how:
            found.append((seed, how))
    return found
