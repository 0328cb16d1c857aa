"""The Triton launch floor: a one-element Triton kernel, launched the way our entry points
launch theirs (`kernel[grid](...)`), so its time per call is the least any of them can take
(issue 16, item 3: "measure, in the same run, a trivial kernel's time as the launch floor").
torch's `one.add_(0)` (the `launch` ceiling) pays torch's launch path, not Triton's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_zero(ptr):
    """One element, read and written back: the least work a launched program can do."""
    tl.store(ptr, tl.load(ptr) + 0)


def triton_launch(one: torch.Tensor) -> None:
    """One launch of the trivial kernel on a one-element tensor (one program)."""
    _add_zero[(1,)](one)
