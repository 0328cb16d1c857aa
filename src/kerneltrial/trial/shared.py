"""Buffers the harness owns and an isolated worker maps: how inputs reach an arm in another
process and its outputs come back (trial/worker.py describes the wire format).

On a CPU each buffer is a file in a private temporary folder (in /dev/shm where it exists, so it
stays in memory), mapped with `torch.UntypedStorage.from_file(..., shared=True)` on both sides;
on a GPU it is a device allocation made with CUDA's virtual memory API, whose file descriptor the
harness sends the worker over a Unix socket (trial/vmm.py: a worker of another uid can open it),
or, where cuda-python is not installed, a device allocation the worker opens through a legacy CUDA
IPC handle (the fields of `UntypedStorage._share_cuda_`), which cannot cross uids. The harness writes the
values, the worker writes outputs into slots, and neither side copies through a pipe.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kerneltrial.trial import vmm

SHM = Path("/dev/shm")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class Buffer:
    """One shared buffer: its id on the wire, a flat uint8 tensor over it, and how the worker opens it."""

    id: int
    bytes: torch.Tensor
    desc: dict[str, Any]
    fd: int | None = None  # a VMM buffer's exported descriptor, until it is sent to the worker

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def typed(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The first `numel` elements of the buffer as `dtype` (a flat view, same memory)."""
        return torch.empty(0, dtype=dtype, device=self.bytes.device).set_(self.bytes.untyped_storage(), 0, (numel,))


@dataclass
class Arena:
    """The shared buffers of one worker, on one device; `close` frees them (CPU: deletes the files)."""

    device: torch.device
    owner: Callable[[int], None] | None = None  # hands each file (a descriptor) to the worker's uid (trial/confine.py)
    folder: Path | None = None
    buffers: dict[int, Buffer] = field(default_factory=dict)
    next_id: int = 0

    def allocate(self, nbytes: int) -> Buffer:
        """A new shared buffer of at least `nbytes` bytes (one, for an empty tensor)."""
        nbytes = max(1, int(nbytes))
        self.next_id += 1
        fd = None
        if self.device.type == "cuda" and vmm.available():  # a worker of another uid can open it
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            mapping, fd = vmm.Mapping.create(nbytes, index)
            flat = mapping.tensor()[:nbytes]
            desc = {"id": self.next_id, "nbytes": nbytes, "vmm": [index, mapping.size]}
        elif self.device.type == "cuda":
            flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            desc = {"id": self.next_id, "nbytes": nbytes, "cuda": cuda_handle(flat.untyped_storage())}
        else:
            if self.folder is None:
                base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else None
                # the harness's: a worker that could write it could plant links the harness follows
                self.folder = Path(tempfile.mkdtemp(prefix="kerneltrial-shared-", dir=base))
                self.folder.chmod(0o711)
            path = self.folder / f"buffer-{self.next_id}"
            made = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(made, nbytes)
                if self.owner is not None:
                    self.owner(made)  # handed to the worker's uid by descriptor, never by name
            finally:
                os.close(made)
            storage = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=nbytes)
            flat = torch.empty(0, dtype=torch.uint8).set_(storage)
            desc = {"id": self.next_id, "nbytes": nbytes, "path": str(path)}
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
            if "path" in buffer.desc:
                Path(buffer.desc["path"]).unlink(missing_ok=True)

    def close(self) -> None:
        self.release(list(self.buffers))
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


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
