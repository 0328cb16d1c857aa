"""The harness's side of an isolated worker: start it, talk to it under a deadline, name how it died.

A worker (trial/worker.py) is started by a `Starter`: a trial's (`TrialStarter`) with `python -I` by
file path, in the sandbox (trial/confine.py, trial/sandbox.py), in a fresh temporary working
directory, as its own process group; the package interface check's (submission/isolated.py) as a
target imports an archive. Either way it runs with two pipes and a socket (for shared buffers'
descriptors) it alone holds besides the harness; its output goes to a log file nobody parses. Every request waits at most `Settings.timeout_s` for its answer.
A worker that misses it is killed (its whole process group) and the request raises `WorkerHung`;
one that dies raises `WorkerCrashed` (killed by a signal) or `WorkerExited` (it exited); one that
answers what the protocol does not allow raises `WorkerBroken` and is killed. Each is a failure of
the arm the worker runs, never of the trial: the caller records it as that arm's check and carries
on, and the arm's next request starts a fresh worker (`WorkerHandle`).

Answers are JSON read by `json.loads` and checked field by field where they are used: nothing a
worker sends is executed or unpickled here. An arm's own exception comes back as its type name and
first line and is raised here as an `ArmRaised` subclass of that name, so that a check's message
reads as it does for an arm in the harness's process ("raised RuntimeError: ...").

The worker's requests and answers (trial/worker.py; "raised" {type, message} answers any request
whose work raised; every answer carries `refused`, the first launch over the target's limits the
request saw, or ""):
  load {module | op, names, sys_path, shims, target, timer, device}
      -> loaded {pid, defines, kerneltrial_modules}
      MODE target adds {archive, threads, fds_fd} and answers {threads, error, callables, signature}:
      torch's thread count before the import; the module's import error, else its callables and the
      entry point's signature (names[0] is the entry point)
  call {fn, args, add, drop}                  one untimed call (a gate call), poisoned outputs,
      -> called {outputs}                     read after synchronising the current stream
         outputs: null (returned None) | [{dtype, shape, stride, offset, storage, nbytes,
                  input (buffer id) | previous (storage index of the last call)}] | returned: TYPE
  fetch {outputs: [[storage, buffer]], snapshots: [[buffer, buffer]]} -> fetched
         each output storage and each input buffer copied into a harness buffer, then every
         stream of the device waited for
  bind {id, fn, args, add, inplace, pool, slots} -> bound   an arm's inputs for timed samples
  warm {id, calls} -> warmed
  sample {id, calls, key} -> sampled {ns, odd, persistent, retaken, kept_behind}
         before call j, value set j (`pool[j]`) is written into the inputs; after it, its outputs
         are copied into `slots[j]` (both outside the timed intervals); `odd`: {call: metas} of
         outputs that did not fit their slot or are not contiguous; `persistent`: calls whose
         output shared storage with the previous call's output, which the worker still held
  release {id, drop} -> released
  exit (no answer)
A shared buffer (`add`): {id, nbytes, memory: "read" | "write"} (CPU: a memfd, its descriptor on
FDS_FD, mapped shared; "read": read-only, the harness sealed it against writable mappings),
{id, nbytes, vmm: [device, size]} (GPU: CUDA's virtual memory API, its descriptor on FDS_FD; the
`vmm` shim, trial/vmm.py, maps it) or {id, nbytes, cuda: [device, handle, size, offset,
ref handle, ref offset, event handle, event sync]} (legacy CUDA IPC; bytes as hex). A tensor:
{buffer, dtype, shape, stride, offset}; a scalar argument: {value}.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

import torch

from kerneltrial.trial import confine, targets
from kerneltrial.trial.shared import Arena

WORKER = Path(__file__).with_name("worker.py")
SHIMS = {  # self-contained files the worker loads by path (worker.py says why)
    "interpreter_fix": Path(__file__).parents[1] / "ops" / "interpreter_fix.py",
    "poison": Path(__file__).with_name("poison.py"),
    "timing": Path(__file__).with_name("timing.py"),
    "targets": Path(__file__).with_name("targets.py"),
    "vmm": Path(__file__).with_name("vmm.py"),
}
HEADER = struct.Struct(">I")
MAX_ANSWER = 64 << 20  # bytes of one answer: far above any honest one (metadata only; data is shared)
REAP_S = 5.0  # how long a worker that closed its pipe gets to exit before it is killed
# The deadline of `load` is at least this: a fresh worker imports torch and triton (4.7 s for a
# one-function module on a loaded 2-core CPU machine), whatever the deadline of a call.
LOAD_S = 120.0
IDENTIFIER_MAX = 64
FDS_PER_MESSAGE = 200  # descriptors in one message on the socket (Linux takes at most 253)


class WorkerFailure(RuntimeError):
    """The worker of an arm failed; the arm fails the check, the trial goes on."""


class WorkerCrashed(WorkerFailure):
    """Killed by a signal."""


class WorkerExited(WorkerFailure):
    """Exited (any code) while the harness waited for it."""


class WorkerHung(WorkerFailure):
    """No answer within the deadline; killed."""


class WorkerBroken(WorkerFailure):
    """Answered what the protocol does not allow (malformed, oversized, out of bounds); killed."""


class SandboxMissing(WorkerBroken):
    """/proc shows a sandbox piece the host allowed missing from the worker (`when`: at what point)."""

    def __init__(self, problems: list[str], when: str) -> None:
        super().__init__(
            f"worker broke the protocol: its sandbox was not applied {when} ({'; '.join(problems)}); killed"
        )
        self.problems, self.when = problems, when


class ArmRaised(Exception):
    """The arm raised in its worker; subclasses carry the arm's exception type name."""


_RAISED: dict[str, type[ArmRaised]] = {}


def arm_exception(name: str, message: str) -> ArmRaised:
    """An exception named like the one the arm raised (a plain name; anything else reads ArmRaised)."""
    if not (name.isidentifier() and len(name) <= IDENTIFIER_MAX):
        return ArmRaised(f"{name[:IDENTIFIER_MAX]!r}: {message}")
    if name not in _RAISED:
        _RAISED[name] = type(name, (ArmRaised,), {"__module__": "isolated worker"})
    return _RAISED[name](message)


@dataclass
class Started:
    """A worker process as its `Starter` started it: the process the harness waits for, its
    sandbox, the read end of its launcher's status lines (`launcher PID`, then `exited CODE`; None:
    no launcher), whether its PID is in a namespace of its own, what its `load` request adds."""

    proc: subprocess.Popen[bytes]
    confinement: confine.Confinement
    status: int | None = None
    pidns: bool = True
    load: dict[str, Any] = field(default_factory=dict)


class Starter(Protocol):
    """How a worker starts: with `fds` (its request and answer pipes and its descriptor socket)
    passed on, its output to `log`, in `folder` (the harness's, removed when the worker ends)."""

    def start(self, fds: tuple[int, int, int], log: IO[bytes], folder: Path) -> Started: ...


@dataclass(frozen=True)
class TrialStarter:
    """A trial's worker: `python -I worker.py MODE FDS...` by path, in the sandbox (trial/confine.py)."""

    mode: str
    cuda: bool

    def start(self, fds: tuple[int, int, int], log: IO[bytes], folder: Path) -> Started:
        confinement = confine.Confinement(confine.host(self.cuda), folder)
        program = [sys.executable, "-I", str(WORKER), self.mode, *map(str, fds)]
        proc = subprocess.Popen(
            confinement.command(program),
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=confinement.environment(),
            start_new_session=True,  # its own process group: a Ctrl-C reaches the harness, which ends it
        )
        return Started(proc, confinement)


@dataclass(frozen=True)
class Settings:
    """How the harness runs isolated arms: the answer deadline, the device, the launch limits to
    check (`--target`), the timer of timed samples (backend, cold L2; None: no timed samples) and
    how workers start (None: a trial's, `TrialStarter`), and when every request must be answered
    by at the latest (None: each request's own deadline only)."""

    timeout_s: float
    device: torch.device
    target: targets.Target | None = None
    timer: tuple[str, bool] | None = None
    starter: Starter | None = None
    deadline: float | None = None  # time.monotonic() past which no request waits (a whole check's end)

    def capped(self, deadline: float) -> float:
        """`deadline`, or the settings' own when sooner."""
        return deadline if self.deadline is None else min(deadline, self.deadline)


@dataclass(frozen=True)
class ArmSource:
    """Where an isolated arm's code comes from: a user module (`sealed`: a file path or a dotted
    name, kerneltrial not importable) or kerneltrial's own operators (`registry`: the op's arms)."""

    mode: Literal["sealed", "registry", "target"]
    module: str | None = None
    op: str | None = None


class Process:
    """One live worker and its two pipe ends."""

    def __init__(self, source: ArmSource, settings: Settings) -> None:
        self.settings = settings
        self.folder = Path(tempfile.mkdtemp(prefix="worker-"))  # a neutral name: the log is its output descriptor
        self.log = (self.folder / "worker.log").open("wb")
        to_worker, from_harness = os.pipe()
        from_worker, to_harness = os.pipe()
        self.fds, worker_fds = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # shared buffers' descriptors
        self.fds.setblocking(False)
        fds = (to_worker, to_harness, worker_fds.fileno())
        starter = settings.starter or TrialStarter(source.mode, settings.device.type == "cuda")
        try:
            started = starter.start(fds, self.log, self.folder)
        finally:
            os.close(to_worker)
            os.close(to_harness)
            worker_fds.close()
        self.proc, self.confinement, self.status, self.load = (
            started.proc,
            started.confinement,
            started.status,
            started.load,
        )
        self.leader = self.proc.pid  # whose processes /proc is read for (a launcher's, without a PID namespace)
        self.pidns = started.pidns
        self.status_text = b""
        self.write_fd, self.read_fd = from_harness, from_worker
        os.set_blocking(self.write_fd, False)
        os.set_blocking(self.read_fd, False)

    def launched(self) -> None:
        """With a launcher: its pid read (`launcher PID`), then its sandbox checked before the worker
        imports anything."""
        if self.status is None:
            return
        deadline = self.settings.capped(time.monotonic() + max(self.settings.timeout_s, LOAD_S))
        line = self._status_line(deadline)
        if not line.startswith("launcher "):
            raise self.died("start")
        if not self.pidns:  # its pid is the harness's namespace's
            self.leader = int(line.split()[1])
        problems = self.confinement.problems(self.leader)
        if problems:
            self.kill()
            raise SandboxMissing(problems, "before the worker started")

    def _status_line(self, deadline: float) -> str:
        """The launcher's next status line ('' at its end or at `deadline`)."""
        assert self.status is not None
        while b"\n" not in self.status_text:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.status], [], [], left)[0]:
                return ""
            chunk = os.read(self.status, 4096)
            if not chunk:
                return ""
            self.status_text += chunk
        line, _, self.status_text = self.status_text.partition(b"\n")
        return line.decode(errors="replace")

    def request(self, message: dict[str, Any], expect: str, fds: list[int] | None = None) -> dict[str, Any]:
        """Send one request (and, first, the descriptors `fds` of the shared buffers it adds, in their
        order) and return its answer (kind `expect`); an arm's raise is raised here."""
        what = str(message["kind"])
        self.confinement.thaw()  # frozen while another arm was timed (arms.Isolation.quiet)
        timeout = max(self.settings.timeout_s, LOAD_S) if what == "load" else self.settings.timeout_s
        deadline = self.settings.capped(time.monotonic() + timeout)
        self._send_fds(fds or [], deadline, what)
        data = json.dumps(message).encode()
        self._write(HEADER.pack(len(data)) + data, deadline, what)
        (length,) = HEADER.unpack(self._read(HEADER.size, deadline, what))
        if length > MAX_ANSWER:
            raise self.broken(f"an answer of {length} bytes to '{what}' (at most {MAX_ANSWER})")
        data = self._read(length, deadline, what)
        try:
            answer = json.loads(data)
        except (ValueError, RecursionError, MemoryError) as exc:  # nested past the parser's depth: RecursionError
            raise self.broken(
                f"an answer to '{what}' that is not JSON kerneltrial reads ({type(exc).__name__})"
            ) from None
        if not isinstance(answer, dict) or not isinstance(answer.get("kind"), str):
            raise self.broken(f"an answer to '{what}' without a kind")
        targets.note(str(answer.get("refused") or ""))  # over-limit launches count as refused here
        if answer["kind"] == "raised":
            raise arm_exception(str(answer.get("type")), str(answer.get("message", ""))[:2000])
        if answer["kind"] != expect:
            raise self.broken(f"answered '{answer['kind']}' to '{what}' (expected '{expect}')")
        return answer

    def _write(self, data: bytes, deadline: float, what: str) -> None:
        view = memoryview(data)
        while view:
            if not select.select([], [self.write_fd], [], self._left(deadline, what))[1]:
                continue
            try:
                view = view[os.write(self.write_fd, view) :]
            except BrokenPipeError:
                raise self.died(what) from None

    def _send_fds(self, fds: list[int], deadline: float, what: str) -> None:
        """The descriptors, FDS_PER_MESSAGE at a time, under the request's deadline (a worker that
        never reads its socket is killed at it, as one that never reads its pipe)."""
        for start in range(0, len(fds), FDS_PER_MESSAGE):
            while True:
                if not select.select([], [self.fds], [], self._left(deadline, what))[1]:
                    continue
                try:
                    socket.send_fds(self.fds, [b"f"], fds[start : start + FDS_PER_MESSAGE])
                    break
                except BlockingIOError:
                    continue
                except OSError:
                    raise self.died(what) from None

    def _read(self, n: int, deadline: float, what: str) -> bytes:
        chunks: list[bytes] = []
        while n:
            if not select.select([self.read_fd], [], [], self._left(deadline, what))[0]:
                continue
            chunk = os.read(self.read_fd, min(n, 1 << 20))
            if not chunk:
                raise self.died(what)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _left(self, deadline: float, what: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            self.kill()
            raise WorkerHung(
                f"worker hung: no answer to '{what}' in time ({self.settings.timeout_s:g} s a request); killed"
            )
        return left

    def died(self, what: str) -> WorkerFailure:
        """How the worker ended, having closed its pipe during `what`."""
        try:
            code = self.proc.wait(REAP_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return WorkerBroken(f"worker broke the protocol: it closed its pipe during '{what}'; killed")
        if self.status is not None:  # the launcher's report of the worker's exit
            line = self._status_line(time.monotonic() + REAP_S)
            line = self._status_line(time.monotonic() + REAP_S) if line.startswith("launcher ") else line
            if line.startswith("exited ") and line.split()[1].lstrip("-").isdigit():
                code = int(line.split()[1])
        if code < 0:
            return WorkerCrashed(f"worker crashed: killed by signal {signal.Signals(-code).name} during '{what}'")
        return WorkerExited(f"worker exited with code {code} during '{what}'")

    def broken(self, detail: str) -> WorkerBroken:
        self.kill()
        return WorkerBroken(f"worker broke the protocol: {detail}; killed")

    def kill(self) -> None:
        self.confinement.kill()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        """Ask the worker to exit, kill it if it does not, free its pipes and folder."""
        self.confinement.thaw()
        if self.proc.poll() is None:
            try:
                data = json.dumps({"kind": "exit"}).encode()
                os.write(self.write_fd, HEADER.pack(len(data)) + data)
                self.proc.wait(REAP_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (self.write_fd, self.read_fd, *([] if self.status is None else [self.status])):
            os.close(fd)
        self.fds.close()
        self.log.close()
        self.confinement.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def worker_sys_path() -> list[str]:
    """The harness's import path for the worker (dotted user modules), absolute."""
    return [os.path.abspath(p or ".") for p in sys.path]


@dataclass
class WorkerHandle:
    """An isolated arm's worker: started on the first request, started afresh after a failure.
    `generation` counts the starts (an arm bound to an earlier worker knows it is gone)."""

    source: ArmSource
    settings: Settings
    names: list[str]
    process: Process | None = None
    arena: Arena = field(init=False)
    defines: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)  # a sealed module's own top-level functions
    modules: list[str] = field(default_factory=list)  # the kerneltrial modules the worker says it holds
    loaded: dict[str, Any] = field(default_factory=dict)  # the last `loaded` answer
    generation: int = 0

    def __post_init__(self) -> None:
        self.arena = Arena(self.settings.device)

    def request(self, message: dict[str, Any], expect: str, fds: list[int] | None = None) -> dict[str, Any]:
        process = self.start()
        try:
            return process.request(message, expect, fds)
        except WorkerFailure:
            self.stop()
            raise

    def start(self) -> Process:
        """The live worker, started and loaded when there is none."""
        if self.process is not None:
            return self.process
        self.arena.close()
        self.process = Process(self.source, self.settings)
        self.arena = Arena(self.settings.device)
        self.generation += 1
        try:
            self.process.launched()
            answer = self.process.request(self.load_message() | self.process.load, "loaded")
        except (WorkerFailure, ArmRaised):  # a module that fails to import leaves no worker behind
            self.stop()
            raise
        problems = self.process.confinement.problems(self.process.leader)
        if problems:
            self.stop()
            raise SandboxMissing(problems, "after its module's import")
        modules = answer.get("kerneltrial_modules")
        if self.source.mode != "registry" and modules:
            self.stop()
            raise WorkerBroken(f"worker broke the protocol: a sealed worker imported {modules}; killed")
        names = {key: answer.get(key) or [] for key in ("defines", "functions")}
        if not all(
            isinstance(v, list) and all(isinstance(n, str) for n in v) for v in [*names.values(), modules or []]
        ):
            self.stop()
            raise WorkerBroken(
                "worker broke the protocol: a `loaded` answer whose names are not lists of strings; killed"
            )
        self.defines, self.functions, self.modules = names["defines"], names["functions"], list(modules or [])
        self.loaded = answer
        return self.process

    def load_message(self) -> dict[str, Any]:
        target = self.settings.target
        timer = self.settings.timer
        return {
            "kind": "load",
            "module": self.source.module,
            "op": self.source.op,
            "names": self.names,
            "sys_path": worker_sys_path(),
            "shims": {name: str(path) for name, path in SHIMS.items()},
            "target": None if target is None else {"name": target.name, "max_grid": list(target.max_grid)},
            "timer": None if timer is None else {"backend": timer[0], "cold": timer[1]},
            "device": str(self.settings.device),
        }

    def stop(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None

    def close(self) -> None:
        self.stop()
        self.arena.close()
