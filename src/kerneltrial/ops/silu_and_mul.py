"""SiLU-and-mul (SwiGLU activation): `silu_and_mul(x)`, x [..., 2d] -> [..., d], vLLM semantics.

    out = silu(x[..., :d]) * x[..., d:]        silu(a) = a * sigmoid(a) = a / (1 + exp(-a))

Rounding (the reference is vLLM's `SiluAndMul.forward_native`, `F.silu(x[..., :d]) * x[..., d:]`):
silu is evaluated in fp32 and rounded to the input dtype, then the product is computed in
fp32 and rounded at the store. vLLM's CUDA kernel (`silu_kernel` returns the input type
before `* y`) rounds at the same two points, and so do these kernels; the default bf16
tolerance (two ulps) also accepts a kernel that rounds only once (fp32 to the store, as
FlagGems does). The float64 oracle rounds nowhere.

Bytes moved: each row reads 2d elements and writes d (3 * rows * d elements).

Layouts: `contiguous`, and `row_strided` (the 2d-wide rows are the first 2d columns of a
wider tensor; read in place, no copy). The output is a fresh contiguous [..., d] tensor.

Kernel (one family): `_silu_and_mul_tiles` walks work items of BLOCK_ROWS rows x BLOCK_D
output columns with a grid-stride loop over a bounded grid (launch.MAX_GRID); each item
loads the gate columns and the matching up columns (offset d) of its rows.
- control: BLOCK_ROWS=1, BLOCK_D=next_pow2(d): one row per program (the reference geometry);
- `packed_r*`: several narrow rows per step (capped at PACK_ELEMENTS columns per step);
- `tile*`: a row split into BLOCK_D-column tiles, so wide rows spread over many programs
  with a modest register footprint (BLOCK_D / (32 * warps) = 8 bf16 = one 16-byte access).

Launch geometry is data: one frozen config record per kernel (`TilesConfig`; `PackedConfig`
for packed rows); GEOMETRIES, the control and the candidates by arm name; DISPATCH, the
exported entry point's rule. ops/catalog.py declares the operator from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.spec import Case, Inputs

NAME = "silu_and_mul"
LAYOUTS = ("contiguous", "row_strided")
SPECIAL_ROWS = (inp.ZERO, inp.TINY, inp.LARGE, inp.NONFINITE)  # inputs.py, "Coverage"
PACK_ELEMENTS = 4096  # packed steps hold at most this many output elements (rows x BLOCK_D)


@dataclass(frozen=True, slots=True)
class TilesConfig:
    """Launch knobs of `_silu_and_mul_tiles` over one row per item: output columns per item
    (None: the whole row, capped at next_pow2(d)) and warps (None: launch.row_warps of the
    item). TilesConfig() is the control geometry: one whole row per program."""

    block_d: int | None = None
    num_warps: int | None = None


@dataclass(frozen=True, slots=True)
class PackedConfig:
    """Launch knobs of `_silu_and_mul_tiles` over whole rows, several per item: at most
    `most_rows` rows and PACK_ELEMENTS elements per item (`rows_per_step`), and warps."""

    most_rows: int
    num_warps: int


# The control and the candidates, by arm name (ops/catalog.py declares one arm each).
GEOMETRIES: dict[str, TilesConfig | PackedConfig] = {
    "control": TilesConfig(),
    "packed_r4_w4": PackedConfig(4, 4),
    "packed_r16_w4": PackedConfig(16, 4),
    "tile1024_w4": TilesConfig(1024, 4),
    "tile2048_w4": TilesConfig(2048, 4),
    "tile2048_w8": TilesConfig(2048, 8),
}


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """The exported entry point's rule: rows with d <= `tile_above` are packed as `packed` says;
    wider rows are split into tiles as `tiles` says."""

    tile_above: int
    packed: PackedConfig
    tiles: TilesConfig


# Tiles of 2048 columns with 4 warps (16 bf16 per thread and tensor: two 16-byte loads). Data:
# results/archive/h200/silu_and_mul measured tile2048_w8 (then the rule) 3-7% behind torch.compile
# at 2048-4096 tokens; results/archive/h200/silu_and_mul-s2 measures tile2048_w4 as this rule.
# Packed steps take as many rows as fit PACK_ELEMENTS, with 4 warps.
DISPATCH = DispatchConfig(tile_above=2048, packed=PackedConfig(PACK_ELEMENTS, 4), tiles=TilesConfig(2048, 4))


@launch.Direct
@triton.jit
def _silu_and_mul_tiles(
    X,
    Y,
    n_rows,
    d,
    x_stride,
    y_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    n_col_tiles = tl.cdiv(d, BLOCK_D)
    n_items = tl.cdiv(n_rows, BLOCK_ROWS) * n_col_tiles
    row_offs = tl.arange(0, BLOCK_ROWS)
    col_offs = tl.arange(0, BLOCK_D)
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        rows = tl.cast(item // n_col_tiles, tl.int64) * BLOCK_ROWS + row_offs
        cols = (item % n_col_tiles) * BLOCK_D + col_offs
        mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
        gate_ptrs = X + rows[:, None] * x_stride + cols[None, :]
        a = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(gate_ptrs + d, mask=mask, other=0.0).to(tl.float32)
        silu = (a * tl.sigmoid(a)).to(Y.dtype.element_ty).to(tl.float32)
        tl.store(Y + rows[:, None] * y_stride + cols[None, :], (silu * b).to(Y.dtype.element_ty), mask=mask)


@dataclass(frozen=True, slots=True)
class Launch:
    """A launch of `_silu_and_mul_tiles`: grid, rows per step, output columns per step, warps."""

    grid: tuple[int]
    block_rows: int
    block_d: int
    num_warps: int


@lru_cache(maxsize=launch.PLANS)
def tiles_launch(
    n_rows: int, d: int, block_rows: int, block_d: int | None, num_warps: int | None, max_grid: int
) -> Launch:
    """`_silu_and_mul_tiles` over n_rows x d outputs: `block_rows` rows x `block_d` columns
    per item (capped at next_pow2(d); None: the whole row), warps by launch.row_warps of the
    elements an item holds unless given."""
    block_d = min(block_d or launch.next_pow2(d), launch.next_pow2(d))
    items = triton.cdiv(n_rows, block_rows) * triton.cdiv(d, block_d)
    num_warps = num_warps or launch.row_warps(block_rows * block_d)
    return Launch(launch.bounded_grid(items, max_grid), block_rows, block_d, num_warps)


def rows_per_step(d: int, most: int) -> int:
    """Rows a packed step holds: up to `most`, keeping rows x next_pow2(d) <= PACK_ELEMENTS."""
    return max(1, min(most, PACK_ELEMENTS // launch.next_pow2(d)))


@lru_cache(maxsize=launch.PLANS)
def auto_launch(n_rows: int, d: int, max_grid: int) -> Launch:
    """The dispatcher's launch (`DISPATCH`)."""
    if d <= DISPATCH.tile_above:
        packed = DISPATCH.packed
        return tiles_launch(n_rows, d, rows_per_step(d, packed.most_rows), None, packed.num_warps, max_grid)
    return tiles_launch(n_rows, d, 1, DISPATCH.tiles.block_d, DISPATCH.tiles.num_warps, max_grid)


def halves(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x as [rows, 2d] rows and d, or ValueError for an odd last dimension."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension (gate and up halves); got {x.shape[-1]}")
    rows = launch.as_rows(x)
    return rows, rows.shape[1] // 2


def run(x: torch.Tensor, rows: torch.Tensor, d: int, plan: Launch) -> torch.Tensor:
    """Launch `plan` over `rows` into a fresh contiguous [..., d] tensor."""
    y = x.new_empty((*x.shape[:-1], d))  # contiguous: row stride d
    _silu_and_mul_tiles[plan.grid](
        rows, y, rows.shape[0], d, rows.stride(0), d,
        BLOCK_ROWS=plan.block_rows, BLOCK_D=plan.block_d, num_warps=plan.num_warps,
    )  # fmt: skip
    return y


def silu_and_mul_tiles(
    x: torch.Tensor, block_rows: int = 1, block_d: int | None = None, num_warps: int | None = None
) -> torch.Tensor:
    """Launch `_silu_and_mul_tiles` (`tiles_launch`); defaults give the control (one whole
    row per program)."""
    rows, d = halves(x)
    return run(x, rows, d, tiles_launch(rows.shape[0], d, block_rows, block_d, num_warps, launch.MAX_GRID))


def silu_and_mul_packed(x: torch.Tensor, most_rows: int, num_warps: int) -> torch.Tensor:
    """Whole rows, several per step for narrow rows (see `rows_per_step`)."""
    return silu_and_mul_tiles(x, block_rows=rows_per_step(x.shape[-1] // 2, most_rows), num_warps=num_warps)


def silu_and_mul_auto(x: torch.Tensor) -> torch.Tensor:
    """The exported entry point (`auto_launch`)."""
    rows, d = halves(x)
    return run(x, rows, d, auto_launch(rows.shape[0], d, launch.MAX_GRID))


# ---- semantics --------------------------------------------------------------------------


def make_inputs(case: Case, seed: int, device: torch.device) -> Inputs:
    """x at a drawn offset, with zero, tiny, large and non-finite rows (the coverage inputs.py
    describes; a kernel that skips all-zero rows as padding leaves their outputs unwritten)."""
    gen = inp.generator(seed, device)
    x = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device, scale=2.0)
    inp.scale_rows(x, inp.pick_rows(inp.rows_of(x), SPECIAL_ROWS, gen, device))
    return {"x": x}


def reference(x: torch.Tensor) -> tuple[torch.Tensor]:
    """vLLM's SiluAndMul.forward_native: silu rounded to x's dtype, then the product."""
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d]) * x[..., d:],)


def oracle(x: torch.Tensor) -> tuple[torch.Tensor]:
    xd = x.double()
    d = x.shape[-1] // 2
    return (F.silu(xd[..., :d]) * xd[..., d:],)


def bytes_moved(case: Case) -> int:
    """Read the 2d-wide input rows once, write the d-wide output once."""
    size = case.itemsize
    return inp.numel(case.shape) // 2 * 3 * size


def shape_rule(shape: tuple[int, ...]) -> str:
    """The operator's complaint about a shape, or "" (x is [..., 2d]: gate and up halves)."""
    return "" if shape[-1] % 2 == 0 else "needs an even last dimension ([..., 2d]: gate and up halves)"


def extra_shape(rows: int, d: int) -> tuple[int, ...]:
    """An extra case's shape: the extra shapes' widths are d, and x is [rows, 2d]."""
    return (rows, 2 * d)


def launcher(config: TilesConfig | PackedConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """The arm that launches `config`: `silu_and_mul(x)`."""
    if isinstance(config, PackedConfig):
        return partial(silu_and_mul_packed, most_rows=config.most_rows, num_warps=config.num_warps)
    if config == TilesConfig():
        return silu_and_mul_tiles
    return partial(silu_and_mul_tiles, block_d=config.block_d, num_warps=config.num_warps)


def describe(config: TilesConfig | PackedConfig) -> str:
    """An arm's one-line doc from its geometry."""
    if isinstance(config, PackedConfig):
        return f"up to {config.most_rows} rows per step ({PACK_ELEMENTS} elements at most), {config.num_warps} warps"
    if config == TilesConfig():
        return "one row per program, next-pow2 block"
    return f"rows split into {config.block_d}-column tiles, {config.num_warps} warps"


def eager(x: torch.Tensor) -> torch.Tensor:
    return reference(x)[0]


# ---- peers ------------------------------------------------------------------------------


def liger_fused(fn: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """Liger's fused gate-up function reads both halves of one [..., 2d] buffer (its
    LigerSiLUMulFunction(a, b) would copy both half views, being strided, to contiguous tensors
    first). Its `ensure_contiguous` copies a row_strided input before the kernel: the cost a
    Liger user pays for that layout, measured as such."""
    return lambda x: fn.apply(x)


def flaggems_halves(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """FlagGems takes the gate and up halves as two tensors; its pointwise kernels accept strided views."""
    return lambda x: fn(x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :])
