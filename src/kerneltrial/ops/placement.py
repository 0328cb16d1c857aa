"""Where an input's tensors sit in memory: a case's `misalign` moves them off 16-byte alignment.

ops/inputs.py draws every tensor at storage offset 0 or a multiple of 16 bytes (the alignment
Triton specialises on), so the timed calls run at the alignment a fresh allocation has. A slice of
a larger activation, `h[:, 1:]` of a bf16 tensor or a view at an odd element offset, has a data
pointer that is not 16-byte aligned, and a kernel that loads 16-byte vectors from the pointer
rounded down (or assumes alignment some other way) is wrong there and only there. The gate draws
such inputs as an extra case of the check's own shape with `Case.misalign` = k, an odd number
of elements (ops/inputs.py `extra_cases`): `misaligned` moves every tensor of a draw k elements
further into a copy of its storage, so no data pointer is 16-byte aligned (k odd: k * itemsize
is no multiple of 16 for any dtype of 2, 4 or 8 bytes; the drawn offsets themselves are
multiples of 16 bytes). Views that share a storage (Q and K of one QKV tensor) keep sharing it.

`placed` wraps an operator's draw so that it honours a case's `misalign`; `Operator` wraps its
`make_inputs` and `values_for` with it, so every operator, a user's included, draws them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ALIGN_BYTES = 16  # the alignment a misaligned draw breaks (Triton's pointer specialisation)
_PLACED = "_kerneltrial_placed"  # marks a draw `placed` already wraps


def misaligned(values: dict[str, Any], elements: int) -> dict[str, Any]:
    """`values` with every tensor moved `elements` elements further into a copy of its storage
    (same values, shapes and strides; views of one storage keep sharing their copy); the
    elements before them are zeros. `elements` must be odd (see the module doc)."""
    if elements <= 0 or elements % 2 == 0:
        raise ValueError(f"misaligned by {elements} elements: an odd positive count is what breaks 16-byte alignment")
    copies: dict[int, torch.Tensor] = {}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            out[name] = value
            continue
        storage = value.untyped_storage()
        key = storage.data_ptr()
        if key not in copies:
            whole = torch.empty(0, dtype=value.dtype, device=value.device).set_(storage)
            flat = torch.zeros(elements + whole.numel(), dtype=value.dtype, device=value.device)
            flat[elements:].copy_(whole)
            copies[key] = flat
        out[name] = copies[key].as_strided(value.shape, value.stride(), value.storage_offset() + elements)
    return out


def aligned(t: torch.Tensor) -> bool:
    """Whether `t`'s data pointer is a multiple of ALIGN_BYTES."""
    return t.data_ptr() % ALIGN_BYTES == 0


def placed(draw: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """`draw(case, seed, device, ...)` followed by `misaligned` when the case has a `misalign`
    (once: a draw already wrapped is returned as it is)."""
    if getattr(draw, _PLACED, False):
        return draw

    def draw_placed(case: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        values = draw(case, *args, **kwargs)
        k = getattr(case, "misalign", 0)
        return misaligned(values, k) if k else values

    setattr(draw_placed, _PLACED, True)
    draw_placed.__doc__ = draw.__doc__
    draw_placed.__wrapped__ = draw  # type: ignore[attr-defined]
    return draw_placed
