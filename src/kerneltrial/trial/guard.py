"""Guarded inputs: every tensor an arm receives lives inside a larger buffer with canaries.

`guard(inputs)` copies each input's storage into a flat buffer with GUARD_BYTES of canary
before and after it and gives the arm views at the same shape and strides. After the arm's
calls `problems` compares the whole buffer, bit for bit, with what it must hold: the
canaries, the untouched padding of strided views, and the values of every input that is not
a documented in-place output. A write anywhere else is "wrote outside its output"; a changed
input is "modified its input(s)". The gate and the timed checks both call arms on guarded
inputs only.

Storage offsets: the arm's tensors start where its inputs start in their own storage (the
offsets ops/inputs.py draws: 0 or a multiple of 16 bytes), or, with `offset_bytes`, every
storage's first viewed element at that offset. The arm's storage begins inside the flat
buffer (a DLPack alias of it), so even at offset 0 the canary lies right before it. That
storage starts GUARD_BYTES (a multiple of 512) into the flat buffer, a fresh allocation: a
kernel's pointer alignment is that of a fresh allocation plus the drawn offset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kerneltrial.ops.registry import Inputs, Operator

GUARD_BYTES = 1 << 16  # canary on each side of an input's storage
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class View:
    """Where an input tensor lives inside its guarded buffer."""

    buffer: int  # index into Guarded.buffers
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # in the flat buffer


@dataclass
class Guarded:
    """An arm's private inputs: views into canary-guarded buffers."""

    inputs: Inputs
    buffers: list[torch.Tensor]  # flat: canary, the input's whole storage, canary
    pristine: list[torch.Tensor]  # the buffers as created (canaries and strided padding)
    views: dict[str, View]
    writers: dict[str, torch.Tensor]  # the same memory as each input, with its own version counter

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [self.inputs[name] for name in self.views]


def canary(dtype: torch.dtype) -> float | int | bool:
    """A value no operator writes by accident: large and odd for floats, a pattern for integers."""
    if dtype.is_floating_point:
        return -12345.0
    if dtype == torch.bool:
        return True
    return 0x5A if dtype.itemsize == 1 else 0x5A5A


def _first_offsets(inputs: Inputs) -> dict[int, int]:
    """Storage address -> the smallest storage offset of the inputs viewing that storage."""
    first: dict[int, int] = {}
    for value in inputs.values():
        if isinstance(value, torch.Tensor):
            key = value.untyped_storage().data_ptr()
            first[key] = min(first.get(key, value.storage_offset()), value.storage_offset())
    return first


def guard(inputs: Inputs, offset_bytes: int | None = None, full: Callable[..., torch.Tensor] = torch.full) -> Guarded:
    """Private copies of `inputs` (same values, shapes and strides) inside guarded buffers, at
    the inputs' own storage offsets or, with `offset_bytes`, each storage's first viewed element
    at that many bytes. Views that share a storage (e.g. Q and K slices of one QKV tensor)
    keep sharing it. `full` allocates the buffers (an isolated arm's live in shared memory:
    trial/shared.py)."""
    buffers: list[torch.Tensor] = []
    homes: dict[int, tuple[int, int]] = {}  # storage address -> (buffer index, canary length)
    aliases: list[torch.Tensor] = []  # per buffer: the arm's storage, from its start in the buffer
    starts: list[int] = []  # per buffer: where the arm's storage starts in it
    first = _first_offsets(inputs)
    views: dict[str, View] = {}
    out: Inputs = {}
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor):
            out[name] = value
            continue
        storage = value.untyped_storage()
        if storage.data_ptr() not in homes:
            whole = torch.empty(0, dtype=value.dtype, device=value.device).set_(storage)
            pad = max(1, GUARD_BYTES // value.element_size())
            flat = full((pad + whole.numel() + pad,), canary(value.dtype), dtype=value.dtype, device=value.device)
            flat[pad : pad + whole.numel()].copy_(whole)
            homes[storage.data_ptr()] = (len(buffers), pad)
            moved = 0 if offset_bytes is None else first[storage.data_ptr()] - offset_bytes // value.element_size()
            starts.append(pad + moved)
            aliases.append(torch.from_dlpack(flat[pad + moved :]))
            buffers.append(flat)
        index, pad = homes[storage.data_ptr()]
        view = View(index, tuple(value.shape), tuple(value.stride()), pad + value.storage_offset())
        views[name] = view
        out[name] = aliases[index].as_strided(view.shape, view.stride, view.offset - starts[index])
    writers = {
        name: torch.empty(0, dtype=out[name].dtype, device=out[name].device).set_(
            buffers[v.buffer].untyped_storage(), v.offset, v.shape, v.stride
        )
        for name, v in views.items()
    }
    return Guarded(out, buffers, [b.clone() for b in buffers], views, writers)


def write(g: Guarded, values: Inputs) -> None:
    """Put `values` (inputs of the same case) into the guarded views; scalars are replaced.
    The write goes through aliases with their own version counters: the arm's tensors keep
    their versions and pointers, so neither tells a kernel that the values changed."""
    for name, value in values.items():
        if name in g.views:
            g.writers[name].copy_(value)
        else:
            g.inputs[name] = value


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t` reinterpreted as integers of the same width, so NaN == NaN bit for bit."""
    return t if not t.is_floating_point() else t.view(_SAME_SIZE_INT[t.element_size()])


def problems(op: Operator, g: Guarded, values: Inputs, timed: bool = False) -> str:
    """'' when every byte of the guarded buffers holds what it must after the arm's calls on
    `values`; otherwise the first defect, named ("wrote outside its output" or a modified
    input; `timed` words it for a check of a timed call)."""
    changed_inputs: list[str] = []
    for index, actual in enumerate(g.buffers):
        expected = g.pristine[index].clone()
        outputs = torch.zeros(actual.shape, dtype=torch.bool, device=actual.device)
        owned = torch.zeros(actual.shape, dtype=torch.bool, device=actual.device)
        mine = {name: v for name, v in g.views.items() if v.buffer == index}
        for name, v in mine.items():
            owned.as_strided(v.shape, v.stride, v.offset).fill_(True)
            if name in op.inplace:
                outputs.as_strided(v.shape, v.stride, v.offset).fill_(True)
            else:
                expected.as_strided(v.shape, v.stride, v.offset).copy_(values[name])
        differs = (_bits(actual) != _bits(expected)) & ~outputs
        if not bool(differs.any()):
            continue
        outside = differs & ~owned
        if bool(outside.any()):
            return (
                f"wrote outside its output: {int(outside.sum())} element(s) beyond the bytes of "
                f"{', '.join(mine)} (canary or strided padding) were overwritten{' while timed' if timed else ''}"
            )
        changed_inputs += [
            name
            for name, v in mine.items()
            if name not in op.inplace and bool(differs.as_strided(v.shape, v.stride, v.offset).any())
        ]
    if not changed_inputs:
        return ""
    allowed = f"(only {', '.join(op.inplace) or 'nothing'} may be written)"
    if timed:
        return f"modified its inputs while timed: {', '.join(changed_inputs)} {allowed}"
    return f"modified its input(s) {', '.join(changed_inputs)} {allowed}"
