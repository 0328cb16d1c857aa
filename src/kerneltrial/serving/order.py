"""The launch order of a serving trial: counterbalanced reversed-pair blocks, seeded.

A pure function of (arm names, rounds, seed): plan.json lists it, each launches.jsonl row begins
with one of its entries, and verify recomputes it from protocol.toml (docs/serving.md,
"Acceptance and noise").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kerneltrial.serving.protocol import Arm


def williams_rows(k: int) -> list[list[int]]:
    """The k rows of a Williams square: row r is (0, 1, k-1, 2, k-2, ...) + r mod k. Every index
    is at every position once; for even k each index follows every other once (carry-over
    balance); for odd k the rows with their reverses (the second half of each block) balance it."""
    first = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    return [[(i + r) % k for i in first] for r in range(k)]


def launch_order(arms: list[Arm], rounds: int, seed: int) -> list[tuple[int, int, str]]:
    """(round, position, arm name): every round launches every arm once, in counterbalanced
    reversed-pair blocks. Block b is rounds 2b and 2b+1: row b mod k of a Williams square, then
    the same row reversed (two arms: A B B A, then B A A B). The arms' labels are shuffled once
    by the seed, so the order is a pure function of (arm names, rounds, seed). Over a complete
    design (k blocks, 2k rounds) every arm is at every position equally often; within a block
    every arm's mean position is the same, so a linear drift cancels from each arm's mean."""
    names = [a.name for a in arms]
    random.Random(seed).shuffle(names)
    rows = williams_rows(len(names))
    order = []
    for r in range(rounds):
        block, second = divmod(r, 2)
        row = [names[i] for i in rows[block % len(names)]]
        order += [(r, pos, n) for pos, n in enumerate(row[::-1] if second else row)]
    return order


def block_of(round_: int) -> int:
    """The counterbalanced block (launch_order) a round belongs to."""
    return round_ // 2


@dataclass(frozen=True)
class PlannedLaunch:
    """One launch of launch_order: plan.json lists them, each launches.jsonl row begins with one,
    and verify recomputes them from protocol.toml."""

    launch: int
    round: int
    block: int
    position: int
    arm: str


def planned_launches(arms: list[Arm], rounds: int, seed: int) -> list[PlannedLaunch]:
    """launch_order numbered, each round with its block."""
    return [PlannedLaunch(i, r, block_of(r), p, n) for i, (r, p, n) in enumerate(launch_order(arms, rounds, seed))]
