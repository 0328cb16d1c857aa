"""Sigmoid gate: `sigmoid_gate_mul(x, gate)`, out = x * sigmoid(gate), a fresh tensor of x's shape.

Two forms, named by the case layout:
- `contiguous`: elementwise, gate has x's shape;
- `row_gate`:   one gate per row, gate [..., 1] for x [..., D] (broadcast over the row).

Rounding (the reference is the torch formula `x * torch.sigmoid(gate)` in the input dtype):
sigmoid is evaluated in fp32 and rounded to the dtype, then the product is computed in fp32
and rounded at the store. These kernels round at the same two points; the default bf16
tolerance (two ulps) also accepts a kernel that rounds only once at the store (fp32 math
throughout), since either result is within one rounding of the other. The float64 oracle
rounds nowhere.

Bytes moved: elementwise reads x and gate and writes out (3 * numel elements); row_gate
reads x and one gate per row and writes out (2 * numel + rows elements).

Kernels (inputs are made contiguous first: a copy only for strided inputs):
- `_sigmoid_gate_row_tiles`: work items are BLOCK_D-column tiles of one row, so a tile
  loads a row gate once as a scalar. BLOCK_D=next_pow2(D) is the control (one row per
  program, the reference geometry); `rowtile*` candidates split rows into fixed tiles.
- `_sigmoid_gate_flat`: tiles of BLOCK elements over the flattened tensor, ignoring rows
  (`tile512_w4`, `tile1024_w4`, `tile2048_w8`); the row_gate form gathers each element's
  gate at index // D, with D a compile-time constant so the division is a multiply-shift.
Both walk their work items with a grid-stride loop over a bounded grid (launch.MAX_GRID).

Launch geometry is data: one frozen config record per kernel (`RowTilesConfig`, `FlatConfig`);
GEOMETRIES, the control and the candidates by arm name; DISPATCH, the exported entry point's
rule. ops/catalog.py declares the operator from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.spec import Case, Inputs

NAME = "sigmoid_gate_mul"
LAYOUTS = ("contiguous", "row_gate")
SPECIAL_ROWS = (inp.ZERO, inp.TINY, inp.LARGE, inp.NONFINITE)  # inputs.py, "Coverage"


@dataclass(frozen=True, slots=True)
class RowTilesConfig:
    """Launch knobs of `_sigmoid_gate_row_tiles`: columns per tile (None: the whole row, capped
    at next_pow2(D)) and warps (None: launch.row_warps of the tile). RowTilesConfig() is the
    control geometry: one whole row per program."""

    block_d: int | None = None
    num_warps: int | None = None


@dataclass(frozen=True, slots=True)
class FlatConfig:
    """Launch knobs of `_sigmoid_gate_flat`: elements of the flattened tensor per tile, warps."""

    block: int
    num_warps: int


# The control and the candidates, by arm name (ops/catalog.py declares one arm each).
GEOMETRIES: dict[str, RowTilesConfig | FlatConfig] = {
    "control": RowTilesConfig(),
    "tile512_w4": FlatConfig(512, 4),
    "tile1024_w4": FlatConfig(1024, 4),
    "tile2048_w8": FlatConfig(2048, 8),
    "rowtile1024_w4": RowTilesConfig(1024, 4),
    "rowtile2048_w8": RowTilesConfig(2048, 8),
}


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """The exported entry point's rule: a row gate on rows at least `row_gate_from` wide takes
    `row_tiles` (one scalar gate load per tile); everything else takes `flat`."""

    row_gate_from: int
    row_tiles: RowTilesConfig
    flat: FlatConfig


# Flat tiles of 1024 elements with 4 warps: 8 bf16, one 16-byte access per thread.
DISPATCH = DispatchConfig(row_gate_from=1024, row_tiles=RowTilesConfig(1024, 4), flat=FlatConfig(1024, 4))


@triton.jit
def _gated(x, g):
    """x * sigmoid(g) from fp32 values, with sigmoid rounded to x's storage dtype first."""
    return x.to(tl.float32) * tl.sigmoid(g.to(tl.float32)).to(x.dtype).to(tl.float32)


@launch.Direct
@triton.jit
def _sigmoid_gate_row_tiles(X, G, Y, n_rows, D, BLOCK_D: tl.constexpr, ROW_GATE: tl.constexpr):
    n_col_tiles = tl.cdiv(D, BLOCK_D)
    col_offs = tl.arange(0, BLOCK_D)
    for item in range(tl.program_id(0), n_rows * n_col_tiles, tl.num_programs(0)):
        row = tl.cast(item // n_col_tiles, tl.int64)
        cols = (item % n_col_tiles) * BLOCK_D + col_offs
        mask = cols < D
        x = tl.load(X + row * D + cols, mask=mask, other=0.0)
        if ROW_GATE:
            g = tl.load(G + row)
        else:
            g = tl.load(G + row * D + cols, mask=mask, other=0.0)
        tl.store(Y + row * D + cols, _gated(x, g).to(Y.dtype.element_ty), mask=mask)


@launch.Direct
@triton.jit
def _sigmoid_gate_flat(X, G, Y, numel, BLOCK: tl.constexpr, ROW_GATE: tl.constexpr, ROW_WIDTH: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for tile in range(tl.program_id(0), tl.cdiv(numel, BLOCK), tl.num_programs(0)):
        start = tl.cast(tile, tl.int64) * BLOCK
        mask = start + offs < numel
        x = tl.load(X + start + offs, mask=mask, other=0.0)
        if ROW_GATE:
            first_row = start // ROW_WIDTH
            first_col = (start - first_row * ROW_WIDTH).to(tl.int32)
            g = tl.load(G + first_row + (first_col + offs) // ROW_WIDTH, mask=mask, other=0.0)
        else:
            g = tl.load(G + start + offs, mask=mask, other=0.0)
        tl.store(Y + start + offs, _gated(x, g).to(Y.dtype.element_ty), mask=mask)


def is_row_gate(x_shape: tuple[int, ...], gate_shape: tuple[int, ...]) -> bool:
    """Which form a call is: False for an elementwise gate (x's shape), True for [..., 1]."""
    if gate_shape == x_shape:
        return False
    if gate_shape == (*x_shape[:-1], 1):
        return True
    raise ValueError(
        f"sigmoid_gate_mul: gate must have x's shape {tuple(x_shape)} or {(*x_shape[:-1], 1)}; got {tuple(gate_shape)}"
    )


@dataclass(frozen=True, slots=True)
class Launch:
    """A launch: which kernel (row tiles or flat tiles), its grid, block, warps, and the form."""

    row_tiles: bool
    grid: tuple[int]
    block: int
    num_warps: int
    row_gate: bool


@lru_cache(maxsize=launch.PLANS)
def row_tiles_launch(
    x_shape: tuple[int, ...], gate_shape: tuple[int, ...], block_d: int | None, num_warps: int | None, max_grid: int
) -> Launch:
    """`_sigmoid_gate_row_tiles`: `block_d` columns per item, capped at next_pow2(D) (None:
    the whole row); `num_warps` None picks launch.row_warps of the block."""
    row_gate = is_row_gate(x_shape, gate_shape)
    d = x_shape[-1]
    block_d = min(block_d or launch.next_pow2(d), launch.next_pow2(d))
    items = inp.numel(x_shape[:-1]) * triton.cdiv(d, block_d)
    return Launch(True, launch.bounded_grid(items, max_grid), block_d, num_warps or launch.row_warps(block_d), row_gate)


@lru_cache(maxsize=launch.PLANS)
def flat_launch(
    x_shape: tuple[int, ...], gate_shape: tuple[int, ...], block: int, num_warps: int, max_grid: int
) -> Launch:
    """`_sigmoid_gate_flat`: `block` elements of the flattened tensor per item."""
    row_gate = is_row_gate(x_shape, gate_shape)
    return Launch(
        False, launch.bounded_grid(triton.cdiv(inp.numel(x_shape), block), max_grid), block, num_warps, row_gate
    )


@lru_cache(maxsize=launch.PLANS)
def auto_launch(x_shape: tuple[int, ...], gate_shape: tuple[int, ...], max_grid: int) -> Launch:
    """The dispatcher's launch (`DISPATCH`)."""
    if is_row_gate(x_shape, gate_shape) and x_shape[-1] >= DISPATCH.row_gate_from:
        tiles = DISPATCH.row_tiles
        return row_tiles_launch(x_shape, gate_shape, tiles.block_d, tiles.num_warps, max_grid)
    return flat_launch(x_shape, gate_shape, DISPATCH.flat.block, DISPATCH.flat.num_warps, max_grid)


def run(x: torch.Tensor, gate: torch.Tensor, plan: Launch) -> torch.Tensor:
    """Launch `plan` on contiguous copies of x and gate (no copy when they are contiguous)."""
    x, gate = x.contiguous(), gate.contiguous()
    y = torch.empty_like(x)
    if plan.row_tiles:
        d = x.shape[-1]
        _sigmoid_gate_row_tiles[plan.grid](
            x, gate, y, x.numel() // d, d, BLOCK_D=plan.block, ROW_GATE=plan.row_gate, num_warps=plan.num_warps
        )
    else:
        # the row width is a compile-time constant of the row_gate form only (1 otherwise),
        # so the elementwise form compiles once for every shape
        _sigmoid_gate_flat[plan.grid](
            x, gate, y, x.numel(),
            BLOCK=plan.block, ROW_GATE=plan.row_gate, ROW_WIDTH=x.shape[-1] if plan.row_gate else 1,
            num_warps=plan.num_warps,
        )  # fmt: skip
    return y


def sigmoid_gate_row_tiles(
    x: torch.Tensor, gate: torch.Tensor, block_d: int | None = None, num_warps: int | None = None
) -> torch.Tensor:
    """Launch `_sigmoid_gate_row_tiles` (`row_tiles_launch`); defaults give the control (one
    whole row per program)."""
    return run(x, gate, row_tiles_launch(x.shape, gate.shape, block_d, num_warps, launch.MAX_GRID))


def sigmoid_gate_flat(x: torch.Tensor, gate: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    """Launch `_sigmoid_gate_flat`: `block` elements of the flattened tensor per step."""
    return run(x, gate, flat_launch(x.shape, gate.shape, block, num_warps, launch.MAX_GRID))


def sigmoid_gate_auto(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The exported entry point (`auto_launch`)."""
    return run(x, gate, auto_launch(x.shape, gate.shape, launch.MAX_GRID))


# ---- semantics --------------------------------------------------------------------------


def make_inputs(case: Case, seed: int, device: torch.device) -> Inputs:
    """x ~ N(0, 1); gate ~ N(0, 3^2) so sigmoid spans nearly (0, 1); gate [..., 1] for row_gate.
    Coverage (inputs.py): both at drawn offsets; zero, tiny, large and non-finite rows, in x
    and its gates alike (a kernel that skips all-zero rows as padding leaves their outputs
    unwritten)."""
    if case.layout not in LAYOUTS:
        raise ValueError(f"unknown layout {case.layout!r}; expected one of {', '.join(LAYOUTS)}")
    gen = inp.generator(seed, device)
    x = inp.randn(case.shape, case.torch_dtype, gen, device)
    gate_shape = (*case.shape[:-1], 1) if case.layout == "row_gate" else case.shape
    gate = inp.randn(gate_shape, case.torch_dtype, gen, device, scale=3.0)
    picked = inp.pick_rows(inp.rows_of(x), SPECIAL_ROWS, gen, device)
    inp.scale_rows(x, picked)
    inp.scale_rows(gate, picked)
    return {"x": x, "gate": gate}


def reference(x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor]:
    """The torch formula: sigmoid rounded to the dtype, then the (broadcast) product."""
    return (x * torch.sigmoid(gate),)


def oracle(x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor]:
    return (x.double() * torch.sigmoid(gate.double()),)


def bytes_moved(case: Case) -> int:
    """Read x and the gates once, write out once."""
    size = case.itemsize
    n = inp.numel(case.shape)
    gates = n // case.shape[-1] if case.layout == "row_gate" else n
    return (2 * n + gates) * size


def launcher(config: RowTilesConfig | FlatConfig) -> Callable[..., torch.Tensor]:
    """The arm that launches `config`: `sigmoid_gate_mul(x, gate)`."""
    if isinstance(config, FlatConfig):
        return partial(sigmoid_gate_flat, block=config.block, num_warps=config.num_warps)
    if config == RowTilesConfig():
        return sigmoid_gate_row_tiles
    return partial(sigmoid_gate_row_tiles, block_d=config.block_d, num_warps=config.num_warps)


def describe(config: RowTilesConfig | FlatConfig) -> str:
    """An arm's one-line doc from its geometry."""
    if isinstance(config, FlatConfig):
        return f"flat {config.block}-element tiles, {config.num_warps} warps; row gates gathered per element"
    if config == RowTilesConfig():
        return "one row per program, next-pow2 block"
    return f"rows split into {config.block_d}-column tiles, {config.num_warps} warps; one gate load per tile"


def eager(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)
