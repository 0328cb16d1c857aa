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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops import peers_flashinfer as fi
from kerneltrial.ops import peers_quack as quack
from kerneltrial.ops import peers_sglang as sgl
from kerneltrial.ops.peers import flaggems_loader, liger_loader, register_peers
from kerneltrial.ops.registry import Case, Inputs, Operator, register_impl, register_op

LAYOUTS = ("contiguous", "row_strided")
PACKINGS = ((4, 4), (8, 4), (16, 8))  # (rows per step, warps) of the packed candidates
WIDE_CHUNK = 4096  # chunk of the wide kernel; rows wider than WIDE_THRESHOLD use it
WIDE_THRESHOLD = 16384
# The dispatcher's rows kernel: rows narrower than PACK_TO elements are packed up to PACK_TO
# elements per step; DISPATCH_WARPS[0] warps up to 4096-element blocks, DISPATCH_WARPS[1]
# above. Leads (scripts/device/sweep.py, cold L2, both modes): 4 warps one row per step
# matched or beat packed steps of 4096 elements at 2048 columns (13.3 vs 13.8 us at
# 4096x2048, 36.2 vs 38.4 at 16384x2048); 8 warps beat 16 at 5120 (25.9 vs 28.9) and 14336
# columns (32.7 vs 33.4) and tied at 8192 and 16384. Trials: results/archive/h200/rmsnorm-s2,
# rmsnorm_fp32-s2, rmsnorm_fp32-wide-rows-r3. Below 2048 columns no width was measured:
# packing to PACK_TO keeps the 2048-element step the trials measured.
DISPATCH_WARPS = (4, 8)
PACK_TO = 2048


@triton.jit
def apply_weight(normed, w, out_dtype: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr):
    """`normed` (fp32) times weight `w` (fp32), rounded the way the operator specifies."""
    if ROUND_BEFORE_WEIGHT:
        return (normed.to(out_dtype).to(tl.float32) * w).to(out_dtype)
    return (normed * w).to(out_dtype)


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


def choose(n: int) -> tuple[bool, int, int]:
    """The dispatcher's rule for rows n wide: (wide kernel, rows per step, warps)."""
    if n > WIDE_THRESHOLD:
        return True, 1, launch.row_warps(WIDE_CHUNK)
    block = launch.next_pow2(n)
    return False, max(1, PACK_TO // block), DISPATCH_WARPS[0] if block <= 4096 else DISPATCH_WARPS[1]


@lru_cache(maxsize=launch.PLANS)
def auto_launch(n_rows: int, n: int, max_grid: int) -> Launch:
    """The dispatcher's launch (`choose`) over n_rows x n."""
    wide, block_rows, warps = choose(n)
    if wide:
        return wide_launch(n_rows, n, WIDE_CHUNK, warps, max_grid)
    return rows_launch(n_rows, n, block_rows, warps, max_grid)


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
    chunk: int = WIDE_CHUNK,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Launch `_rms_norm_wide`: one row per step, in `chunk`-element chunks."""
    rows = launch.as_rows(x)
    plan = wide_launch(rows.shape[0], rows.shape[1], chunk, num_warps, launch.MAX_GRID)
    return run(x, rows, weight, eps, round_before_weight, plan)


def rms_norm_auto(x: torch.Tensor, weight: torch.Tensor, eps: float, round_before_weight: bool) -> torch.Tensor:
    """The exported entry point: the rows kernel (PACK_TO, DISPATCH_WARPS) up to
    WIDE_THRESHOLD columns; the two-pass wide kernel beyond (`choose`)."""
    rows = launch.as_rows(x)
    return run(x, rows, weight, eps, round_before_weight, auto_launch(rows.shape[0], rows.shape[1], launch.MAX_GRID))


# ---- semantics --------------------------------------------------------------------------


def make_inputs(case: Case, seed: int, device: torch.device) -> Inputs:
    """x and weight at drawn offsets, x with the special rows of the normalisations, a drawn
    eps (the coverage inputs.py describes)."""
    gen = inp.generator(seed, device)
    x = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    eps = inp.draw_eps(gen, 1e-6)
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


SMALL = (  # (2, 3, 200): a width that is neither a power of two nor a multiple of 128
    Case((1, 64)),
    Case((7, 5120)),
    Case((33, 1536)),
    Case((2, 3, 200)),
    Case((4, 20000)),
)
GPU = (
    Case((1, 2048)),
    Case((64, 2048)),
    Case((4096, 2048)),
    Case((16384, 2048)),
    Case((4096, 4096)),
    Case((4096, 5120)),
    Case((4096, 8192)),
    Case((2048, 14336)),
    Case((65536, 2048)),
    Case((1000, 3000)),
    Case((70001, 40)),  # coverage: rows past the 65535 grid limit at a width that is no multiple of 128
)


def _register(
    name: str, signature: str, doc: str, reference, round_before_weight: bool, dtypes: tuple[str, ...]
) -> None:
    extra_small = tuple(Case(c.shape, "float32") for c in SMALL[:3]) if "float32" in dtypes else ()
    extra_gpu = tuple(Case(c.shape, "float32") for c in GPU[2:5]) if "float32" in dtypes else ()
    register_op(
        Operator(
            name=name,
            signature=signature,
            doc=doc,
            layouts=LAYOUTS,
            make_inputs=make_inputs,
            reference=reference,
            oracle=oracle,
            bytes_moved=bytes_moved,
            dtypes=dtypes,
            small_cases=SMALL + extra_small,
            gpu_cases=GPU + extra_gpu,
        )
    )
    rbw = round_before_weight
    register_impl(name, "control", kind="control", doc="one row per program, next-pow2 block")(
        partial(rms_norm_rows, round_before_weight=rbw)
    )
    for rows, warps in PACKINGS:
        register_impl(name, f"packed_r{rows}_w{warps}", doc=f"{rows} rows per step, {warps} warps")(
            partial(rms_norm_rows, round_before_weight=rbw, block_rows=rows, num_warps=warps)
        )
    register_impl(name, "wide", doc=f"two passes over {WIDE_CHUNK}-element chunks")(
        partial(rms_norm_wide, round_before_weight=rbw)
    )
    register_impl(name, "kerneltrial", doc="dispatch by row width (exported entry point)")(
        partial(rms_norm_auto, round_before_weight=rbw)
    )

    def eager(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return reference(x, weight, eps)[0]

    casting = "llama" if rbw else "gemma"
    register_peers(
        name,
        eager,
        liger=liger_loader(
            "liger_kernel.ops.rms_norm",
            "LigerRMSNormFunction",
            lambda f: lambda x, w, eps=1e-6: f.apply(x, w, eps, 0.0, casting, False),
        ),
        flaggems=flaggems_loader("rms_norm", lambda f: lambda x, w, eps=1e-6: f(x, [x.shape[-1]], w, eps))
        if rbw
        else None,
    )
    rounding = "one rounding after the weight" if rbw else "the operator's contract"
    fi.register_flashinfer(  # peers_flashinfer.py and peers_quack.py state each kernel's contract
        name, fi.flashinfer_loader("norm", "rmsnorm", fi.rmsnorm_out), f"norm.rmsnorm (JIT CUDA), {rounding}"
    )
    quack.register_quack(name, f"rmsnorm (CuTe DSL), {rounding}")
    if rbw:  # peers_sglang.py states each kernel's contract
        sgl.register_sglang(
            name,
            sgl.sglang_loader("layernorm.norm", "rmsnorm", sgl.rmsnorm_out, jit=True),
            "layernorm.norm.rmsnorm (JIT CUDA), one rounding after the weight",
        )
    else:
        sgl.register_sglang(
            name,
            sgl.sglang_loader("layernorm.rmsnorm_fp32", "rmsnorm_fp32", sgl.rmsnorm_fp32, jit=False),
            "layernorm.rmsnorm_fp32 (Triton), contiguous only",
            layouts=("contiguous",),
        )


_register(
    "rmsnorm",
    "rmsnorm(x, weight, eps=1e-6) -> Tensor",
    __doc__.split("\n")[2].strip(),
    reference_rmsnorm,
    True,
    ("bfloat16",),
)
_register(
    "rmsnorm_fp32",
    "rmsnorm_fp32(x, weight, eps=1e-6) -> Tensor",
    __doc__.split("\n")[3].strip(),
    reference_rmsnorm_fp32,
    False,
    ("bfloat16", "float32"),
)
