"""Z-Image QK RMSNorm: per-head RMSNorm of Q or K read in place from a fused QKV tensor.

    zimage_qk_rmsnorm(x, weight, eps=1e-5):
        y = bf16(x.f32 * rsqrt(mean(x.f32^2 over the last dim) + eps)) * w
    x [..., H, D] (Z-Image: H = 30 heads, D = 128), weight [D]; y is a fresh contiguous
    tensor of x's shape. x may be a strided slice of a fused QKV tensor
    ([tokens, 3*H*D] viewed as [tokens, 3, H, D], sliced to Q or K): the kernels index
    (token, head) through the token and head strides, with no copy.

    zimage_qk_rmsnorm_pair(q, k, q_weight, k_weight, eps=1e-5) -> (q_out, k_out):
        the same normalisation of Q and K in one launch (exported as
        `zimage_qk_rmsnorm_qk`); its own operator because its signature differs.

Bytes moved: read x (tokens*H*D elements) and the weight (D), write y (tokens*H*D);
the pair operator moves that twice.

Kernel geometry: every (token, head) pair is one D-wide row, rows = tokens*H, row r is
token r // H, head r % H (H a compile-time constant, so the division is a multiply).
A step normalises BLOCK_ROWS rows held in registers as a [BLOCK_ROWS, next_pow2(D)] block
(contiguous along D: 16-byte vector accesses); BLOCK_ROWS=1 is the control (one row per
program), BLOCK_ROWS>1 packs rows, since a 128-wide bf16 row is only 256 bytes.
Programs walk the steps with a grid-stride loop over a bounded grid (launch.MAX_GRID);
the persistent candidate caps the grid at a few programs per SM instead. The pair kernel
adds a second grid axis of size 2: axis 1 selects Q or K.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.peers import register_peers
from kerneltrial.ops.registry import Case, Inputs, Operator, register_impl, register_op
from kerneltrial.ops.rms_norm import apply_weight

OP = "zimage_qk_rmsnorm"
PAIR_OP = "zimage_qk_rmsnorm_pair"
LAYOUTS = ("contiguous", "qkv_slice")
QKV_INDEX = {"q": 0, "k": 1}  # position of Q and K in the fused [..., 3, H, D] tensor
PACKINGS = ((4, 4), (8, 4), (16, 8))  # (rows per step, warps) of the packed candidates
# The dispatchers' packing (rows per step, warps). Data, not a guess: in the H200 trials
# (results/archive/h200/zimage_qk_rmsnorm and zimage_qk_rmsnorm_pair, cold L2) 16 rows per step with
# 8 warps was the fastest packing or within 1.3% of it at every size from 256 to 131072
# tokens in both layouts, while the earlier rule (fewer rows per step below 1024 steps)
# lost up to 30% at 256-4096 tokens.
DISPATCH_PACKING = (16, 8)
PROGRAMS_PER_SM = 8  # grid of the persistent candidate on a GPU (8 x 8 warps fill an SM)
INTERPRETER_PROGRAMS = 4  # grid of the persistent candidate in the interpreter (no SMs)
EPS = 1e-5


@triton.jit
def _normalize_rows(
    X,
    W,
    Y,
    n_rows,
    token_stride,
    head_stride,
    D,
    eps,
    HEADS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid-stride loop over axis 0: each step normalises BLOCK_ROWS (token, head) rows."""
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    for step in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_ROWS), tl.num_programs(0)):
        rows = step * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        token = rows // HEADS
        head = rows - token * HEADS
        src = token.to(tl.int64) * token_stride + head * head_stride
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x = tl.load(X + src[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        y = apply_weight(x * rstd[:, None], w, Y.dtype.element_ty, True)
        dst = rows.to(tl.int64) * D
        tl.store(Y + dst[:, None] + cols[None, :], y, mask=mask)


@triton.jit
def _qk_norm(
    X,
    W,
    Y,
    n_rows,
    token_stride,
    head_stride,
    D,
    eps,
    HEADS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    _normalize_rows(X, W, Y, n_rows, token_stride, head_stride, D, eps, HEADS, BLOCK_ROWS, BLOCK_D)


@triton.jit
def _qk_norm_pair(
    Q,
    K,
    WQ,
    WK,
    QY,
    KY,
    n_rows,
    q_token_stride,
    q_head_stride,
    k_token_stride,
    k_head_stride,
    D,
    eps,
    HEADS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    if tl.program_id(1) == 0:
        _normalize_rows(Q, WQ, QY, n_rows, q_token_stride, q_head_stride, D, eps, HEADS, BLOCK_ROWS, BLOCK_D)
    else:
        _normalize_rows(K, WK, KY, n_rows, k_token_stride, k_head_stride, D, eps, HEADS, BLOCK_ROWS, BLOCK_D)


# ---- launches ---------------------------------------------------------------------------


def token_head_view(x: torch.Tensor) -> torch.Tensor:
    """`x` [..., H, D] as [tokens, H, D] with unit stride along D.

    A view of the same memory (no copy) whenever the leading dimensions flatten to one
    token stride: contiguous tensors and Q/K/V slices of a fused QKV tensor. Other layouts
    (a non-unit stride along D, leading dimensions that do not flatten) are copied.
    """
    view = x.reshape(-1, *x.shape[-2:])
    return view if view.stride(-1) == 1 else view.contiguous()


def _geometry(x: torch.Tensor, block_rows: int, num_warps: int | None) -> tuple[int, int, int, int]:
    """(n_rows, heads, BLOCK_D, warps) of a launch over `x`'s (token, head) rows."""
    n_rows = x.numel() // x.shape[-1]
    if n_rows >= 2**31:
        raise ValueError(f"{n_rows} rows exceed the kernels' int32 row index")
    block_d = launch.next_pow2(x.shape[-1])
    return n_rows, x.shape[-2], block_d, num_warps or launch.row_warps(block_d * block_rows)


def _programs(n_steps: int, max_programs: int | None) -> int:
    """Programs along axis 0: one per step, capped by launch.MAX_GRID (read at call time)."""
    cap = launch.MAX_GRID if max_programs is None else min(max_programs, launch.MAX_GRID)
    return launch.bounded_grid(n_steps, cap)[0]


def qk_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = EPS,
    block_rows: int = 1,
    num_warps: int | None = None,
    max_programs: int | None = None,
) -> torch.Tensor:
    """Launch `_qk_norm`: `block_rows` rows per step (1 = the control geometry)."""
    xv = token_head_view(x)
    n_rows, heads, block_d, warps = _geometry(x, block_rows, num_warps)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (_programs(triton.cdiv(n_rows, block_rows), max_programs),)
    _qk_norm[grid](
        xv,
        weight,
        y,
        n_rows,
        xv.stride(0),
        xv.stride(1),
        x.shape[-1],
        eps,
        HEADS=heads,
        BLOCK_ROWS=block_rows,
        BLOCK_D=block_d,
        num_warps=warps,
    )
    return y


def qk_norm_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = EPS,
    block_rows: int = 1,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch `_qk_norm_pair` once for Q and K of the same shape: grid (steps, 2)."""
    if q.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same shape")
    qv, kv = token_head_view(q), token_head_view(k)
    n_rows, heads, block_d, warps = _geometry(q, block_rows, num_warps)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    grid = (_programs(triton.cdiv(n_rows, block_rows), None), 2)
    _qk_norm_pair[grid](
        qv,
        kv,
        q_weight,
        k_weight,
        q_out,
        k_out,
        n_rows,
        qv.stride(0),
        qv.stride(1),
        kv.stride(0),
        kv.stride(1),
        q.shape[-1],
        eps,
        HEADS=heads,
        BLOCK_ROWS=block_rows,
        BLOCK_D=block_d,
        num_warps=warps,
    )
    return q_out, k_out


def persistent_programs(device: torch.device) -> int:
    """Grid of the persistent candidate: PROGRAMS_PER_SM per SM on a GPU."""
    if device.type == "cuda":
        return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_PROGRAMS


def zimage_qk_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The exported entry point: DISPATCH_PACKING rows per step."""
    rows, warps = DISPATCH_PACKING
    return qk_norm(x, weight, eps, block_rows=rows, num_warps=warps)


def zimage_qk_rmsnorm_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exported one-launch Q+K entry point: DISPATCH_PACKING rows per step."""
    rows, warps = DISPATCH_PACKING
    return qk_norm_pair(q, k, q_weight, k_weight, eps, block_rows=rows, num_warps=warps)


def qk_norm_two_launches(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two launches of `zimage_qk_rmsnorm`: what the single launch must beat."""
    return zimage_qk_rmsnorm(q, weight=q_weight, eps=eps), zimage_qk_rmsnorm(k, weight=k_weight, eps=eps)


# ---- semantics --------------------------------------------------------------------------


def qkv_slices(
    shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K of shape [..., H, D], views into one random fused QKV tensor [..., 3*H*D]."""
    *lead, heads, d = shape
    fused = inp.randn((*lead, 3 * heads * d), dtype, gen, device).view(*lead, 3, heads, d)
    return fused.select(-3, QKV_INDEX["q"]), fused.select(-3, QKV_INDEX["k"])


def special_heads(x: torch.Tensor, gen: torch.Generator, device: torch.device) -> None:
    """A zero, a tiny and an eps-scale (token, head) row of `x`, written through its view
    (for `qkv_slice`, into the fused tensor): the coverage inputs.py describes."""
    inp.scale_rows(x, inp.pick_rows(inp.rows_of(x), inp.NORM_ROWS, gen, device))


def make_inputs(case: Case, seed: int, device: torch.device) -> Inputs:
    """x in `contiguous` layout, or the K slice of a fused QKV tensor (`qkv_slice`), at an
    offset, with special rows; eps EPS or 1e-6 by seed (inputs.py, "Coverage")."""
    gen = inp.generator(seed, device)
    if case.layout == "qkv_slice":
        x = qkv_slices(case.shape, case.torch_dtype, gen, device)[1]
    else:
        x = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    special_heads(x, gen, device)
    weight = inp.randn((case.shape[-1],), case.torch_dtype, gen, device)
    return {"x": x, "weight": weight, "eps": inp.eps_for(seed, EPS)}


def make_pair_inputs(case: Case, seed: int, device: torch.device) -> Inputs:
    """Q and K: two contiguous tensors, or both slices of one fused QKV tensor (`qkv_slice`);
    coverage as in `make_inputs`, special rows drawn for each."""
    gen = inp.generator(seed, device)
    if case.layout == "qkv_slice":
        q, k = qkv_slices(case.shape, case.torch_dtype, gen, device)
    else:
        q = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
        k = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    special_heads(q, gen, device)
    special_heads(k, gen, device)
    d = case.shape[-1]
    q_weight = inp.randn((d,), case.torch_dtype, gen, device)
    k_weight = inp.randn((d,), case.torch_dtype, gen, device)
    return {"q": q, "k": k, "q_weight": q_weight, "k_weight": k_weight, "eps": inp.eps_for(seed, EPS)}


def eager(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The torch formula as Z-Image writes it (diffusers RMSNorm on q and k)."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    normed = (x * torch.rsqrt(variance + eps)).to(weight.dtype)
    return normed * weight


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> tuple[torch.Tensor]:
    return (eager(x, weight, eps),)


def oracle(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> tuple[torch.Tensor]:
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double(),)


def eager_pair(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    return eager(q, q_weight, eps), eager(k, k_weight, eps)


def reference_pair(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    return eager_pair(q, k, q_weight, k_weight, eps)


def oracle_pair(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    return oracle(q, q_weight, eps) + oracle(k, k_weight, eps)


def bytes_moved(case: Case) -> int:
    """Read x and the weight once, write y once."""
    size = case.itemsize
    return (2 * inp.numel(case.shape) + case.shape[-1]) * size


def bytes_moved_pair(case: Case) -> int:
    """Q and K: twice the single operator."""
    return 2 * bytes_moved(case)


# (3, 7, 80): a head_dim that is neither a power of two nor a multiple of 128
SMALL = (Case((1, 1, 128)), Case((5, 30, 128)), Case((3, 7, 80)), Case((2, 3, 4, 128)))
# Z-Image's shapes, then coverage: a head_dim that is neither a power of two nor a multiple of
# 128 (96, as Phi-3), with more (token, head) rows than the 65535 grid limit.
GPU = tuple(
    Case((tokens, 30, 128), layout=layout) for tokens in (256, 1024, 4096, 16384, 32768, 131072) for layout in LAYOUTS
) + tuple(Case((2400, 30, 96), layout=layout) for layout in LAYOUTS)


def qk_norm_persistent(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """16 rows per step, 8 warps, on a persistent grid of `persistent_programs` programs."""
    return qk_norm(x, weight, eps, block_rows=16, num_warps=8, max_programs=persistent_programs(x.device))


def _register() -> None:
    register_op(
        Operator(
            name=OP,
            signature="zimage_qk_rmsnorm(x, weight, eps=1e-5) -> Tensor",
            doc=__doc__.split("\n")[3].strip(),
            layouts=LAYOUTS,
            make_inputs=make_inputs,
            reference=reference,
            oracle=oracle,
            bytes_moved=bytes_moved,
            small_cases=SMALL,
            gpu_cases=GPU,
            contiguous_outputs=True,
            shape_rule=lambda shape: (
                "" if len(shape) >= 3 else "must be [..., tokens, heads, head_dim] (at least 3 dimensions)"
            ),
        )
    )
    register_impl(OP, "control", kind="control", doc="one row per program, next-pow2 block")(qk_norm)
    for rows, warps in PACKINGS:
        register_impl(OP, f"packed_r{rows}_w{warps}", doc=f"{rows} rows per step, {warps} warps")(
            partial(qk_norm, block_rows=rows, num_warps=warps)
        )
    register_impl(OP, "persistent_r16_w8", doc=f"16 rows per step, 8 warps, {PROGRAMS_PER_SM} programs per SM")(
        qk_norm_persistent
    )
    register_impl(OP, "kerneltrial", doc="packed rows chosen by row count (exported entry point)")(zimage_qk_rmsnorm)
    register_peers(OP, eager)

    register_op(
        Operator(
            name=PAIR_OP,
            signature="zimage_qk_rmsnorm_pair(q, k, q_weight, k_weight, eps=1e-5) -> (Tensor, Tensor)",
            doc="Q and K normalised in one launch",
            layouts=LAYOUTS,
            make_inputs=make_pair_inputs,
            reference=reference_pair,
            oracle=oracle_pair,
            bytes_moved=bytes_moved_pair,
            small_cases=SMALL,
            gpu_cases=GPU,
            contiguous_outputs=True,
            shape_rule=lambda shape: (
                "" if len(shape) >= 3 else "must be [..., tokens, heads, head_dim] (at least 3 dimensions)"
            ),
        )
    )
    register_impl(PAIR_OP, "control", kind="control", doc="one launch, one row per program")(qk_norm_pair)
    for rows, warps in PACKINGS:
        register_impl(PAIR_OP, f"packed_r{rows}_w{warps}", doc=f"one launch, {rows} rows per step, {warps} warps")(
            partial(qk_norm_pair, block_rows=rows, num_warps=warps)
        )
    register_impl(PAIR_OP, "two_launches", doc="zimage_qk_rmsnorm dispatcher called for Q, then K")(
        qk_norm_two_launches
    )
    register_impl(PAIR_OP, "kerneltrial", doc="one launch, packed rows chosen by row count (exported entry point)")(
        zimage_qk_rmsnorm_qk
    )
    register_peers(PAIR_OP, eager_pair)


_register()
