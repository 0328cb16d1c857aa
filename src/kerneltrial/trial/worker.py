"""The isolated worker: a process of its own that runs one kernel module's functions for
kerneltrial's harness, and never imports the harness. One worker for trials and packages.

The harness (trial/isolation.py) starts it by file path, `python -I .../trial/worker.py MODE
READ_FD WRITE_FD [FDS_FD]`; the package interface check (submission/isolated.py, MODE `target`)
runs a copy under a neutral name with no argument, by a plain interpreter, as a target would
import the archive: its channel is its standard input and output (moved to descriptors of its
own at once; 0 becomes /dev/null, 1 its log), FDS_FD is named in `load`, which also sets a path
without kerneltrial; no finder of the worker's is on sys.meta_path and the shims leave
sys.modules once loaded. The harness reads nothing of its output but a log (an arm may print
anything): requests on READ_FD, answers on WRITE_FD; on FDS_FD, a Unix socket, the descriptors of
shared buffers arrive before the request that adds them. A message is one frame: 4 bytes
big-endian length, then that many bytes of UTF-8 JSON, an object with a "kind". The harness waits
a deadline for every answer and kills a worker that misses it; a worker whose harness has gone exits.

What it imports: the standard library, torch, triton, the arm's module, and five self-contained
files of kerneltrial loaded by path under private names (`_kt_shim_*`): ops/interpreter_fix.py
(the interpreter's bf16 rounding, as in the harness), trial/poison.py (poisoned outputs for the
gate's calls), trial/timing.py (the harness's Timer: an isolated arm is timed as an in-process one
is), trial/targets.py (the launch limits of `--target`) and trial/vmm.py (GPU buffers; it imports
cuda-python when one arrives). None of them holds harness state. Before anything else it takes
kerneltrial out of reach: a finder first on sys.meta_path refuses `kerneltrial` and every
submodule (MODE `sealed`, user arms). MODE `registry` (a built-in arm isolated by `isolate`) lets
`kerneltrial`, `kerneltrial.ops*` (the built-in kernels and peers) and the torch-free constants of
`kerneltrial.rundir*` they read import, and refuses the rest (trial, analysis, ...: the harness).
The requests and answers it takes and gives: trial/isolation.py's docstring."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import json
import mmap
import os
import socket
import struct
import sys
import threading
import time
import warnings
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20
PACKAGE = "kerneltrial"
# MODE registry: the packages (and their submodules) a built-in arm imports, the operators and the
# torch-free ground floor they build on (ops/inputs.py and ops/registry.py read rundir's constants);
# never the harness (trial/, analysis/)
REGISTRY_ALLOWED = ("kerneltrial.ops", "kerneltrial.rundir")
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
PARENT_POLL_S = 1.0


class Refuse(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: kerneltrial (in MODE registry: all but REGISTRY_ALLOWED) is not importable."""

    def __init__(self, mode: str, fd_socket: socket.socket | None = None) -> None:
        self.mode = mode
        self.fd_socket = fd_socket

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        allowed = name == PACKAGE or any(name == p or name.startswith(p + ".") for p in REGISTRY_ALLOWED)
        if self.mode == "registry" and allowed:
            return None
        raise ModuleNotFoundError(
            f"{name} is not importable in kerneltrial's isolated worker: the arm runs in a process of "
            "its own, apart from the harness",
            name=name,
        )


def seal(mode: str) -> None:
    """Take kerneltrial out of reach before anything of the arm is imported (MODE target: the
    harness gives a path without it, set at `load`)."""
    if mode == "target":
        return
    if mode not in ("sealed", "registry"):
        raise SystemExit(f"worker: unknown mode {mode!r}; use sealed or registry")
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(__file__).resolve().parent]
    sys.meta_path.insert(0, Refuse(mode))


def watch_parent() -> None:
    """Exit when the harness has gone (an orphan stuck in a kernel would never read its pipe)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(70)

    threading.Thread(target=watch, daemon=True).start()


# ---------------------------------------------------------------- frames


def read_exact(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    (length,) = HEADER.unpack(head)
    if length > MAX_FRAME:
        raise SystemExit(f"worker: a request of {length} bytes is over the {MAX_FRAME} limit")
    body = read_exact(fd, length)
    return None if body is None else json.loads(body)


def write_frame(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------- tensors


def load_file(name: str, path: str) -> ModuleType:
    """A Python file imported under `name` (registered first: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def dtype_of(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}")
    return getattr(torch, name)


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def open_buffer(desc: dict[str, Any], vmm: ModuleType | None = None) -> Any:
    """The storage of one shared buffer the harness owns, from its descriptor (`desc["fd"]`): a
    memfd, mapped read-only where `memory` is "read" (the harness sealed it so: no writable mapping
    of it can be made), or a GPU buffer made with CUDA's virtual memory API, through the `vmm` shim."""
    import torch

    if "memory" in desc:
        readonly = desc["memory"] == "read"
        memory = mmap.mmap(
            int(desc["fd"]), int(desc["nbytes"]), prot=mmap.PROT_READ if readonly else mmap.PROT_WRITE | mmap.PROT_READ
        )
        os.close(int(desc["fd"]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not writable": a kernel that writes it faults, as it should
            return torch.frombuffer(memory, dtype=torch.uint8).untyped_storage()
    if "vmm" in desc:
        if vmm is None:
            raise ValueError("a VMM buffer needs the vmm shim")
        device, size = (int(v) for v in desc["vmm"])
        return vmm.Mapping.open(int(desc["fd"]), size, device).tensor().untyped_storage()
    device, handle, size, offset, ref_handle, ref_offset, event, sync = desc["cuda"]
    torch.cuda._lazy_init()
    return torch.UntypedStorage._new_shared_cuda(
        device,
        bytes.fromhex(handle),
        size,
        offset,
        bytes.fromhex(ref_handle),
        ref_offset,
        None if event is None else bytes.fromhex(event),
        sync,
    )


def bytes_of(storage: Any) -> Any:
    """A uint8 tensor over a whole storage."""
    import torch

    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def describe(outputs: list[Any], buffers: dict[int, Any], held: list[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """What the harness needs to mirror each output (layout; its storage, numbered; whether that
    storage is an input's buffer or one of the last call's outputs, which the worker still holds),
    and the distinct storages in that numbering."""
    inputs = {s.data_ptr(): b for b, s in buffers.items() if s.nbytes()}
    previous = {s.data_ptr(): k for k, s in enumerate(held) if s.nbytes()}
    storages: list[Any] = []
    metas = []
    for out in outputs:
        storage = out.untyped_storage()
        known = [k for k, s in enumerate(storages) if s.nbytes() and s.data_ptr() == storage.data_ptr()]
        if not known:
            storages.append(storage)
        meta = {
            "dtype": dtype_name(out.dtype),
            "shape": list(out.shape),
            "stride": list(out.stride()),
            "offset": out.storage_offset(),
            "storage": known[0] if known else len(storages) - 1,
            "nbytes": storage.nbytes(),
        }
        if storage.nbytes() and storage.data_ptr() in inputs:
            meta["input"] = inputs[storage.data_ptr()]
        elif storage.nbytes() and storage.data_ptr() in previous:
            meta["previous"] = previous[storage.data_ptr()]
        metas.append(meta)
    return metas, storages


def as_outputs(returned: Any) -> list[Any] | None:
    """The returned tensor(s) as a list; None for a non-tensor (the harness names its type)."""
    import torch

    if isinstance(returned, torch.Tensor):
        return [returned]
    if isinstance(returned, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in returned):
        return list(returned)
    return None


class Bind:
    """An arm's inputs for timed samples: its arguments, the value sets written before each call
    (`pool`), the harness's output slots of each call (`slots`)."""

    def __init__(self, worker: Worker, message: dict[str, Any]) -> None:
        self.fn = worker.functions[message["fn"]]
        self.args = [worker.argument(d) for d in message["args"]]
        self.tensors = [a for a in self.args if hasattr(a, "untyped_storage")]
        # separate tensor objects over the same memory: writing the values bumps no version counter of the arm's
        self.writers = {i: worker.argument(d) for i, d in enumerate(message["args"]) if "buffer" in d}
        self.inplace = [int(i) for i in message["inplace"]]
        self.pool = [[(int(i), worker.argument(d)) for i, d in call] for call in message["pool"]]
        self.slots = [[worker.argument(d) for d in call] for call in message["slots"]]
        self.buffers = [int(b["id"]) for b in message["add"]]
        self.returned: Any = None
        self.last: list[Any] = []  # the last call's output storages, held until the next call returns

    def call(self) -> None:
        from torch.autograd.graph import increment_version

        for t in self.tensors:
            increment_version(t)
        self.returned = self.fn(*self.args)

    def outputs(self) -> list[Any]:
        if self.inplace:
            return [self.args[i] for i in self.inplace]
        outputs = as_outputs(self.returned)
        if outputs is None:
            raise TypeError(f"the arm returned {type(self.returned).__name__}, not a tensor or a tuple of tensors")
        return outputs

    def keep(self, j: int, odd: dict[str, Any], persistent: list[int]) -> None:
        """After call j (untimed): its outputs into slot j; note odd outputs and a reused buffer."""
        outputs = self.outputs()
        storages = [t.untyped_storage() for t in outputs]
        held = {s.data_ptr() for s in self.last if s.nbytes()}
        if not self.inplace and any(s.nbytes() and s.data_ptr() in held for s in storages):
            persistent.append(j)
        slots = self.slots[j]
        fits = len(outputs) == len(slots) and all(
            o.shape == s.shape and o.dtype == s.dtype for o, s in zip(outputs, slots, strict=False)
        )
        if fits:
            for out, slot in zip(outputs, slots, strict=True):
                slot.copy_(out)
        if not fits or not all(o.is_contiguous() for o in outputs):
            odd[str(j)] = [
                {"dtype": dtype_name(o.dtype), "shape": list(o.shape), "stride": list(o.stride())} for o in outputs
            ]
        self.last = storages


class Worker:
    """The state of one worker: its arm's functions, the harness's buffers it has mapped, its binds."""

    def __init__(self, mode: str, fd_socket: socket.socket | None = None) -> None:
        self.mode = mode
        self.fd_socket = fd_socket
        self.functions: dict[str, Any] = {}
        self.own_functions: list[str] = []  # a sealed module's top-level functions, for the harness's error
        self.buffers: dict[int, Any] = {}
        self.binds: dict[int, Bind] = {}
        self.held: list[Any] = []  # the last gate call's output storages
        self.staged: list[Any] = []  # ... and their bytes as copied at its return, on the current stream
        self.staged_inputs: dict[int, Any] = {}  # its argument buffers' bytes, likewise
        self.returned: list[Any] = []
        self.case_sizes: tuple[int, ...] = ()  # the last gate call's argument sizes (poison.poison_before_call)
        self.shims: dict[str, ModuleType] = {}
        self.context = ExitStack()
        self.timer: Any = None
        self.device: Any = None
        self.fixed = False

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request; `refused`: the first over-limit launch (--target) it saw."""
        mark = self.seen()
        try:
            self.fix_interpreter()
            answer = getattr(self, "on_" + str(message["kind"]))(message)
            self.fix_interpreter()  # before the arm's first call: it imported triton at its import
        except Exception as exc:  # the arm may raise anything; the harness names it
            text = str(exc).splitlines()[0] if str(exc) else ""
            answer = {"kind": "raised", "type": type(exc).__name__, "message": text}
        return answer | {"refused": self.refused_since(mark)}

    def fix_interpreter(self) -> None:
        """The interpreter's float32 -> bfloat16 rounding, as in the harness, once triton is imported
        (by the arm: a worker whose arm uses torch alone never imports it)."""
        fix = self.shims.get("interpreter_fix")
        if self.fixed or fix is None or os.environ.get("TRITON_INTERPRET") != "1" or "triton" not in sys.modules:
            return
        fix.patch()
        self.fixed = True
        if self.mode == "target":  # the module would see the patch's marker
            from triton.runtime import interpreter

            vars(interpreter._convert_float).pop("kerneltrial_patched", None)

    # -- buffers and arguments

    def update(self, message: dict[str, Any]) -> None:
        """Unmap the buffers to drop; map the added ones (their descriptors arrive on the socket
        first, one per buffer but a legacy CUDA IPC one, in their order)."""
        for buffer in message.get("drop", []):
            self.buffers.pop(int(buffer), None)
        added = list(message.get("add", []))
        shared = [d for d in added if "cuda" not in d]
        if shared:
            if self.fd_socket is None:
                raise ValueError("shared buffers need the worker's socket (FDS_FD)")
            fds: list[int] = []
            while len(fds) < len(shared):  # the harness sends them a message of at most 200 at a time
                data, more, _, _ = socket.recv_fds(self.fd_socket, 1, len(shared) - len(fds))
                if not data or not more:
                    raise ValueError(f"{len(shared)} shared buffers but {len(fds)} descriptors arrived")
                fds += more
            for desc, fd in zip(shared, fds, strict=True):
                desc["fd"] = fd
        for desc in added:
            self.buffers[int(desc["id"])] = open_buffer(desc, self.shims.get("vmm"))

    def argument(self, desc: dict[str, Any]) -> Any:
        """A scalar, or a new tensor object over a shared buffer (with a version counter of its own)."""
        import torch

        if "value" in desc:
            return desc["value"]
        storage = self.buffers[int(desc["buffer"])]
        empty = torch.empty(0, dtype=dtype_of(desc["dtype"]), device=storage.device)
        return empty.set_(storage, int(desc["offset"]), list(desc["shape"]), list(desc["stride"]))

    # -- requests

    def on_load(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.mode == "target":
            sys.path[:] = [str(p) for p in message["sys_path"]]
            self.fd_socket = socket.socket(fileno=int(message["fds_fd"]))
        import torch

        if message.get("threads") is not None:
            torch.set_num_threads(int(message["threads"]))
        self.device = torch.device(message["device"])
        shims = message["shims"]
        self.shims = {name: load_file(f"_kt_shim_{name}", path) for name, path in shims.items()}
        if self.mode == "target":  # loaded: the module would see them in sys.modules
            for name in shims:
                sys.modules.pop(f"_kt_shim_{name}", None)
        target = message.get("target")
        if target:
            targets = self.shims["targets"]
            profile = targets.Target(target["name"], tuple(target["max_grid"]), "")
            self.context.enter_context(targets.targeting(profile))
        timer = message.get("timer")
        if timer:
            gpu = self.device.type == "cuda"
            self.timer = self.shims["timing"].timer_for(timer["backend"], gpu, bool(timer["cold"]))
        names = [str(n) for n in message["names"]]
        if self.mode == "target":
            return self.load_target(str(message["module"]), str(message["archive"]), names[0], torch.get_num_threads())
        self.functions = self.load_arm(message, names)
        loaded = sorted(m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
        return {
            "kind": "loaded",
            "pid": os.getpid(),
            "defines": sorted(self.functions),
            "functions": self.own_functions,
            "kerneltrial_modules": loaded,
        }

    def load_target(self, name: str, archive: str, entry: str, threads: int) -> dict[str, Any]:
        """MODE target: the unpacked archive's module `name` imported by its name, as a target
        imports it; an import error is part of the answer (the harness words the check's result)."""
        answer: dict[str, Any] = {"kind": "loaded", "pid": os.getpid(), "threads": threads, "error": ""}
        answer |= {"callables": [], "signature": "", "defines": [], "kerneltrial_modules": []}
        if importlib.util.find_spec(name) is not None:
            return answer | {"error": f"the module name {name} is taken by an installed module here; rename {name}.py"}
        sys.path.insert(0, archive)
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a user's module may raise anything at import
            return answer | {
                "error": f"{name}.py failed to import from the unpacked archive: {type(exc).__name__}: {exc}"
            }
        fn = getattr(module, entry, None)
        try:
            signature = str(inspect.signature(fn)) if callable(fn) else ""
        except (TypeError, ValueError):
            signature = "(?)"
        self.functions = {entry: fn} if callable(fn) else {}
        answer["kerneltrial_modules"] = sorted(m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
        callables = sorted(n for n, v in vars(module).items() if callable(v))
        return answer | {"callables": callables, "signature": signature, "defines": sorted(self.functions)}

    def load_arm(self, message: dict[str, Any], names: list[str]) -> dict[str, Any]:
        """The functions `names` of the arm: a module's top-level functions, or (MODE registry)
        the built-in implementations of one operator."""
        if self.mode == "registry":
            registry = importlib.import_module("kerneltrial.ops.registry")
            op = registry.get_op(message["op"])
            return {n: op.impls[n].resolve() for n in names if n in op.impls and op.impls[n].available}
        for entry in message.get("sys_path", []):
            if entry not in sys.path:
                sys.path.append(entry)
        spec = str(message["module"])
        if spec.endswith(".py") or Path(spec).exists():
            module = load_file(f"arm_{Path(spec).stem}", spec)
        else:
            module = importlib.import_module(spec)
        self.own_functions = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__
        )
        return {n: getattr(module, n) for n in names if callable(getattr(module, n, None))}

    def refused_since(self, mark: int) -> str:
        targets = self.shims.get("targets")
        return targets.first_since(mark) if targets else ""

    def seen(self) -> int:
        targets = self.shims.get("targets")
        return targets.seen() if targets else 0

    def on_call(self, message: dict[str, Any]) -> dict[str, Any]:
        """One gate call: outputs poisoned (CPU: torch.empty* patched; GPU: free blocks the size of
        the last call's outputs, else of the inputs), read after synchronising the current stream."""
        import torch

        self.update(message)
        args = [self.argument(d) for d in message["args"]]
        poison = self.shims["poison"]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        self.case_sizes = poison.poison_before_call(tensors, self.returned, self.device, self.case_sizes)
        with poison.poisoned_allocations(self.device):
            returned = self.functions[message["fn"]](*args)
        outputs = None if returned is None else as_outputs(returned)
        answer: dict[str, Any] = {"kind": "called", "outputs": None}
        if returned is not None and outputs is None:
            answer["returned"] = type(returned).__name__
        self.returned = outputs or []
        answer["outputs"], self.held = describe(self.returned, self.buffers, self.held)
        # what a caller's stream sees right after the return, copied on it before anything waits:
        # an output left on a stream not ordered with the caller's is caught however late it is read
        self.staged = [bytes_of(storage).clone() for storage in self.held]
        used = {int(d["buffer"]) for d in message["args"] if "buffer" in d}
        self.staged_inputs = {b: bytes_of(self.buffers[b]).clone() for b in used}
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        if outputs is None:
            answer["outputs"] = None
        return answer

    def on_fetch(self, message: dict[str, Any]) -> dict[str, Any]:
        """The last call's outputs and input snapshots, as copied at its return (`on_call`), into harness
        buffers; on a GPU the copies and the arm's last outputs are then spoiled and the cache given back
        (a worker that kept its poisoned blocks and copies left the harness's check out of memory)."""
        import torch

        self.update(message)
        self.copy_staged(message["outputs"], message["snapshots"])
        if self.device.type == "cuda":
            inputs = {s.data_ptr() for s in self.buffers.values()}
            own = [bytes_of(s) for s in self.held if s.nbytes() and s.data_ptr() not in inputs]
            self.shims["poison"].spoil([*self.staged, *self.staged_inputs.values(), *own])
            torch.cuda.synchronize(self.device)  # every stream: the arm's and the spoiling
        self.staged, self.staged_inputs = [], {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"kind": "fetched"}

    def copy_staged(self, outputs: list[list[int]], snapshots: list[list[int]]) -> None:
        pairs = [(self.staged[int(k)], int(b)) for k, b in outputs]
        pairs += [(self.staged_inputs.get(int(s), bytes_of(self.buffers[int(s)])), int(b)) for s, b in snapshots]
        for src, buffer in pairs:  # an output's slot spans its extent, which may end before its storage
            dst = bytes_of(self.buffers[buffer])
            n = min(src.numel(), dst.numel())
            dst[:n].copy_(src[:n])

    def on_bind(self, message: dict[str, Any]) -> dict[str, Any]:
        self.update(message)
        self.binds[int(message["id"])] = Bind(self, message)
        return {"kind": "bound"}

    def on_warm(self, message: dict[str, Any]) -> dict[str, Any]:
        bind = self.binds[int(message["id"])]
        for _ in range(int(message["calls"])):
            bind.call()
            bind.last = [t.untyped_storage() for t in bind.outputs()]
        self.settle()
        return {"kind": "warmed"}

    def on_sample(self, message: dict[str, Any]) -> dict[str, Any]:
        """One timed sample with the harness's Timer: value set j before call j, its outputs into
        slot j after it, both outside the timed intervals."""
        bind = self.binds[int(message["id"])]
        odd: dict[str, Any] = {}
        persistent: list[int] = []
        timing = self.shims["timing"]

        def before(j: int) -> None:
            for i, values in bind.pool[j]:
                bind.writers[i].copy_(values)

        hooks = timing.Hooks(before=before, after=lambda j: bind.keep(j, odd, persistent))
        retaken, behind = self.timer.retaken, self.timer.kept_behind
        ns = self.timer.sample(bind.call, int(message["calls"]), key=int(message["key"]), hooks=hooks)
        self.settle()
        return {
            "kind": "sampled",
            "ns": int(ns),
            "odd": odd,
            "persistent": persistent,
            "retaken": self.timer.retaken - retaken,
            "kept_behind": self.timer.kept_behind - behind,
        }

    def settle(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_release(self, message: dict[str, Any]) -> dict[str, Any]:
        self.binds.pop(int(message["id"]), None)
        self.update(message)
        if self.timer is not None:
            self.timer.release()
        return {"kind": "released"}


def target_channel() -> tuple[int, int]:
    """MODE target: the channel (standard input and output) on descriptors of the worker's own;
    0 becomes /dev/null and 1 the log (standard error)."""
    read_fd, write_fd = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    return read_fd, write_fd


def main(argv: list[str]) -> int:
    if len(argv) == 1:  # a target's launch (see the module's docstring)
        mode, (read_fd, write_fd), fd_socket = "target", target_channel(), None
    elif len(argv) in (4, 5):
        mode, read_fd, write_fd = argv[1], int(argv[2]), int(argv[3])
        fd_socket = socket.socket(fileno=int(argv[4])) if len(argv) == 5 else None
    else:
        raise SystemExit(
            "usage: python -I worker.py sealed|registry READ_FD WRITE_FD [FDS_FD] (started by kerneltrial)"
        )
    seal(mode)
    watch_parent()
    worker = Worker(mode, fd_socket)
    while True:
        message = read_frame(read_fd)
        if message is None or message.get("kind") == "exit":
            return 0
        write_frame(write_fd, worker.handle(message))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
