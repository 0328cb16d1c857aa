"""The package interface check, run as the target runs an archive: in a process where no
kerneltrial module is importable, judged by the harness.

The harness (this process) unpacks the archive into a scratch folder and starts
`target_worker.py` (a copy, under `python -I -S`, in an empty working directory) with a
sys.path of the unpacked folder first, then what a fresh `python` of this interpreter would
have (PYTHONPATH, site-packages, their .pth files' entries; no working or script directory),
without kerneltrial: each directory holding a kerneltrial entry (the package, its
distribution metadata, an editable install's .pth or finder, a folder holding the package)
is replaced by a folder of links to its other entries, and no .pth file runs in the worker.
Environment variables named KERNELTRIAL* are dropped. So a module that behaves one way when kerneltrial is imported (or importable) and
another at the target behaves here as at the target.

The harness draws every input, sends it, receives the outputs and the inputs as the call left
them, and judges with the gate: `gate.check` runs on `Remote`, an arm whose every call runs in
the worker. Inputs and results cross as torch.save files (loaded with weights_only, so a
reply cannot run code in the harness), one line on a pipe per call: the simplest correct
mechanism, kept here so the check can move to the general isolation worker (issue 24, item
1) without changing what it judges. Where the worker differs from the in-process gate: on a
GPU it poisons free blocks of its previous result's sizes, not of the reference's (the same
sizes once a case's warm-up calls ran); the poisoning and the launch-limit hook run inside the
worker, where a hostile module can disable them (the threat here is a module that behaves
differently at the target, which the isolation removes; one that attacks the check is item 1's).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import select
import shutil
import subprocess
import sys
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
from kerneltrial.submission.interface import mismatch, params_of_signature
from kerneltrial.trial import gate, poison, targets

SEEDS = (0, 1)
WORKER = Path(__file__).with_name("target_worker.py")
# kerneltrial's torch-only files the worker runs (copied beside it; see target_worker.py)
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
    checks: int  # gate checks that ran
    device: str


def _fresh_path(workdir: Path) -> list[str]:
    """sys.path of a fresh `python` of this interpreter with this environment (PYTHONPATH,
    site-packages and what their .pth files add), started in the empty `workdir`, without the
    working directory: this process's script and test directories are not in it."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def _names_kerneltrial(folder: Path) -> bool:
    return "kerneltrial" in folder.name.casefold()


def _hidden(folder: Path) -> set[str]:
    """The entries of `folder` that would make kerneltrial importable from it: those whose name
    contains 'kerneltrial' (the package, its distribution metadata, an editable install's .pth
    or finder) and folders holding one (a repository's src/: `import src.kerneltrial`)."""
    hidden = set()
    for child in folder.iterdir():
        try:
            if _names_kerneltrial(child) or (child.is_dir() and any(map(_names_kerneltrial, child.iterdir()))):
                hidden.add(child.name)
        except OSError:  # unreadable: nothing can be imported from it either
            continue
    return hidden


def path_without_kerneltrial(scratch: Path, workdir: Path) -> list[str]:
    """`_fresh_path()` with nothing of kerneltrial: each directory with `_hidden` entries is
    replaced by a folder in `scratch` of links to its other entries; an entry that is not a
    directory (a zip) is kept unless its own path names kerneltrial."""
    path: list[str] = []
    for index, entry in enumerate(_fresh_path(workdir)):
        folder = Path(entry)
        if not folder.is_dir():
            if entry and "kerneltrial" not in entry.casefold():
                path.append(entry)
            continue
        hidden = _hidden(folder)
        if not hidden:
            path.append(entry)
            continue
        overlay = scratch / f"path-{index}"
        overlay.mkdir()
        for child in sorted(folder.iterdir()):
            if child.name not in hidden:
                (overlay / child.name).symlink_to(child)
        path.append(str(overlay))
    return path


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker is told: one JSON object on its command line (target_worker.py reads
    these fields; it cannot import this class)."""

    path: list[str]  # its sys.path, after the unpacked archive
    archive_dir: str
    module: str
    op: str
    channel: tuple[int, int]  # the worker's pipe ends: what it reads, what it writes
    hello: str  # files: the module's Hello (JSON), each call's arguments and Reply (torch.save)
    request: str
    reply: str
    shims: dict[str, str]  # SHIMS name -> the copy beside the worker
    target: dict[str, Any] | None  # targets.Target.record(), when a target is named


@dataclass(frozen=True)
class Hello:
    """What the worker found in the module: an import error, or its callables and the entry
    point's `inspect.signature` text."""

    error: str
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
    """The worker process and its channel: a request file, a reply file, a line per call."""

    def __init__(self, process: subprocess.Popen[bytes], channel: tuple[int, int], folder: Path, timeout: float):
        self.process = process
        self.inbox, self.outbox = channel  # the harness's ends: what the worker writes, what it reads
        self.folder = folder
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.ended = ""

    def _end(self, why: str) -> WorkerEnded:
        self.ended = self.ended or why
        return WorkerEnded(self.ended)

    def _exited(self) -> str:
        try:
            code = self.process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        lines = (self.folder / "worker.log").read_text(errors="replace").strip().splitlines()
        return f"crashed: the worker exited (exit {code}): {lines[-1] if lines else 'no output'}"

    def _wait(self) -> None:
        """Until the worker's next line, the end of the channel or the deadline."""
        received = b""
        while not received.endswith(b"\n"):
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.process.kill()  # stuck in the arm: it would not see its channel close
                raise self._end(f"did not finish within {self.timeout:g} s (a kernel that never returns?)")
            if select.select([self.inbox], [], [], remaining)[0]:
                chunk = os.read(self.inbox, 4096)
                if not chunk:
                    raise self._end(self._exited())
                received += chunk

    def hello(self) -> Hello:
        self._wait()
        return Hello(**json.loads((self.folder / "hello.json").read_text()))

    def call(self, args: list[Any]) -> Reply:
        """One call of the entry point on `args` in the worker."""
        if self.ended:
            raise WorkerEnded(self.ended)
        torch.save({"args": args}, self.folder / "request.pt")
        try:
            os.write(self.outbox, b"call\n")
        except BrokenPipeError:
            raise self._end(self._exited()) from None
        self._wait()
        return Reply(**torch.load(self.folder / "reply.pt", weights_only=True))


@contextmanager
def started(scratch: Path, module: str, op: str, target: targets.Target | None, timeout: float) -> Iterator[Worker]:
    """A worker for the archive unpacked in `scratch/archive`; stopped on leaving the block."""
    harness, workdir = scratch / "harness", scratch / "work"
    harness.mkdir()
    workdir.mkdir()
    script = shutil.copy(WORKER, harness / "worker.py")
    shims = {name: str(shutil.copy(path, harness / f"{name}.py")) for name, path in SHIMS.items()}
    worker_in, outbox = os.pipe()
    inbox, worker_out = os.pipe()
    config = WorkerConfig(
        path=path_without_kerneltrial(scratch, workdir),
        archive_dir=str(scratch / "archive"),
        module=module,
        op=op,
        channel=(worker_in, worker_out),
        hello=str(harness / "hello.json"),
        request=str(harness / "request.pt"),
        reply=str(harness / "reply.pt"),
        shims=shims,
        target=target.record() if target else None,
    )
    environment = {k: v for k, v in os.environ.items() if "KERNELTRIAL" not in k.upper()}
    with open(harness / "worker.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script), json.dumps(asdict(config))],
            cwd=workdir,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(worker_in, worker_out),
        )
    os.close(worker_in)
    os.close(worker_out)
    try:
        yield Worker(process, (inbox, outbox), harness, timeout)
    finally:
        os.close(outbox)  # the worker's loop ends at the end of its input
        os.close(inbox)
        try:
            process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


def _entry_problem(operator: Operator, hello: Hello, module_file: str) -> str:
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


def interface_check(archive: bytes, op_name: str, target_name: str | None, timeout: float) -> InterfaceResult:
    """Run the unpacked `archive` in a worker and gate its entry point on every case of the
    operator's panel (the small CPU panel without a GPU, the GPU panel with one), every layout,
    seeds 0 and 1, with the target's launch limits when one is named. Raises `WorkerEnded`
    when the worker exits or `timeout` (seconds, for the whole check) runs out."""
    operator = get_op(op_name)
    device = launch.device()
    target = targets.get_target(target_name) if target_name else None
    with tempfile.TemporaryDirectory() as folder, _one_thread():
        scratch = Path(folder)
        with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
            (module_file,) = [n for n in zipped.namelist() if n.endswith(".py")]  # `inspect` passed: one, flat
            zipped.extractall(scratch / "archive")
        with started(scratch, module_file[:-3], op_name, target, timeout) as worker:
            problem = _entry_problem(operator, worker.hello(), module_file)
            if problem:
                return InterfaceResult(False, problem, 0, device.type)
            impl = Impl(op=op_name, name=f"submission:{module_file[:-3]}", kind="user", loader=lambda: Remote(worker))
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
                    return InterfaceResult(False, f"gate: {case.id} seed {seed}: {result.message}", checks, device.type)
            return InterfaceResult(True, "", checks, device.type)
