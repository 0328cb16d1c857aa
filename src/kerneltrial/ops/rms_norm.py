"""RMSNorm: `rmsnorm` (bf16 rounding before the weight) and `rmsnorm_fp32` (fp32 to the store).

    rmsnorm:       y = (x.f32 * rsqrt(mean(x.f32^2) + eps)).to(dtype) * w
    rmsnorm_fp32:  y = (x.f32 * rsqrt(mean(x.f32^2) + eps) * w.f32).to(dtype)

Kernels (one family, shared with fused_add_rms_norm.py through `apply_weight`):
- `_rms_norm_rows`: BLOCK_ROWS rows per step, each row in one BLOCK_N block held in
  registers. BLOCK_ROWS=1 is the control (one row per program, next-power-of-two block,
  the common reference geometry); BLOCK_ROWS>1 packs narrow rows so a program moves
  enough bytes per step. Without rounding before the weight (rmsnorm_fp32) the weight is
  loaded per step, after the reduction, in its own dtype: held in fp32 for the whole
  program it cost 80-158 registers per thread where the rounding mode needs 64-127, one
  program per SM instead of two at 5120-16384 columns, and up to a third of the time
  (2048x14336: 47 against 35 us; scripts/device/sweep.py leads, docs/NOTES.md).
- `_rms_norm_wide`: one row per step in BLOCK_N chunks, two passes over the row
  (sum of squares, then normalise), for rows too wide to hold in registers.
Both walk their work with a grid-stride loop over a bounded grid (launch.MAX_GRID).

Launch geometry is data: one frozen config record per kernel (`RowsConfig`, `WideConfig`);
GEOMETRIES, the control and the candidates by arm name; DISPATCH, the exported entry point's
rule. ops/catalog.py declares the operators from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.spec import Case, Inputs

LAYOUTS = ("contiguous", "row_strided")


@dataclass(frozen=True, slots=True)
class RowsConfig:
    """Launch knobs of `_rms_norm_rows`: rows per step, and warps (None: launch.row_warps of the
    block). RowsConfig() is the control geometry: one row per program, next-power-of-two block."""

    block_rows: int = 1
    num_warps: int | None = None


@dataclass(frozen=True, slots=True)
class WideConfig:
    """Launch knobs of `_rms_norm_wide`: the chunk a row is read in, and warps (None:
    launch.row_warps of the chunk's block)."""

    chunk: int = 4096
    num_warps: int | None = None


# The control and the candidates, by arm name (ops/catalog.py declares one arm each).
GEOMETRIES: dict[str, RowsConfig | WideConfig] = {
    "control": RowsConfig(),
    "packed_r4_w4": RowsConfig(4, 4),
    "packed_r8_w4": RowsConfig(8, 4),
    "packed_r16_w8": RowsConfig(16, 8),
    "wide": WideConfig(),
}


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """The exported entry point's rule (`choose`): rows wider than `wide_above` take the wide
    kernel as `wide` says; narrower rows are packed up to `pack_to` elements per step, with
    warps[0] warps up to `warps_split`-element blocks and warps[1] above."""

    wide_above: int
    wide: WideConfig
    pack_to: int
    warps: tuple[int, int]
    warps_split: int

    def choose(self, n: int) -> RowsConfig | WideConfig:
        """The geometry for rows `n` wide."""
        if n > self.wide_above:
            return self.wide
        block = launch.next_pow2(n)
        return RowsConfig(max(1, self.pack_to // block), self.warps[0] if block <= self.warps_split else self.warps[1])


# Leads (scripts/device/sweep.py, cold L2, both modes): 4 warps one row per step matched or
# beat packed steps of 4096 elements at 2048 columns (13.3 vs 13.8 us at 4096x2048, 36.2 vs
# 38.4 at 16384x2048); 8 warps beat 16 at 5120 (25.9 vs 28.9) and 14336 columns (32.7 vs
# 33.4) and tied at 8192 and 16384. Trials: results/archive/h200/rmsnorm-s2, rmsnorm_fp32-s2,
# rmsnorm_fp32-wide-rows-r3. Below 2048 columns no width was measured: packing to pack_to
# keeps the 2048-element step the trials measured.
DISPATCH = DispatchConfig(wide_above=16384, wide=WideConfig(4096, 8), pack_to=2048, warps=(4, 8), warps_split=4096)


@triton.jit
def apply_weight(normed, w, out_dtype: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr):
    """`normed` (fp32) times weight `w` (fp32), rounded the way the operator specifies."""
    if ROUND_BEFORE_WEIGHT:
        return (normed.to(out_dtype).to(tl.float32) * w).to(out_dtype)
    return (normed * w).to(out_dtype)


@launch.Direct
@triton.jit
def _rms_norm_rows(
    X,
    W,
    Y,
    n_rows,
    x_stride,
    y_stride,
    N,
    eps,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROUND_BEFORE_WEIGHT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if ROUND_BEFORE_WEIGHT:  # loaded once per program (see the module docstring)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    n_steps = tl.cdiv(n_rows, BLOCK_ROWS)
    for step in range(tl.program_id(0), n_steps, tl.num_programs(0)):
        rows = tl.cast(step, tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        if not ROUND_BEFORE_WEIGHT:  # loaded per step, after the reduction
            w = tl.load(W + cols, mask=col_mask, other=0.0)[None, :].to(tl.float32)
        y = apply_weight(x * rstd[:, None], w, Y.dtype.element_ty, ROUND_BEFORE_WEIGHT)
        tl.store(Y + rows[:, None] * y_stride + cols[None, :], y, mask=mask)


@launch.Direct
@triton.jit
def _rms_norm_wide(
    X,
    W,
    Y,
    n_rows,
    x_stride,
    y_stride,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    ROUND_BEFORE_WEIGHT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * x_stride
        y_row = Y + tl.cast(row, tl.int64) * y_stride
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            x = tl.load(x_row + start + cols, mask=start + cols < N, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        for start in range(0, N, BLOCK_N):
            mask = start + cols < N
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(
                y_row + start + cols, apply_weight(x * rstd, w, Y.dtype.element_ty, ROUND_BEFORE_WEIGHT), mask=mask
            )


@dataclass(frozen=True, slots=True)
class Launch:
    """One launch's geometry: which kernel, its grid, rows per step, block and warps."""

    wide: bool
    grid: tuple[int]
    block_rows: int
    block_n: int
    num_warps: int


@lru_cache(maxsize=launch.PLANS)
def rows_launch(n_rows: int, n: int, block_rows: int, num_warps: int | None, max_grid: int) -> Launch:
    """`_rms_norm_rows` over n_rows x n: `block_rows` rows per step, next-pow2 block."""
    block_n = launch.next_pow2(n)
    grid = launch.bounded_grid(triton.cdiv(n_rows, block_rows), max_grid)
    return Launch(False, grid, block_rows, block_n, num_warps or launch.row_warps(block_n * block_rows))


@lru_cache(maxsize=launch.PLANS)
def wide_launch(n_rows: int, n: int, chunk: int, num_warps: int | None, max_grid: int) -> Launch:
    """`_rms_norm_wide` over n_rows x n in `chunk`-element chunks."""
    block_n = min(chunk, launch.next_pow2(n))
    return Launch(True, launch.bounded_grid(n_rows, max_grid), 1, block_n, num_warps or launch.row_warps(block_n))


@lru_cache(maxsize=launch.PLANS)
def auto_launch(n_rows: int, n: int, max_grid: int) -> Launch:
    """The dispatcher's launch (`DISPATCH.choose`) over n_rows x n."""
    config = DISPATCH.choose(n)
    if isinstance(config, WideConfig):
        return wide_launch(n_rows, n, config.chunk, config.num_warps, max_grid)
    return rows_launch(n_rows, n, config.block_rows, config.num_warps, max_grid)


def run(x: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, eps: float, rbw: bool, plan: Launch) -> torch.Tensor:
    """Launch `plan` over `rows` (x as [rows, N]) into a fresh contiguous tensor of x's shape."""
    n_rows, n = rows.shape
    y = x.new_empty(x.shape)  # contiguous: row stride n
    if plan.wide:
        _rms_norm_wide[plan.grid](
            rows, weight, y, n_rows, rows.stride(0), n, n, eps,
            BLOCK_N=plan.block_n, ROUND_BEFORE_WEIGHT=rbw, num_warps=plan.num_warps,
        )  # fmt: skip
    else:
        _rms_norm_rows[plan.grid](
            rows, weight, y, n_rows, rows.stride(0), n, n, eps,
            BLOCK_ROWS=plan.block_rows, BLOCK_N=plan.block_n, ROUND_BEFORE_WEIGHT=rbw, num_warps=plan.num_warps,
        )  # fmt: skip
    return y


def rms_norm_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    round_before_weight: bool,
    block_rows: int = 1,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Launch `_rms_norm_rows`: `block_rows` rows per step (1 = the control geometry)."""
    rows = launch.as_rows(x)
    plan = rows_launch(rows.shape[0], rows.shape[1], block_rows, num_warps, launch.MAX_GRID)
    return run(x, rows, weight, eps, round_before_weight, plan)


def rms_norm_wide(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    round_before_weight: bool,
    chunk: int,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Launch `_rms_norm_wide`: one row per step, in `chunk`-element chunks."""
    rows = launch.as_rows(x)
    plan = wide_launch(rows.shape[0], rows.shape[1], chunk, num_warps, launch.MAX_GRID)
    return run(x, rows, weight, eps, round_before_weight, plan)


def rms_norm_auto(x: torch.Tensor, weight: torch.Tensor, eps: float, round_before_weight: bool) -> torch.Tensor:
    """The exported entry point: the geometry `DISPATCH` chooses for the row width."""
    rows = launch.as_rows(x)
    return run(x, rows, weight, eps, round_before_weight, auto_launch(rows.shape[0], rows.shape[1], launch.MAX_GRID))


# ---- semantics --------------------------------------------------------------------------


def make_inputs(case: Case, seed: int, device: torch.device, scalars: Mapping[str, Any] | None = None) -> Inputs:
    """x and weight at drawn offsets, x with the special rows of the normalisations, a drawn
    eps (the coverage inputs.py describes), or `scalars`' (inputs.kept)."""
    gen = inp.generator(seed, device)
    x = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    eps = inp.kept(inp.draw_eps(gen, 1e-6), scalars, "eps")
    inp.scale_rows(x, inp.pick_rows(inp.rows_of(x), inp.NORM_ROWS, gen, device), eps)
    weight = inp.randn((case.shape[-1],), case.torch_dtype, gen, device)
    return {"x": x, "weight": weight, "eps": eps}


def reference_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor]:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed * weight,)


def reference_rmsnorm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor]:
    xf = x.float()
    return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype),)


def oracle(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor]:
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double(),)


def bytes_moved(case: Case) -> int:
    """Read x and weight once, write y once."""
    size = case.itemsize
    return (2 * inp.numel(case.shape) + case.shape[-1]) * size


def launcher(config: RowsConfig | WideConfig, round_before_weight: bool) -> Callable[..., torch.Tensor]:
    """The arm that launches `config`: `rmsnorm(x, weight, eps)` of the given rounding."""
    rbw = round_before_weight
    if isinstance(config, WideConfig):
        return partial(rms_norm_wide, round_before_weight=rbw, chunk=config.chunk, num_warps=config.num_warps)
    if config == RowsConfig():  # the control: the launcher's defaults
        return partial(rms_norm_rows, round_before_weight=rbw)
    return partial(rms_norm_rows, round_before_weight=rbw, block_rows=config.block_rows, num_warps=config.num_warps)


def describe(config: RowsConfig | WideConfig) -> str:
    """An arm's one-line doc from its geometry."""
    if isinstance(config, WideConfig):
        return f"two passes over {config.chunk}-element chunks"
    if config == RowsConfig():
        return "one row per program, next-pow2 block"
    return f"{config.block_rows} rows per step, {config.num_warps} warps"


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return reference_rmsnorm(x, weight, eps)[0]


def eager_rmsnorm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return reference_rmsnorm_fp32(x, weight, eps)[0]


# ---- peers ------------------------------------------------------------------------------


def liger_rms_norm(casting: str) -> Callable[[Any], Callable[..., torch.Tensor]]:
    """Adapter for Liger-Kernel's `LigerRMSNormFunction` in casting mode `casting` ("llama":
    rounding before the weight; "gemma": fp32 to the store), offset 0, not in place."""
    return lambda f: lambda x, w, eps=1e-6: f.apply(x, w, eps, 0.0, casting, False)


def flaggems_rms_norm(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """FlagGems `rms_norm(x, normalized_shape, weight, eps)`."""
    return lambda x, w, eps=1e-6: fn(x, [x.shape[-1]], w, eps)
