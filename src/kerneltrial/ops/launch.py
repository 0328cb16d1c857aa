"""Launch geometry shared by every kernel: block sizes, warps, and a bounded grid.

No kernel launches a grid dimension above `MAX_GRID` (65535, the smallest limit among
the chips our users run on). Kernels that may need more programs loop: program `pid`
handles work items pid, pid + num_programs, ... (a grid-stride loop).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton import knobs

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


# Direct launches past JITFunction.run: bounded like the plans; a full cache is emptied, not grown.
DIRECT_KERNELS = 4096
I32, I64 = (-(2**31), 2**31 - 1), 2**63


def int_class(a: int) -> tuple[bool, bool, bool, bool, int | None]:
    """What Triton specialises a non-constexpr int on (a superset): == 1 (made a constant), divisible
    by 16, and its width (i32, i64 or u64). Ints of one class share one compiled kernel, so a new row
    count reuses it (an exact value per key would miss on every new shape). An int past u64 or below
    i64 is keyed by its value: Triton refuses it, and a kept launcher would wrap it."""
    outside = a >= 2 * I64 or a < -I64
    return (a == 1, a % 16 == 0, I32[0] <= a <= I32[1], a >= I64, a if outside else None)


def specialisation_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What Triton may specialise a compiled kernel on, for non-constexpr `args` (a superset of it):
    each tensor's dtype and whether its data pointer is 16-byte aligned; an int's `int_class`; a
    float's type alone (Triton passes a non-constexpr Python float as fp32 and never specialises
    it); anything else (a bool, None) by type and value."""
    return tuple(
        (a.dtype, a.data_ptr() % 16 == 0)
        if isinstance(a, torch.Tensor)
        else int_class(a)
        if type(a) is int
        else float
        if type(a) is float
        else (type(a), a)
        for a in args
    )


def global_options() -> tuple[Any, ...]:
    """The options JITFunction.run adds to every call from Triton's settings, which its cache key
    holds: debug and the instrumentation mode (and, where this Triton has it, fpsan's casts)."""
    compilation = knobs.compilation
    return (
        knobs.runtime.debug,
        compilation.instrumentation_mode,
        getattr(compilation, "fpsan_homomorphic_casts", None),
    )


def first_constexpr(fn: Any) -> int:
    """The index of `fn`'s first constexpr parameter (its count of parameters when none is)."""
    names = list(fn.arg_names)
    annotations = getattr(getattr(fn, "fn", None), "__annotations__", {})
    marked = [i for i, name in enumerate(names) if "constexpr" in str(annotations.get(name, ""))]
    return marked[0] if marked else len(names)


class Direct:
    """A `@triton.jit` kernel launched as `kernel[grid](*args, **meta)`, past JITFunction.run after the
    first call of each specialisation (issue 37: run binds and specialises every argument on every call;
    the saving is in results/h100-hostcost, docs/NOTES.md session 22).

    The first call for a key goes through the JITFunction, which compiles or finds the kernel and
    returns it; later calls with the same key launch that compiled kernel through its own launcher
    (`CompiledKernel[grid]`, checked by trial/targets.py like any launch). The key is
    `specialisation_key` of the positional arguments, the keyword ones (constexprs and options),
    `global_options` and the current CUDA device. Positional arguments must stop before the first
    constexpr and every later parameter is passed by keyword (both refused otherwise), so no constexpr
    is keyed by type alone. After the first call of a key JITFunction.run's other per-call work is
    skipped too: its pre-run hooks (kerneltrial's kernels have none) and its check that the globals a
    kernel read at compile time are unchanged (kerneltrial's kernels read module constants only).
    Under the interpreter (an InterpretedFunction, no compiled kernel) every call goes through it.
    Grids are tuples (a callable grid is Triton's, not this launcher's); arguments are tensors,
    ints, floats, bools or None (a tuple of tensors or a tensor descriptor would be keyed by identity
    or refused as unhashable: no kerneltrial kernel takes one)."""

    __slots__ = ("fn", "kernels", "compiled", "positional")

    def __init__(self, fn: Any) -> None:
        from triton.runtime.jit import JITFunction

        self.fn = fn
        self.compiled = isinstance(fn, JITFunction)
        self.positional = first_constexpr(fn)
        self.kernels: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return lambda *args, **meta: self.launch(grid, args, meta)

    def key(self, args: tuple[Any, ...], meta: dict[str, Any]) -> tuple[Any, ...]:
        """The reuse key of a call (see the class docstring)."""
        return (specialisation_key(args), tuple(meta.items()), global_options(), torch.cuda.current_device())

    def launch(self, grid: tuple[int, ...], args: tuple[Any, ...], meta: dict[str, Any]) -> None:
        """Launch over `grid`: the kept compiled kernel if this key has one, else through the JITFunction."""
        key = self.key(args, meta) if self.compiled else ()
        kept = self.kernels.get(key)
        if kept is not None:
            kernel, constexprs = kept
            kernel[grid + (1,) * (3 - len(grid))](*args, *constexprs)  # its launcher reads three dimensions
            return
        name = getattr(self.fn, "__name__", self.fn)
        if len(args) > self.positional:  # checked under the interpreter too, so that the CPU tests see it
            raise TypeError(f"{name}: pass its constexprs by keyword (got {len(args)} positional arguments)")
        later = self.fn.arg_names[len(args) :]
        missing = [n for n in later if n not in meta]
        if missing:
            raise TypeError(f"{name}: pass {missing} by keyword to launch it directly")
        kernel = self.fn[grid](*args, **meta)
        if not self.compiled or kernel is None:  # a cache hook may make run return none: nothing to keep
            return
        if len(self.kernels) >= DIRECT_KERNELS:
            self.kernels.clear()
        self.kernels[key] = (kernel, tuple(meta[n] for n in later))
