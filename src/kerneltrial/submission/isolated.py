"""The package interface check, run as the target runs an archive: in a process where no
kerneltrial module is importable or visible, judged by the harness.

The harness (this process) unpacks the archive into a scratch folder and starts the trial's own
isolated worker (trial/worker.py, MODE target: one worker for trials and packages) from a copy
named as `Environment.script`, as a target would import the archive: a plain interpreter with
site enabled, sys.path the unpacked folder then the target interpreter's path without
kerneltrial, an environment scrubbed of kerneltrial, a parent whose command line names nothing
of it, under two environments that differ in script name, working directory and torch's
thread count (target_env.py says how each is made). The archive must pass under both: a
module that passes under one and not the other is refused as `environment-dependent` (it can
tell one process from another, and so the check from the target). Each worker runs in the
sandbox the trial's isolated workers run in (trial/confine.py, from neutral copies:
submission/confined.py): it cannot write the scratch folder or the harness's files, nor
trace, signal or read the harness; a piece the host lacks is in the result (`sandbox`).

The harness draws every input and judges with the gate: `gate.check` runs on the trial's isolated
arm (trial/remote.py `RemoteFn`), so a package is checked by the same machinery as an isolated
arm of a trial: inputs in shared buffers read-only to the worker (on a CPU), outputs and every
argument's memory read back by the harness with the worker frozen, poisoned allocations, the
launch limits of the target. The poisoning and the launch-limit hook run inside the worker, where
a hostile module can disable them (the threat here is a module that behaves differently at the
target, which the isolation removes; one that attacks the check from its worker gets no further
than the sandbox).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, Impl, Operator, all_ops, get_op
from kerneltrial.submission.confined import Copies, WorkerSandbox, sandbox_record
from kerneltrial.submission.interface import mismatch, params_of_signature
from kerneltrial.submission.receipt import SandboxRecord
from kerneltrial.submission.target_env import (
    FIRST,
    Environment,
    fresh_path,
    launch_command,
    names_kerneltrial,
    path_without_kerneltrial,
    scrubbed_environ,
    second_environment,
    target_python,
)
from kerneltrial.trial import confine, gate, isolation, targets
from kerneltrial.trial.arms import Isolation
from kerneltrial.trial.isolation import (
    ArmRaised,
    ArmSource,
    SandboxMissing,
    Settings,
    Started,
    WorkerFailure,
    WorkerHung,
)
from kerneltrial.trial.remote import Remote, RemoteFn

SEEDS = (0, 1)
# the trial worker's self-contained files but its timer (an interface check times nothing),
# copied into the scratch folder
SHIMS = {name: path for name, path in isolation.SHIMS.items() if name != "timing"}


class WorkerEnded(Exception):
    """The worker stopped answering (it exited, or the check's time ran out): the end of the
    check, not an arm's gate result. The message completes 'interface check ...'."""


@dataclass(frozen=True)
class InterfaceResult:
    passed: bool
    reason: str  # one line; '' when passed
    checks: int  # gate checks that ran, under every environment together
    device: str
    environments: tuple[str, ...] = ()  # each environment it ran under, in words
    sandbox: SandboxRecord | None = None  # the pieces the workers ran in (None: no worker started)


@dataclass(frozen=True)
class Prepared:
    """What every worker of one check shares: the scratch folder (the archive unpacked in
    archive/), the target interpreter, its sys.path, the scrubbed environment, the shims, the
    sandbox's copies, and the device kind the sandbox was probed for (`cuda`)."""

    scratch: Path
    python: Path
    path: list[str]
    environ: dict[str, str]
    shims: dict[str, str]  # SHIMS name -> the copy in the scratch folder
    copies: Copies
    cuda: bool

    @classmethod
    def make(cls, scratch: Path, cuda: bool | None = None) -> Prepared:
        """Build them in `scratch`, which holds the unpacked archive in archive/; `cuda` defaults
        to whether the check runs on a GPU."""
        for folder in ("app", "lib", "work"):
            (scratch / folder).mkdir()
        python = target_python(scratch)
        environ = scrubbed_environ(os.environ, scratch / "work")
        path = path_without_kerneltrial(scratch, fresh_path(python, scratch / "work", environ))
        shims = {name: str(shutil.copy(file, scratch / "lib" / f"{name}.py")) for name, file in SHIMS.items()}
        cuda = launch.device().type == "cuda" if cuda is None else cuda
        return cls(scratch, python, path, environ, shims, Copies.make(scratch / "lib", python), cuda)


@dataclass(frozen=True)
class Hello:
    """What the worker found in the module: an import error, or its callables and the entry
    point's `inspect.signature` text; and torch's thread count before the import."""

    error: str
    threads: int
    callables: list[str] = field(default_factory=list)
    signature: str = ""


def hello_of(loaded: dict[str, Any]) -> Hello | None:
    """The worker's `loaded` answer in MODE target as a Hello; None when a field has the wrong type
    (the answer is the worker's: a module may have patched it)."""
    error, threads = loaded.get("error", ""), loaded.get("threads")
    callables, signature = loaded.get("callables", []), loaded.get("signature", "")
    if not (isinstance(error, str) and isinstance(signature, str) and type(threads) is int):
        return None
    if not (isinstance(callables, list) and all(isinstance(n, str) for n in callables)):
        return None
    return Hello(error, threads, callables, signature)


@dataclass(frozen=True)
class TargetStarter:
    """Starts the trial's worker (trial/worker.py) as a target imports the archive: a copy named
    `environment.script` run by the target interpreter through the launcher (target_env.LAUNCHER),
    in its sandbox from neutral copies (submission/confined.py), in the environment's working
    directory; its own folder (home, caches) is `own-*` in the harness's run folder."""

    prepared: Prepared
    environment: Environment
    module: str

    def start(self, fds: tuple[int, int, int], log: IO[bytes], folder: Path) -> Started:
        scratch = self.prepared.scratch
        run = scratch / f"run-{Path(self.environment.script).stem}"  # the harness's
        run.mkdir(exist_ok=True)
        own = Path(tempfile.mkdtemp(prefix="own-", dir=run))
        script = scratch / "app" / self.environment.script
        if not script.exists():
            shutil.copy(isolation.WORKER, script)
        cwd = scratch / ("work" if self.environment.cwd == "empty" else "archive")
        host = confine.host(self.prepared.cuda)
        sandbox = WorkerSandbox.make(host, own, self.prepared.copies)
        status, status_w = os.pipe()
        try:
            proc = subprocess.Popen(
                sandbox.command(launch_command(self.prepared.python, script, (status_w, *fds), not sandbox.pidns)),
                pass_fds=(status_w, *fds),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=sandbox.environment(self.prepared.environ) | {"PWD": str(cwd)},
                start_new_session=True,  # its own process group, which the worker stays in
            )
        except BaseException:
            sandbox.close()
            os.close(status)
            raise
        finally:
            os.close(status_w)
        load = {"sys_path": self.prepared.path, "archive": str(scratch / "archive"), "fds_fd": fds[2]}
        load |= {"threads": self.environment.threads, "shims": self.prepared.shims}
        return Started(proc, sandbox.confinement, status, sandbox.pidns, load)


class TargetWorker:
    """The archive's entry point in its worker, as the gate calls it (`RemoteFn`), ending the check
    (`WorkerEnded`) when the worker fails, its sandbox was not applied or the check's time ran out."""

    def __init__(self, remote: Remote, op: Operator, timeout: float, deadline: float) -> None:
        self.remote, self.op, self.timeout, self.deadline = remote, op, timeout, deadline
        self.fn = RemoteFn(remote, op.name, bool(op.inplace))
        self.ended = ""

    def _end(self, why: str) -> WorkerEnded:
        self.ended = self.ended or why
        self.remote.handle.stop()
        return WorkerEnded(self.ended)

    def _why(self, exc: Exception, when: str) -> str:
        if isinstance(exc, SandboxMissing):
            allowed = ", ".join(confine.host(self.remote.handle.settings.device.type == "cuda").allowed)
            return (
                f"stopped {exc.when}: the worker's sandbox was not applied ({'; '.join(exc.problems)}), though this "
                f"host allows {allowed} (trial/confine.py); nothing of the module is trusted"
            )
        if isinstance(exc, WorkerHung):
            return f"did not {when} within {self.timeout:g} s" + (
                " (a kernel that never returns?)" if when == "finish" else ""
            )
        return f"crashed: {exc}"

    def hello(self) -> Hello:
        try:
            self.remote.start()
        except (WorkerFailure, ArmRaised) as exc:
            raise self._end(self._why(exc, "start")) from None
        hello = hello_of(self.remote.handle.loaded)
        if hello is None:
            raise self._end("crashed: the worker answered a malformed `loaded` (fields of the wrong type)")
        return hello

    def __call__(self, *args: Any) -> Any:
        if self.ended:
            raise WorkerEnded(self.ended)
        if time.monotonic() > self.deadline:
            raise self._end(f"did not finish within {self.timeout:g} s (a kernel that never returns?)")
        try:
            return self.fn(*args)
        except WorkerFailure as exc:
            raise self._end(self._why(exc, "finish")) from None


@contextmanager
def started(
    prepared: Prepared,
    environment: Environment,
    module: str,
    op: str,
    target: targets.Target | None,
    timeout: float,
    deadline: float | None = None,
) -> Iterator[TargetWorker]:
    """A worker for the archive unpacked in `prepared.scratch/archive`, under `environment`, in
    its sandbox (submission/confined.py); stopped on leaving the block. `deadline`
    (time.monotonic) defaults to `timeout` from now; no request waits past it."""
    deadline = deadline or time.monotonic() + timeout
    device = torch.device("cuda") if prepared.cuda else torch.device("cpu")
    starter = TargetStarter(prepared, environment, module)
    settings = Settings(max(deadline - time.monotonic(), 1.0), device, target, None, starter, deadline)
    operator = get_op(op)
    with Isolation(settings) as isolated:
        remote = isolated.remote(ArmSource("target", module=module, op=op), [op])
        yield TargetWorker(remote, operator, timeout, deadline)


def entry_problem(operator: Operator, hello: Hello, module_file: str) -> str:
    """Why the imported module is not a submission of `operator`, or ''."""
    if hello.error:
        return hello.error
    entries = [o.name for o in all_ops() if o.name in hello.callables]
    if entries != [operator.name]:
        return f"{module_file} has entry points {entries or 'none'}; it needs exactly one, {operator.name}"
    params = params_of_signature(hello.signature)
    if params is None:
        return f"entry point: the signature {operator.name}{hello.signature} cannot be read as Python"
    problem = mismatch(operator.signature, params)
    return f"entry point: {problem}" if problem else ""


@contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread while the harness and the worker take turns: idle OpenMP threads
    spinning in one process slowed the other's calls sevenfold on a 2-core machine (the small
    rmsnorm panel: 88 s against 12 s, measured while other jobs shared the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Run:
    """The check under one environment."""

    passed: bool
    reason: str
    checks: int
    environment: str  # in words, with the thread count the worker had
    threads: int


def _check_under(
    prepared: Prepared,
    environment: Environment,
    operator: Operator,
    module_file: str,
    target: targets.Target | None,
    timeout: float,
    deadline: float,
) -> Run:
    """The gate on every case of the panel, every layout, both seeds, in a worker under `environment`."""
    device = launch.device()
    with started(prepared, environment, module_file[:-3], operator.name, target, timeout, deadline) as worker:
        hello = worker.hello()
        described = environment.describe(hello.threads)
        problem = entry_problem(operator, hello, module_file)
        if problem:
            return Run(False, problem, 0, described, hello.threads)
        name = f"submission:{module_file[:-3]}"
        impl = Impl(op=operator.name, name=name, kind="user", loader=lambda: worker)
        panel = operator.gpu_cases if device.type == "cuda" else operator.small_cases
        checks = 0
        cases = [Case(c.shape, c.dtype, layout) for c in panel for layout in operator.layouts]
        for case, seed in ((case, seed) for case in cases for seed in SEEDS):
            with inp.drawing(inp.new_inputs_seed()):  # values, offsets, eps and extra shapes drawn afresh
                result = gate.check(operator, impl, case, seed, device)
            if device.type == "cuda":  # the worker allocates on the same device: the cache goes back
                torch.cuda.empty_cache()
            if worker.ended:
                raise WorkerEnded(worker.ended)
            checks += 1
            if not result.passed:
                return Run(False, f"gate: {case.id} seed {seed}: {result.message}", checks, described, hello.threads)
        return Run(True, "", checks, described, hello.threads)


def _verdict(runs: list[Run], device: str, sandbox: SandboxRecord) -> InterfaceResult:
    """Passed when every environment passed; a failure under one environment that another
    passes is `environment-dependent`."""
    checks = sum(run.checks for run in runs)
    environments = tuple(run.environment for run in runs)
    failed = [run for run in runs if not run.passed]
    if not failed:
        return InterfaceResult(True, "", checks, device, environments, sandbox)
    first = failed[0]
    passed = [run for run in runs if run.passed]
    reason = (
        f"environment-dependent: it passes under {passed[0].environment} but not under {first.environment} "
        f"(a module must not tell one process from another): {first.reason}"
        if passed
        else f"{first.reason} (imported as the target imports it: {first.environment})"
    )
    return InterfaceResult(False, reason, checks, device, environments, sandbox)


def _scratch_parent() -> str | None:
    """Where the scratch folder goes: the temporary directory, unless its path names kerneltrial."""
    return "/tmp" if names_kerneltrial(tempfile.gettempdir()) else None


@contextmanager
def unpacked(archive: bytes, cuda: bool | None = None) -> Iterator[tuple[Prepared, str]]:
    """A scratch folder holding `archive` unpacked and prepared (`Prepared.make`), and the name of
    its module; removed on leaving the block, with one torch thread meanwhile (`_one_thread`)."""
    with tempfile.TemporaryDirectory(dir=_scratch_parent()) as folder, _one_thread():
        scratch = Path(folder)
        with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
            (module_file,) = [n for n in zipped.namelist() if n.endswith(".py")]  # `inspect` passed: one, flat
            zipped.extractall(scratch / "archive")
        yield Prepared.make(scratch, cuda), module_file


def interface_check(archive: bytes, op_name: str, target_name: str | None, timeout: float) -> InterfaceResult:
    """Run the unpacked `archive` in a worker under each of two environments (`FIRST`, then
    `second_environment` of the thread count the first had) and gate its entry point on every
    case of the operator's panel (the small CPU panel without a GPU, the GPU panel with one),
    every layout, seeds 0 and 1, with the target's launch limits when one is named; every worker
    in its sandbox (the pieces it had: `InterfaceResult.sandbox`). Raises `WorkerEnded` when a
    worker exits, its sandbox was not applied, or `timeout` (seconds, for the whole check) runs out."""
    operator = get_op(op_name)
    target = targets.get_target(target_name) if target_name else None
    deadline = time.monotonic() + timeout
    with unpacked(archive) as (prepared, module_file):
        runs = [_check_under(prepared, FIRST, operator, module_file, target, timeout, deadline)]
        second = second_environment(runs[0].threads)
        runs.append(_check_under(prepared, second, operator, module_file, target, timeout, deadline))
    return _verdict(runs, launch.device().type, sandbox_record(confine.host(prepared.cuda)))
