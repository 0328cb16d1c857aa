"""The trial runner: protocol in, run directory out (see docs/DESIGN.md for the format).

Stages, each appending raw rows as it measures them (flushed per row):
1. correctness: every arm x case x seed through the gate; an arm failing a case is not
   timed in that case;
2. ceilings: device-to-device copy and a read-only stream on the same device;
3. plan: calls per sample per case (fixed by the protocol, or sized from the control);
4. rounds: per case and seed, warm-up, then in each round every timed arm once, in a
   seeded random order.
A killed run resumes (`resume=True`): rows already on disk are kept and not measured again.
A finished run directory is never overwritten.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, Impl, Operator, get_op, load_user_module
from kerneltrial.trial import gate, protocol as proto, provenance
from kerneltrial.trial.timing import Timer, calls_for, label, make_timer

TIMING_COLUMNS = ["case", "seed", "round", "position", "arm", "calls", "ns"]
CEILING_COLUMNS = ["kind", "sample", "bytes", "ns"]
CEILING_SAMPLES = 10
INPUT_SETS_COLD = 2  # input sets rotated between samples in cold-L2 mode


class RunError(RuntimeError):
    """The run cannot start or continue; the message says why and what to do."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __getattr__(self, name: str) -> Path:
        files = {
            "protocol": "protocol.toml", "provenance": "provenance.json", "plan": "plan.json",
            "correctness": "correctness.jsonl", "ceilings": "ceilings.csv", "timings": "timings.csv",
            "summary": "summary.json",
        }
        if name not in files:
            raise AttributeError(name)
        return self.root / files[name]


def trim_partial_line(path: Path) -> None:
    """Drop a last line a killed process left half-written."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


@contextmanager
def csv_appender(path: Path, columns: list[str]) -> Iterator[Any]:
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(columns)
            handle.flush()

        def append(row: list[Any]) -> None:
            writer.writerow(row)
            handle.flush()

        yield append


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def prepare(out: Path, protocol_path: Path, resume: bool) -> tuple[RunDir, str]:
    """Create or reopen the run directory; refuse to overwrite or to mix protocols."""
    run = RunDir(out)
    digest = proto.sha256_of(protocol_path)
    if out.exists() and any(out.iterdir()):
        if run.provenance.exists() and json.loads(run.provenance.read_text()).get("finished_at"):
            raise RunError(f"{out} holds a finished run; a finished run directory is never overwritten: choose another --out")
        if not resume:
            raise RunError(f"{out} holds an unfinished run; continue it with --resume or choose another --out")
        if not run.protocol.exists() or proto.sha256_of(run.protocol) != digest:
            raise RunError(f"{out} was started with another protocol; --resume needs the same protocol file")
        for path in (run.correctness, run.ceilings, run.timings):
            trim_partial_line(path)
        return run, digest
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(protocol_path, run.protocol)
    write_json(run.provenance, provenance.collect(Path(__file__).resolve().parents[3], digest))
    return run, digest


def resolve_arms(op: Operator, p: proto.Protocol) -> list[Impl]:
    arms = [op.impl(name) for name in p.arms()]
    if not arms[0].available:
        raise RunError(f"the control {arms[0].name!r} is unavailable here: {arms[0].reason}")
    return arms


def load_modules(p: proto.Protocol, protocol_path: Path) -> None:
    for spec in p.impl_modules:
        local = protocol_path.parent / spec
        load_user_module(str(local) if spec.endswith(".py") and local.exists() else spec)


# ---- stages -------------------------------------------------------------------------------

def run_correctness(run: RunDir, op: Operator, arms: list[Impl], cases: list[Case], seeds: list[int], device: torch.device, progress: Any) -> dict[tuple[str, str], bool]:
    """Gate every (case, seed, arm); returns whether each (case, arm) passed every seed."""
    done = {(r["case"], r["seed"], r["arm"]): r for r in read_jsonl(run.correctness)}
    task = progress.add_task("correctness", total=len(cases) * len(seeds) * len(arms))
    with run.correctness.open("a") as handle:
        for case in cases:
            for seed in seeds:
                for impl in arms:
                    key = (case.id, seed, impl.name)
                    if key not in done and impl.available and impl.supports(case):
                        done[key] = gate.check(op, impl, case, seed, device).row()
                        handle.write(json.dumps(done[key]) + "\n")
                        handle.flush()
                    progress.advance(task)
    return {
        (case.id, impl.name): impl.available and impl.supports(case) and all(done[(case.id, s, impl.name)]["passed"] for s in seeds)
        for case in cases for impl in arms
    }


def run_ceilings(run: RunDir, timer: Timer, device: torch.device) -> None:
    """Copy and read-only stream bandwidth on this device, CEILING_SAMPLES samples each."""
    have = {(r["kind"], int(r["sample"])) for r in read_csv(run.ceilings)}
    nbytes = (1 << 30) if device.type == "cuda" else (16 << 20)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    streams = {"copy": (lambda: dst.copy_(src), 2 * nbytes), "read": (lambda: src.sum(), nbytes)}
    with csv_appender(run.ceilings, CEILING_COLUMNS) as append:
        for kind, (call, moved) in streams.items():
            call()
            for sample in range(CEILING_SAMPLES):
                if (kind, sample) not in have:
                    append([kind, sample, moved, timer.sample(call, 1)])


def input_sets(op: Operator, case: Case, seed: int, device: torch.device, count: int) -> list[dict[str, Any]]:
    return [op.make_inputs(case, seed + k * 1_000_003, device) for k in range(count)]


def plan_calls(p: proto.Protocol, op: Operator, timer: Timer, case: Case, impl: Impl, device: torch.device) -> int:
    if p.calls_per_sample != "auto":
        return int(p.calls_per_sample)
    fn = impl.resolve()
    inputs = op.make_inputs(case, p.seeds[0], device)
    for _ in range(p.warmup):
        fn(*inputs.values())
    return calls_for(timer, lambda: fn(*inputs.values()), p.target_sample_us * 1e3)


def round_order(order_seed: int, case_index: int, seed: int, round_index: int, arms: list[str]) -> list[str]:
    rng = np.random.default_rng([order_seed, case_index, seed, round_index])
    return [arms[i] for i in rng.permutation(len(arms))]


def run_rounds(run: RunDir, p: proto.Protocol, op: Operator, timer: Timer, plan: dict[str, Any], timed: dict[str, list[Impl]], device: torch.device, progress: Any) -> None:
    done = {(r["case"], int(r["seed"]), int(r["round"]), r["arm"]) for r in read_csv(run.timings)}
    cases = {c["case"]: c for c in plan["cases"]}
    total = sum(len(timed[cid]) for cid in cases) * len(p.seeds) * p.rounds
    task = progress.add_task("timing", total=total, completed=len(done))
    n_sets = INPUT_SETS_COLD if timer.cold else 1
    with csv_appender(run.timings, TIMING_COLUMNS) as append:
        for case_index, spec in enumerate(p.cases):
            case = spec.case()
            arms = timed[case.id]
            calls = cases[case.id]["calls"]
            names = [a.name for a in arms]
            for seed in p.seeds:
                if all((case.id, seed, r, a) in done for r in range(p.rounds) for a in names):
                    continue
                sets = input_sets(op, case, seed, device, n_sets)
                fns = {a.name: a.resolve() for a in arms}
                for name, fn in fns.items():
                    for _ in range(p.warmup):
                        fn(*sets[0].values())
                sample = 0
                for round_index in range(p.rounds):
                    for position, name in enumerate(round_order(p.order_seed, case_index, seed, round_index, names)):
                        if (case.id, seed, round_index, name) in done:
                            continue
                        inputs = sets[sample % n_sets]
                        fn = fns[name]
                        ns = timer.sample(lambda: fn(*inputs.values()), calls, key=hash((name, sample % n_sets)))
                        append([case.id, seed, round_index, position, name, calls, ns])
                        sample += 1
                        progress.advance(task)
                timer.release()
                del sets


def run_trial(protocol_path: Path, out: Path, resume: bool = False, progress: Any = None) -> Path:
    """Run the trial `protocol_path` describes into `out`; return the run directory."""
    from kerneltrial.analysis.summary import write_summary

    p = proto.load(protocol_path)
    load_modules(p, protocol_path)
    op = get_op(p.op)
    arms = resolve_arms(op, p)
    cases = [c.case() for c in p.cases]
    for case in cases:
        if case.layout not in op.layouts:
            raise RunError(f"case {case.id}: {op.name} has no layout {case.layout!r}; use one of {', '.join(op.layouts)}")
    timer = make_timer(p.backend, p.l2)
    device = launch.device()
    run, digest = prepare(out, protocol_path, resume)
    progress = progress or _NoProgress()

    passed = run_correctness(run, op, arms, cases, p.seeds, device, progress)
    run_ceilings(run, timer, device)
    timed = {c.id: [a for a in arms if passed[(c.id, a.name)]] for c in cases}
    if run.plan.exists():
        plan = json.loads(run.plan.read_text())
    else:
        plan = {
            "protocol_sha256": digest, "op": op.name, "backend": timer.name, "is_gpu": timer.is_gpu,
            "timing_label": label(timer), "l2": p.l2,
            "arms": [{"name": a.name, "kind": a.kind, "available": a.available, "reason": a.reason} for a in arms],
            "cases": [
                {"case": c.id, "shape": list(c.shape), "layout": c.layout, "dtype": c.dtype, "bytes": op.bytes_moved(c),
                 "calls": plan_calls(p, op, timer, c, timed[c.id][0], device) if timed[c.id] else 0}
                for c in cases
            ],
            "seeds": p.seeds, "rounds": p.rounds, "tie_band": p.tie_band, "gate": p.gate,
            "bootstrap": {"resamples": p.bootstrap_resamples, "seed": p.bootstrap_seed, "confidence": p.confidence},
        }
        write_json(run.plan, plan)
    run_rounds(run, p, op, timer, plan, timed, device, progress)

    record = json.loads(run.provenance.read_text())
    record.update(finished_at=provenance.now(), clocks_at_end=provenance.clocks())
    write_summary(run.root)
    write_json(run.provenance, record)
    return run.root


class _NoProgress:
    """Stands in for a rich Progress when none is shown."""

    def add_task(self, *_: Iterable[Any], **__: Any) -> int:
        return 0

    def advance(self, *_: Any, **__: Any) -> None:
        return None
