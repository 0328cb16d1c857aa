"""The package interface check, run as the target runs an archive: in a process where no
kerneltrial module is importable or visible, judged by the harness.

The harness (this process) unpacks the archive into a scratch folder and starts
`target_worker.py` (a copy) as a target would import the archive: a plain interpreter with
site enabled, sys.path the unpacked folder then the target interpreter's path without
kerneltrial, an environment scrubbed of kerneltrial, a parent whose command line names nothing
of it, under two environments that differ in script name, working directory and torch's
thread count (target_env.py says how each is made). The archive must pass under both: a
module that passes under one and not the other is refused as `environment-dependent` (it can
tell one process from another, and so the check from the target). Each worker runs in the
sandbox the trial's isolated workers run in (trial/confine.py, from neutral copies:
submission/confined.py): it cannot write the scratch folder or the harness's files, nor
trace, signal or read the harness; a piece the host lacks is in the result (`sandbox`).

The harness draws every input, sends it, receives the outputs and the inputs as the call left
them, and judges with the gate: `gate.check` runs on `Remote`, an arm whose every call runs in
the worker. Inputs and results cross as torch.save files (loaded with weights_only, so a
reply cannot run code in the harness), one line on a pipe per call: the simplest correct
mechanism, kept here so the check can move to the general isolation worker (issue 24, item
1) without changing what it judges. Where the worker differs from the in-process gate: on a
GPU it poisons free blocks of its previous result's sizes, not of the reference's (the same
sizes once a case's warm-up calls ran); the poisoning and the launch-limit hook run inside the
worker, where a hostile module can disable them (the threat here is a module that behaves
differently at the target, which the isolation removes; one that attacks the check from its
worker gets no further than the sandbox).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import interpreter_fix, launch
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
from kerneltrial.trial import confine, gate, poison, targets

SEEDS = (0, 1)
WORKER = Path(__file__).with_name("target_worker.py")
# kerneltrial's torch-only files the worker runs (copied into the scratch folder; see target_worker.py)
SHIMS = {
    "poison": Path(poison.__file__),
    "bf16_rounding": Path(interpreter_fix.__file__),
    "launch_limits": Path(targets.__file__),
}
EXIT_WAIT_S = 10.0  # how long a worker may take to exit once its channel is closed


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
class WorkerConfig:
    """What the worker is told: one JSON object, the first line of its input (target_worker.py
    reads these fields; it cannot import this class)."""

    path: list[str]  # its sys.path, after the unpacked archive
    archive_dir: str
    module: str
    op: str
    hello: str  # files: the module's Hello (JSON), each call's arguments and Reply (torch.save)
    request: str
    reply: str
    shims: dict[str, str]  # SHIMS name -> the copy in the scratch folder
    target: dict[str, Any] | None  # targets.Target.record(), when a target is named
    threads: int | None  # torch.set_num_threads before the import; None: torch's default


@dataclass(frozen=True)
class Hello:
    """What the worker found in the module: an import error, or its callables and the entry
    point's `inspect.signature` text; and torch's thread count before the import."""

    error: str
    threads: int
    callables: list[str] = field(default_factory=list)
    signature: str = ""


@dataclass(frozen=True)
class Reply:
    """One call as the worker saw it."""

    returned: Any  # a tensor, tensors, a number or None; None too for what it cannot send
    returned_type: str
    addresses: list[int]  # the worker's storage address of each returned tensor
    args: list[Any]  # the arguments as the call left them
    raised: str  # 'Type: message', or ''
    launch: str  # the launch limit it broke (targets), or ''


class Worker:
    """The worker process and its channel: a request file, a reply file, a line per call. The
    worker is not this process's child: the sandbox's processes and the launcher stand between
    (target_env.LAUNCHER); the launcher says `launcher PID` first and `exited N` on the channel
    when the worker ends. All of them share the first process's group, and the sandbox's cgroup."""

    def __init__(
        self,
        launcher: subprocess.Popen[bytes],
        channel: tuple[int, int],
        config: WorkerConfig,
        sandbox: WorkerSandbox,
        timing: tuple[float, float],
    ):
        self.launcher = launcher
        self.inbox, self.outbox = channel  # the harness's ends: what the worker writes, what it reads
        self.config = config
        self.folder = Path(config.request).parent  # the harness's: the log and each request
        self.sandbox = sandbox
        self.timeout, self.deadline = timing
        self.leader = launcher.pid  # whose processes /proc is read for (the launcher's, without a PID namespace)
        self.ended = ""
        self.received = b""

    def _end(self, why: str) -> WorkerEnded:
        self.ended = self.ended or why
        return WorkerEnded(self.ended)

    def kill(self) -> None:
        """Every process of the worker: its cgroup's, and the first process's group."""
        self.sandbox.kill()
        try:
            os.killpg(self.launcher.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # every one of them already gone
            pass

    def confined(self, when: str) -> None:
        """End the check unless /proc shows every sandbox piece the host allowed (`when`: at what point)."""
        problems = self.sandbox.problems(self.leader)
        if problems:
            self.kill()
            allowed = ", ".join(self.sandbox.host.allowed)
            raise self._end(
                f"stopped {when}: the worker's sandbox was not applied ({'; '.join(problems)}), though this host "
                f"allows {allowed} (trial/confine.py); nothing of the module is trusted"
            )

    def launched(self) -> None:
        """Read the launcher's pid, then check its sandbox before the worker imports anything."""
        try:
            line = self._line(self.deadline)
        except TimeoutError:
            self.kill()
            raise self._end(f"did not start within {self.timeout:g} s") from None
        if line is None or not line.startswith("launcher "):
            raise self._end(self._exited(line))
        if not self.sandbox.pidns:  # its pid is this process's namespace's
            self.leader = int(line.split()[1])
        self.confined("before the worker started")

    def _exited(self, line: str | None) -> str:
        code = line.split()[1] if line else None
        lines = (self.folder / "worker.log").read_text(errors="replace").strip().splitlines()
        return f"crashed: the worker exited (exit {code}): {lines[-1] if lines else 'no output'}"

    def _line(self, until: float) -> str | None:
        """The channel's next line, or None at its end; TimeoutError at `until`."""
        while b"\n" not in self.received:
            remaining = until - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if select.select([self.inbox], [], [], remaining)[0]:
                chunk = os.read(self.inbox, 4096)
                if not chunk:
                    return None
                self.received += chunk
        line, _, self.received = self.received.partition(b"\n")
        return line.decode(errors="replace")

    def _wait(self) -> None:
        """Until the worker's next line, the end of the channel or the deadline."""
        try:
            line = self._line(self.deadline)
        except TimeoutError:
            self.kill()  # stuck in the arm: it would not see its channel close
            raise self._end(f"did not finish within {self.timeout:g} s (a kernel that never returns?)") from None
        if line is None or line.startswith("exited "):
            raise self._end(self._exited(line))

    def hello(self) -> Hello:
        self._wait()
        hello = Hello(**json.loads(Path(self.config.hello).read_text()))
        if not hello.error:  # else the worker has ended
            self.confined("after the module's import")
        return hello

    def call(self, args: list[Any]) -> Reply:
        """One call of the entry point on `args` in the worker."""
        if self.ended:
            raise WorkerEnded(self.ended)
        torch.save({"args": args}, self.config.request)
        try:
            os.write(self.outbox, b"call\n")
        except BrokenPipeError:
            raise self._end(self._exited(None)) from None
        self._wait()
        return Reply(**torch.load(self.config.reply, weights_only=True))

    def close(self) -> None:
        """Close the channel (the worker's loop ends at the end of its input) and wait for the
        launcher's report; kill what is left after EXIT_WAIT_S."""
        os.close(self.outbox)
        end = time.monotonic() + EXIT_WAIT_S
        try:
            while self._line(end) is not None:
                pass
        except TimeoutError:
            self.kill()
        os.close(self.inbox)
        self.launcher.wait()


@contextmanager
def started(
    prepared: Prepared,
    environment: Environment,
    module: str,
    op: str,
    target: targets.Target | None,
    timeout: float,
    deadline: float | None = None,
) -> Iterator[Worker]:
    """A worker for the archive unpacked in `prepared.scratch/archive`, under `environment`, in
    its sandbox (submission/confined.py); stopped on leaving the block. `deadline`
    (time.monotonic) defaults to `timeout` from now."""
    scratch = prepared.scratch
    folder = scratch / f"run-{Path(environment.script).stem}"  # the harness's: the log and each request
    folder.mkdir(exist_ok=True)
    own = Path(tempfile.mkdtemp(prefix="own-", dir=folder))  # the worker's: its home, hello and replies
    script = scratch / "app" / environment.script
    if not script.exists():
        shutil.copy(WORKER, script)
    cwd = scratch / ("work" if environment.cwd == "empty" else "archive")
    config = WorkerConfig(
        path=prepared.path,
        archive_dir=str(scratch / "archive"),
        module=module,
        op=op,
        hello=str(own / "hello.json"),
        request=str(folder / "request.pt"),
        reply=str(own / "reply.pt"),
        shims=prepared.shims,
        target=target.record() if target else None,
        threads=environment.threads,
    )
    host = confine.host(prepared.cuda)
    try:
        sandbox = WorkerSandbox.make(host, own, prepared.copies)
    except OSError as exc:  # the cgroup (the probe made one a moment ago), or the folder's owner
        raise WorkerEnded(
            f"could not start: the worker's sandbox cannot be made ({exc}); the host allowed {', '.join(host.allowed)}"
        ) from None
    worker_in, outbox = os.pipe()
    inbox, worker_out = os.pipe()
    try:
        with open(folder / "worker.log", "wb") as log:
            launcher = subprocess.Popen(
                sandbox.command(launch_command(prepared.python, script, fork_away=not sandbox.pidns)),
                cwd=cwd,
                env=sandbox.environment(prepared.environ) | {"PWD": str(cwd)},
                stdin=worker_in,
                stdout=worker_out,
                stderr=log,
                start_new_session=True,  # its own process group, which the worker stays in
            )
    except BaseException:
        sandbox.close()
        raise
    finally:
        os.close(worker_in)
        os.close(worker_out)
    timing = (timeout, deadline or time.monotonic() + timeout)
    worker = Worker(launcher, (inbox, outbox), config, sandbox, timing)
    try:
        os.write(outbox, json.dumps(asdict(config)).encode() + b"\n")
        worker.launched()
        yield worker
    finally:
        worker.close()
        sandbox.close()


def _raised(text: str) -> Exception:
    """The worker's 'Type: message' as an exception the gate words as in-process ('raised
    ValueError: ...'); a type that is not a builtin exception stays part of the message."""
    name, _, message = text.partition(": ")
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except TypeError:  # a builtin exception with required arguments (UnicodeDecodeError)
            pass
    return RuntimeError(text)


def _view(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(
        storage, like.storage_offset(), like.shape, like.stride()
    )


class Remote:
    """The entry point as the gate calls it: each call runs in the worker. The worker's writes
    into the inputs' whole storages (values, canaries, strided padding) are copied back into the
    gate's guarded buffers; an output in an input's storage comes back as a view of the gate's
    buffer (the gate sees the aliasing), and one in the storage of the worker's previous result
    as a view of the previous result the gate still holds (it sees the persistent buffer)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.previous: dict[int, weakref.ref[torch.Tensor]] = {}  # worker storage address -> our copy

    def _home(self, t: torch.Tensor, address: int, homes: dict[int, torch.UntypedStorage]) -> torch.Tensor:
        storage = homes.get(t.untyped_storage().data_ptr())
        if storage is None:
            held = self.previous.get(address)
            earlier = held() if held else None
            if earlier is None or earlier.untyped_storage().nbytes() != t.untyped_storage().nbytes():
                return t
            storage = earlier.untyped_storage()
            storage.copy_(t.untyped_storage())
        return _view(storage, t)

    def __call__(self, *args: Any) -> Any:
        reply = self.worker.call(list(args))
        if reply.launch:
            raise targets.GridLimitError(reply.launch)
        if reply.raised:
            raise _raised(reply.raised)
        homes = _write_back(args, reply.args)
        returned = reply.returned
        if returned is None and reply.returned_type != "NoneType":
            raise TypeError(f"the entry point returned {reply.returned_type}; expected a tensor")
        if not isinstance(returned, (torch.Tensor, tuple, list)):
            return returned
        tensors = [returned] if isinstance(returned, torch.Tensor) else list(returned)
        mapped = [self._home(t, a, homes) for t, a in zip(tensors, reply.addresses, strict=True)]
        self.previous = {a: weakref.ref(t) for a, t in zip(reply.addresses, mapped, strict=True)}
        return mapped[0] if isinstance(returned, torch.Tensor) else type(returned)(mapped)


def _write_back(sent: tuple[Any, ...], back: list[Any]) -> dict[int, torch.UntypedStorage]:
    """Copy what the call left in each sent tensor's whole storage into the gate's storage;
    the reply's storage address -> the gate's storage."""
    if len(back) != len(sent):
        raise RuntimeError(f"the worker sent back {len(back)} arguments for {len(sent)}")
    homes: dict[int, torch.UntypedStorage] = {}
    for mine, theirs in zip(sent, back, strict=True):
        if not isinstance(mine, torch.Tensor):
            continue
        if not isinstance(theirs, torch.Tensor) or theirs.untyped_storage().nbytes() != mine.untyped_storage().nbytes():
            raise RuntimeError("the worker sent back an input of another size than it received")
        address = theirs.untyped_storage().data_ptr()
        if address not in homes:
            mine.untyped_storage().copy_(theirs.untyped_storage())
            homes[address] = mine.untyped_storage()
    return homes


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
        impl = Impl(op=operator.name, name=name, kind="user", loader=lambda: Remote(worker))
        panel = operator.gpu_cases if device.type == "cuda" else operator.small_cases
        checks = 0
        cases = [Case(c.shape, c.dtype, layout) for c in panel for layout in operator.layouts]
        for case, seed in ((case, seed) for case in cases for seed in SEEDS):
            with inp.drawing(inp.new_inputs_seed()):  # values, offsets, eps and extra shapes drawn afresh
                result = gate.check(operator, impl, case, seed, device)
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
