"""Isolated arms: an arm whose code runs in a worker process (trial/worker.py) while the harness
draws the values, decides what to check, compares and owns the verdict.

- `RemoteFn` is an isolated arm as a callable, what its `Impl` resolves to. The correctness gate
  (trial/gate.py) calls it as it calls any arm, unchanged: each call copies the tensors' storages
  into shared buffers (a mirror per storage, kept across the next call so that the gate's "same
  buffers" call reaches the worker at the same addresses), runs the function in the worker with
  poisoned outputs (on a CPU the inputs read-only to it, unless the operator writes them), and
  copies back the outputs, into slots the harness owns, and every argument's memory as the harness
  itself reads it with the worker frozen; the worker's snapshot of it, taken at the return before
  it waits for its side streams, must equal that read (`LateWrite`).
  The harness mirrors what the gate inspects: an output that is a view of an input comes back as
  a view of the harness's input (`aliasing`), one that reuses the storage of the last call's
  output comes back in that call's slot (`persistent`); a launch over the target's limits is
  counted as refused here (`targets`).
- `IsolatedArm` is the timed form (trial/timed.py `TimedArm`): its guarded inputs live in shared
  buffers, as do the unit's value sets (`pool`) and one output slot per call. For a sample the
  harness writes the value sets, sends one request and takes the wall clock around it; the worker
  writes value set j before call j, times every call with the harness's Timer and copies every
  call's outputs into their slots. Only then does the harness draw which call to check (the OS's
  randomness), so the worker cannot know it; the check and the audit of every guarded byte run
  here. The worker's figure is published; the harness's wall clock bounds it (docs/CHECKS.md,
  "Checks: what each defeats, and what a kernel can still do").
- `timed_arm` gives an arm's timed form (isolated or in-process). The workers of one run or `check`
  are held by trial/arms.py `Isolation`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kerneltrial.ops.registry import Impl, Inputs, Operator, Outputs
from kerneltrial.trial import gate, guard, timed
from kerneltrial.trial.isolation import (
    WorkerBroken,
    WorkerCrashed,
    WorkerExited,
    WorkerFailure,
    WorkerHandle,
)
from kerneltrial.trial.shared import Arena, Buffer, dtype_name
from kerneltrial.trial.timing import Timer

DTYPES = {
    dtype_name(d): d
    for d in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    )
}
MAX_DIMS = 16
MIN_OUTPUT_CAP = 64 << 20  # an output may span at least this many bytes, whatever the inputs
OUTPUT_CAP_FACTOR = 16  # ... or this many times the bytes of its inputs
ALIGN = 64  # bytes: the start of every tensor packed into one shared buffer


class LateWrite(WorkerFailure):
    """The arm's memory changed after its call returned (the check fails; the worker goes on)."""


class BoundExceeded(WorkerBroken):
    """The worker claimed a sample took longer than the harness measured around it (stopped)."""


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass(frozen=True)
class OutputMeta:
    """One output as the worker describes it (checked here: nothing else is trusted)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage: int
    input: int | None = None
    previous: int | None = None

    @property
    def extent(self) -> int:
        """Bytes of its storage the output spans (from the storage's start)."""
        if any(s == 0 for s in self.shape):
            return 0
        last = self.offset + sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=True))
        return (last + 1) * self.dtype.itemsize


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkerBroken(f"worker broke the protocol: {what} {value!r} is not a count")
    return value


def _counts(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise WorkerBroken(f"worker broke the protocol: {what} {value!r} is not a list of counts")
    return tuple(_count(v, what) for v in value)


def output_meta(raw: Any, layout_only: bool = False) -> OutputMeta:
    """An output description from the worker, every field checked (`layout_only`: dtype, shape and
    stride, as a timed sample reports an output that did not fit its slot)."""
    if not isinstance(raw, dict) or raw.get("dtype") not in DTYPES:
        raise WorkerBroken(f"worker broke the protocol: output {raw!r:.200} has no known dtype")
    shape, stride = _counts(raw.get("shape"), "shape"), _counts(raw.get("stride"), "stride")
    if len(shape) != len(stride):
        raise WorkerBroken(f"worker broke the protocol: shape {shape} and stride {stride} differ in length")
    if layout_only:
        return OutputMeta(DTYPES[raw["dtype"]], shape, stride, 0, 0)
    related = {k: _count(raw[k], k) for k in ("input", "previous") if raw.get(k) is not None}
    return OutputMeta(
        DTYPES[raw["dtype"]],
        shape,
        stride,
        _count(raw.get("offset"), "offset"),
        _count(raw.get("storage"), "storage"),
        **related,
    )


def view(storage: torch.UntypedStorage, meta: OutputMeta) -> torch.Tensor:
    """The output over `storage`, as the worker laid it out (refused when out of bounds)."""
    try:
        empty = torch.empty(0, dtype=meta.dtype, device=storage.device)
        return empty.set_(storage, meta.offset, meta.shape, meta.stride)
    except RuntimeError as exc:
        raise WorkerBroken(f"worker broke the protocol: an output out of its storage's bounds ({exc})") from None


@dataclass
class Mirror:
    """A harness storage handed to the worker: the copy it works on (`readonly`: read-only to it,
    on a CPU) and the snapshot it makes at the call's return."""

    storage: torch.UntypedStorage
    live: Buffer
    snap: Buffer
    readonly: bool


@dataclass
class Remote:
    """One isolated arm's worker, and the state its calls keep between them."""

    handle: WorkerHandle
    mirrors: dict[int, Mirror] = field(default_factory=dict)  # harness storage data_ptr -> its mirror
    recent: list[set[int]] = field(default_factory=list)  # mirrors used by the last calls
    slots: dict[int, Buffer] = field(default_factory=dict)  # the last call's output slots, by storage index
    sent: set[int] = field(default_factory=set)  # buffers the worker has mapped
    drop: list[int] = field(default_factory=list)  # buffers to unmap with the next request
    generation: int = 0
    bind: int | None = None  # the worker's bind of the timed arm now using this worker
    bind_buffers: set[int] = field(default_factory=set)
    binds: int = 0

    @property
    def arena(self) -> Arena:
        return self.handle.arena

    def start(self) -> None:
        """The worker running; after a restart nothing of the last one's state is kept."""
        self.handle.start()
        if self.generation != self.handle.generation:
            self.generation = self.handle.generation
            self.mirrors, self.recent, self.slots, self.sent, self.drop = {}, [], {}, set(), []
            self.bind, self.bind_buffers = None, set()

    def hold(self) -> None:
        """Freeze the worker while the harness reads the memory it shares with it (trial/confine.py):
        no thread of the worker can change it between the answer and the harness's read. Its next
        request thaws it. On a GPU, work it queued before stays queued (docs/CHECKS.md)."""
        process = self.handle.process
        if process is not None:
            process.confinement.freeze()
        if self.handle.settings.device.type == "cuda":
            torch.cuda.synchronize(self.handle.settings.device)

    def wake(self) -> None:
        """Thaw the worker before the harness's clock starts (its next request would thaw it too): the
        thaw and its wait are the harness's, in neither the arm's figure nor its floor (kernel/bounds.py)."""
        process = self.handle.process
        if process is not None:
            process.confinement.thaw()

    def additions(self) -> list[Buffer]:
        """Buffers the worker has not mapped yet (and now will)."""
        new = [b for i, b in self.arena.buffers.items() if i not in self.sent]
        self.sent |= {b.id for b in new}
        return new

    def release(self, ids: list[int]) -> None:
        self.arena.release(ids)
        self.drop += [i for i in ids if i in self.sent]
        self.sent -= set(ids)

    def request(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        """Send `message` with the buffers the worker has yet to map (a GPU buffer's descriptor goes
        over the worker's socket; the harness's copy is closed once sent) and those to unmap."""
        new = self.additions()
        message = message | {"add": [b.desc for b in new], "drop": self.drop}
        self.drop = []
        try:
            return self.handle.request(message, expect, [b.fd for b in new if b.fd is not None])
        finally:
            for buffer in new:
                buffer.close_fd()

    # ---- gate calls

    def call(self, fn: str, args: tuple[Any, ...], readonly: bool) -> Any:
        """One call of the arm's `fn` on the harness's `args`, as the gate makes it (`readonly`: the
        operator writes none of its arguments, so the worker gets them read-only); a worker whose
        answer breaks the protocol is stopped."""
        try:
            return self._call(fn, args, readonly)
        except WorkerBroken:
            self.handle.stop()
            raise
        except WorkerCrashed as exc:
            if readonly and self.handle.settings.device.type == "cpu":
                raise WorkerCrashed(
                    f"{exc} (its inputs are read-only to it: a kernel that writes one faults)"
                ) from None
            raise

    def _call(self, fn: str, args: tuple[Any, ...], readonly: bool) -> Any:
        self.start()
        descs, used = self.arguments(args, readonly)
        device = self.handle.settings.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the copies into the mirrors are complete
        answer = self.request({"kind": "call", "fn": fn, "args": descs}, "called")
        if answer.get("returned") is not None:
            raise TypeError(f"the arm returned {str(answer['returned'])[:64]}, not a tensor or a tuple of tensors")
        raw = answer.get("outputs")
        metas = None if raw is None else [output_meta(m) for m in (raw if isinstance(raw, list) else [raw])]
        cap = max(MIN_OUTPUT_CAP, OUTPUT_CAP_FACTOR * sum(self.mirrors[k].storage.nbytes() for k in used))
        slots = self.output_slots(metas or [], cap)
        outputs = [[k, b.id] for k, b in slots.items()]
        snapshots = [[self.mirrors[k].live.id, self.mirrors[k].snap.id] for k in used]
        self.request({"kind": "fetch", "outputs": outputs, "snapshots": snapshots}, "fetched")
        self.hold()
        late = False
        for k in used:  # the inputs as the harness reads them, worker frozen, outputs in place included
            mirror = self.mirrors[k]
            n = mirror.storage.nbytes()
            late |= not torch.equal(mirror.live.bytes[:n], mirror.snap.bytes[:n])
            bytes_of(mirror.storage).copy_(mirror.live.bytes[:n])
        self.retire(used, slots)
        if late:
            raise LateWrite(
                "wrote an argument's memory after the call returned: the harness's own read of it, after every "
                "stream finished, differs from the copy made at the return on the caller's stream (a write on "
                "a stream not ordered with the caller's, or a worker that reports a false snapshot)"
            )
        if metas is None:
            return None
        return tuple(view(self.base(m, slots), m) for m in metas)

    def arguments(self, args: tuple[Any, ...], readonly: bool) -> tuple[list[dict[str, Any]], set[int]]:
        """The wire form of `args` and the mirrors they use (values copied in)."""
        descs: list[dict[str, Any]] = []
        used: set[int] = set()
        for a in args:
            if isinstance(a, torch.Tensor):
                storage = a.untyped_storage()
                key = storage.data_ptr()
                if key in self.mirrors and self.mirrors[key].readonly != readonly:
                    old = self.mirrors.pop(key)
                    self.release([old.live.id, old.snap.id])
                if key not in self.mirrors:
                    n = storage.nbytes()
                    live, snap = self.arena.allocate(n, readonly), self.arena.allocate(n)
                    self.mirrors[key] = Mirror(storage, live, snap, readonly)
                mirror = self.mirrors[key]
                mirror.live.bytes[: storage.nbytes()].copy_(bytes_of(storage))
                used.add(key)
                descs.append(
                    {
                        "buffer": mirror.live.id,
                        "dtype": dtype_name(a.dtype),
                        "shape": list(a.shape),
                        "stride": list(a.stride()),
                        "offset": a.storage_offset(),
                    }
                )
            elif a is None or isinstance(a, (bool, int, float)):
                descs.append({"value": a})
            else:
                raise TypeError(f"an isolated arm takes tensors and numbers, not {type(a).__name__}")
        return descs, used

    def output_slots(self, metas: list[OutputMeta], cap: int) -> dict[int, Buffer]:
        """A harness buffer per output storage that is not an input's: the last call's slot when
        the worker says it reused that storage (so the harness sees the reuse), else a new one."""
        needed: dict[int, int] = {}
        reused: dict[int, int] = {}
        for m in metas:
            if m.input is None:
                needed[m.storage] = max(needed.get(m.storage, 0), m.extent)
                if m.previous is not None:
                    reused[m.storage] = m.previous
        slots: dict[int, Buffer] = {}
        for k, extent in needed.items():
            if extent > cap:
                raise WorkerBroken(f"worker broke the protocol: an output spanning {extent} bytes (at most {cap})")
            previous = self.slots.get(reused.get(k, -1))
            slots[k] = (
                previous if previous is not None and previous.bytes.numel() >= extent else self.arena.allocate(extent)
            )
        return slots

    def base(self, meta: OutputMeta, slots: dict[int, Buffer]) -> torch.UntypedStorage:
        if meta.input is None:
            return slots[meta.storage].bytes.untyped_storage()
        for mirror in self.mirrors.values():
            if mirror.live.id == meta.input:
                return mirror.storage  # an output that is a view of an input: a view of the harness's
        raise WorkerBroken(f"worker broke the protocol: output of input buffer {meta.input}, which it was not given")

    def retire(self, used: set[int], slots: dict[int, Buffer]) -> None:
        """Keep the mirrors of the last two calls and this call's slots; free the rest (the harness's
        outputs keep their memory while it holds them)."""
        self.recent = [*self.recent[-1:], used]
        keep = set().union(*self.recent)
        for key in [k for k in self.mirrors if k not in keep]:
            mirror = self.mirrors.pop(key)
            self.release([mirror.live.id, mirror.snap.id])
        kept = {b.id for b in slots.values()}
        self.release([b.id for b in self.slots.values() if b.id not in kept])
        self.slots = slots


class RemoteFn:
    """An isolated arm's function: called like the arm, run in its worker (`Remote.call`; `inplace`:
    its operator writes arguments, else the worker gets them read-only). `local`: a built-in arm's
    own callable, for what the harness sizes without timing the arm."""

    def __init__(self, remote: Remote, fn: str, inplace: bool, local: Any = None) -> None:
        self.remote, self.fn, self.inplace, self.local = remote, fn, inplace, local

    def __call__(self, *args: Any) -> Any:
        return self.remote.call(self.fn, args, readonly=not self.inplace)


def pack(arena: Arena, likes: list[torch.Tensor], readonly: bool = False) -> list[torch.Tensor]:
    """Contiguous tensors shaped like `likes`, all in one new shared buffer (zeroed)."""
    starts, total = [], 0
    for t in likes:
        starts.append(total)
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    storage = arena.allocate(total, readonly).bytes.untyped_storage()
    return [
        torch.empty(0, dtype=t.dtype, device=storage.device).set_(storage, start // t.element_size(), t.shape)
        for t, start in zip(likes, starts, strict=True)
    ]


@dataclass
class IsolatedArm(timed.TimedArm):
    """A timed arm whose calls run in its worker; see the module docstring."""

    remote: Remote | None = None
    op: Operator | None = None
    bind: int = 0
    generation: int = 0
    pool: list[dict[str, torch.Tensor]] = field(default_factory=list)
    slots: list[list[torch.Tensor]] = field(default_factory=list)
    flagged: bool = False  # the checked call's output reused the previous call's storage

    @classmethod
    def bound(cls, op: Operator, impl: Impl, fn: RemoteFn, values: Inputs, calls: int) -> IsolatedArm:
        """The arm's guarded inputs, value sets and output slots in shared buffers, bound in its worker."""
        remote = fn.remote
        remote.start()
        if remote.bind is not None:  # one timed arm per worker at a time: the previous one is done
            remote.release(sorted(remote.bind_buffers))
            remote.request({"kind": "release", "id": remote.bind}, "released")
        before = set(remote.arena.buffers)
        inputs = guard.guard(values, full=remote.arena.full)
        names = list(inputs.inputs)
        tensors = [n for n in names if n in inputs.views]
        like = (
            [values[n] for n in op.inplace] if op.inplace else list(op.reference(*gate.clone_inputs(values).values()))
        )
        flat = pack(remote.arena, [values[n] for _ in range(calls) for n in tensors], readonly=True)
        pool = [dict(zip(tensors, flat[j * len(tensors) : (j + 1) * len(tensors)], strict=True)) for j in range(calls)]
        flat = pack(remote.arena, [t for _ in range(calls) for t in like])
        slots = [flat[j * len(like) : (j + 1) * len(like)] for j in range(calls)]
        arena = remote.arena
        args = [arena.describe(inputs.inputs[n]) if n in inputs.views else {"value": inputs.inputs[n]} for n in names]
        remote.binds += 1
        remote.request(
            {
                "kind": "bind",
                "id": remote.binds,
                "fn": fn.fn,
                "args": args,
                "inplace": [names.index(n) for n in op.inplace],
                "pool": [[[names.index(n), arena.describe(t)] for n, t in call.items()] for call in pool],
                "slots": [[arena.describe(t) for t in call] for call in slots],
            },
            "bound",
        )
        remote.bind, remote.bind_buffers = remote.binds, set(arena.buffers) - before
        return cls(
            impl,
            fn,
            inputs,
            remote=remote,
            op=op,
            bind=remote.binds,
            generation=remote.generation,
            pool=pool,
            slots=slots,
        )

    def _request(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        assert self.remote is not None
        if self.remote.handle.generation != self.generation or self.remote.handle.process is None:
            raise WorkerExited("worker exited: the arm's worker was replaced after an earlier failure")
        return self.remote.request(message | {"id": self.bind}, expect)

    def call(self) -> None:
        """One untimed call (a warm-up), in the worker."""
        self._request({"kind": "warm", "calls": 1}, "warmed")

    def sample(
        self, timer: Timer, op: Operator, unit: timed.Unit, calls: int, key: int, graph: bool
    ) -> tuple[int, int, int | None]:
        """Value sets written, one request, the wall clock around it; then the call to check is drawn.
        A worker whose answer breaks the protocol, or claims more than the bound, is stopped.
        `peak_bytes` stays None: the worker's allocations are its own process's (trial/memory.py)."""
        try:
            return self._sample(timer, op, unit, calls, key)
        except WorkerBroken:
            assert self.remote is not None
            self.remote.handle.stop()
            raise

    def _sample(self, timer: Timer, op: Operator, unit: timed.Unit, calls: int, key: int) -> tuple[int, int, int]:
        if calls != len(self.pool):
            raise ValueError(f"arm {self.impl.name} was bound for {len(self.pool)} calls per sample, not {calls}")
        for j, values in enumerate(self.pool):
            for name, t in values.items():
                t.copy_(unit.pool[j][name])
        device = self.remote.handle.settings.device if self.remote else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if self.remote is not None:
            self.remote.wake()
        start = time.perf_counter_ns()
        answer = self._request({"kind": "sample", "calls": calls, "key": key}, "sampled")
        wall = time.perf_counter_ns() - start
        assert self.remote is not None
        self.remote.hold()  # frozen while the harness audits the guarded inputs and reads the slots
        ns = _count(answer.get("ns"), "ns")
        if ns > wall:
            raise BoundExceeded(
                f"worker claimed {ns} ns for a sample the harness measured at {wall} ns around it; stopped"
            )
        timer.retaken += _count(answer.get("retaken", 0), "retaken")
        timer.kept_behind += _count(answer.get("kept_behind", 0), "kept_behind")
        checked = timed.checked_call(calls)  # after the sample: the worker cannot know which call
        odd = answer.get("odd") or {}
        self.kept = self.received(op, self.slots[checked], odd.get(str(checked)) if isinstance(odd, dict) else None)
        self.flagged = checked in (answer.get("persistent") or [])
        return ns, checked, wall

    def received(self, op: Operator, slots: list[torch.Tensor], odd: Any) -> Outputs:
        """The checked call's outputs: its slots, or, where the worker says they did not fit or are
        not contiguous where the interface says so, stand-ins on the meta device that carry their
        layout (the comparison fails on shape, dtype or contiguity before reading a value)."""
        if odd is None:
            return tuple(slots)
        if not isinstance(odd, list) or len(odd) > MAX_DIMS:
            raise WorkerBroken(f"worker broke the protocol: output layouts {odd!r:.200}")
        metas = [output_meta(m, layout_only=True) for m in odd]
        fits = len(metas) == len(slots) and all(
            m.shape == tuple(s.shape) and m.dtype == s.dtype for m, s in zip(metas, slots, strict=False)
        )
        contiguous = all(torch.empty_strided(m.shape, m.stride, device="meta").is_contiguous() for m in metas)
        if fits and (contiguous or not op.contiguous_outputs or op.inplace):
            return tuple(slots)
        return tuple(torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta") for m in metas)

    def persistent_problem(self, op: Operator, got: Outputs) -> str:
        if op.inplace or not self.flagged:
            return ""
        return (
            "returns a persistent buffer: the checked call's output shares storage with the previous call's "
            "output, which the caller still holds; allocate a fresh output per call"
        )


def timed_arm(op: Operator, impl: Impl, values: Inputs, calls: int) -> timed.TimedArm:
    """The timed form of `impl`: in its worker when isolated, else in the harness's process."""
    fn = impl.resolve()
    if isinstance(fn, RemoteFn):
        return IsolatedArm.bound(op, impl, fn, values, calls)
    return timed.TimedArm.make(impl, values)
