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

Kernels: the single-tensor kernel, its launcher and the exported dispatcher live in
ops/zimage_qk_rmsnorm.py (the self-contained submission module, with its rule file and its
launch geometries, GEOMETRIES); this module holds the pair operator's kernel, which adds a
second grid axis of size 2 (axis 1 selects Q or K), the two operators' semantics, and the
launchers ops/catalog.py declares their arms with (one per geometry of that module; the pair
operator's without the persistent one, PAIR_GEOMETRIES).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache, partial
from typing import Any

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops import zimage_qk_rmsnorm as module
from kerneltrial.ops.spec import Case, Inputs
from kerneltrial.ops.zimage_qk_rmsnorm import EPS, Geometry, normalize_rows, token_head_view, zimage_qk_rmsnorm

OP = "zimage_qk_rmsnorm"
PAIR_OP = "zimage_qk_rmsnorm_pair"
LAYOUTS = ("contiguous", "qkv_slice")
QKV_INDEX = {"q": 0, "k": 1}  # position of Q and K in the fused [..., 3, H, D] tensor


@launch.Direct
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
        normalize_rows(Q, WQ, QY, n_rows, q_token_stride, q_head_stride, D, eps, HEADS, BLOCK_ROWS, BLOCK_D)
    else:
        normalize_rows(K, WK, KY, n_rows, k_token_stride, k_head_stride, D, eps, HEADS, BLOCK_ROWS, BLOCK_D)


# ---- launches ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairLaunch:
    """A launch of `_qk_norm_pair`: grid (steps, 2), (token, head) rows, rows per step,
    heads, block, warps."""

    grid: tuple[int, int]
    n_rows: int
    block_rows: int
    heads: int
    block_d: int
    num_warps: int


@lru_cache(maxsize=launch.PLANS)
def pair_launch(
    shape: tuple[int, ...], block_rows: int, num_warps: int | None, max_programs: int | None, max_grid: int
) -> PairLaunch:
    """The pair kernel's geometry over Q and K of `shape` (the single module's `launch_shape`
    and `programs`; `max_grid` is the module's MAX_GRID, read at call time by `programs`)."""
    n_rows = inp.numel(shape[:-1])
    if n_rows >= 2**31:
        raise ValueError(f"{n_rows} rows exceed the kernels' int32 row index")
    block_d = triton.next_power_of_2(max(1, shape[-1]))
    warps = num_warps or module.row_warps(block_d * block_rows)
    grid = (module.programs(triton.cdiv(n_rows, block_rows), max_programs), 2)
    return PairLaunch(grid, n_rows, block_rows, shape[-2], block_d, warps)


def token_heads(x: torch.Tensor) -> torch.Tensor:
    """`module.token_head_view`, skipping its reshape when x is already [tokens, H, D] with
    unit stride along D (a view of itself: same tensor, less host time)."""
    return x if x.dim() == 3 and x.stride(2) == 1 else token_head_view(x)


def qk_norm_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = EPS,
    block_rows: int = 1,
    num_warps: int | None = None,
    max_programs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch `_qk_norm_pair` once for Q and K of the same shape: grid (steps, 2)."""
    if q.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same shape")
    plan = pair_launch(q.shape, block_rows, num_warps, max_programs, module.MAX_GRID)
    qv, kv = token_heads(q), token_heads(k)
    q_out, k_out = q.new_empty(q.shape), k.new_empty(k.shape)
    _qk_norm_pair[plan.grid](
        qv, kv, q_weight, k_weight, q_out, k_out, plan.n_rows,
        qv.stride(0), qv.stride(1), kv.stride(0), kv.stride(1), q.shape[-1], eps,
        HEADS=plan.heads, BLOCK_ROWS=plan.block_rows, BLOCK_D=plan.block_d, num_warps=plan.num_warps,
    )  # fmt: skip
    return q_out, k_out


@lru_cache(maxsize=launch.PLANS)
def pair_geometry(shape: tuple[int, ...], layout: str) -> Geometry:
    """The geometry the single operator's rule picks for Q of `shape` in `layout`: the rule
    reads (rows, width, layout)."""
    return module.rule().choose(inp.numel(shape[:-1]), shape[-1], layout)


def zimage_qk_rmsnorm_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exported one-launch Q+K entry point: the geometry the single operator's rule picks for Q
    (the pair kernel walks each tensor's rows as the single kernel does)."""
    return launch_pair(q, k, q_weight, k_weight, eps, geometry=pair_geometry(q.shape, module.layout_of(q)))


@cache
def persistent_programs(device: torch.device) -> int:
    """`module.persistent_programs`, asked once per device (a device-properties query per
    call costs host time)."""
    return module.persistent_programs(device)


def launch_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = EPS,
    *,
    geometry: Geometry,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`qk_norm_pair` with one of the module's geometries."""
    cap = persistent_programs(q.device) if geometry.persistent else None
    return qk_norm_pair(q, k, q_weight, k_weight, eps, geometry.block_rows, geometry.num_warps, cap)


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


def special_heads(x: torch.Tensor, gen: torch.Generator, device: torch.device, eps: float) -> None:
    """The special (token, head) rows of the normalisations in `x`, written through its view
    (for `qkv_slice`, into the fused tensor): the coverage inputs.py describes."""
    inp.scale_rows(x, inp.pick_rows(inp.rows_of(x), inp.NORM_ROWS, gen, device), eps)


def make_inputs(case: Case, seed: int, device: torch.device, scalars: Mapping[str, Any] | None = None) -> Inputs:
    """x in `contiguous` layout, or the K slice of a fused QKV tensor (`qkv_slice`), at a
    drawn offset, with special rows; a drawn eps (inputs.py, "Coverage"), or `scalars`' (inputs.kept)."""
    gen = inp.generator(seed, device)
    if case.layout == "qkv_slice":
        x = qkv_slices(case.shape, case.torch_dtype, gen, device)[1]
    else:
        x = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    eps = inp.kept(inp.draw_eps(gen, EPS), scalars, "eps")
    special_heads(x, gen, device, eps)
    weight = inp.randn((case.shape[-1],), case.torch_dtype, gen, device)
    return {"x": x, "weight": weight, "eps": eps}


def make_pair_inputs(case: Case, seed: int, device: torch.device, scalars: Mapping[str, Any] | None = None) -> Inputs:
    """Q and K: two contiguous tensors, or both slices of one fused QKV tensor (`qkv_slice`);
    coverage as in `make_inputs`, special rows drawn for each."""
    gen = inp.generator(seed, device)
    if case.layout == "qkv_slice":
        q, k = qkv_slices(case.shape, case.torch_dtype, gen, device)
    else:
        q = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
        k = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device)
    eps = inp.kept(inp.draw_eps(gen, EPS), scalars, "eps")
    special_heads(q, gen, device, eps)
    special_heads(k, gen, device, eps)
    d = case.shape[-1]
    q_weight = inp.randn((d,), case.torch_dtype, gen, device)
    k_weight = inp.randn((d,), case.torch_dtype, gen, device)
    return {"q": q, "k": k, "q_weight": q_weight, "k_weight": k_weight, "eps": eps}


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


EXTRA_HEADS = 3  # heads of an extra shape: [tokens, EXTRA_HEADS, head_dim]


def token_heads_shape(tokens: int, head_dim: int) -> tuple[int, ...]:
    """An extra case's shape: `tokens` tokens of EXTRA_HEADS heads."""
    return (tokens, EXTRA_HEADS, head_dim)


def shape_rule(shape: tuple[int, ...]) -> str:
    """Both operators' complaint about a shape, or ""."""
    return "" if len(shape) >= 3 else "must be [..., tokens, heads, head_dim] (at least 3 dimensions)"


# The pair operator's control and candidates: the single module's geometries but the persistent
# one (the pair panel's trials measured the packed geometries only).
PAIR_GEOMETRIES = {name: g for name, g in module.GEOMETRIES.items() if not g.persistent}


def launcher(geometry: Geometry) -> Callable[..., torch.Tensor]:
    """The single operator's arm that launches `geometry` (one of the module's GEOMETRIES)."""
    return partial(module.launch_geometry, geometry=geometry)


def pair_launcher(geometry: Geometry) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The pair operator's arm that launches `geometry` for Q and K in one launch."""
    return partial(launch_pair, geometry=geometry)


def describe(geometry: Geometry) -> str:
    """A single-operator arm's one-line doc from its geometry."""
    if geometry.block_rows == 1:
        return "one row per program, next-pow2 block"
    warps = f"{geometry.num_warps} warps" if geometry.num_warps else "warps by block size"
    grid = f", {module.PROGRAMS_PER_SM} programs per SM" if geometry.persistent else ""
    return f"{geometry.block_rows} rows per step, {warps}{grid}"


def describe_pair(geometry: Geometry) -> str:
    """A pair-operator arm's one-line doc from its geometry."""
    return f"one launch, {describe(geometry)}"
