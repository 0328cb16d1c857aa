"""Buffers the harness owns and an isolated worker maps: how inputs reach an arm in another
process and its outputs come back (trial/worker.py describes the wire format).

On a CPU each buffer is a memfd (anonymous shared memory, in no folder) that the harness maps and
whose descriptor it sends the worker over a Unix socket; its size is sealed (a worker cannot shrink
it under the harness's mapping, which would kill the harness with SIGBUS), and a buffer the worker
must only read (a gate call's input) is sealed against every later writable mapping: the worker can
map it read-only and no other way, whatever it reopens, and a kernel that writes it faults. On a GPU
each buffer is a device allocation made with CUDA's virtual memory API, its descriptor sent the same
way (trial/vmm.py: a worker of another uid can open it; the worker chooses its own access, so a GPU
input is not read-only to it), or, where cuda-python is not installed, a device allocation the
worker opens through a legacy CUDA IPC handle (the fields of `UntypedStorage._share_cuda_`), which
cannot cross uids. The harness writes the values, the worker writes outputs into slots, and neither
side copies through a pipe.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from kerneltrial.trial import vmm

# F_SEAL_FUTURE_WRITE (Linux 5.1): no new writable mapping, no write(2), through any descriptor;
# mappings made before it (the harness's) stay writable. Python's fcntl module does not name it.
F_SEAL_FUTURE_WRITE = 0x0010
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class Buffer:
    """One shared buffer: its id on the wire, a flat uint8 tensor over it, and how the worker opens it."""

    id: int
    bytes: torch.Tensor
    desc: dict[str, Any]
    fd: int | None = None  # its descriptor (a memfd, or a VMM buffer's), until it is sent to the worker

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def typed(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The first `numel` elements of the buffer as `dtype` (a flat view, same memory)."""
        return torch.empty(0, dtype=dtype, device=self.bytes.device).set_(self.bytes.untyped_storage(), 0, (numel,))


@dataclass
class Arena:
    """The shared buffers of one worker, on one device; `close` frees them."""

    device: torch.device
    buffers: dict[int, Buffer] = field(default_factory=dict)
    next_id: int = 0

    def allocate(self, nbytes: int, readonly: bool = False) -> Buffer:
        """A new shared buffer of at least `nbytes` bytes (one, for an empty tensor); `readonly`:
        the worker may only read it (CPU; a GPU buffer's access is the worker's to choose)."""
        nbytes = max(1, int(nbytes))
        self.next_id += 1
        desc: dict[str, Any] = {"id": self.next_id, "nbytes": nbytes}
        if self.device.type == "cuda" and vmm.available():  # a worker of another uid can open it
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            mapping, fd = vmm.Mapping.create(nbytes, index)
            flat = mapping.tensor()[:nbytes]
            desc["vmm"] = [index, mapping.size]
        elif self.device.type == "cuda":
            fd, flat = None, torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            desc["cuda"] = cuda_handle(flat.untyped_storage())
        else:
            fd, flat = sealed_memory(nbytes, readonly)
            desc["memory"] = "read" if readonly else "write"
        buffer = Buffer(self.next_id, flat, desc, fd)
        self.buffers[buffer.id] = buffer
        return buffer

    def full(
        self, size: tuple[int, ...], fill: float | int | bool, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """torch.full of a flat size in a new shared buffer (what `guard.guard` allocates its canary
        buffers with, for an isolated arm)."""
        (numel,) = size
        tensor = self.allocate(numel * dtype.itemsize).typed(dtype, numel)
        return tensor.fill_(fill)

    def tensor_like(self, like: torch.Tensor) -> torch.Tensor:
        """A new contiguous shared tensor of `like`'s shape and dtype (zeroed)."""
        flat = self.allocate(like.numel() * like.element_size()).typed(like.dtype, like.numel())
        return flat.view(like.shape)

    def describe(self, t: torch.Tensor) -> dict[str, Any]:
        """The wire form of a tensor that lives in one of this arena's buffers."""
        ptr = t.untyped_storage().data_ptr()
        for buffer in self.buffers.values():
            # a guarded input's storage may start inside its buffer (trial/guard.py keeps the
            # inputs' own storage offsets): the wire offset counts from the buffer's start
            skip = ptr - buffer.bytes.data_ptr()
            if 0 <= skip < buffer.bytes.numel() and skip % t.element_size() == 0:
                return {
                    "buffer": buffer.id,
                    "dtype": dtype_name(t.dtype),
                    "shape": list(t.shape),
                    "stride": list(t.stride()),
                    "offset": skip // t.element_size() + t.storage_offset(),
                }
        raise ValueError("a tensor outside the shared buffers cannot be handed to an isolated worker")

    def release(self, ids: list[int]) -> None:
        for i in ids:
            buffer = self.buffers.pop(i, None)
            if buffer is None:
                continue
            buffer.close_fd()

    def close(self) -> None:
        self.release(list(self.buffers))


def sealed_memory(nbytes: int, readonly: bool) -> tuple[int, torch.Tensor]:
    """A memfd of `nbytes` mapped here, its size sealed (and, `readonly`, every later writable
    mapping refused): its descriptor and a flat uint8 tensor over the harness's mapping."""
    # an unnamed memfd: a module reads its mappings (/proc/self/maps, the fd links), and a name would
    # tell it which process checks it (the package check runs it as a target would: hostile review)
    fd = os.memfd_create("", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        flat = torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)  # keeps the mapping alive
        seals = SIZE_SEALS | (F_SEAL_FUTURE_WRITE if readonly else 0) | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return fd, flat


def cuda_handle(storage: torch.UntypedStorage) -> list[Any]:
    """The CUDA IPC fields of a device storage, JSON-ready (bytes as hex), in the order the worker's
    `UntypedStorage._new_shared_cuda` takes them."""
    device, handle, size, offset, ref_handle, ref_offset, event, sync = storage._share_cuda_()
    return [
        device,
        bytes(handle).hex(),
        size,
        offset,
        bytes(ref_handle).hex(),
        ref_offset,
        None if event is None else bytes(event).hex(),
        bool(sync),
    ]
