"""Soft-capped row argmax: `softcap_row_argmax(logits, cap)` -> int64 [rows], greedy sampling.

    out[r] = argmax_j  cap * tanh(logits[r, j].f32 / cap)      (first index on ties)

The semantics are defined on the fp32 capped values, not on the logits: tanh is monotonic,
but in fp32 it rounds distinct large logits to the same value (every logit above ~9.1 * cap
caps to exactly `cap`), and those then tie, so the first of them wins. bf16 logits tie
often too (a 256000-wide row holds many copies of its largest values). The reference is
the official formula, `torch.argmax`, whose documented tie rule is the first maximal index;
the float64 oracle computes the capped values in float64, rounds them to fp32 (the
reference's dtype, where the ties are defined) and takes the smallest index among the
maxima explicitly. Integer outputs are compared exactly (`Operator.exact`).

fp32 tanh is not correctly rounded anywhere: torch's CPU and CUDA tanh and the kernels'
`softcap` (a series below |x/cap| = 0.25, (1 - e^-2a) / (1 + e^-2a) above, at most ~5
fp32 ulps from torch) order two distinct bf16 logits identically except near the edge of
fp32 saturation, SAFE_BELOW * cap < |x| < 9.1 * cap, where neighbouring capped values are
a few ulps apart (about 5 at 6 * cap, 30 at 5 * cap) and implementations may disagree on
whether they tie; `make_inputs` draws no logit there. The same holds for subnormal logits
(|x| < 1.2e-38), which x / cap and x * (1 / cap) round differently (and a GPU may flush to
zero). Non-finite logits follow torch.argmax: +-Inf caps to +-cap, and NaN is larger than
every value (a row with a NaN answers the index of its first NaN); the kernels rank a NaN's
capped value as +Inf and its raw value above every other (`raw_key`), so the tanh skip
never passes over it.

Bytes moved: read rows * vocab logits, write rows int64 indices.

Layouts: `contiguous` and `row_strided` (the rows are the first `vocab` columns of a wider
tensor, read in place).

Kernels (each walks its work items with a grid-stride loop over a bounded grid):
- `_argmax_rows`: BLOCK_ROWS rows per step, each row in BLOCK_N chunks; every lane keeps a
  running (max capped value, first index) and the lanes are merged at the end of the row.
  BLOCK_ROWS=1 is the control (one row per program). A next-power-of-two block of a whole
  262144-wide row does not fit in registers, so the control loops over chunks of at most
  CONTROL_BLOCK elements, the largest block that keeps the value and index accumulators in
  registers at 16 warps. BLOCK_ROWS>1 packs narrow rows.
- `_argmax_spans`: a row is split into `n_parts` spans (one work item each, so one row can
  occupy many SMs); a span is read in BLOCK_N chunks and tanh is evaluated only for chunks
  whose raw maximum exceeds every earlier raw value of the span (tanh is monotonic, so no
  other chunk can hold a strictly larger capped value): on random rows only a few chunks
  pay for tanh. With one span per row it writes the index directly; otherwise each span
  writes a partial (max capped value, first index) and `_merge_parts` (one tiny launch)
  keeps, per row, the smallest index among the equal maxima: exact and deterministic,
  no atomics.
- `_argmax_stream` (the `stream_*` candidates and the dispatcher): the same span walk and
  tanh skip, in one launch. The next chunk's load is issued before the current chunk is
  reduced (software prefetch: a chunk is always in flight while the previous one is
  examined). Spans per row are chosen so the grid stays within `programs` work items (the
  resident slots: one wave, no partial last wave from the split), whole spans per program.
  With several spans per row, each span stores its partial (max capped value, first
  index), then takes a ticket from a per-row int32 counter (atomic add,
  acq_rel, after a CTA barrier); the span that draws the last ticket reads the row's
  partials (bypassing L1), keeps the smallest index among the equal maxima, writes the
  answer and resets the counter to 0. The merge is exact and deterministic (the result
  does not depend on which span finishes last). The counters (a zeroed buffer that every call
  leaves zeroed again) and the partials (each written before it is read) are cached per
  (device, stream) (`Scratch`): a call allocates only its output.

Launch geometry is data: one frozen config record per kernel (`RowsConfig`, `SplitConfig`,
`StreamConfig`); GEOMETRIES, the control and the candidates by arm name; DISPATCH, the
exported entry point's rule. ops/catalog.py declares the operator from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import triton
import triton.language as tl

from kerneltrial.ops import launch

NAME = "softcap_row_argmax"
LAYOUTS = ("contiguous", "row_strided")
CONTROL_BLOCK = 8192  # the control's chunk: the largest block it keeps in registers
PACK_ELEMENTS = 4096  # packed steps hold at most this many elements (rows x BLOCK_N)
MAX_PARTS = 1024  # the merge reads every partial of a row in one block


@dataclass(frozen=True, slots=True)
class RowsConfig:
    """Launch knobs of `_argmax_rows`: rows per step, and warps (None: launch.row_warps of the
    block). RowsConfig() is the control geometry: one row per program, in chunks of at most
    CONTROL_BLOCK elements."""

    block_rows: int = 1
    num_warps: int | None = None


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """Launch knobs of `_argmax_spans` (then `_merge_parts` when a row has several spans): at
    most `parts` spans per row, read in `chunk`-element chunks, and warps."""

    parts: int
    chunk: int
    num_warps: int


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Launch knobs of `_argmax_stream`: chunk, warps, and `programs`, the work items the grid
    is kept near (spans per row follow from it, `stream_parts`)."""

    chunk: int
    num_warps: int
    programs: int


# The control and the candidates, by arm name (ops/catalog.py declares one arm each). The
# stream candidates' programs: 4 (or 2) per SM of a 132-SM H200.
GEOMETRIES: dict[str, RowsConfig | SplitConfig | StreamConfig] = {
    "control": RowsConfig(),
    "packed_r4_w4": RowsConfig(4, 4),
    "packed_r16_w8": RowsConfig(16, 8),
    "rows_skip_c4096_w8": SplitConfig(1, 4096, 8),
    "rows_skip_c8192_w16": SplitConfig(1, 8192, 16),
    "split_p16_c4096_w8": SplitConfig(16, 4096, 8),
    "split_p64_c2048_w8": SplitConfig(64, 2048, 8),
    "split_p256_c1024_w4": SplitConfig(256, 1024, 4),
    "stream_c2048_w4": StreamConfig(2048, 4, 528),
    "stream_c4096_w4": StreamConfig(4096, 4, 528),
    "stream_c8192_w8": StreamConfig(8192, 8, 264),
}


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """The exported entry point's rule: rows up to `narrow` wide are packed (`_argmax_rows`, up
    to `max_pack_rows` rows and PACK_ELEMENTS elements per step); wider rows are streamed by
    the one-launch kernel, as `long` says when its spans are long (>= `long_span` elements) and
    fit one wave of its programs, else as `short` says (`choose_stream`)."""

    narrow: int
    max_pack_rows: int
    short: StreamConfig
    long: StreamConfig
    long_span: int


# Leads (scripts/device/sweep.py, cold L2, two machines): 2048/4/528 was fastest or within 3%
# from 1 to 64 rows (6.5-6.9 us at 1 x 262144, 23.1 us at 64) and at 2048 x 130560 (150 us
# against 165 for 4096/4/528 and 187 for 8192/8/264, the previous rule); 4096/4/528 at
# 256 x 262144 (52.7 against 58.2). Trial: results/archive/h200/softcap_row_argmax-r4.
# long_span: measured spans were 32768 (64 rows, a tie) and 131072 (256 rows, `long` 10%
# faster); 65536 (128 rows) was not measured.
DISPATCH = DispatchConfig(
    narrow=4096,
    max_pack_rows=16,
    short=StreamConfig(2048, 4, 528),
    long=StreamConfig(4096, 4, 528),
    long_span=65536,
)


@triton.jit
def softcap(x, cap, inv_cap):
    """cap * tanh(x / cap) in fp32: an odd series to x^9 below |x/cap| = 0.25 (remainder
    < 1e-8 relative), (1 - t) / (1 + t) with t = exp(-2|x/cap|) above. Monotonic; exactly
    +-cap from |x/cap| ~ 9.1 on, like fp32 tanh; +Inf for a NaN (larger than every capped
    value, as torch.argmax ranks NaN)."""
    y = x * inv_cap
    a = tl.abs(y)
    s = tl.minimum(a, 0.25)
    s2 = s * s
    series = s + s * s2 * (-1.0 / 3.0 + s2 * (2.0 / 15.0 + s2 * (-17.0 / 315.0 + s2 * (62.0 / 2835.0))))
    t = tl.exp(-2.0 * a)
    r = tl.where(a < 0.25, series, (1.0 - t) / (1.0 + t))
    return tl.where(x == x, cap * tl.where(y < 0, -r, r), float("inf"))


@triton.jit
def raw_key(x):
    """A raw logit ordered as its capped value is, ties aside: NaN above everything (+Inf),
    +Inf as the largest finite value (both cap to cap), the rest as they are."""
    return tl.where(x == x, tl.minimum(x, 3.4028234663852886e38), float("inf"))


@launch.Direct
@triton.jit
def _argmax_rows(
    X,
    OUT,
    n_rows,
    stride,
    N,
    cap,
    inv_cap,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    n_steps = tl.cdiv(n_rows, BLOCK_ROWS)
    for step in range(tl.program_id(0), n_steps, tl.num_programs(0)):
        rows = tl.cast(step, tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        best = tl.full((BLOCK_ROWS, BLOCK_N), float("-inf"), tl.float32)
        best_idx = tl.zeros((BLOCK_ROWS, BLOCK_N), tl.int32)
        for start in range(0, N, BLOCK_N):
            idx = start + cols
            mask = row_mask[:, None] & (idx < N)[None, :]
            x = tl.load(X + rows[:, None] * stride + idx[None, :], mask=mask, other=0.0).to(tl.float32)
            v = tl.where(mask, softcap(x, cap, inv_cap), float("-inf"))
            better = v > best  # strict: a lane keeps its earliest maximum
            best = tl.where(better, v, best)
            best_idx = tl.where(better, idx[None, :], best_idx)
        top = tl.max(best, axis=1, keep_dims=True)
        first = tl.min(tl.where(best == top, best_idx, N), axis=1)
        tl.store(OUT + rows, first.to(tl.int64), mask=row_mask)


@launch.Direct
@triton.jit
def _argmax_spans(
    X,
    VAL,
    IDX,
    OUT,
    n_rows,
    stride,
    N,
    span,
    n_parts,
    cap,
    inv_cap,
    BLOCK_N: tl.constexpr,
    PARTIALS: tl.constexpr,
):
    for item in range(tl.program_id(0), n_rows * n_parts, tl.num_programs(0)):
        row = item // n_parts
        lo = (item - row * n_parts) * span
        hi = tl.minimum(lo + span, N)
        best, best_idx = _walk_span(X + tl.cast(row, tl.int64) * stride, lo, hi, cap, inv_cap, BLOCK_N)
        if PARTIALS:
            tl.store(VAL + item, best)
            tl.store(IDX + item, best_idx)
        else:
            tl.store(OUT + row, best_idx.to(tl.int64))


@launch.Direct
@triton.jit
def _merge_parts(VAL, IDX, OUT, n_rows, n_parts, BLOCK_ROWS: tl.constexpr, BLOCK_P: tl.constexpr):
    parts = tl.arange(0, BLOCK_P)
    for step in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_ROWS), tl.num_programs(0)):
        rows = tl.cast(step, tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        mask = (rows < n_rows)[:, None] & (parts < n_parts)[None, :]
        offs = rows[:, None] * n_parts + parts[None, :]
        v = tl.load(VAL + offs, mask=mask, other=float("-inf"))
        i = tl.load(IDX + offs, mask=mask, other=0)
        top = tl.max(v, axis=1, keep_dims=True)
        first = tl.min(tl.where(mask & (v == top), i, 2147483647), axis=1)
        tl.store(OUT + rows, first.to(tl.int64), mask=rows < n_rows)


@triton.jit
def _walk_span(x_row, lo, hi, cap, inv_cap, BLOCK_N: tl.constexpr):
    """(largest capped value, its first index) of x_row[lo:hi], read in BLOCK_N chunks;
    tanh only for chunks whose raw maximum exceeds every earlier raw value of the span."""
    cols = tl.arange(0, BLOCK_N)
    best = tl.full((), float("-inf"), tl.float32)  # largest capped value of the span so far
    best_idx = lo  # its first index
    seen = tl.full((), float("-inf"), tl.float32)  # largest raw logit of the span so far
    for start in range(lo, hi, BLOCK_N):
        idx = start + cols
        mask = idx < hi
        x = tl.load(x_row + idx, mask=mask, other=0.0).to(tl.float32)
        x_top = tl.max(tl.where(mask, raw_key(x), float("-inf")), axis=0)
        if x_top > seen:  # only such a chunk can hold a strictly larger capped value
            v = tl.where(mask, softcap(x, cap, inv_cap), float("-inf"))
            v_top = tl.max(v, axis=0)
            first = tl.min(tl.where(v == v_top, idx, hi), axis=0)
            best_idx = tl.where(v_top > best, first, best_idx)
            best = tl.maximum(best, v_top)
            seen = x_top
    return best, best_idx


@triton.jit
def _finish_span(VAL, IDX, CNT, OUT, item, row, n_parts, best, best_idx, BLOCK_P: tl.constexpr, MERGE: tl.constexpr):
    """Write a span's answer: the row's index directly when it is the only span (MERGE
    False); else publish the partial, take a ticket, and let the row's last span merge."""
    if MERGE:
        tl.store(VAL + item, best)
        tl.store(IDX + item, best_idx)
        tl.debug_barrier()  # the partial is written before the ticket is taken
        ticket = tl.atomic_add(CNT + row, 1, sem="acq_rel", scope="gpu")
        if ticket == n_parts - 1:  # every other span of the row has published its partial
            parts = tl.arange(0, BLOCK_P)
            offs = tl.cast(row, tl.int64) * n_parts + parts
            pmask = parts < n_parts
            v = tl.load(VAL + offs, mask=pmask, other=float("-inf"), cache_modifier=".cg")
            i = tl.load(IDX + offs, mask=pmask, other=2147483647, cache_modifier=".cg")
            top = tl.max(v, axis=0)
            first = tl.min(tl.where(pmask & (v == top), i, 2147483647), axis=0)
            tl.store(OUT + row, first.to(tl.int64))
            tl.atomic_xchg(CNT + row, 0, sem="relaxed", scope="gpu")  # ready for the next call
    else:
        tl.store(OUT + row, best_idx.to(tl.int64))


@launch.Direct
@triton.jit
def _argmax_stream(
    X,
    VAL,
    IDX,
    CNT,
    OUT,
    n_rows,
    stride,
    N,
    span,
    n_parts,
    cap,
    inv_cap,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
    MERGE: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    for item in range(tl.program_id(0), n_rows * n_parts, tl.num_programs(0)):
        row = item // n_parts
        lo = (item - row * n_parts) * span
        hi = tl.minimum(lo + span, N)
        x_row = X + tl.cast(row, tl.int64) * stride
        best = tl.full((), float("-inf"), tl.float32)  # largest capped value of the span so far
        best_idx = lo  # its first index
        seen = tl.full((), float("-inf"), tl.float32)  # largest raw logit of the span so far
        x = tl.load(x_row + lo + cols, mask=lo + cols < hi, other=float("-inf"))
        for start in range(lo, hi, BLOCK_N):
            nxt = start + BLOCK_N + cols  # prefetch: issued before this chunk is examined
            x_next = tl.load(x_row + nxt, mask=nxt < hi, other=float("-inf"))
            xf = x.to(tl.float32)  # masked lanes hold -inf
            x_top = tl.max(raw_key(xf), axis=0)
            if x_top > seen:  # only such a chunk can hold a strictly larger capped value
                idx = start + cols
                v = tl.where(idx < hi, softcap(xf, cap, inv_cap), float("-inf"))
                v_top = tl.max(v, axis=0)
                first = tl.min(tl.where(v == v_top, idx, hi), axis=0)
                best_idx = tl.where(v_top > best, first, best_idx)
                best = tl.maximum(best, v_top)
                seen = x_top
            x = x_next
        _finish_span(VAL, IDX, CNT, OUT, item, row, n_parts, best, best_idx, BLOCK_P, MERGE)


@dataclass(frozen=True, slots=True)
class RowsLaunch:
    """A launch of `_argmax_rows`: grid, rows per step, chunk, warps."""

    grid: tuple[int]
    block_rows: int
    block_n: int
    num_warps: int


@lru_cache(maxsize=launch.PLANS)
def rows_launch(n_rows: int, n: int, block_rows: int, num_warps: int | None, max_grid: int) -> RowsLaunch:
    """`_argmax_rows` over n_rows x n, `block_rows` rows per step."""
    limit = CONTROL_BLOCK if block_rows == 1 else max(1, PACK_ELEMENTS // block_rows)
    block_n = min(launch.next_pow2(n), limit)
    grid = launch.bounded_grid(triton.cdiv(n_rows, block_rows), max_grid)
    return RowsLaunch(grid, block_rows, block_n, num_warps or launch.row_warps(block_n * block_rows))


def run_rows(logits: torch.Tensor, rows: torch.Tensor, cap: float, plan: RowsLaunch) -> torch.Tensor:
    n_rows, n = rows.shape
    out = logits.new_empty(logits.shape[:-1], dtype=torch.int64)
    _argmax_rows[plan.grid](
        rows, out, n_rows, rows.stride(0), n, cap, 1.0 / cap,
        BLOCK_ROWS=plan.block_rows, BLOCK_N=plan.block_n, num_warps=plan.num_warps,
    )  # fmt: skip
    return out


def argmax_rows(logits: torch.Tensor, cap: float, block_rows: int = 1, num_warps: int | None = None) -> torch.Tensor:
    """Launch `_argmax_rows`: `block_rows` rows per step (1 = the control geometry)."""
    rows = launch.as_rows(logits)
    return run_rows(
        logits, rows, cap, rows_launch(rows.shape[0], rows.shape[1], block_rows, num_warps, launch.MAX_GRID)
    )


def span_geometry(n: int, parts: int, chunk: int) -> tuple[int, int, int]:
    """(spans per row, span length, chunk) for `parts` requested spans of an n-wide row:
    spans are whole chunks, the chunk shrinks to fit a narrow row, no span is empty."""
    chunk = min(chunk, launch.next_pow2(n))
    parts = max(1, min(parts, triton.cdiv(n, chunk), MAX_PARTS))
    span = triton.cdiv(triton.cdiv(n, parts), chunk) * chunk
    return triton.cdiv(n, span), span, chunk


@dataclass(frozen=True, slots=True)
class SpanLaunch:
    """A launch over spans of rows (`span_geometry`): `n_parts` spans of `span` elements per
    row read in `chunk`-element chunks, a grid over the n_rows * n_parts work items, warps,
    and the merge's block over a row's partials (next_pow2(n_parts))."""

    grid: tuple[int]
    n_parts: int
    span: int
    chunk: int
    num_warps: int
    block_p: int


@lru_cache(maxsize=launch.PLANS)
def span_launch(n_rows: int, n: int, parts: int, chunk: int, num_warps: int, max_grid: int) -> SpanLaunch:
    n_parts, span, chunk = span_geometry(n, parts, chunk)
    grid = launch.bounded_grid(n_rows * n_parts, max_grid)
    return SpanLaunch(grid, n_parts, span, chunk, num_warps, launch.next_pow2(n_parts))


def argmax_split(
    logits: torch.Tensor, cap: float, parts: int = 1, chunk: int = 4096, num_warps: int = 8
) -> torch.Tensor:
    """Launch `_argmax_spans` with up to `parts` spans per row, then `_merge_parts` if > 1."""
    rows = launch.as_rows(logits)
    n_rows, n = rows.shape
    s = span_launch(n_rows, n, parts, chunk, num_warps, launch.MAX_GRID)
    partials = s.n_parts > 1
    device = logits.device
    out = torch.empty(n_rows, dtype=torch.int64, device=device)
    val = torch.empty(n_rows * s.n_parts if partials else 1, dtype=torch.float32, device=device)
    idx = torch.empty(val.numel(), dtype=torch.int32, device=device)
    _argmax_spans[s.grid](
        rows, val, idx, out, n_rows, rows.stride(0), n, s.span, s.n_parts, cap, 1.0 / cap,
        BLOCK_N=s.chunk, PARTIALS=partials, num_warps=s.num_warps,
    )  # fmt: skip
    if partials:
        block_rows = max(1, min(64, 4096 // s.block_p))
        _merge_parts[launch.bounded_grid(triton.cdiv(n_rows, block_rows))](
            val,
            idx,
            out,
            n_rows,
            s.n_parts,
            BLOCK_ROWS=block_rows,
            BLOCK_P=s.block_p,
            num_warps=4,
        )
    return out.view(logits.shape[:-1])


@dataclass
class Scratch:
    """`_argmax_stream`'s buffers on one (device, stream): per-row int32 ticket counters, zero
    between calls (allocated zeroed, never poisoned; the last span of a row resets its
    counter), and the partials (max capped value, first index) of each span, written
    before they are read. Cached so a call allocates only its output."""

    cnt: torch.Tensor
    val: torch.Tensor
    idx: torch.Tensor


_SCRATCH: dict[tuple, Scratch] = {}
# Scratch is sized to at least SCRATCH_MIN entries: the dispatcher merges only rows that have
# several spans, at most its streams' programs work items (528), so its buffers never grow and
# a CUDA graph that captured them never sees them replaced. Growing replaces the buffers.
SCRATCH_MIN = 1024


def scratch(n_rows: int, items: int, device: torch.device) -> Scratch:
    """The cached Scratch of the current stream, grown on demand to `n_rows` counters and
    `items` partials. The stream is read as Triton reads it (the raw CUDA stream handle):
    torch.cuda.current_stream builds a Stream object per call."""
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    s = _SCRATCH.get(key)
    if s is None or s.cnt.numel() < n_rows or s.val.numel() < items:
        cnt = torch.zeros(launch.next_pow2(max(n_rows, SCRATCH_MIN)), dtype=torch.int32, device=device)
        size = launch.next_pow2(max(items, SCRATCH_MIN))
        val = torch.empty(size, dtype=torch.float32, device=device)
        s = _SCRATCH[key] = Scratch(cnt, val, torch.empty(size, dtype=torch.int32, device=device))
    return s


def stream_parts(n_rows: int, programs: int) -> int:
    """Spans per row for a grid of about `programs` whole-span work items: never more items
    than `programs` once rows alone reach it (no partial last wave from the split)."""
    return max(1, programs // n_rows)


def run_stream(logits: torch.Tensor, rows: torch.Tensor, cap: float, plan: SpanLaunch) -> torch.Tensor:
    n_rows, n = rows.shape
    merge = plan.n_parts > 1
    buffers = scratch(n_rows if merge else 0, n_rows * plan.n_parts if merge else 0, logits.device)
    out = logits.new_empty(logits.shape[:-1], dtype=torch.int64)
    _argmax_stream[plan.grid](
        rows, buffers.val, buffers.idx, buffers.cnt, out, n_rows, rows.stride(0), n, plan.span, plan.n_parts,
        cap, 1.0 / cap, BLOCK_N=plan.chunk, BLOCK_P=plan.block_p, MERGE=merge,
        num_warps=plan.num_warps,
    )  # fmt: skip
    return out


def argmax_stream(
    logits: torch.Tensor, cap: float, parts: int = 1, chunk: int = 8192, num_warps: int = 8, programs: int | None = None
) -> torch.Tensor:
    """Launch `_argmax_stream` once: up to `parts` spans per row (or, with `programs`, as many
    as keep the grid near `programs` work items), merged in the same launch by the last span."""
    rows = launch.as_rows(logits)
    n_rows, n = rows.shape
    if programs is not None:
        parts = stream_parts(n_rows, programs)
    return run_stream(logits, rows, cap, span_launch(n_rows, n, parts, chunk, num_warps, launch.MAX_GRID))


def choose_stream(n_rows: int, n: int) -> StreamConfig:
    """The dispatcher's one-launch geometry: DISPATCH.long when the spans are long (>=
    DISPATCH.long_span) and fit one wave of its programs, else DISPATCH.short."""
    long = DISPATCH.long
    n_parts, span, _ = span_geometry(n, stream_parts(n_rows, long.programs), long.chunk)
    if span >= DISPATCH.long_span and n_rows * n_parts <= long.programs:
        return long
    return DISPATCH.short


@lru_cache(maxsize=launch.PLANS)
def auto_launch(n_rows: int, n: int, max_grid: int) -> RowsLaunch | SpanLaunch:
    """The dispatcher's launch: rows up to DISPATCH.narrow wide packed (`_argmax_rows`); wider
    rows streamed by the one-launch kernel in the geometry `choose_stream` picks."""
    if n <= DISPATCH.narrow:
        block_rows = max(1, min(DISPATCH.max_pack_rows, PACK_ELEMENTS // launch.next_pow2(n)))
        return rows_launch(n_rows, n, block_rows, None, max_grid)
    stream = choose_stream(n_rows, n)
    return span_launch(n_rows, n, stream_parts(n_rows, stream.programs), stream.chunk, stream.num_warps, max_grid)


def softcap_row_argmax(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """The exported entry point (`auto_launch`)."""
    rows = launch.as_rows(logits)
    plan = auto_launch(rows.shape[0], rows.shape[1], launch.MAX_GRID)
    if type(plan) is RowsLaunch:
        return run_rows(logits, rows, cap, plan)
    return run_stream(logits, rows, cap, plan)


# ---- semantics --------------------------------------------------------------------------


def shape_rule(shape: tuple[int, ...]) -> str:
    """The operator's complaint about a shape, or "" (ties are planted in both halves of a row)."""
    if len(shape) == 2 and shape[-1] >= 2:
        return ""
    return "must be [rows, vocab] with vocab >= 2 (ties are planted in both halves)"


def launcher(config: RowsConfig | SplitConfig | StreamConfig) -> Callable[..., torch.Tensor]:
    """The arm that launches `config`: `softcap_row_argmax(logits, cap)`."""
    if isinstance(config, StreamConfig):
        return partial(argmax_stream, chunk=config.chunk, num_warps=config.num_warps, programs=config.programs)
    if isinstance(config, SplitConfig):
        return partial(argmax_split, parts=config.parts, chunk=config.chunk, num_warps=config.num_warps)
    if config == RowsConfig():
        return argmax_rows
    return partial(argmax_rows, block_rows=config.block_rows, num_warps=config.num_warps)


def describe(config: RowsConfig | SplitConfig | StreamConfig) -> str:
    """An arm's one-line doc from its geometry."""
    if isinstance(config, StreamConfig):
        return f"one launch, ~{config.programs} span items, {config.chunk}-chunks prefetched, last span merges"
    if isinstance(config, SplitConfig) and config.parts == 1:
        return f"one span per row, {config.chunk}-chunks, tanh only on new raw maxima"
    if isinstance(config, SplitConfig):
        return f"up to {config.parts} spans per row, then an exact merge"
    if config == RowsConfig():
        return f"one row per program, chunks of <= {CONTROL_BLOCK}"
    return f"{config.block_rows} rows per step, {config.num_warps} warps"


def eager(logits: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.argmax(cap * torch.tanh(logits.float() / cap), dim=-1)
