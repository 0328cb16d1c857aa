"""zimage_qk_rmsnorm: the Z-Image QK RMSNorm kernel, its launcher and its shape dispatcher.

    zimage_qk_rmsnorm(x, weight, eps=1e-5):
        y = bf16(x.f32 * rsqrt(mean(x.f32^2 over the last dim) + eps)) * w
    x [..., H, D], weight [D]; y is a fresh contiguous tensor of x's shape. x may be a
    strided slice of a fused QKV tensor ([tokens, 3, H, D] sliced to Q or K): read in place.

Self-contained on purpose: this file is the Track 1 submission (a module whose top-level
function is named after the operator). It imports only the standard library, torch and
triton, and reads its dispatch rule from `zimage_qk_rmsnorm.rule.toml` next to it (through
the module's loader, so a ZIP holding the two files works too). The rule is data derived
from committed trials by `kerneltrial dispatch derive`; kerneltrial's operator module
(ops/zimage_qk_norm.py) registers its arms from the geometries below.

Kernel geometry: every (token, head) pair is one D-wide row, rows = tokens*H, row r is
token r // H, head r % H (H a compile-time constant, so the division is a multiply).
A step normalises BLOCK_ROWS rows held in registers as a [BLOCK_ROWS, next_pow2(D)] block
(contiguous along D: 16-byte vector accesses); BLOCK_ROWS=1 is the control (one row per
program), BLOCK_ROWS>1 packs rows, since a 128-wide bf16 row is only 256 bytes. Programs
walk the steps with a grid-stride loop over a grid of at most MAX_GRID programs; the
persistent geometry caps the grid at PROGRAMS_PER_SM programs per SM instead.
"""

from __future__ import annotations

import bisect
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

EPS = 1e-5
# The smallest grid-dimension limit among the chips submissions run on (kerneltrial's
# ops/launch.py MAX_GRID; repeated here because this file imports nothing of kerneltrial).
MAX_GRID = 65535
PROGRAMS_PER_SM = 8  # grid of the persistent geometry on a GPU (8 x 8 warps fill an SM)
INTERPRETER_PROGRAMS = 4  # grid of the persistent geometry in the interpreter (no SMs)
RULE_SCHEMA = "kerneltrial.dispatch-rule/1"
ANY_LAYOUT = "*"


@dataclass(frozen=True)
class Geometry:
    """How one launch walks the rows: rows per step, warps (None: by block size), persistent grid."""

    block_rows: int
    num_warps: int | None = None
    persistent: bool = False


# The arms a rule may name: kerneltrial registers exactly these as the operator's control
# and candidates, so every arm a trial measured is one the dispatcher can launch.
GEOMETRIES: dict[str, Geometry] = {
    "control": Geometry(1),
    "packed_r4_w4": Geometry(4, 4),
    "packed_r8_w4": Geometry(8, 4),
    "packed_r16_w8": Geometry(16, 8),
    "persistent_r16_w8": Geometry(16, 8, persistent=True),
}


@triton.jit
def normalize_rows(
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
    out_dtype = Y.dtype.element_ty
    for step in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_ROWS), tl.num_programs(0)):
        rows = step * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        token = rows // HEADS
        head = rows - token * HEADS
        src = token.to(tl.int64) * token_stride + head * head_stride
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x = tl.load(X + src[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        # rounded to the output dtype before the weight, as Z-Image's formula does
        y = ((x * rstd[:, None]).to(out_dtype).to(tl.float32) * w).to(out_dtype)
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
    normalize_rows(X, W, Y, n_rows, token_stride, head_stride, D, eps, HEADS, BLOCK_ROWS, BLOCK_D)


# ---- launches ---------------------------------------------------------------------------


def token_head_view(x: torch.Tensor) -> torch.Tensor:
    """`x` [..., H, D] as [tokens, H, D] with unit stride along D.

    A view of the same memory (no copy) whenever the leading dimensions flatten to one
    token stride: contiguous tensors and Q/K/V slices of a fused QKV tensor. Other layouts
    (a non-unit stride along D, leading dimensions that do not flatten) are copied.
    """
    view = x.reshape(-1, *x.shape[-2:])
    return view if view.stride(-1) == 1 else view.contiguous()


def launch_shape(x: torch.Tensor, block_rows: int, num_warps: int | None) -> tuple[int, int, int, int]:
    """(n_rows, heads, BLOCK_D, warps) of a launch over `x`'s (token, head) rows."""
    n_rows = x.numel() // x.shape[-1]
    if n_rows >= 2**31:
        raise ValueError(f"{n_rows} rows exceed the kernels' int32 row index")
    block_d = triton.next_power_of_2(max(1, x.shape[-1]))
    return n_rows, x.shape[-2], block_d, num_warps or row_warps(block_d * block_rows)


def row_warps(block: int) -> int:
    """Warps for one row block of `block` elements in registers (kerneltrial's ops/launch.py rule)."""
    for size, warps in ((32768, 32), (8192, 16), (2048, 8)):
        if block >= size:
            return warps
    return 4


def programs(n_steps: int, max_programs: int | None) -> int:
    """Programs along axis 0: one per step, capped by MAX_GRID (read at call time) and `max_programs`."""
    cap = MAX_GRID if max_programs is None else min(max_programs, MAX_GRID)
    return max(1, min(n_steps, cap))


def persistent_programs(device: torch.device) -> int:
    """Grid of the persistent geometry: PROGRAMS_PER_SM per SM on a GPU."""
    if device.type == "cuda":
        return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_PROGRAMS


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
    n_rows, heads, block_d, warps = launch_shape(x, block_rows, num_warps)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (programs(triton.cdiv(n_rows, block_rows), max_programs),)
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


def launch_geometry(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, *, geometry: Geometry) -> torch.Tensor:
    """`qk_norm` with one of GEOMETRIES."""
    cap = persistent_programs(x.device) if geometry.persistent else None
    return qk_norm(x, weight, eps, geometry.block_rows, geometry.num_warps, cap)


# ---- the dispatcher ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """The rule file, read for dispatch: per (width, layout) ordered row thresholds."""

    default: Geometry
    # (width, layout) -> (ascending min_rows, the geometry from each threshold on)
    branches: dict[tuple[int, str], tuple[list[int], list[Geometry]]]

    def choose(self, rows: int, width: int, layout: str) -> Geometry:
        """The branch of `rows` for (width, layout), else (width, any layout), else the default."""
        for key in ((width, layout), (width, ANY_LAYOUT)):
            if key in self.branches:
                thresholds, geometries = self.branches[key]
                return geometries[max(0, bisect.bisect_right(thresholds, rows) - 1)]
        return self.default


def rule_path() -> Path:
    return Path(__file__).with_name(Path(__file__).stem + ".rule.toml")


def parse_rule(text: str, source: str) -> Rule:
    """The dispatch part of a rule file; each arm must be one of GEOMETRIES."""
    data = tomllib.loads(text)
    if data.get("schema") != RULE_SCHEMA:
        raise ValueError(f"{source}: schema {data.get('schema')!r} is not {RULE_SCHEMA!r}")

    def geometry(arm: str) -> Geometry:
        if arm not in GEOMETRIES:
            raise ValueError(f"{source}: arm {arm!r} has no geometry here; use one of {', '.join(GEOMETRIES)}")
        return GEOMETRIES[arm]

    grouped: dict[tuple[int, str], list[tuple[int, Geometry]]] = {}
    for branch in data.get("branches", []):
        key = (int(branch["width"]), str(branch["layout"]))
        grouped.setdefault(key, []).append((int(branch["min_rows"]), geometry(branch["arm"])))
    branches = {}
    for key, items in grouped.items():
        items.sort(key=lambda item: item[0])
        branches[key] = ([rows for rows, _ in items], [g for _, g in items])
    return Rule(default=geometry(data["default"]), branches=branches)


@functools.cache
def rule() -> Rule:
    """The rule next to this file, read once (through the loader: a ZIP archive works too)."""
    path = rule_path()
    return parse_rule(__loader__.get_data(str(path)).decode(), str(path))


def layout_of(x: torch.Tensor) -> str:
    """The trial layout `x` belongs to: `contiguous`, else a strided view (`qkv_slice`)."""
    return "contiguous" if x.is_contiguous() else "qkv_slice"


def zimage_qk_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The exported entry point: the rule's geometry for x's row count, width and layout."""
    geometry = rule().choose(x.numel() // x.shape[-1], x.shape[-1], layout_of(x))
    return launch_geometry(x, weight, eps, geometry=geometry)
