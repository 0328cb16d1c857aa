"""What is timed is what was checked: every timing sample ends with a checked call.

Each arm times its own private, canary-guarded copy of the inputs (`TimedArm`), so an arm
that writes its inputs late cannot sabotage another arm. In every round the runner draws
fresh input values (`values_seed`), and the sample's last call runs on them: the values are
written into the arm's buffers right before that call, outside the timed intervals
(`Timer.sample(before_last=...)`). After the sample the last call's output is compared with
the reference for those values under the gate's rules, and every byte of the guarded
buffers is audited (inputs unchanged, nothing written outside the outputs). Each call also
bumps the inputs' version counters, so a result cache keyed on pointer and version never
hits; a cache keyed on pointers alone returns the previous values' result on the last call.

A failed check is a row of timed_checks.jsonl with a named message; the arm's timing rows are
kept, and the summary excludes the arm from that case ("failed while timed"). An arm that
raises while timed is dropped from the rest of the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.autograd.graph import increment_version

from kerneltrial.ops.registry import Case, Impl, Inputs, Operator, Outputs
from kerneltrial.trial import gate, guard

VALUES_SEED_BASE = 1_000_000_007  # far from the gate's seeds (protocol seeds, +7919, +104729)
ROUNDS_PER_SEED = 10_007  # values_seed is unique per (seed, round) below this many rounds

WRONG = "wrong result while timed: "
RAISED = "raised while timed: "


def values_seed(seed: int, round_index: int) -> int:
    """Seed of the fresh input values of one (seed, round) unit, the same for every arm."""
    return VALUES_SEED_BASE + ROUNDS_PER_SEED * seed + round_index


@dataclass
class TimedCheck:
    """One checked timing sample; a row of timed_checks.jsonl."""

    case: str
    seed: int
    round: int
    arm: str
    values_seed: int
    passed: bool
    max_abs: float
    max_rel: float
    ulp: float
    message: str

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Expected:
    """The values of one unit and what they must produce."""

    seed: int
    values: Inputs
    reference: Outputs
    oracle: Outputs


def expected_for(op: Operator, case: Case, seed: int, round_index: int, device: torch.device) -> Expected:
    vseed = values_seed(seed, round_index)
    values = op.make_inputs(case, vseed, device)
    reference, oracle = gate.expected(op, values)
    return Expected(vseed, values, reference, oracle)


@dataclass
class TimedArm:
    """One arm's private inputs for a (case, seed) and the state its checks need."""

    impl: Impl
    fn: Callable[..., Any]
    inputs: guard.Guarded
    last: list[Any] = field(default_factory=lambda: [None])  # what the latest call returned
    previous: Outputs = ()  # the last checked output, kept alive to expose persistent buffers

    @classmethod
    def make(cls, impl: Impl, values: Inputs) -> TimedArm:
        fn = impl.resolve()
        if fn is None:
            raise ValueError(f"arm {impl.name} is unavailable: {impl.reason}")
        return cls(impl, fn, guard.guard(values))

    def call(self) -> None:
        """One timed call: bump the inputs' version counters (host only), call, keep the result."""
        for t in self.inputs.tensors:
            increment_version(t)
        self.last[0] = self.fn(*self.inputs.inputs.values())

    def before_last(self, expected: Expected) -> Callable[[], None]:
        return lambda: guard.write(self.inputs, expected.values)

    def check(self, op: Operator, case: Case, seed: int, round_index: int, expected: Expected, exact: bool,
              device: torch.device, persistent: bool = True) -> TimedCheck:
        """Audit the sample just taken: its last call ran on `expected.values`."""
        gate.synchronize(device)
        got = op.outputs(self.inputs.inputs, self.last[0])
        diff, wrong = gate.compare(op, case, got, expected.reference, expected.oracle, exact)
        message = (WRONG + wrong if wrong else guard.problems(op, self.inputs, expected.values, timed=True)
                   or (gate.persistent(op, got, self.previous) if persistent else ""))
        self.previous = () if op.inplace else got
        gate.settle(device)  # side-stream work the arm left behind ends here, before the next arm
        return TimedCheck(case.id, seed, round_index, self.impl.name, expected.seed, not message,
                          diff.max_abs, diff.max_rel, diff.ulp, message)


def raised(case: Case, seed: int, round_index: int, arm: str, vseed: int, exc: Exception) -> TimedCheck:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return TimedCheck(case.id, seed, round_index, arm, vseed, False, float("nan"), float("nan"), float("nan"),
                      f"{RAISED}{type(exc).__name__}: {first_line}")
