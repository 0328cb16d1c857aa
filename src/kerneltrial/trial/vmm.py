"""GPU memory a worker of another uid can open: CUDA's virtual memory API, exported as a file
descriptor that the harness hands the worker over a Unix socket (SCM_RIGHTS).

Legacy CUDA IPC handles (`UntypedStorage._share_cuda_`) cannot cross uids: a worker under a uid of
its own fails with "mapping of buffer object failed", while a VMM allocation exported as a POSIX
file descriptor opens under the whole sandbox (results/h200/sandbox-2026-12-04/ipc_probe.log).

Self-contained (torch and cuda-python's `cuda.bindings` only, imported when used): the harness
imports it (trial/shared.py) and the worker loads it by path as a shim (trial/worker.py), so that
both sides map memory the same way. A `Mapping` is unmapped and released when the last tensor over
it is gone (`tensor` keeps it alive through `__cuda_array_interface__`).
"""

from __future__ import annotations

import os
from typing import Any


def driver() -> Any:
    from cuda.bindings import driver as cu

    return cu


def available() -> bool:
    try:
        driver()
    except ImportError:
        return False
    return True


def _ok(result: Any, what: str) -> Any:
    """The value(s) of a cuda.bindings call, or RuntimeError naming the call and its error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


def created(cu: Any, size: int, prop: Any) -> Any:
    """cuMemCreate's handle; on out of memory, tried once more after torch's caching allocator
    gives back the blocks it keeps (freed tensors' memory, which the driver cannot hand to this
    call: the first CUDA package check, on an H100, failed so at its largest case). A failure
    after that names the size and what the device has free."""
    import torch

    err, handle = cu.cuMemCreate(size, prop, 0)
    emptied = err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    if emptied:
        torch.cuda.empty_cache()
        err, handle = cu.cuMemCreate(size, prop, 0)
    if int(err) != 0:
        try:
            free, total = torch.cuda.mem_get_info()
            room = f"{free} of {total} bytes free on the device"
        except RuntimeError as exc:
            room = f"free memory unknown: {exc}"
        after = ", after torch's cache was emptied" if emptied else ""
        raise RuntimeError(f"cuMemCreate of {size} bytes failed: {err} ({room}{after})")
    return handle


class Mapping:
    """`size` bytes of device memory mapped into this process at `ptr`."""

    def __init__(self, handle: Any, size: int, device: int) -> None:
        cu = driver()
        self.handle, self.size, self.device, self.ptr = handle, size, device, None
        self.ptr = _ok(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        _ok(cu.cuMemMap(self.ptr, size, 0, handle, 0), "cuMemMap")
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _ok(cu.cuMemSetAccess(self.ptr, size, [access], 1), "cuMemSetAccess")

    @classmethod
    def create(cls, nbytes: int, device: int) -> tuple[Mapping, int]:
        """A new allocation of at least `nbytes` on `device`, and a file descriptor that exports it."""
        import torch

        torch.cuda.synchronize(device)  # the primary context current on this thread
        cu = driver()
        kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        prop.requestedHandleTypes = kind
        flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        grain = int(_ok(cu.cuMemGetAllocationGranularity(prop, flag), "cuMemGetAllocationGranularity"))
        size = -(-max(1, nbytes) // grain) * grain
        handle = created(cu, size, prop)
        fd = int(_ok(cu.cuMemExportToShareableHandle(handle, kind, 0), "cuMemExportToShareableHandle"))
        return cls(handle, size, device), fd

    @classmethod
    def open(cls, fd: int, size: int, device: int) -> Mapping:
        """The allocation another process exported as `fd` (closed here once imported)."""
        import torch

        torch.cuda.synchronize(device)
        cu = driver()
        kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        try:
            handle = _ok(cu.cuMemImportFromShareableHandle(fd, kind), "cuMemImportFromShareableHandle")
        finally:
            os.close(fd)
        return cls(handle, size, device)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.size,), "typestr": "|u1", "data": (int(self.ptr), False), "version": 3}

    def tensor(self) -> Any:
        """A flat uint8 tensor over the whole mapping (it keeps this object alive)."""
        import torch

        return torch.as_tensor(self, device=f"cuda:{self.device}")

    def __del__(self) -> None:
        if self.ptr is None:
            return
        try:
            cu = driver()
            cu.cuMemUnmap(self.ptr, self.size)
            cu.cuMemAddressFree(self.ptr, self.size)
            cu.cuMemRelease(self.handle)
        except Exception:  # at interpreter exit the driver may be gone already
            pass
