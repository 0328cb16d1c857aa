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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops import peers_flashinfer as fi
from kerneltrial.ops import peers_sglang as sgl
from kerneltrial.ops.peers import flaggems_loader, liger_loader, register_peers
from kerneltrial.ops.registry import Case, Inputs, Operator, register_impl, register_op

NAME = "silu_and_mul"
LAYOUTS = ("contiguous", "row_strided")
SPECIAL_ROWS = (inp.ZERO, inp.TINY, inp.LARGE, inp.NONFINITE)  # inputs.py, "Coverage"
PACK_ELEMENTS = 4096  # packed steps hold at most this many output elements (rows x BLOCK_D)
PACKINGS = ((4, 4), (16, 4))  # (most rows per step, warps) of the packed candidates
TILES = ((1024, 4), (2048, 4), (2048, 8))  # (BLOCK_D, warps) of the column-tiled candidates
DISPATCH_TILE = 2048  # the dispatcher tiles rows wider than this; narrower rows are packed
# Warps of the dispatcher's tiles (16 bf16 per thread and tensor: two 16-byte loads). Data:
# results/archive/h200/silu_and_mul measured tile2048_w8 (then the rule) 3-7% behind torch.compile
# at 2048-4096 tokens; results/archive/h200/silu_and_mul-s2 measures tile2048_w4 as this rule.
DISPATCH_WARPS = 4


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
    """The dispatcher's launch. Rule: rows with d <= DISPATCH_TILE are packed (as many rows
    as fit PACK_ELEMENTS, 4 warps); wider rows are split into DISPATCH_TILE-column tiles
    with DISPATCH_WARPS warps."""
    if d <= DISPATCH_TILE:
        return tiles_launch(n_rows, d, rows_per_step(d, PACK_ELEMENTS), None, 4, max_grid)
    return tiles_launch(n_rows, d, 1, DISPATCH_TILE, DISPATCH_WARPS, max_grid)


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


SMALL = (  # (3, 10) and (2, 3, 200): d = 5 and 100, neither a power of two nor a multiple of 128
    Case((1, 128)),
    Case((3, 10)),
    Case((5, 3072)),
    Case((2, 10240)),
    Case((2, 3, 200)),
)
GPU = (
    Case((1, 12288)),
    Case((64, 12288)),
    Case((2048, 12288)),
    Case((4096, 12288)),
    Case((16384, 12288)),
    Case((65536, 12288)),
    Case((4096, 28672)),
    # coverage: d = 5000 (a partial last tile; no multiple of 128), and rows past the 65535
    # grid limit at d = 40
    Case((1000, 10000)),
    Case((70001, 80)),
)

register_op(
    Operator(
        name=NAME,
        signature="silu_and_mul(x) -> Tensor",
        doc=__doc__.split("\n")[0],
        layouts=LAYOUTS,
        make_inputs=make_inputs,
        reference=reference,
        oracle=oracle,
        bytes_moved=bytes_moved,
        small_cases=SMALL,
        gpu_cases=GPU,
        shape_rule=lambda shape: (
            "" if shape[-1] % 2 == 0 else "needs an even last dimension ([..., 2d]: gate and up halves)"
        ),
        extra_shape=lambda rows, d: (rows, 2 * d),  # the extra shapes' widths are d: x is [rows, 2d]
    )
)

register_impl(NAME, "control", kind="control", doc="one row per program, next-pow2 block")(silu_and_mul_tiles)
for _rows, _warps in PACKINGS:
    register_impl(
        NAME,
        f"packed_r{_rows}_w{_warps}",
        doc=f"up to {_rows} rows per step ({PACK_ELEMENTS} elements at most), {_warps} warps",
    )(partial(silu_and_mul_packed, most_rows=_rows, num_warps=_warps))
for _block, _warps in TILES:
    register_impl(NAME, f"tile{_block}_w{_warps}", doc=f"rows split into {_block}-column tiles, {_warps} warps")(
        partial(silu_and_mul_tiles, block_d=_block, num_warps=_warps)
    )
register_impl(NAME, "kerneltrial", doc="packed narrow rows, 2048-column tiles for wide rows (exported entry point)")(
    silu_and_mul_auto
)


def _eager(x: torch.Tensor) -> torch.Tensor:
    return reference(x)[0]


def _halves(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """FlagGems takes the gate and up halves as two tensors; its pointwise kernels accept strided views."""
    return lambda x: fn(x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :])


# Liger: the fused gate-up function reads both halves of one [..., 2d] buffer (its
# LigerSiLUMulFunction(a, b) would copy both half views, being strided, to contiguous
# tensors first). Its `ensure_contiguous` copies a row_strided input before the kernel:
# the cost a Liger user pays for that layout, measured as such.
register_peers(
    NAME,
    _eager,
    liger=liger_loader("liger_kernel.ops.swiglu", "LigerFusedGateUpSiLUMulFunction", lambda f: lambda x: f.apply(x)),
    flaggems=flaggems_loader("silu_and_mul", _halves),
)
sgl.register_sglang(  # peers_sglang.py states the kernel's contract
    NAME,
    sgl.sglang_loader("activation", "silu_and_mul", sgl.silu_and_mul, jit=True),
    "activation.silu_and_mul (JIT CUDA, fast math), one rounding, contiguous only",
    layouts=("contiguous",),
)
fi.register_flashinfer(  # peers_flashinfer.py states the kernel's contract
    NAME,
    fi.flashinfer_loader("activation", "silu_and_mul", fi.silu_and_mul),
    "activation.silu_and_mul (JIT CUDA), one rounding, contiguous only",
    layouts=("contiguous",),
)
