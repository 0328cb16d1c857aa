"""What is timed is what was checked: every timed call runs on fresh values, and one call of
every sample, chosen at random, is checked.

Each arm times its own private, canary-guarded copy of the inputs (`TimedArm`), so an arm
that writes its inputs late cannot sabotage another arm. For every (seed, round) unit the
runner draws a pool of fresh value sets (`Unit`), one per call of a sample, from
`values_seed`. Before call j of a sample the arm's buffers receive value set j, outside the
timed intervals (`timing.Hooks`), through aliases that leave the arm's version counters and
pointers as they were; the calls themselves bump the version counters. So no call repeats
its inputs, and nothing but the values tells a kernel that they changed: a cache keyed on
pointers, versions or shapes returns wrong results, and skipping the work of any call
returns a wrong result for that call.

Which call is checked is drawn per sample from the operating system's randomness (not
seeded, so a kernel cannot compute it; recorded as `checked_call`). After the sample that
call's output is compared with the reference for its values under the gate's rules, and
every byte of the guarded buffers is audited (inputs as last written, nothing written
outside the outputs). A kernel that skips the work of a fraction f of its calls fails a
sample's check with probability f, in every sample.

A failed check is a row of timed_checks.jsonl with a named message; the arm's timing rows are
kept, and the summary excludes the arm from that case ("failed while timed"). An arm that
raises while timed is dropped from the rest of the case.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.autograd.graph import increment_version

from kerneltrial.ops.registry import Case, Impl, Inputs, Operator, Outputs
from kerneltrial.rundir.streams import CALL_STRIDE, values_seed
from kerneltrial.trial import gate, guard, memory
from kerneltrial.trial.memory import PeakMemory
from kerneltrial.trial.timing import Hooks, Timer

WRONG = "wrong result while timed: "
RAISED = "raised while timed: "


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
    checked_call: int | None = None  # which call of the sample was checked (value set checked_call)

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Unit:
    """The value sets of one (seed, round) unit, one per call, and their expected outputs
    (computed when a check first needs them, then shared by the arms)."""

    op: Operator
    seed: int  # values_seed of the unit
    pool: list[Inputs]
    _expected: dict[int, tuple[Outputs, Outputs]] = field(default_factory=dict)

    @classmethod
    def draw(cls, op: Operator, case: Case, seed: int, round_index: int, calls: int, device: torch.device) -> Unit:
        """Fresh tensors for every call; the scalar arguments (eps, cap) stay those of the
        (case, seed): a compiled peer must not recompile, nor a captured CUDA graph replay a
        stale eps, inside a timed sample (make_inputs draws them per seed). Tensors whose values
        depend on a scalar are drawn for the scalar kept (`Operator.values_with`)."""
        base = values_seed(seed, round_index)
        scalars = {k: v for k, v in op.make_inputs(case, seed, device).items() if not isinstance(v, torch.Tensor)}
        return cls(op, base, [op.values_with(case, base + j * CALL_STRIDE, device, scalars) for j in range(calls)])

    def expected(self, j: int) -> tuple[Outputs, Outputs]:
        """(reference, oracle) for value set j."""
        if j not in self._expected:
            self._expected[j] = gate.expected(self.op, self.pool[j])
        return self._expected[j]


@dataclass
class TimedArm:
    """One arm's private inputs for a (case, seed) and the state its checks need."""

    impl: Impl
    fn: Callable[..., Any]
    inputs: guard.Guarded
    last: list[Any] = field(default_factory=lambda: [None])  # what the latest call returned
    kept: Outputs = ()  # the checked call's outputs, kept (in-place: copied) until the check
    previous: Outputs = ()  # the last checked output, kept alive to expose persistent buffers
    # the latest sample's extra peak memory, bytes (trial/memory.py); None: not measured (a CPU,
    # `cuda-graph`, or an isolated arm, whose sample never sets it: its allocations are its process's)
    peak_bytes: int | None = None

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

    def sample(
        self, timer: Timer, op: Operator, unit: Unit, calls: int, key: int, graph: bool
    ) -> tuple[int, int, int | None]:
        """One timed sample on the unit's value sets: (ns, the call to check, the harness's wall
        bound). In the harness's process the checked call is drawn first, so that the hooks keep
        its outputs only; there is no separate bound (None). An isolated arm draws it after the
        sample and returns the wall clock around it (trial/remote.py). Where the run measures
        peak memory, each call's extra peak is measured around it (`peak_bytes`, trial/memory.py)."""
        checked = checked_call(calls)
        hooks = self.hooks(op, unit, checked, copy=graph)
        peak = PeakMemory(hooks) if memory.measured(timer) else None
        ns = timer.sample(self.call, calls, key=key, hooks=hooks if peak is None else peak.hooks)
        self.peak_bytes = None if peak is None else peak.most
        return ns, checked, None

    def persistent_problem(self, op: Operator, got: Outputs) -> str:
        """'' unless the checked output reuses the storage of the arm's previous one, still held."""
        return gate.persistent(op, got, self.previous)

    def hooks(self, op: Operator, unit: Unit, checked: int, copy: bool = False) -> Hooks:
        """Value set j before call j; after call `checked`, its outputs are kept for the check,
        copied when the next call overwrites them (in-place outputs; `copy`: a graph's outputs)."""

        def keep(j: int) -> None:
            if j == checked:
                got = op.outputs(self.inputs.inputs, self.last[0])
                self.kept = tuple(t.clone() for t in got) if op.inplace or copy else got

        return Hooks(before=lambda j: guard.write(self.inputs, unit.pool[j]), after=keep)

    def check(
        self,
        op: Operator,
        case: Case,
        seed: int,
        round_index: int,
        unit: Unit,
        checked: int,
        exact: bool,
        device: torch.device,
        persistent: bool = True,
    ) -> TimedCheck:
        """Audit the sample just taken: call `checked` ran on value set `checked`, the last call on the last set."""
        gate.synchronize(device)
        got, self.kept = self.kept, ()
        reference, oracle = unit.expected(checked)
        diff, wrong = gate.compare(op, case, got, reference, oracle, exact)
        message = (
            WRONG + wrong
            if wrong
            else guard.problems(op, self.inputs, unit.pool[-1], timed=True)
            or (self.persistent_problem(op, got) if persistent else "")
        )
        self.previous = () if op.inplace else got
        gate.settle(device)  # side-stream work the arm left behind ends here, before the next arm
        return TimedCheck(
            case.id,
            seed,
            round_index,
            self.impl.name,
            unit.seed,
            not message,
            diff.max_abs,
            diff.max_rel,
            diff.ulp,
            message,
            checked,
        )


def checked_call(calls: int) -> int:
    """The call of a sample to check: uniform, from the OS's randomness (no seed to compute)."""
    return secrets.randbelow(calls)


def raised(case: Case, seed: int, round_index: int, arm: str, vseed: int, exc: Exception) -> TimedCheck:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return TimedCheck(
        case.id,
        seed,
        round_index,
        arm,
        vseed,
        False,
        float("nan"),
        float("nan"),
        float("nan"),
        f"{RAISED}{type(exc).__name__}: {first_line}",
    )
