"""Launch geometry shared by every kernel: block sizes, warps, and a bounded grid.

No kernel launches a grid dimension above `MAX_GRID` (65535, the smallest limit among
the chips our users run on). Kernels that may need more programs loop: program `pid`
handles work items pid, pid + num_programs, ... (a grid-stride loop).
"""

from __future__ import annotations

import os

import torch
import triton

MAX_GRID = 65535
# Launch decisions (grids, blocks, warps) are pure functions of shapes, strides and dtypes,
# cached with functools.lru_cache: recomputing them cost Python time on every call, and the
# host time of a call is what an eager caller waits on (issue 16). Every cached decision
# takes MAX_GRID as an argument, so a changed limit (tests set 3) is a different key.
PLANS = 4096


def interpreted() -> bool:
    """True when Triton kernels run through the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device() -> torch.device:
    """Where inputs live: the GPU when there is one, else the CPU (interpreter)."""
    return torch.device("cuda") if torch.cuda.is_available() and not interpreted() else torch.device("cpu")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def bounded_grid(n_items: int, cap: int | None = None) -> tuple[int]:
    """A 1-D grid of at most `cap` (default MAX_GRID) programs for `n_items` grid-stride work items."""
    return (max(1, min(n_items, MAX_GRID if cap is None else cap)),)


def row_warps(block: int) -> int:
    """Warps for a kernel that keeps one row block of `block` elements in registers."""
    if block >= 32768:
        return 32
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View `x` [..., N] as [rows, N] without a copy when its layout allows (unit stride in N)."""
    if x.dim() == 2 and x.stride(1) == 1:  # already rows: skip reshape's host cost
        return x
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows


def in_place_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """`t` [..., N] as a [rows, N] view with unit stride in N, or ValueError (never a copy)."""
    if t.dim() == 2:  # already rows: skip view's host cost
        rows = t
    else:
        try:
            rows = t.view(-1, t.shape[-1])
        except RuntimeError:
            rows = None
    if rows is None or (rows.stride(-1) != 1 and t.shape[-1] > 1):
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} and strides {t.stride()} cannot be written in place "
            "as [rows, N] with unit stride in N; pass a contiguous or row-strided tensor"
        )
    return rows
