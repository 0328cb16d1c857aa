"""The trial runner: protocol in, run directory out (the files: docs/RUNDIR.md; their rules: docs/VERIFY.md).

First the preflight (trial/preflight.py: the protocol file, its keys, every case against free
memory), before the run directory exists. Then stages, each appending raw rows as it measures
them (flushed per row):
1. correctness: every arm x case x seed through the gate; an arm failing a case is not
   timed in that case;
2. ceilings: device-to-device copy and a read-only stream on the same device, and two launch
   floors: torch's (an add of 0 to one element) and Triton's (trial/floor.py);
3. plan: calls per sample per case (fixed by the protocol, or sized from the control);
4. rounds (trial/rounds.py): per case and seed, warm-up, then in each round every timed arm
   once, in a seeded random order, each on its own guarded inputs; the last call of every sample
   runs on the round's fresh values and is checked (trial/timed.py, timed_checks.jsonl);
5. host cost: per case and timed arm (not one that raised while timed), `host_samples` samples
   of `host_calls` back-to-back calls on one set of inputs, nothing synchronised inside a
   sample: the host time per call a caller is blocked, and whether the device was behind at
   the end (trial/timing.py `host_sample`; host.csv);
6. the end: summary.json, provenance's end fields, and manifest.json (sha256 of every file).
A killed run resumes (`resume=True`): rows already on disk are kept and not measured again.
A finished run directory is never overwritten.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kerneltrial.kernel.links import Links
from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, Impl, Operator, get_op, load_user_module
from kerneltrial.rundir import provenance as source_provenance
from kerneltrial.rundir.documents import PLAN_V1
from kerneltrial.rundir.files import (
    jsonl_appender,
    now,
    read_json,
    read_jsonl,
    trim_partial_line,
    write_json,
)
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.integrity_notes import FLOOR_RULE
from kerneltrial.rundir.layout import FLOOR_MODEL, PARTIAL_LAYOUT_KINDS, RunDir
from kerneltrial.rundir.streams import AUTO_CALLS_LIMIT
from kerneltrial.trial import confine, gate, memory, provenance, timed
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.arms import Isolation
from kerneltrial.trial.calibration import (
    CalibrationError,
    Delay,
    calibration_arm,
    calibration_protocol,
    require_calibration,
    size_delay,
)
from kerneltrial.trial.clocks import ClockReader
from kerneltrial.trial.confirm import check_confirmation
from kerneltrial.trial.isolation import Settings
from kerneltrial.trial.preflight import preflight
from kerneltrial.trial.remote import RemoteFn
from kerneltrial.trial.rounds import Retakes, run_rounds
from kerneltrial.trial.stages import run_ceilings, run_host
from kerneltrial.trial.targets import Target, targeting
from kerneltrial.trial.timing import Timer, calls_for, host_calls, label, make_timer

# plan.json `checks` (docs/VERIFY.md, "Timed checks"): 2 = fresh values before every call, a random call checked; 3 = and
# isolated arms (plan `isolated`), whose samples carry the harness's wall bound (timings.csv `wall_ns`)
CHECKS_VERSION = 3
# the round trip's trusted worker (trial/rounds.py): kerneltrial's torch formula, the fastest built-in
# arm of every operator, so that its wall clock is mostly what a sample costs beside its calls
ROUNDTRIP_REFERENCE = "torch_eager"


class RunError(RuntimeError):
    """The run cannot start or continue; the message says why and what to do."""


def module_hashes(p: proto.Protocol, protocol_path: Path) -> dict[str, str]:
    """sha256 of each user kernel file the protocol loads (dotted modules: of their file)."""
    import importlib.util

    hashes = {}
    for spec in p.impl_modules:
        local = protocol_path.parent / spec
        path = local if spec.endswith(".py") and local.exists() else Path(spec)
        if not path.is_file():
            found = importlib.util.find_spec(spec)
            path = Path(found.origin) if found and found.origin else path
        hashes[spec] = sha256_file(path) if path.is_file() else "unknown"
    return hashes


def moved_device(record: dict[str, Any], uuid: str | None, host: str) -> str | None:
    """Why an unfinished run (its provenance `record`) cannot continue on GPU `uuid` of `host`,
    or None: a resumed run, a fleet unit above all (Ray picks its GPU), would mix two chips'
    rows. A uuid or host the run did not record (a CPU run has no uuid) is not compared."""
    started_uuid, started_host = record.get("device", {}).get("uuid"), record.get("hostname")
    if started_uuid in (None, uuid) and started_host in (None, host):
        return None
    return f"it was started on GPU {started_uuid} of host {started_host}, this is GPU {uuid} of host {host}"


def prepare(
    out: Path, protocol_path: Path, p: proto.Protocol, resume: bool, links: Links | None = None
) -> tuple[RunDir, str]:
    """Create or reopen the run directory; refuse to overwrite, to mix protocols, kernel
    files or devices. A new run records the freeze record, the user modules' hashes and a
    confirmation's links (`confirmation`, paths relative to the run directory)."""
    run = RunDir(out)
    digest = sha256_file(protocol_path)
    modules = module_hashes(p, protocol_path)
    if out.exists() and any(out.iterdir()):
        record = read_json(run.provenance) if run.provenance.exists() else {}
        if record.get("finished_at"):
            raise RunError(
                f"{out} holds a finished run; a finished run directory is never overwritten: choose another --out"
            )
        if not resume:
            raise RunError(f"{out} holds an unfinished run; continue it with --resume or choose another --out")
        if not run.protocol.exists() or sha256_file(run.protocol) != digest:
            raise RunError(f"{out} was started with another protocol; --resume needs the same protocol file")
        if record.get("impl_modules", {}) != modules:
            raise RunError(
                f"{out}: a user kernel module changed since the run started ({record.get('impl_modules')} vs {modules}); start a new run"
            )
        device = provenance.device_info()
        here = device.get("gpu")
        if record.get("device", {}).get("gpu") != here:
            raise RunError(
                f"{out} was started on {record.get('device', {}).get('gpu') or 'a CPU'}, this machine has {here or 'no GPU'}; resume it there"
            )
        moved = moved_device(record, device.get("uuid"), socket.gethostname())
        if moved:
            raise RunError(
                f"{out}: {moved}; one run's rows come from one chip: resume it on that device or start a new run directory (another --out)"
            )
        started_with = record.get("git", {}).get("source_sha256")
        if started_with != source_provenance.source_digest():
            raise RunError(
                f"{out} was started by other kerneltrial code (source sha256 {str(started_with)[:12]}..., "
                f"commit {record.get('git', {}).get('commit')}); resume it with that code or start a new run"
            )
        for path in (run.correctness, run.ceilings, run.timings, run.timed_checks, run.host):
            trim_partial_line(path)
        return run, digest
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(protocol_path, run.protocol)
    source = source_provenance.source_files()  # read once: the archive and the recorded digest agree
    source_provenance.write_source_archive(run.source, source)  # before provenance.json: a resumable run has it
    record = provenance.collect(digest, source)
    record.update(
        freeze=proto.freeze_record(protocol_path),
        impl_modules=modules,
        inputs_seed=inp.active_inputs_seed(),
        isolation={"arms": p.isolated(), "timeout_s": p.isolate_timeout_s},
    )
    if links is not None:
        record["confirmation"] = links.rebased(protocol_path.resolve().parent, out).record()
    write_json(run.provenance, record)
    return run, digest


def sealed_on_resume(out: Path) -> bool:
    """A run killed after it was marked finished but before its manifest was written: write the
    manifest (its rows are complete) and report True; False for any other directory."""
    run = RunDir(out)
    if not run.provenance.exists() or run.manifest.exists():
        return False
    if not read_json(run.provenance).get("finished_at"):
        return False
    write_manifest(run)
    return True


def resolve_arms(
    op: Operator, p: proto.Protocol, delay: Delay, isolation: Isolation, registered: frozenset[str] = frozenset()
) -> list[Impl]:
    """The protocol's arms, refused before any GPU work when the control is not a control
    (a peer as control leaves the run without a summary) or an arm does not exist; the arms of
    protocol `isolate` each get a worker process of their own (not one a user module `registered`
    here through kerneltrial's registry: its module ran in this process)."""
    arms = [calibration_arm(op, n, delay) if n.startswith(("aa:", "slow:")) else op.impl(n) for n in p.arms()]
    clash = sorted(registered & set(p.isolated()))
    if clash:
        raise RunError(
            f"isolate: arm {clash[0]!r} is registered by a user module through kerneltrial's registry, so its module "
            "was imported in kerneltrial's process; it cannot be isolated: make it the module's top-level "
            "function named after the operator (arm user:MODULE) or leave it out of isolate"
        )
    arms = [isolation.isolate(a) if a.name in p.isolated() else a for a in arms]
    control = arms[0]
    if control.kind != "control":
        controls = ", ".join(i.name for i in op.impls.values() if i.kind == "control")
        raise RunError(
            f"control {control.name!r} is a {control.kind} arm of {op.name}, not a control; "
            f"set control to one of: {controls} (compare {control.name} as a candidate)"
        )
    if not control.available:
        raise RunError(f"the control {control.name!r} is unavailable here: {control.reason}")
    for arm in arms:
        if arm.layouts is not None and arm.kind not in PARTIAL_LAYOUT_KINDS:
            raise RunError(
                f"{arm.kind} arm {arm.name!r} takes only layouts {', '.join(arm.layouts)}; only a peer may skip "
                "layouts (a candidate unavailable in a case would leave the gate): register it for every layout"
            )
        if arm.widths is not None and arm.kind not in ("peer", "calibration"):  # aa:/slow: copy their peer
            raise RunError(
                f"{arm.kind} arm {arm.name!r} declares widths {arm.widths}; only a peer may (the gate would draw "
                "no extra shape of another width for it): register it without widths"
            )
    return arms


def check_arms(protocol_path: Path, p: proto.Protocol) -> list[Impl]:
    """Load the protocol's user modules and resolve its arms (names, control): run and freeze
    both refuse a protocol whose arms cannot run, before any work."""
    with Isolation(Settings(p.isolate_timeout_s, launch.device())) as isolation:
        registered = load_modules(p, protocol_path, isolation)
        return resolve_arms(get_op(p.op), p, Delay(torch.device("cpu")), isolation, registered)


def load_modules(p: proto.Protocol, protocol_path: Path, isolation: Isolation) -> frozenset[str]:
    """Register the arms of the protocol's user modules: a module of an isolated arm is imported in
    its worker only (`Protocol.isolates_module`), any other one here; returns the names of the arms
    the modules imported here registered."""
    registered: set[str] = set()
    for spec in p.impl_modules:
        local = protocol_path.parent / spec
        path = str(local) if spec.endswith(".py") and local.exists() else spec
        if p.isolates_module(spec):
            isolation.module_arms(path)
        else:
            registered |= {impl.name for impl in load_user_module(path)}
    return frozenset(registered)


# ---- stages -------------------------------------------------------------------------------


def run_correctness(
    run: RunDir,
    op: Operator,
    arms: list[Impl],
    cases: list[Case],
    seeds: list[int],
    device: torch.device,
    progress: Any,
    exact: bool = False,
) -> dict[tuple[str, str], bool]:
    """Gate every (case, seed, arm); returns whether each (case, arm) passed every seed."""
    done = {(r["case"], r["seed"], r["arm"]): r for r in read_jsonl(run.correctness)}
    task = progress.add_task("correctness", total=len(cases) * len(seeds) * len(arms))
    with jsonl_appender(run.correctness) as append:
        for case in cases:
            for seed in seeds:
                for impl in arms:
                    key = (case.id, seed, impl.name)
                    if key not in done and impl.available and impl.supports(case):
                        done[key] = gate.check(op, impl, case, seed, device, exact=exact).row()
                        append(done[key])
                    progress.advance(task)
    return {
        (case.id, impl.name): impl.available
        and impl.supports(case)
        and all(done[(case.id, s, impl.name)]["passed"] for s in seeds)
        for case in cases
        for impl in arms
    }


def plan_calls(p: proto.Protocol, op: Operator, timer: Timer, case: Case, impl: Impl, device: torch.device) -> int:
    if p.calls_per_sample != "auto":
        return int(p.calls_per_sample)
    fn = impl.resolve()
    if isinstance(fn, RemoteFn) and fn.local is not None:  # a built-in arm in a worker: sized on its own code here
        fn = fn.local
    inputs = op.make_inputs(case, p.seeds[0], device)
    for _ in range(p.warmup):
        fn(*inputs.values())
    calls = calls_for(timer, lambda: fn(*inputs.values()), p.target_sample_us * 1e3, AUTO_CALLS_LIMIT)
    timer.release()
    return calls


def sandbox_record(p: proto.Protocol, device: torch.device) -> dict[str, Any] | None:
    """plan.json `sandbox`: the pieces this host gave isolated workers (null without isolated arms)."""
    if not p.isolated():
        return None
    sandbox = confine.host(device.type == "cuda")
    return {"allowed": list(sandbox.allowed), "missing": sandbox.missing}


def build_plan(
    p: proto.Protocol,
    op: Operator,
    timer: Timer,
    arms: list[Impl],
    cases: list[Case],
    timed_arms: dict[str, list[Impl]],
    digest: str,
    delay: Delay,
    device: torch.device,
    frozen_at: str | None,
    order_seed: int | None = None,
) -> dict[str, Any]:
    """plan.json: everything verify needs besides the raw rows (docs/RUNDIR.md). `order_seed`
    overrides the protocol's (replicates: `order_seed_override` true in plan.json)."""
    plan: dict[str, Any] = {
        "schema": PLAN_V1,
        "protocol_sha256": digest,
        "op": op.name,
        "backend": timer.name,
        "is_gpu": timer.is_gpu,
        "checks": CHECKS_VERSION,
        "isolated": p.isolated(),
        "sandbox": sandbox_record(p, device),
        "roundtrip": roundtrip_reference(p, timer),
        "floor_rule": FLOOR_RULE.model_dump(),  # the rule a floor follows where `roundtrip` names a reference
        "exact": p.exact,
        "frozen_at": frozen_at,
        "plausibility": {"bandwidth_margin": p.bandwidth_margin, "launch_floor_fraction": p.launch_floor_fraction},
        "timing_label": label(timer),
        "peak_memory": memory.measured(timer),  # timings.csv `peak_bytes` (trial/memory.py)
        "l2": p.l2,
        "order_seed": p.order_seed if order_seed is None else order_seed,
        "inputs_seed": inp.active_inputs_seed(),
        **({"order_seed_override": True} if order_seed is not None else {}),
        "arms": [
            {"name": a.name, "kind": a.kind, "available": a.available, "reason": a.reason}
            | ({"layouts": list(a.layouts)} if a.layouts is not None else {})  # peers only: resolve_arms
            for a in arms
        ],
        "cases": [],
        "clocks": {"max_sm_mhz": ClockReader.open(timer.is_gpu).max_sm_mhz(), "throttle_fraction": p.throttle_fraction},
        "noise_rule": {
            "target_ci_width": p.target_ci_width,
            "max_rounds": p.max_rounds,
            "time_budget_s": p.time_budget_s,
        },
        "seeds": p.seeds,
        "rounds": p.rounds,
        "host": {"samples": p.host_samples, "calls": host_calls(p.host_calls, timer.is_gpu)},
        "floor": dict(FLOOR_MODEL),  # the speed-of-light model summary/6 reports (kernel/floor.py)
        "tie_band": p.tie_band,
        "gate": p.gate,
        "bootstrap": {"resamples": p.bootstrap_resamples, "seed": p.bootstrap_seed, "confidence": p.confidence},
    }
    for c in cases:
        calls = plan_calls(p, op, timer, c, timed_arms[c.id][0], device) if timed_arms[c.id] else 0
        plan["cases"].append(
            {
                "case": c.id,
                "shape": list(c.shape),
                "layout": c.layout,
                "dtype": c.dtype,
                "bytes": op.bytes_moved(c),
                **({"flops": op.flops(c)} if op.flops else {}),  # where the operator counts them (ops/flops.py)
                "calls": calls,
                "rounds": p.rounds,
            }
            | size_delay(p, op, timer, c, timed_arms[c.id], delay, device)
        )
    if any(a.kind == "calibration" for a in arms):
        plan["calibration"] = {
            "injected_slowdown": p.injected_slowdown,
            "max_false_positive_rate": p.max_false_positive_rate,
            "min_power": p.min_power,
        }
    return plan


def run_trial(
    protocol_path: Path,
    out: Path,
    resume: bool = False,
    progress: Any = None,
    announce: Callable[[list[Impl]], None] | None = None,
    order_seed: int | None = None,
    target: Target | None = None,
) -> Path:
    """Run the trial `protocol_path` describes into `out`; return the run directory.
    `announce` sees the resolved arms before any work (the CLI lists unavailable ones);
    `order_seed` replaces the protocol's seed of the round order (recorded in plan.json);
    `target`: every Triton launch is checked against its grid limits (plan.json records it)."""
    with targeting(target), inp.drawing(inputs_seed_of(RunDir(out), resume)):
        return _run_trial(protocol_path, out, resume, progress, announce, order_seed, target)


def inputs_seed_of(run: RunDir, resume: bool) -> int | None:
    """The run's inputs seed (ops/inputs.py): a resumed run's, from its provenance.json (None:
    started before inputs seeds), else a fresh one; `prepare` records it, plan.json copies it."""
    if resume and run.provenance.exists():
        return read_json(run.provenance).get("inputs_seed")
    return inp.new_inputs_seed()


def refuse_partial_sandbox(protocol_path: Path, p: proto.Protocol, device: torch.device) -> None:
    """A frozen protocol's isolated arms run in the whole sandbox, or the protocol accepts less
    (`accept_partial_sandbox`); an exploratory run only records what was missing."""
    if not p.isolated() or p.accept_partial_sandbox or not proto.is_frozen(protocol_path):
        return
    sandbox = confine.host(device.type == "cuda")
    if sandbox.missing:
        raise RunError(
            f"{protocol_path}: {sandbox.note()}; a frozen protocol's isolated arms need the whole sandbox. Run where "
            "the host allows it (as root, with setpriv, cgroup v2, pyseccomp), or accept it in a new protocol with "
            "accept_partial_sandbox = true (recorded; every page of the run says so)"
        )


def roundtrip_reference(p: proto.Protocol, timer: Timer) -> str | None:
    """plan.json `roundtrip`: the built-in arm whose trusted worker measures a sample's round trip
    (trial/rounds.py), where the floor applies: isolated arms on the host clock; else None (on a
    GPU the worker's timer starts a sample with a spin of its own length, which the harness cannot
    see, so no floor follows from the wall clock: docs/CHECKS.md)."""
    return ROUNDTRIP_REFERENCE if p.isolated() and timer.name == "host-clock" else None


def _run_trial(
    protocol_path: Path,
    out: Path,
    resume: bool,
    progress: Any,
    announce: Callable[[list[Impl]], None] | None,
    order_seed: int | None,
    target: Target | None,
) -> Path:
    p = preflight(protocol_path)  # the file, its keys, every case against free memory: before the run directory
    links = check_confirmation(protocol_path, p)
    device = launch.device()
    timer = make_timer(p.backend, p.l2)
    refuse_partial_sandbox(protocol_path, p, device)
    with Isolation(Settings(p.isolate_timeout_s, device, target, (timer.name, timer.cold))) as isolation:
        registered = load_modules(p, protocol_path, isolation)
        op = get_op(p.op)
        delay = Delay(device)
        arms = resolve_arms(op, p, delay, isolation, registered)
        if announce is not None:
            announce(arms)
        require_calibration(p, protocol_path, provenance.device_info().get("gpu"))
        cases = [c.case() for c in p.cases]
        for case in cases:
            if case.layout not in op.layouts:
                raise RunError(
                    f"case {case.id}: {op.name} has no layout {case.layout!r}; use one of {', '.join(op.layouts)}"
                )
            op.validate(case)
        if resume and sealed_on_resume(out):
            return out
        run, digest = prepare(out, protocol_path, p, resume, links)
        reference = isolation.isolate(op.impl(ROUNDTRIP_REFERENCE)) if roundtrip_reference(p, timer) else None
        trial = Trial(
            run, p, op, arms, cases, timer, device, delay, progress or _NoProgress(), isolation.quiet, reference
        )
        return _measure(trial, digest, resume, order_seed, target)


@dataclass(frozen=True)
class Trial:
    """What the stages of one run share."""

    run: RunDir
    p: proto.Protocol
    op: Operator
    arms: list[Impl]
    cases: list[Case]
    timer: Timer
    device: torch.device
    delay: Delay
    progress: Any
    quiet: Callable[[timed.TimedArm | None], None]  # freezes every worker but the timed arm's (arms.Isolation.quiet)
    reference: Impl | None = None  # the control in a trusted worker of its own (trial/rounds.py, the round trip)


def _measure(t: Trial, digest: str, resume: bool, order_seed: int | None, target: Target | None) -> Path:
    """The stages from correctness to the manifest (module docstring)."""
    from kerneltrial.kernel.summary import write_summary

    run, p, op, timer, device, delay, progress = t.run, t.p, t.op, t.timer, t.device, t.delay, t.progress
    delay.measure_rate()
    passed = run_correctness(run, op, t.arms, t.cases, p.seeds, device, progress, exact=p.exact)
    t.quiet(None)  # no worker runs while the harness measures its ceilings
    run_ceilings(run, timer, device, [op.bytes_moved(c) for c in t.cases])
    timed_arms = {c.id: [a for a in t.arms if passed[(c.id, a.name)]] for c in t.cases}
    if run.plan.exists():
        plan = resumed_plan(run, order_seed, target)
    else:
        frozen = read_json(run.provenance).get("freeze")
        plan = build_plan(
            p,
            op,
            timer,
            t.arms,
            t.cases,
            timed_arms,
            digest,
            delay,
            device,
            frozen["frozen_at"] if frozen else None,
            order_seed,
        ) | ({"target": target.record()} if target else {})
        write_json(run.plan, plan)
    retakes = Retakes.of(p, plan)
    plan = run_rounds(run, p, op, timer, plan, timed_arms, device, delay, progress, t.quiet, t.reference, retakes)
    t.quiet(None)  # the host stage times in-process arms only
    run_host(run, op, plan, t.cases, timed_arms, p.seeds[0], p.warmup, device, delay, progress)

    write_summary(run.root, overwrite=resume)  # a resumed run may have died after writing it
    record = read_json(run.provenance)
    record.update(
        finished_at=now(),
        clocks_at_end=source_provenance.clocks(),
        lead={
            "samples_retaken": timer.retaken,
            "samples_kept_behind": timer.kept_behind,
            "samples_retaken_throttled": retakes.count,
            "samples_retaken_throttled_by_arm": dict(sorted(retakes.by_arm.items())),
            "final_cycles_per_call": timer.lead_cycles_per_call,
            "sessions": "last" if resume else "all",
        },
    )  # a killed session's counts are never written
    write_json(run.provenance, record)
    write_manifest(run)
    return run.root


def resumed_plan(run: RunDir, order_seed: int | None, target: Target | None) -> dict[str, Any]:
    """plan.json of the run being resumed, refused when it was started another way."""
    out = run.root
    plan = read_json(run.plan)
    if plan.get("checks") != CHECKS_VERSION:
        raise RunError(
            f"{out} was started by a kerneltrial with another timed-check contract (plan.json checks "
            f"{plan.get('checks')!r}, this one writes {CHECKS_VERSION}); it cannot be resumed by this one: start a new run"
        )
    if order_seed is not None and order_seed != plan["order_seed"]:
        raise RunError(f"{out} was started with order seed {plan['order_seed']}; resume it with that seed")
    if plan.get("target") != (target.record() if target else None):
        started = (plan.get("target") or {}).get("name", "(none)")
        raise RunError(f"{out} was started with --target {started}; resume it with the same --target")
    return plan


def calibrate(protocol_path: Path, out: Path, resume: bool = False, progress: Any = None) -> Path:
    """A/A calibration with the protocol's settings: writes `<out>.protocol.toml` and runs it
    (here, not in calibration.py: the runner uses calibration's arms, so the arrow goes one way)."""
    derived = out.with_name(out.name + ".protocol.toml")
    text = calibration_protocol(protocol_path)
    if derived.exists() and derived.read_text() != text:
        raise CalibrationError(f"{derived} exists with other content; choose another --out")
    derived.write_text(text)
    return run_trial(derived, out, resume=resume, progress=progress)


def write_manifest(run: RunDir) -> None:
    """manifest.json, written last: the sha256 of every file of the run directory."""
    files = {
        path.relative_to(run.root).as_posix(): sha256_file(path)
        for path in sorted(run.root.rglob("*"))
        if path.is_file() and path != run.manifest
    }
    write_json(run.manifest, {"schema": "kerneltrial.manifest/1", "files": files})


class _NoProgress:
    """Stands in for a rich Progress when none is shown."""

    def add_task(self, *_: Iterable[Any], **__: Any) -> int:
        return 0

    def advance(self, *_: Any, **__: Any) -> None:
        return None

    def update(self, *_: Any, **__: Any) -> None:
        return None
