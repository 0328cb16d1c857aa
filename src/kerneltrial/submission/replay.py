"""The archived module re-executed on a sample of its confirmation runs' checked calls (issue 35,
item 7): what `package --confirmed` and `inspect --receipt` do after the runs themselves pass
(submission/evidence.py), so that a module swapped under a rehashed manifest is refused.

A run records each checked call's seeds, not its inputs or outputs: correctness.jsonl a gate
check's case and seed (`make_inputs(case, seed)` drew its values), timed_checks.jsonl a timed
check's case, seed, the unit's values seed and the checked call (`values_with(case, values_seed
+ call * CALL_STRIDE, scalars of make_inputs(case, seed))`, trial/timed.py `Unit.draw`); both
under the run's inputs seed (provenance.json `inputs_seed`, a gate row's own where it has one;
none before inputs seeds). So the inputs are drawn again from those seeds (`Checked.inputs`),
the archived module runs on them in the interface check's worker (sandboxed, where no kerneltrial
is importable: submission/isolated.py) on the CPU (the Triton interpreter), and its outputs are
compared with the operator's reference and float64 oracle at the gate's tolerance
(`gate.compare`, exact where the run's plan is): every call the run recorded as passed must pass.

The sample: per run, one gate check and one timed check (checked_call recorded) of the module's
arm, drawn from the operating system's randomness among the recorded passed calls on the run's
cases of at most REPLAY_ELEMENTS elements (its smallest cases where none is that small: the
interpreter runs ~1 M elements a second).

What it shows, and not: a module that is wrong on the run's inputs is refused however the run's
files were edited; a different module that is right everywhere (a slower twin) passes, and only
the source anchor (evidence.source_problem) ties it to the run. The inputs are exactly the run's
only where this kerneltrial draws as the run's did (a run with an inputs seed, of the same
drawing code); for older runs they are draws of the same cases and seeds.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path
from typing import Any, Literal

import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops.registry import Case, Inputs, Operator, get_op
from kerneltrial.rundir.streams import CALL_STRIDE
from kerneltrial.submission.confined import sandbox_record
from kerneltrial.submission.isolated import TargetWorker, WorkerEnded, entry_problem, started, unpacked
from kerneltrial.submission.receipt import SandboxRecord
from kerneltrial.submission.target_env import FIRST
from kerneltrial.trial import confine, gate

CPU = torch.device("cpu")
REPLAY_ELEMENTS = 1 << 20  # the committed zimage confirmation's smallest case (983040) takes ~1.6 s
REPLAY_TIMEOUT_S = 600.0
# the worker runs on the CPU whatever the host has: the interpreter for Triton, no GPU visible
CPU_ENVIRONMENT = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


@dataclass(frozen=True)
class Checked:
    """One checked call a run recorded as passed, and the seeds that draw its inputs again."""

    run: Path
    source: Literal["gate", "timed"]  # correctness.jsonl or timed_checks.jsonl
    case: Case
    seed: int
    inputs_seed: int | None
    values_seed: int | None = None  # timed: the unit's values seed
    call: int | None = None  # timed: the checked call

    def describe(self) -> str:
        if self.source == "gate":
            return f"gate check {self.case.id} seed {self.seed}"
        return f"timed check {self.case.id} seed {self.seed} values seed {self.values_seed} call {self.call}"

    def inputs(self, op: Operator) -> Inputs:
        """The call's inputs, drawn again (see the module docstring)."""
        with inp.drawing(self.inputs_seed):
            values = op.make_inputs(self.case, self.seed, CPU)
            if self.source == "gate" or self.values_seed is None or self.call is None:
                return values
            scalars = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
            return op.values_with(self.case, self.values_seed + self.call * CALL_STRIDE, CPU, scalars)


@dataclass(frozen=True)
class ReplayResult:
    passed: bool
    reason: str  # one line; '' when passed
    calls: dict[Path, int]  # run -> its checked calls re-executed
    sandbox: SandboxRecord


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cases(plan: dict[str, Any]) -> dict[str, Case]:
    """The run's cases by id, the cheapest to replay only (see the module docstring)."""
    cases = [Case(tuple(c["shape"]), c["dtype"], c["layout"]) for c in plan.get("cases", [])]
    if not cases:
        return {}
    small = [c for c in cases if prod(c.shape) <= REPLAY_ELEMENTS]
    smallest = min(prod(c.shape) for c in cases)
    return {c.id: c for c in (small or [c for c in cases if prod(c.shape) == smallest])}


def recorded(run: Path, arm: str) -> tuple[list[Checked], list[Checked]]:
    """(gate checks, timed checks) `run` recorded as passed for `arm`, on its cheapest cases."""
    plan = json.loads((run / "plan.json").read_text())
    provenance = json.loads((run / "provenance.json").read_text())
    cases = _cases(plan)
    seed = provenance.get("inputs_seed")
    gates = [
        Checked(run, "gate", cases[r["case"]], int(r["seed"]), r.get("inputs_seed", seed))
        for r in _rows(run / "correctness.jsonl")
        if r.get("arm") == arm and r.get("passed") is True and r.get("case") in cases
    ]
    timed = [
        Checked(run, "timed", cases[r["case"]], int(r["seed"]), seed, int(r["values_seed"]), int(r["checked_call"]))
        for r in _rows(run / "timed_checks.jsonl")
        if r.get("arm") == arm
        and r.get("passed") is True
        and r.get("case") in cases
        and isinstance(r.get("checked_call"), int)
        and isinstance(r.get("values_seed"), int)
    ]
    return gates, timed


def sample(runs: Sequence[Path], arm: str) -> list[Checked]:
    """One gate check and one timed check of each run, drawn (see the module docstring)."""
    draw = random.SystemRandom()
    chosen: list[Checked] = []
    for run in runs:
        for found in recorded(run, arm):
            if found:
                chosen.append(draw.choice(found))
    return chosen


def _problem(op: Operator, remote: TargetWorker, checked: Checked, exact: bool) -> str:
    """Why the archived module's outputs on `checked`'s inputs fail the gate's comparison, or ''."""
    values = checked.inputs(op)
    reference, oracle = gate.expected(op, values)
    sent = gate.clone_inputs(values)
    try:
        got = op.outputs(sent, remote(*sent.values()))
    except WorkerEnded:
        raise
    except Exception as exc:  # the module may raise anything; the gate words it
        return gate.raised_message(exc)
    return gate.compare(op, checked.case, got, reference, oracle, exact)[1]


def replay(archive: bytes, op_name: str, runs: Sequence[Path], timeout: float = REPLAY_TIMEOUT_S) -> ReplayResult:
    """Re-execute the archive's module on a sample of `runs`' checked calls (see the module
    docstring). Raises `WorkerEnded` when the worker exits, its sandbox was not applied, or
    `timeout` (seconds, for every run together) runs out."""
    op = get_op(op_name)
    deadline = time.monotonic() + timeout
    calls: dict[Path, int] = dict.fromkeys(runs, 0)
    with unpacked(archive, cuda=False) as (prepared, module_file):
        sandbox = sandbox_record(confine.host(False))
        prepared = replace(prepared, environ=prepared.environ | CPU_ENVIRONMENT)
        chosen = sample(runs, f"user:{module_file[:-3]}")
        with started(prepared, FIRST, module_file[:-3], op.name, None, timeout, deadline) as worker:
            hello = worker.hello()
            problem = entry_problem(op, hello, module_file)
            if problem:
                return ReplayResult(False, f"the archived module cannot be re-executed: {problem}", calls, sandbox)
            for checked in chosen:
                exact = bool(json.loads((checked.run / "plan.json").read_text()).get("exact"))
                problem = _problem(op, worker, checked, exact)
                if problem:
                    reason = (
                        f"{checked.run}: the archived {module_file}, re-executed on the CPU on the run's "
                        f"{checked.describe()} (its inputs drawn again from the recorded seeds), fails the gate: "
                        f"{problem}; the run recorded that call as passed, so it was not made from this module"
                    )
                    return ReplayResult(False, reason, calls, sandbox)
                calls[checked.run] += 1
    empty = [run for run, n in calls.items() if n == 0]
    if empty:
        reason = (
            f"{empty[0]} recorded no passed checked call of user:{module_file[:-3]} on its cases, so the archived "
            "module cannot be re-executed on its inputs; package from a confirmation run that checked it"
        )
        return ReplayResult(False, reason, calls, sandbox)
    return ReplayResult(True, "", calls, sandbox)
