"""Fused residual add + RMSNorm, in place with vLLM semantics: plain and Gemma flavours.

    fused_add_rmsnorm(x, residual, weight, eps) -> None
        residual <- (x.f32 + residual.f32).to(dtype)
        x        <- (r.f32 * rsqrt(mean(r.f32^2) + eps)).to(dtype) * w
    gemma_fused_add_rmsnorm(x, residual, weight, eps) -> None
        residual <- (x.f32 + residual.f32).to(dtype)
        x        <- (r.f32 * rsqrt(mean(r.f32^2) + eps) * (1 + w.f32)).to(dtype)

where r is the *stored* (dtype-rounded) residual: both normalise what they store, as vLLM's
fused_add_rms_norm kernel does. The Gemma rounding follows vLLM's GemmaRMSNorm.forward_static
for bf16: `x + residual` in the dtype (the only rounding before the end), the statistics and
`(1.0 + weight.float())` in fp32, one rounding to the dtype at the store. The plain flavour
rounds the normalised value before the weight, like ops/rms_norm.py's `rmsnorm` (its
`apply_weight` helper is shared).

Bytes moved: read x, residual and weight, write x and residual: (4 * numel + N) * itemsize.

Kernels (bounded grid of at most launch.MAX_GRID programs, grid-stride loop over the work):
- `_fused_add_rms_norm_rows`: BLOCK_ROWS rows per step, each row in one BLOCK_N block
  (next power of two >= N) held in registers: load x and residual once, store residual and
  x once. BLOCK_ROWS=1 without the vector hint is the control geometry; BLOCK_ROWS>1 packs
  narrow rows so a step moves enough bytes. A `max_programs` cap turns it persistent
  (programs loop over rows, the weight loaded once per program).
- `_fused_add_rms_norm_wide`: one row per step in BLOCK_N chunks, two passes: the first
  sums the squares of the rounded sum, the second re-reads x and residual (mostly from
  L2), recomputes the sum and stores both outputs. Recomputing avoids reading back values
  the program itself just stored.
Vector hint (every candidate, not the control): width and row strides are passed in units
of VEC, the largest power of two <= 16 bytes that divides them all, so Triton can emit
16-byte accesses for widths it does not specialise itself (3000 = 8 * 375 gets
ld.global.v4 instead of 2-byte loads on sm_90).
In place is safe: every element is loaded before it is stored, by the one program that owns
its row. x and residual must be viewable as [rows, N] with unit stride in N (contiguous or
row-strided); any other layout is refused, since an in-place kernel cannot write through a copy.

Launch geometry is data: one frozen config record per kernel (`RowsConfig`, `WideConfig`);
GEOMETRIES, the control and the candidates by arm name; DISPATCH, the exported entry point's
rule. ops/catalog.py declares the operators from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.rms_norm import apply_weight
from kerneltrial.ops.spec import Case, Inputs

LAYOUTS = ("contiguous", "row_strided")


@dataclass(frozen=True, slots=True)
class RowsConfig:
    """Launch knobs of `_fused_add_rms_norm_rows`: rows per step; warps (None: launch.row_warps
    of the block); `waves` programs per SM looping over the rows (None: up to MAX_GRID
    programs); `vectorise`: width and strides passed in units of `vector_width` (the control
    goes without: RowsConfig(vectorise=False) is the reference geometry)."""

    block_rows: int = 1
    num_warps: int | None = None
    waves: int | None = None
    vectorise: bool = True


@dataclass(frozen=True, slots=True)
class WideConfig:
    """Launch knobs of `_fused_add_rms_norm_wide`: the chunk a row is read in (warps:
    launch.row_warps of the chunk's block; always vectorised)."""

    chunk: int = 4096


# The control and the candidates, by arm name (ops/catalog.py declares one arm each).
GEOMETRIES: dict[str, RowsConfig | WideConfig] = {
    "control": RowsConfig(vectorise=False),
    "packed_r2_w8": RowsConfig(2, 8),
    "packed_r4_w8": RowsConfig(4, 8),
    "packed_r8_w4": RowsConfig(8, 4),
    "row_w4": RowsConfig(1, 4),
    "row_w16": RowsConfig(1, 16),
    "persistent": RowsConfig(waves=4),
    "wide": WideConfig(),
}


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """The exported entry point's rule: rows wider than `wide_above` take the wide kernel as
    `wide` says; narrower rows take the rows kernel, packed up to `step_elements` elements per
    step (at most `max_rows_per_step` rows), with launch.row_warps warps."""

    wide_above: int
    wide: WideConfig
    step_elements: int
    max_rows_per_step: int

    def rows_per_step(self, n: int) -> int:
        """Rows per step of the rows kernel for rows `n` wide."""
        return max(1, min(self.max_rows_per_step, self.step_elements // launch.next_pow2(n)))


DISPATCH = DispatchConfig(wide_above=16384, wide=WideConfig(4096), step_elements=4096, max_rows_per_step=64)


@triton.jit
def _load_weight(W, cols, mask, GEMMA: tl.constexpr):
    """The weight as fp32: w, or (1 + w) for Gemma."""
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    return w


@triton.jit
def _add(x_ptrs, r_ptrs, mask):
    """The residual sum rounded to the dtype (what is stored), and its fp32 value."""
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    r = tl.load(r_ptrs, mask=mask, other=0.0)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return s, s.to(tl.float32)


@launch.Direct
@triton.jit
def _fused_add_rms_norm_rows(
    X,
    R,
    W,
    n_rows,
    x_stride_vecs,
    r_stride_vecs,
    n_vecs,
    eps,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GEMMA: tl.constexpr,
    VEC: tl.constexpr,
):
    N, x_stride, r_stride = n_vecs * VEC, x_stride_vecs * VEC, r_stride_vecs * VEC
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = _load_weight(W, cols, col_mask, GEMMA)[None, :]
    n_steps = tl.cdiv(n_rows, BLOCK_ROWS)
    for step in range(tl.program_id(0), n_steps, tl.num_programs(0)):
        rows = tl.cast(step, tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x_ptrs = X + rows[:, None] * x_stride + cols[None, :]
        r_ptrs = R + rows[:, None] * r_stride + cols[None, :]
        s, sf = _add(x_ptrs, r_ptrs, mask)
        tl.store(r_ptrs, s, mask=mask)
        rstd = tl.rsqrt(tl.sum(sf * sf, axis=1) / N + eps)
        tl.store(x_ptrs, apply_weight(sf * rstd[:, None], w, s.dtype, not GEMMA), mask=mask)


@launch.Direct
@triton.jit
def _fused_add_rms_norm_wide(
    X,
    R,
    W,
    n_rows,
    x_stride_vecs,
    r_stride_vecs,
    n_vecs,
    eps,
    BLOCK_N: tl.constexpr,
    GEMMA: tl.constexpr,
    VEC: tl.constexpr,
):
    N, x_stride, r_stride = n_vecs * VEC, x_stride_vecs * VEC, r_stride_vecs * VEC
    cols = tl.arange(0, BLOCK_N)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * x_stride
        r_row = R + tl.cast(row, tl.int64) * r_stride
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            _, sf = _add(x_row + start + cols, r_row + start + cols, start + cols < N)
            acc += sf * sf
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        for start in range(0, N, BLOCK_N):
            mask = start + cols < N
            s, sf = _add(x_row + start + cols, r_row + start + cols, mask)
            w = _load_weight(W, start + cols, mask, GEMMA)
            tl.store(r_row + start + cols, s, mask=mask)
            tl.store(x_row + start + cols, apply_weight(sf * rstd, w, s.dtype, not GEMMA), mask=mask)


# ---- launches ---------------------------------------------------------------------------


@cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 for the CPU interpreter (asked once per
    device: a device-properties query on every call costs host time)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def vector_width(itemsize: int, n: int, *row_strides: int) -> int:
    """Elements per 16-byte vector that divide the row width `n` and every row stride (a power
    of two, 1 at worst). The kernels take width and strides in units of it, so Triton knows
    their alignment and can vectorise widths it does not specialise (e.g. 3000: 8 divides
    it, 16 does not)."""
    vec = 16 // itemsize
    while vec > 1 and any(k % vec for k in (n, *row_strides)):
        vec //= 2
    return vec


@dataclass(frozen=True, slots=True)
class Launch:
    """One launch's geometry: which kernel, its grid, rows per step, block, warps, vector width."""

    wide: bool
    grid: tuple[int]
    block_rows: int
    block_n: int
    num_warps: int
    vec: int


@lru_cache(maxsize=launch.PLANS)
def rows_launch(
    n_rows: int,
    n: int,
    strides: tuple[int, int],
    itemsize: int,
    block_rows: int,
    num_warps: int | None,
    max_programs: int | None,
    vectorise: bool,
    max_grid: int,
) -> Launch:
    """`_fused_add_rms_norm_rows` over n_rows x n with row strides `strides` (x, residual)."""
    vec = vector_width(itemsize, n, *strides) if vectorise else 1
    block_n = launch.next_pow2(n)
    n_steps = triton.cdiv(n_rows, block_rows)
    grid = launch.bounded_grid(min(n_steps, max_programs or n_steps), max_grid)
    return Launch(False, grid, block_rows, block_n, num_warps or launch.row_warps(block_n * block_rows), vec)


@lru_cache(maxsize=launch.PLANS)
def wide_launch(n_rows: int, n: int, strides: tuple[int, int], itemsize: int, chunk: int, max_grid: int) -> Launch:
    """`_fused_add_rms_norm_wide` over n_rows x n in `chunk`-element chunks."""
    block_n = min(chunk, launch.next_pow2(n))
    grid = launch.bounded_grid(n_rows, max_grid)
    return Launch(True, grid, 1, block_n, launch.row_warps(block_n), vector_width(itemsize, n, *strides))


@lru_cache(maxsize=launch.PLANS)
def auto_launch(n_rows: int, n: int, strides: tuple[int, int], itemsize: int, max_grid: int) -> Launch:
    """The dispatcher's launch (`DISPATCH`)."""
    if n > DISPATCH.wide_above:
        return wide_launch(n_rows, n, strides, itemsize, DISPATCH.wide.chunk, max_grid)
    block_rows = DISPATCH.rows_per_step(n)
    return rows_launch(n_rows, n, strides, itemsize, block_rows, None, None, True, max_grid)


def run(xr: torch.Tensor, rr: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, plan: Launch) -> None:
    """Launch `plan` over the [rows, N] views `xr` and `rr` (in place)."""
    n_rows, n = xr.shape
    vec = plan.vec
    if plan.wide:
        _fused_add_rms_norm_wide[plan.grid](
            xr, rr, weight, n_rows, xr.stride(0) // vec, rr.stride(0) // vec, n // vec, eps,
            BLOCK_N=plan.block_n, GEMMA=gemma, VEC=vec, num_warps=plan.num_warps,
        )  # fmt: skip
    else:
        _fused_add_rms_norm_rows[plan.grid](
            xr, rr, weight, n_rows, xr.stride(0) // vec, rr.stride(0) // vec, n // vec, eps,
            BLOCK_ROWS=plan.block_rows, BLOCK_N=plan.block_n, GEMMA=gemma, VEC=vec, num_warps=plan.num_warps,
        )  # fmt: skip


def fused_add_rms_norm_rows(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool,
    block_rows: int = 1,
    num_warps: int | None = None,
    max_programs: int | None = None,
    vectorise: bool = True,
) -> None:
    """Launch `_fused_add_rms_norm_rows`: `block_rows` rows per step; `max_programs` caps the
    grid below MAX_GRID (persistent programs); `vectorise` passes the `vector_width` hint
    (the control goes without: block_rows=1, vectorise=False is the reference geometry)."""
    xr, rr = launch.in_place_rows(x, "x"), launch.in_place_rows(residual, "residual")
    n_rows, n = xr.shape
    strides = (xr.stride(0), rr.stride(0))
    plan = rows_launch(
        n_rows, n, strides, x.element_size(), block_rows, num_warps, max_programs, vectorise, launch.MAX_GRID
    )
    run(xr, rr, weight, eps, gemma, plan)


def fused_add_rms_norm_wide(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, chunk: int
) -> None:
    """Launch `_fused_add_rms_norm_wide`: one row per step, in `chunk`-element chunks."""
    xr, rr = launch.in_place_rows(x, "x"), launch.in_place_rows(residual, "residual")
    n_rows, n = xr.shape
    plan = wide_launch(n_rows, n, (xr.stride(0), rr.stride(0)), x.element_size(), chunk, launch.MAX_GRID)
    run(xr, rr, weight, eps, gemma, plan)


def fused_add_rms_norm_auto(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool
) -> None:
    """The exported entry point (`auto_launch`)."""
    xr, rr = launch.in_place_rows(x, "x"), launch.in_place_rows(residual, "residual")
    n_rows, n = xr.shape
    plan = auto_launch(n_rows, n, (xr.stride(0), rr.stride(0)), x.element_size(), launch.MAX_GRID)
    run(xr, rr, weight, eps, gemma, plan)


# ---- semantics --------------------------------------------------------------------------


def make_inputs(case: Case, seed: int, device: torch.device, scalars: Mapping[str, Any] | None = None) -> Inputs:
    """x and residual at drawn offsets, the special rows of the normalisations in the same rows
    of both (so their sum has them too), a drawn eps (the coverage inputs.py describes), or
    `scalars`' (inputs.kept)."""
    gen = inp.generator(seed, device)
    x = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    residual = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    eps = inp.kept(inp.draw_eps(gen, 1e-6), scalars, "eps")
    picked = inp.pick_rows(inp.rows_of(x), inp.NORM_ROWS, gen, device)
    inp.scale_rows(x, picked, eps)
    inp.scale_rows(residual, picked, eps)
    weight = inp.randn((case.shape[-1],), case.torch_dtype, gen, device)
    return {"x": x, "residual": residual, "weight": weight, "eps": eps}


def reference_fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    s = (x.float() + residual.float()).to(x.dtype)
    sf = s.float()
    normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return normed * weight, s


def reference_gemma(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    s = (x.float() + residual.float()).to(x.dtype)
    sf = s.float()
    return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype), s


def _oracle(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64: the exact sum for residual; x normalises the stored (dtype-rounded) sum."""
    stored = (x.double() + residual.double()).to(x.dtype).double()
    normed = stored * torch.rsqrt(stored.pow(2).mean(-1, keepdim=True) + eps)
    return normed * (offset + weight.double()), x.double() + residual.double()


def oracle(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    return _oracle(x, residual, weight, eps, 0.0)


def oracle_gemma(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    return _oracle(x, residual, weight, eps, 1.0)


def eager_fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In-place torch code as users write it."""
    residual.add_(x)
    r = residual.float()
    x.copy_((r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight)


def eager_gemma(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In-place torch code as users write it (vLLM GemmaRMSNorm.forward_static, then written back)."""
    residual.add_(x)
    r = residual.float()
    x.copy_((r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype))


def bytes_moved(case: Case) -> int:
    """Read x, residual and weight; write x and residual."""
    size = case.itemsize
    return (4 * inp.numel(case.shape) + case.shape[-1]) * size


# ---- peers ------------------------------------------------------------------------------


def liger_in_place(casting_mode: int, offset: float) -> Callable[[object], Callable[..., None]]:
    """Adapter for Liger-Kernel 0.8.5's `_fused_add_rms_norm_forward_kernel`, launched as its
    `fused_add_rms_norm_forward` launches it (one row per program, calculate_settings,
    num_stages 2, an fp32 rstd buffer) but with its outputs Y and S aliased to x and residual.
    Liger's public function returns new tensors; copying them back would charge Liger two
    extra passes that its users do not pay. Aliasing is safe: each program loads its row
    before storing it. Casting modes (Liger's constants): 0 = llama, 1 = gemma."""

    def adapt(kernel: object) -> Callable[..., None]:
        from liger_kernel.ops.utils import calculate_settings

        def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
            xr, rr = launch.in_place_rows(x, "x"), launch.in_place_rows(residual, "residual")
            n_rows, n = xr.shape
            block, warps = calculate_settings(n)
            rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
            kernel[(n_rows,)](  # type: ignore[index]
                xr,
                xr.stride(0),
                rr,
                rr.stride(0),
                xr,
                xr.stride(0),
                rr,
                rr.stride(0),
                weight,
                weight.stride(0),
                rstd,
                rstd.stride(0),
                n,
                eps,
                offset,
                casting_mode,
                BLOCK_SIZE=block,
                num_warps=warps,
                num_stages=2,
            )

        return run

    return adapt


def flaggems_in_place(fn: Callable[..., object]) -> Callable[..., None]:
    """FlagGems `fused_add_rms_norm(x, residual, normalized_shape, weight, eps)`, in place.
    It normalises the unrounded fp32 sum and rounds once after the weight (the generic
    flag_gems.fused version); it calls .contiguous() on its inputs, so it writes in place
    only for contiguous tensors: registered for the contiguous layout alone."""

    def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        fn(x, residual, [x.shape[-1]], weight, eps)

    return run


def launcher(config: RowsConfig | WideConfig, gemma: bool) -> Callable[..., None]:
    """The arm that launches `config`: `fused_add_rmsnorm(x, residual, weight, eps)`, Gemma's or not."""
    if isinstance(config, WideConfig):
        chunk = config.chunk

        def wide(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
            fused_add_rms_norm_wide(x, residual, weight, eps, gemma, chunk)

        return wide
    block_rows, num_warps, waves, vectorise = config.block_rows, config.num_warps, config.waves, config.vectorise

    def rows(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        cap = waves * sm_count(x.device) if waves else None
        fused_add_rms_norm_rows(x, residual, weight, eps, gemma, block_rows, num_warps, cap, vectorise)

    return rows


def entry_point(gemma: bool) -> Callable[..., None]:
    """The exported entry point (`fused_add_rms_norm_auto`) in the operator's signature."""

    def auto(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        fused_add_rms_norm_auto(x, residual, weight, eps, gemma)

    return auto


def describe(config: RowsConfig | WideConfig) -> str:
    """An arm's one-line doc from its geometry."""
    if isinstance(config, WideConfig):
        return f"two passes over {config.chunk}-element chunks"
    if not config.vectorise:
        return "one row per program, next-pow2 block"
    if config.waves:
        return f"one row per step, {config.waves} programs per SM looping over rows"
    if config.block_rows == 1:
        return f"one row per step, {config.num_warps} warps"
    return f"{config.block_rows} rows per step, {config.num_warps} warps"
