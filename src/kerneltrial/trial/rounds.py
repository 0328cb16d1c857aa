"""Stage 4 of a trial (trial/runner.py): the timing rounds.

Per case and seed, warm-up, then in each round every timed arm once, in a seeded random order,
each on its own guarded inputs; the last call of every sample runs on the round's fresh values and
is checked (trial/timed.py, timed_checks.jsonl); an arm that raises leaves the case. With a target
CI width, extra rounds until it is met, `max_rounds` or the time budget. Rows on disk are kept
(resume). `Measured` says what remains, `time_round` measures one (case, seed, round), and
`run_rounds` loops over the cases.

The round trip (plan.json `roundtrip`, host clock only): where a round times an isolated arm, a
trusted worker of kerneltrial's own torch formula (`reference`, the same sandbox, the same unit, the
same calls) is timed ROUNDTRIP_SAMPLES times before the arms (so a run killed mid-round and resumed
times it again with the arms left); its wall clock less its own claim is what a sample costs beside
its calls (the request, the value sets written, the outputs copied into slots). roundtrip.csv keeps
each, and the summary's floor of an isolated arm's claim is its wall clock less the case's round
trip (kernel/bounds.py).
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kerneltrial import stats
from kerneltrial.ops.registry import Case, Impl, Operator
from kerneltrial.rundir.files import csv_appender, jsonl_appender, read_csv, read_jsonl, write_json
from kerneltrial.rundir.layout import PEAK_BYTES, ROUNDTRIP_COLUMNS, ROUNDTRIP_SAMPLES, RunDir
from kerneltrial.trial import gate, timed
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.calibration import Delay
from kerneltrial.trial.clocks import ClockReader
from kerneltrial.trial.remote import IsolatedArm, timed_arm
from kerneltrial.trial.timing import Timer

# wall_ns: the harness's wall clock around an isolated arm's sample (its bound); empty for an arm in this process
TIMING_COLUMNS = ["case", "seed", "round", "position", "arm", "calls", "ns", "sm_mhz", "mem_mhz", "wall_ns"]


def timing_columns(plan: dict[str, Any]) -> list[str]:
    """timings.csv's columns: with `peak_bytes` (trial/memory.py) in a run whose plan.json has
    `peak_memory`; a run from before it (a resumed one) keeps the columns it was started with."""
    return [*TIMING_COLUMNS, PEAK_BYTES] if "peak_memory" in plan else TIMING_COLUMNS


Key = tuple[str, int, int, str]  # (case, seed, round, arm): one sample of timings.csv


def widest_ci(p: proto.Protocol, control: str, samples: dict[tuple[int, int, str], float]) -> float:
    """Widest speedup CI (high - low) of any arm against the control over the units so far."""
    from kerneltrial.stats import BootstrapRule, bootstrap_speedup_ci

    rule = BootstrapRule(p.bootstrap_resamples, p.bootstrap_seed, p.confidence)
    units = sorted({(s, r) for s, r, a in samples if a == control})
    widest = 0.0
    for arm in sorted({a for *_, a in samples} - {control}):
        paired = [u for u in units if (*u, arm) in samples]
        if len(paired) >= 2:
            ci = bootstrap_speedup_ci(
                np.array([samples[(*u, control)] for u in paired]), np.array([samples[(*u, arm)] for u in paired]), rule
            )
            widest = max(widest, ci.high - ci.low)
    return widest


def round_order(order_seed: int, case_index: int, seed: int, round_index: int, arms: list[str]) -> list[str]:
    rng = np.random.default_rng([order_seed, case_index, seed, round_index])
    return [arms[i] for i in rng.permutation(len(arms))]


def reconcile_timed_checks(run: RunDir, columns: list[str]) -> None:
    """A run killed between a timing row and its check row: drop that timing row, so the
    sample is measured again with its check (every timing row has a check; docs/DESIGN.md);
    `columns`: the file's (`timing_columns`)."""
    checked = {(r["case"], int(r["seed"]), int(r["round"]), r["arm"]) for r in read_jsonl(run.timed_checks)}
    rows = read_csv(run.timings)
    kept = [r for r in rows if (r["case"], int(r["seed"]), int(r["round"]), r["arm"]) in checked]
    if len(kept) != len(rows):
        tmp = run.timings.with_suffix(".csv.tmp")  # replaced in one step: a kill here loses nothing
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(kept)
        tmp.replace(run.timings)


@dataclass
class Measured:
    """What the rounds have measured: read once from timings.csv and timed_checks.jsonl, then kept
    up to date by this session (the rounds' own record; the run's files are only appended to)."""

    done: set[Key]  # sampled, or the arm raised there
    samples: dict[Key, float]  # ns per call
    dropped: dict[tuple[str, str], tuple[int, int]]  # (case, arm) -> the (seed, round) it raised in

    @classmethod
    def read(cls, run: RunDir) -> Measured:
        """The run's rows so far (a resumed run's; none for a new one)."""
        rows = read_csv(run.timings)
        measured = cls(
            {(r["case"], int(r["seed"]), int(r["round"]), r["arm"]) for r in rows},
            {(r["case"], int(r["seed"]), int(r["round"]), r["arm"]): int(r["ns"]) / int(r["calls"]) for r in rows},
            {},
        )
        for r in read_jsonl(run.timed_checks):
            if r["message"].startswith(timed.RAISED):
                measured.dropped[(r["case"], r["arm"])] = (r["seed"], r["round"])
                measured.done.add((r["case"], r["seed"], r["round"], r["arm"]))
        return measured

    def present(self, case: str, names: list[str], unit: tuple[int, int]) -> list[str]:
        """The case's arms still in it at `unit` (an arm that raised is in its last unit)."""
        return [a for a in names if self.dropped.get((case, a), unit) == unit]

    def rounds_left(self, case: str, seed: int, names: list[str], rounds: range) -> list[int]:
        """The rounds of (case, seed) among `rounds` with a sample still to take."""
        return [
            r for r in rounds if any((case, seed, r, a) not in self.done for a in self.present(case, names, (seed, r)))
        ]

    def of_case(self, case: str) -> dict[tuple[int, int, str], float]:
        """The case's samples, keyed (seed, round, arm)."""
        return {(s, r, a): v for (c, s, r, a), v in self.samples.items() if c == case}

    def add(self, check: timed.TimedCheck) -> None:
        """A unit's check just written: the sample is done, or the arm raised and leaves the case."""
        self.done.add((check.case, check.seed, check.round, check.arm))
        if check.message.startswith(timed.RAISED):
            self.dropped[(check.case, check.arm)] = (check.seed, check.round)


@dataclass
class Retakes:
    """Throttled samples taken again (protocol `throttle_retakes`, `throttle_recovery_s`): below
    `threshold_mhz` (None: no clock, nothing is re-taken) right after a sample, the device rests
    `pause_s` and the sample is taken again, at most `most` times; `by_arm` counts the re-takes of
    each arm so far. A re-take follows a rest, so an arm re-taken more often than another was timed
    on a cooler card more often: provenance.json keeps the count per arm for the reader to weigh."""

    threshold_mhz: float | None
    most: int
    pause_s: float
    by_arm: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.by_arm.values())

    @classmethod
    def of(cls, p: proto.Protocol, plan: dict[str, Any]) -> Retakes:
        """The protocol's rule, under plan.json's throttle threshold (none without a clock)."""
        clocks = plan.get("clocks") or {}
        threshold = stats.throttle_threshold(clocks.get("max_sm_mhz"), float(clocks.get("throttle_fraction", 0.9)))
        return cls(threshold, p.throttle_retakes, p.throttle_recovery_s)

    def again(self, sm_mhz: int | None, taken: int, arm: str) -> bool:
        """Whether `arm`'s sample read at `sm_mhz`, already re-taken `taken` times, is taken again (after the pause)."""
        if self.threshold_mhz is None or sm_mhz is None or taken >= self.most:
            return False
        if not stats.is_throttled(sm_mhz, self.threshold_mhz):
            return False
        time.sleep(self.pause_s)
        self.by_arm[arm] = self.by_arm.get(arm, 0) + 1
        return True


@dataclass(frozen=True)
class Session:
    """What every unit of one session of the rounds shares."""

    p: proto.Protocol
    op: Operator
    timer: Timer
    device: torch.device
    order_seed: int
    clocks: ClockReader
    measured: Measured
    append: Callable[[list[object]], None]  # a row of timings.csv
    append_check: Callable[[dict[str, Any]], None]  # a row of timed_checks.jsonl
    progress: Any
    task: int
    quiet: Callable[[timed.TimedArm | None], None]  # every other arm's worker frozen (arms.Isolation.quiet)
    reference: Impl | None = None  # the control in a trusted worker of its own (module docstring)
    append_roundtrip: Callable[[list[object]], None] | None = None  # a row of roundtrip.csv
    retakes: Retakes = field(default_factory=lambda: Retakes(None, 0, 0.0))
    peak_column: bool = False  # timings.csv has `peak_bytes` (`timing_columns`)

    def record(self, check: timed.TimedCheck) -> None:
        """Write a unit's check (timed_checks.jsonl), count it done and advance the bar."""
        self.append_check(check.row())
        self.measured.add(check)
        self.progress.advance(self.task)


def warm_arms(
    s: Session, case: Case, seed: int, arms: list[Impl], todo: list[int], calls: int
) -> dict[str, timed.TimedArm]:
    """The arms with a sample to take in the rounds `todo` of (case, seed), each on the seed's
    inputs after the warm-up calls; an arm that raises here is recorded and left out."""
    initial = s.op.make_inputs(case, seed, s.device)
    prepared: dict[str, timed.TimedArm] = {}
    for impl in arms:
        remaining = [r for r in todo if (case.id, seed, r, impl.name) not in s.measured.done]
        if (case.id, impl.name) in s.measured.dropped or not remaining:
            continue
        try:
            arm = timed_arm(s.op, impl, initial, calls)
            for _ in range(s.p.warmup):
                arm.call()
        except Exception as exc:  # an arm may fail in any way; recorded, it leaves the case
            s.record(timed.raised(case, seed, remaining[0], impl.name, timed.values_seed(seed, remaining[0]), exc))
            continue
        finally:
            gate.settle(s.device)  # before the next arm's buffers are allocated
        prepared[impl.name] = arm
    return prepared


def time_round(
    s: Session,
    case_index: int,
    case: Case,
    seed: int,
    round_index: int,
    names: list[str],
    prepared: dict[str, timed.TimedArm],
    calls: int,
    reference: timed.TimedArm | None = None,
) -> None:
    """One unit: every arm still in the case once, in the round's seeded order, on the round's
    fresh values (trial/timed.py `Unit`); a sample already on disk is not taken again. First, where
    an isolated arm is to be timed, the reference's round trips (module docstring)."""
    unit = timed.Unit.draw(s.op, case, seed, round_index, calls, s.device)
    order = round_order(
        s.order_seed, case_index, seed, round_index, s.measured.present(case.id, names, (seed, round_index))
    )
    graph = s.timer.name == "cuda-graph"  # a graph's outputs live in its pool: copied, not kept
    pending = [n for n in order if (case.id, seed, round_index, n) not in s.measured.done]
    if reference is not None and s.append_roundtrip is not None:
        if any(isinstance(prepared[n], IsolatedArm) for n in pending):  # first: a resumed round keeps its trips
            s.quiet(reference)
            for _ in range(ROUNDTRIP_SAMPLES):
                ns, _, wall = reference.sample(s.timer, s.op, unit, calls, 0, graph)
                s.append_roundtrip([case.id, seed, round_index, calls, ns, wall])
    for position, name in enumerate(order):
        if (case.id, seed, round_index, name) in s.measured.done:
            continue
        arm = prepared[name]
        try:
            ns, checked, wall, sm, mem = take_sample(s, arm, name, unit, calls, graph)
            peak = [arm.peak_bytes] if s.peak_column else []  # None (empty): not measured (trial/memory.py)
            check = arm.check(s.op, case, seed, round_index, unit, checked, s.p.exact, s.device, persistent=not graph)
        except Exception as exc:  # recorded; the arm leaves the case
            gate.settle(s.device)
            s.record(timed.raised(case, seed, round_index, name, unit.seed, exc))
            continue
        s.append(
            [case.id, seed, round_index, position, name, calls, ns]
            + ["" if v is None else v for v in (sm, mem, wall, *peak)]
        )
        s.measured.samples[(case.id, seed, round_index, name)] = ns / calls
        s.record(check)


def take_sample(
    s: Session, arm: timed.TimedArm, name: str, unit: timed.Unit, calls: int, graph: bool
) -> tuple[int, int, int | None, int | None, int | None]:
    """One timed sample of `arm` (every other worker frozen) and the clocks right after it, taken
    again while the clock reads throttled (`Retakes`): (ns, checked call, wall ns, SM MHz, memory MHz)."""
    taken = 0
    while True:
        s.quiet(arm)
        ns, checked, wall = arm.sample(s.timer, s.op, unit, calls, hash(name) % 2**31, graph)
        sm, mem = s.clocks.read()
        if not s.retakes.again(sm, taken, name):
            return ns, checked, wall, sm, mem
        taken += 1


def time_units(s: Session, case_index: int, case: Case, arms: list[Impl], calls: int, rounds: range) -> None:
    """The rounds `rounds` of `case`, seed by seed: those with a sample still to take."""
    names = [a.name for a in arms]
    for seed in s.p.seeds:
        todo = s.measured.rounds_left(case.id, seed, names, rounds)
        if not todo:
            continue
        prepared = warm_arms(s, case, seed, arms, todo, calls)
        reference = warm_reference(s, case, seed, prepared, calls)
        for round_index in todo:
            time_round(s, case_index, case, seed, round_index, names, prepared, calls, reference)
        s.timer.release()


def warm_reference(
    s: Session, case: Case, seed: int, prepared: dict[str, timed.TimedArm], calls: int
) -> timed.TimedArm | None:
    """The trusted reference worker on the seed's inputs after the warm-up, where an isolated arm
    is to be timed (module docstring); it is kerneltrial's own control, so a failure is the harness's."""
    if s.reference is None or not any(isinstance(a, IsolatedArm) for a in prepared.values()):
        return None
    reference = timed_arm(s.op, s.reference, s.op.make_inputs(case, seed, s.device), calls)
    for _ in range(s.p.warmup):
        reference.call()
    return reference


def wants_round(
    p: proto.Protocol, case: str, arms: list[Impl], rounds: int, started: float, measured: Measured
) -> bool:
    """The noise rule: another round of `case` (its timed `arms`, `rounds` so far) while its widest
    CI is wider than the target, within `max_rounds` and the time budget (`started`: the session's
    start); none without a target, or when the control was not timed."""
    return (
        p.target_ci_width is not None
        and arms[0].name == p.control
        and rounds < p.max_rounds
        and time.monotonic() - started < p.time_budget_s
        and widest_ci(p, p.control, measured.of_case(case)) > p.target_ci_width
    )


def with_rounds(plan: dict[str, Any], rounds: dict[str, int]) -> dict[str, Any]:
    """A copy of `plan` in which each case of `rounds` has that many rounds."""
    cases = [c | {"rounds": rounds[c["case"]]} if c["case"] in rounds else c for c in plan["cases"]]
    return plan | {"cases": cases}


def roundtrip_appender(run: RunDir, plan: dict[str, Any]) -> AbstractContextManager[Any]:
    """roundtrip.csv's appender in a run whose plan.json has `roundtrip` (a header only where it is
    null); none in a run from before it (a resumed one), which must not gain the file."""
    return csv_appender(run.roundtrip, list(ROUNDTRIP_COLUMNS)) if "roundtrip" in plan else nullcontext(None)


def run_rounds(
    run: RunDir,
    p: proto.Protocol,
    op: Operator,
    timer: Timer,
    plan: dict[str, Any],
    timed_arms: dict[str, list[Impl]],
    device: torch.device,
    delay: Delay,
    progress: Any,
    quiet: Callable[[timed.TimedArm | None], None],
    reference: Impl | None = None,
    retakes: Retakes | None = None,
) -> dict[str, Any]:
    """The rounds of every case (module docstring); returns the plan as they leave it: `plan`
    with the rounds the noise rule added (plan.json is rewritten before each added round, so
    that a resumed run expects it). `plan` itself is not changed."""
    columns = timing_columns(plan)
    reconcile_timed_checks(run, columns)
    measured = Measured.read(run)
    planned = {c["case"]: c for c in plan["cases"]}
    rounds = {cid: c.get("rounds", p.rounds) for cid, c in planned.items()}
    added: dict[str, int] = {}  # case -> its rounds, where the noise rule added some
    total = max(sum(len(timed_arms[cid]) * n for cid, n in rounds.items()) * len(p.seeds), len(measured.done))
    task = progress.add_task("timing", total=total, completed=len(measured.done))
    clocks = ClockReader.open(timer.is_gpu)
    retakes = retakes or Retakes.of(p, plan)
    started = time.monotonic()
    with (
        csv_appender(run.timings, columns) as append,
        jsonl_appender(run.timed_checks) as append_check,
        roundtrip_appender(run, plan) as append_roundtrip,
    ):
        s = Session(
            p,
            op,
            timer,
            device,
            plan["order_seed"],
            clocks,
            measured,
            append,
            append_check,
            progress,
            task,
            quiet,
            reference if plan.get("roundtrip") else None,
            append_roundtrip,
            retakes,
            PEAK_BYTES in columns,
        )
        for case_index, spec in enumerate(p.cases):
            case = spec.case()
            arms, n = timed_arms[case.id], rounds[case.id]
            if not arms:
                continue
            delay.ns = planned[case.id].get("delay_spin_ns", planned[case.id].get("injected_delay_ns", 0.0))
            calls = planned[case.id]["calls"]
            time_units(s, case_index, case, arms, calls, range(n))
            while wants_round(p, case.id, arms, n, started, measured):
                added[case.id] = n = n + 1
                write_json(run.plan, with_rounds(plan, added))  # before measuring: a resumed run expects this round
                total += len(arms) * len(p.seeds)
                progress.update(task, total=total)  # the bar grows with the added round
                time_units(s, case_index, case, arms, calls, range(n - 1, n))
    return with_rounds(plan, added)
