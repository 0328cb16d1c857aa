"""Per-process call records: which implementation served how many calls of each operator.

A server process that loaded a kerneltrial plugin with KERNELTRIAL_DISPATCH_LOG=DIR writes
DIR/dispatch-PID.json (one file per process, so the API server, engine core and worker
processes of one vLLM server never clobber each other):

    {"schema": 1, "pid": 123, "written_at": 1712345678.9,
     "loads": [{"plugin": "vllm_oot", "kernels": "kerneltrial.plugins.kernels",
                "ops": ["rms_norm"], "error": null}],
     "counts": [{"op": "fused_add_rms_norm", "impl": "kerneltrial", "calls": 96, "errors": 0}]}

The file is written when a plugin loads (or fails to), then rewritten atomically at most
every FLUSH_INTERVAL_S while calls change it, and at interpreter exit. vLLM's worker
processes leave through os._exit (no atexit), so the periodic flush is what usually lands:
the counts are lower bounds, never inventions. Under CUDA-graph replay no Python runs, so
the counts are the calls that went through Python (eager steps and graph captures).

Beside it each process writes imports-PID.json, the files it imported from the pinned
distributions (imports.py): the background thread, started at the plugin's load, rescans them
every FLUSH_INTERVAL_S (a rewrite only when sys.modules changed), and the exit flush once more. A
child forked after the load (vLLM's engine core and workers where it forks) continues its
parent's records under its own PID (os.register_at_fork): its first flush writes both files.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kerneltrial.plugins import LOG_ENV
from kerneltrial.plugins.imports import ImportsLog

SCHEMA = 1
FLUSH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class PluginLoad:
    """One plugin's registration in a process; `error` says why it failed, if it did."""

    plugin: str
    kernels: str
    ops: tuple[str, ...]
    error: str | None = None


@dataclass(frozen=True)
class OpCount:
    """Calls of one kernel-level op served by one implementation (`errors`: calls that raised)."""

    op: str
    impl: str
    calls: int
    errors: int


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    written_at: float
    loads: tuple[PluginLoad, ...]
    counts: tuple[OpCount, ...]
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str) -> ProcessRecord:
        """Parse one record file; ValueError naming `source` and the bad part."""
        try:
            raw = json.loads(text)
            if raw.get("schema") != SCHEMA:
                raise ValueError(f"schema {raw.get('schema')!r}, expected {SCHEMA}")
            loads = tuple(
                PluginLoad(str(x["plugin"]), str(x["kernels"]), tuple(map(str, x["ops"])), x["error"])
                for x in raw["loads"]
            )
            counts = tuple(
                OpCount(str(x["op"]), str(x["impl"]), int(x["calls"]), int(x["errors"])) for x in raw["counts"]
            )
            return cls(int(raw["pid"]), float(raw["written_at"]), loads, counts)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{source}: not a kerneltrial dispatch record ({e!r})") from e


class Recorder:
    """Counts calls in this process and writes them to `directory`/dispatch-PID.json."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._loads: list[PluginLoad] = []
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._dirty = False
        self._thread: threading.Thread | None = None
        self._imports: ImportsLog | None = None  # made at the first load (it looks the distributions up)

    @property
    def path(self) -> Path:
        return self.directory / f"dispatch-{self.pid}.json"

    def loaded(self, load: PluginLoad) -> None:
        """Record a plugin registration (or its failure) and write the file at once."""
        with self._lock:
            self._loads.append(load)
            if self._imports is None:
                self._imports = ImportsLog.create(self.directory, self.pid)
        self.flush()
        self.start()

    def call(self, op: str, impl: str, ok: bool) -> None:
        with self._lock:
            c = self._counts.setdefault((op, impl), [0, 0])
            c[0] += 1
            c[1] += 0 if ok else 1
            self._dirty = True
        self.start()

    def start(self) -> None:
        """The background flush thread, once per process."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._flush_loop, name="kerneltrial-dispatch-log", daemon=True)
                self._thread.start()

    def snapshot(self) -> ProcessRecord:
        with self._lock:
            counts = tuple(OpCount(op, impl, c[0], c[1]) for (op, impl), c in sorted(self._counts.items()))
            return ProcessRecord(self.pid, time.time(), tuple(self._loads), counts)

    def flush(self) -> None:
        rec = self.snapshot()
        with self._lock:
            self._dirty = False
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(rec.to_json())
        os.replace(tmp, self.path)

    def refresh_imports(self, force: bool = False) -> None:
        """imports-PID.json rewritten if this process imported more since (imports.py)."""
        if self._imports is None:
            return
        try:
            self._imports.refresh(force)
        except Exception:  # never stop the call records' thread: an imports record not written is a reason
            pass

    def _flush_loop(self) -> None:
        while True:
            self.refresh_imports()
            time.sleep(FLUSH_INTERVAL_S)
            if self._dirty:
                self.flush()

    def forked(self) -> Recorder:
        """The recorder of a forked child: the parent's plugin loads, no calls yet."""
        child = Recorder(self.directory)
        child._loads = list(self._loads)
        child._imports = self._imports.forked(child.pid) if self._imports is not None else None
        return child


# One recorder per process: the plugins and the torch ops of one process share it.
_recorder: Recorder | None = None
_atexit_registered = False


def recorder() -> Recorder | None:
    """This process's recorder, or None when KERNELTRIAL_DISPATCH_LOG is unset (no records)."""
    global _recorder, _atexit_registered
    directory = os.environ.get(LOG_ENV, "").strip()
    if not directory:
        return None
    if _recorder is None:
        _recorder = Recorder(Path(directory))
    elif _recorder.pid != os.getpid():
        _recorder = _recorder.forked()
        if _recorder._loads:
            _recorder.flush()
    if not _atexit_registered:
        atexit.register(_flush_at_exit)
        os.register_at_fork(after_in_child=_after_fork)
        _atexit_registered = True
    return _recorder


def _flush_at_exit() -> None:
    if _recorder is not None and _recorder.pid == os.getpid():
        _recorder.flush()
        _recorder.refresh_imports(force=True)


def _after_fork() -> None:
    """A forked child of a process that loaded a plugin: its own records, written by its own thread
    (nothing is written here: a child that execs at once, or exits within FLUSH_INTERVAL_S, leaves none)."""
    global _recorder
    if _recorder is not None and _recorder.pid != os.getpid() and _recorder._loads:
        _recorder = _recorder.forked()
        _recorder._dirty = True
        _recorder.start()


def record_load(load: PluginLoad) -> None:
    rec = recorder()
    if rec is not None:
        rec.loaded(load)


def record_call(op: str, impl: str, ok: bool) -> None:
    rec = recorder()
    if rec is not None:
        rec.call(op, impl, ok)
