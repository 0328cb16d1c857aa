"""Rotary position embedding of Q and K together, in place, vLLM's and vllm-plugin-FL's semantics.

    rotary_embedding(query, key, cos_sin_cache, positions) -> None   (query, key in place)
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)          # [tokens, R/2] each
        x1, x2 = the two halves of each head's R rotated elements     (neox: [:R/2], [R/2:])
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotary_embedding_gptj(...): the same with GPT-J's interleaved pairs (x1, x2 = [0::2], [1::2]).

query [tokens, q_heads, R], key [tokens, kv_heads, R]: the first R = rotary_dim elements of each
head, as vllm-plugin-FL's RotaryEmbeddingFL.forward_oot passes them to its `rotary_embedding`
dispatch (query.view(tokens, -1, head_size)[..., :rotary_dim]); positions [tokens] int64;
cos_sin_cache [max_position, R], cos then sin halves (vLLM's layout). A case's shape is
(tokens, q_heads, kv_heads, R); the model spec's attention is (tokens, 16, 2, 128).

Rounding: the products of bf16 values and bf16 cos/sin are exact in fp32, so the fp32 formula
rounds once (the subtraction) before the store: the reference, our kernel and any fp32 kernel
agree to the bit. Implementations that round each product to bf16 (vLLM's forward_native and its
CUDA kernel, Liger's Triton kernel with a bf16 cache) differ by up to an ulp of the operands,
which the default tolerance refuses where x1 * cos and x2 * sin nearly cancel.

Layouts (the memory behind the views; the guard checks every byte outside them is untouched):
- `contiguous`: query and key are two contiguous tensors (rotary_dim == head_size);
- `qkv_slice`: query and key are slices of one fused QKV tensor [tokens, (q + 2 kv) * R], as
  vLLM's attention layers split qkv_proj's output (V sits between rows, untouched);
- `partial_rotary`: rotary_dim < head_size: the first R of heads of 2R (GLM-4's partial rotary
  factor 0.5); the tail of each head is never written.

Coverage (ops/inputs.py): special (token, head) rows of query and key (zero, tiny, large,
non-finite), drawn storage offsets, positions drawn over the whole cache with one token at the
last position (an off-by-one row bound is wrong there), and a cache of random angles, not of any
base frequency (a kernel that recomputes cos/sin from the position instead of reading it fails).

Bytes moved: read and write query and key, read positions and one cache row per token.

Kernel: `_rotary_qk` walks tokens with a grid-stride loop over a bounded grid (launch.MAX_GRID);
a program loads a token's position and cos/sin row once and rotates every Q head, then every K
head, as [heads, R/2] blocks. GEOMETRIES: tokens per step and warps (the control: one token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import triton
import triton.language as tl

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.spec import Case, Inputs

NAME = "rotary_embedding"
GPTJ_NAME = "rotary_embedding_gptj"
LAYOUTS = ("contiguous", "qkv_slice", "partial_rotary")
SPECIAL_ROWS = (inp.ZERO, inp.TINY, inp.LARGE, inp.NONFINITE)  # inputs.py, "Coverage"
MAX_POSITION = 4096  # rows of the drawn cos/sin cache
PARTIAL_FACTOR = 2  # `partial_rotary`: head_size = PARTIAL_FACTOR * rotary_dim
EXTRA_Q_HEADS, EXTRA_KV_HEADS = 3, 1  # heads of the gate's extra shapes


@triton.jit
def _rotate_heads(
    X, token_offset, head_stride, c, s, half, HEADS: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr, NEOX: tl.constexpr,
):  # fmt: skip
    """Rotate the first 2 * half elements of HEADS heads of one token in place (fp32, one rounding)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    p = tl.arange(0, BLOCK_P)[None, :]
    mask = (h < HEADS) & (p < half)
    if NEOX:
        first = p
        second = p + half
    else:
        first = 2 * p
        second = 2 * p + 1
    base = X + token_offset + h.to(tl.int64) * head_stride
    x1 = tl.load(base + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + second, mask=mask, other=0.0).to(tl.float32)
    tl.store(base + first, (x1 * c - x2 * s).to(X.dtype.element_ty), mask=mask)
    tl.store(base + second, (x2 * c + x1 * s).to(X.dtype.element_ty), mask=mask)


@launch.Direct
@triton.jit
def _rotary_qk(
    Q, K, COS, SIN, POS, n_tokens, q_token_stride, q_head_stride, k_token_stride, k_head_stride,
    cos_stride, sin_stride, pos_stride, half,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr, NEOX: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    p = tl.arange(0, BLOCK_P)
    pair = p < half
    for start in range(pid * BLOCK_T, n_tokens, programs * BLOCK_T):
        for i in tl.static_range(BLOCK_T):
            t = start + i
            if t < n_tokens:
                t64 = t.to(tl.int64)
                pos = tl.load(POS + t64 * pos_stride).to(tl.int64)
                c = tl.load(COS + pos * cos_stride + p, mask=pair, other=0.0).to(tl.float32)[None, :]
                s = tl.load(SIN + pos * sin_stride + p, mask=pair, other=0.0).to(tl.float32)[None, :]
                _rotate_heads(Q, t64 * q_token_stride, q_head_stride, c, s, half, Q_HEADS, BLOCK_QH, BLOCK_P, NEOX)
                _rotate_heads(K, t64 * k_token_stride, k_head_stride, c, s, half, K_HEADS, BLOCK_KH, BLOCK_P, NEOX)


# ---- launches ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Geometry:
    """Launch knobs of `_rotary_qk`: tokens per grid-stride step, and warps."""

    block_tokens: int = 1
    num_warps: int = 4


GEOMETRIES: dict[str, Geometry] = {
    "control": Geometry(),
    "w2": Geometry(num_warps=2),
    "tokens4_w4": Geometry(block_tokens=4),
}
ENTRY = GEOMETRIES["control"]  # the exported entry point's geometry until a GPU panel picks one


@dataclass(frozen=True, slots=True)
class RotaryLaunch:
    """A launch of `_rotary_qk`: its grid and the power-of-two blocks of Q heads, K heads and pairs."""

    grid: tuple[int]
    block_qh: int
    block_kh: int
    block_p: int


@lru_cache(maxsize=launch.PLANS)
def plan(tokens: int, q_heads: int, kv_heads: int, half: int, block_tokens: int, max_grid: int) -> RotaryLaunch:
    """The geometry over `tokens` tokens: at most `max_grid` programs (launch.MAX_GRID, read at call time)."""
    steps = triton.cdiv(tokens, block_tokens)
    grid = (max(1, min(steps, max_grid)),)
    return RotaryLaunch(grid, launch.next_pow2(q_heads), launch.next_pow2(kv_heads), launch.next_pow2(half))


def check_views(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, positions: torch.Tensor) -> None:
    """ValueError naming the argument whose shape or strides the kernel cannot take."""
    if query.dim() != 3 or key.dim() != 3:
        raise ValueError(
            f"query {tuple(query.shape)} and key {tuple(key.shape)} must be [tokens, heads, rotary_dim]; "
            "view [tokens, heads * head_size] as query.view(tokens, -1, head_size)[..., :rotary_dim]"
        )
    tokens, _, r = query.shape
    if key.shape[0] != tokens or key.shape[-1] != r or positions.numel() != tokens:
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and positions {tuple(positions.shape)} "
            "must have one token count and one rotary_dim"
        )
    if r % 2 or cos.shape[-1] != r // 2:
        raise ValueError(f"rotary_dim {r} must be even and twice the cos/sin width {cos.shape[-1]}")
    for name, t in (("query", query), ("key", key), ("cos", cos)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} of strides {t.stride()} needs unit stride in its last dimension")


def rotate_qk(
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    *,
    neox: bool,
    geometry: Geometry = ENTRY,
) -> None:
    """Rotate query [tokens, q_heads, R] and key [tokens, kv_heads, R] in place by cos[positions],
    sin[positions] ([max_position, R/2] each): one launch of `_rotary_qk` (vllm-plugin-FL's interface)."""
    check_views(query, key, cos, positions)
    tokens, q_heads, r = query.shape
    pos = positions.reshape(-1)
    g = plan(tokens, q_heads, key.shape[1], r // 2, geometry.block_tokens, launch.MAX_GRID)
    _rotary_qk[g.grid](
        query, key, cos, sin, pos, tokens, query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        cos.stride(0), sin.stride(0), pos.stride(0), r // 2,
        Q_HEADS=q_heads, K_HEADS=key.shape[1], BLOCK_QH=g.block_qh, BLOCK_KH=g.block_kh, BLOCK_P=g.block_p,
        BLOCK_T=geometry.block_tokens, NEOX=neox, num_warps=geometry.num_warps,
    )  # fmt: skip


def halves(cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, views of the cache's two halves (no copy)."""
    half = cos_sin_cache.shape[-1] // 2
    return cos_sin_cache[..., :half], cos_sin_cache[..., half:]


def apply(
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    neox: bool,
    geometry: Geometry = ENTRY,
) -> None:
    """The operators' signature: `rotate_qk` with the cache's halves."""
    cos, sin = halves(cos_sin_cache)
    rotate_qk(query, key, cos, sin, positions, neox=neox, geometry=geometry)


def rotary_embedding(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> None:
    """Exported entry point, neox style: query and key rotated in place."""
    apply(query, key, cos_sin_cache, positions, neox=True)


def rotary_embedding_gptj(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> None:
    """Exported entry point, GPT-J style (interleaved pairs): query and key rotated in place."""
    apply(query, key, cos_sin_cache, positions, neox=False)


def launcher(geometry: Geometry, neox: bool) -> Callable[..., None]:
    """The arm that launches `geometry` in the operators' signature."""
    return partial(apply, neox=neox, geometry=geometry)


def describe(geometry: Geometry) -> str:
    tokens = "one token" if geometry.block_tokens == 1 else f"{geometry.block_tokens} tokens"
    return f"{tokens} per step, Q and K heads of a token in one program, {geometry.num_warps} warps"


# ---- semantics --------------------------------------------------------------------------


def heads(case: Case, gen: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """query [tokens, q_heads, R] and key [tokens, kv_heads, R] in the case's layout (module doc)."""
    tokens, q_heads, kv_heads, r = case.shape
    dtype = case.torch_dtype
    if case.layout == "qkv_slice":
        fused = inp.randn((tokens, (q_heads + 2 * kv_heads) * r), dtype, gen, device)
        q = fused[:, : q_heads * r].view(tokens, q_heads, r)
        return q, fused[:, q_heads * r : (q_heads + kv_heads) * r].view(tokens, kv_heads, r)
    if case.layout == "partial_rotary":
        q = inp.randn((tokens, q_heads, PARTIAL_FACTOR * r), dtype, gen, device)
        return q[..., :r], inp.randn((tokens, kv_heads, PARTIAL_FACTOR * r), dtype, gen, device)[..., :r]
    if case.layout == "contiguous":
        return inp.randn((tokens, q_heads, r), dtype, gen, device), inp.randn((tokens, kv_heads, r), dtype, gen, device)
    raise ValueError(f"unknown layout {case.layout!r}; expected one of {', '.join(LAYOUTS)}")


def placed_like(values: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`values` copied to a drawn storage offset (inputs.draw_offset), as every drawn tensor sits."""
    offset = inp.draw_offset(values.dtype, gen)
    buffer = torch.zeros(offset + values.numel(), dtype=values.dtype, device=values.device)
    buffer[offset:].copy_(values.reshape(-1))
    return buffer[offset:].view(values.shape)


def draw_cache(r: int, dtype: torch.dtype, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """[MAX_POSITION, r]: cos then sin of random angles (no base frequency), rounded to `dtype`."""
    angles = torch.rand((MAX_POSITION, r // 2), generator=gen, device=device, dtype=torch.float32) * (2 * math.pi)
    return placed_like(torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype), gen)


def draw_positions(tokens: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """[tokens] int64 over the whole cache, one token (drawn) at its last row."""
    positions = torch.randint(0, MAX_POSITION, (tokens,), generator=gen, device=device, dtype=torch.int64)
    if tokens:
        positions[int(torch.randint(0, tokens, (1,), generator=gen, device=device))] = MAX_POSITION - 1
    return placed_like(positions, gen)


def make_inputs(case: Case, seed: int, device: torch.device) -> Inputs:
    """query and key in the case's layout with special rows, the cache and the positions."""
    gen = inp.generator(seed, device)
    query, key = heads(case, gen, device)
    for x in (query, key):
        inp.scale_rows(x, inp.pick_rows(inp.rows_of(x), SPECIAL_ROWS, gen, device))
    cache = draw_cache(case.shape[-1], case.torch_dtype, gen, device)
    return {"query": query, "key": key, "cos_sin_cache": cache, "positions": draw_positions(case.shape[0], gen, device)}


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x [tokens, heads, R] rotated by cos, sin [tokens, R/2], in their (common) dtype."""
    half = x.shape[-1] // 2
    x1, x2 = (x[..., :half], x[..., half:]) if neox else (x[..., 0::2], x[..., 1::2])
    c, s = cos[:, None, :], sin[:, None, :]
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    return torch.cat((o1, o2), dim=-1) if neox else torch.stack((o1, o2), dim=-1).flatten(-2)


def formula(
    query: torch.Tensor, key: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, neox: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both rotations computed in `dtype` (float32: the reference; float64: the oracle)."""
    cos, sin = (h.to(dtype) for h in halves(cache[positions.reshape(-1)]))
    return rotated(query.to(dtype), cos, sin, neox), rotated(key.to(dtype), cos, sin, neox)


def reference(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, neox: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 formula, rounded once to the inputs' dtype."""
    q, k = formula(query, key, cos_sin_cache, positions, neox, torch.float32)
    return q.to(query.dtype), k.to(key.dtype)


def oracle(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, neox: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    return formula(query, key, cos_sin_cache, positions, neox, torch.float64)


def eager(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, neox: bool = True
) -> None:
    """The torch formula in place (the torch_eager peer)."""
    q, k = reference(query, key, cos_sin_cache, positions, neox)
    query.copy_(q)
    key.copy_(k)


def bytes_moved(case: Case) -> int:
    """Read and write query and key, read one position (int64) and one cache row per token."""
    tokens, q_heads, kv_heads, r = case.shape
    return (2 * tokens * (q_heads + kv_heads) * r + tokens * r) * case.itemsize + 8 * tokens


def extra_shape(tokens: int, width: int) -> tuple[int, ...]:
    """An extra case's shape: EXTRA_Q_HEADS query and EXTRA_KV_HEADS KV heads, width rounded up to even."""
    return (tokens, EXTRA_Q_HEADS, EXTRA_KV_HEADS, width + width % 2)


def shape_rule(shape: tuple[int, ...]) -> str:
    """The operators' complaint about a shape, or ""."""
    if len(shape) != 4 or min(shape) < 1:
        return "must be (tokens, q_heads, kv_heads, rotary_dim), four sizes of at least 1"
    return "" if shape[-1] % 2 == 0 else "needs an even rotary_dim (pairs of elements are rotated)"


# ---- peer adapters (each takes the peer's function, returns the operators' signature) -----


def whole_heads(query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """query and key [tokens, heads, R] as [tokens, heads * head_size] views over whole heads, and
    head_size (their head stride: R, or 2R in `partial_rotary`), for the vLLM-style interface."""
    head_size = query.stride(1)
    if key.stride(1) != head_size or query.stride(-1) != 1 or key.stride(-1) != 1:
        raise ValueError(
            f"query strides {query.stride()} and key strides {key.stride()} need one head stride and unit "
            "stride in the last dimension to be viewed as [tokens, heads * head_size]"
        )

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.as_strided((x.shape[0], x.shape[1] * head_size), (x.stride(0), 1))

    return flat(query), flat(key), head_size


def written_back(target: torch.Tensor, result: torch.Tensor) -> None:
    """Copy a peer's result into `target` unless the peer wrote `target` itself."""
    if result.data_ptr() != target.data_ptr() or result.stride() != target.stride():
        target.copy_(result)


def liger_rope(fn: type) -> Callable[..., None]:
    """`LigerRopeFunction.apply(q, k, cos, sin)` in Hugging Face's layout: q [1, heads, tokens, R] and
    cos, sin [1, tokens, R] (the halves gathered by position and doubled, per call); Liger rotates
    contiguous copies of views, which are copied back (neox style only)."""

    def run(query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> None:
        cos, sin = halves(cos_sin_cache[positions.reshape(-1)])
        cos, sin = torch.cat((cos, cos), dim=-1)[None], torch.cat((sin, sin), dim=-1)[None]
        q, k = fn.apply(query[None].transpose(1, 2), key[None].transpose(1, 2), cos, sin)[:2]
        written_back(query, q.transpose(1, 2)[0])
        written_back(key, k.transpose(1, 2)[0])

    return run


def flaggems_rope(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], neox: bool) -> Callable[..., None]:
    """`gems_rope_forward(q, k, cos, sin, position_ids, rotary_interleaved, inplace=True)`, called as
    vllm-plugin-FL's flaggems backend calls it (its RotaryEmbeddingFL passes the same views)."""

    def run(query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> None:
        cos, sin = halves(cos_sin_cache)
        q, k = fn(query, key, cos, sin, position_ids=positions, rotary_interleaved=not neox, inplace=True)
        written_back(query, q)
        written_back(key, k)

    return run
