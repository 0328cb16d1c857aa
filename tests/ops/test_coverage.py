"""Coverage of the check panels: every operator's panel holds inputs that expose real defects.

Coverage items (src/kerneltrial/ops/inputs.py, "Coverage", and each operator's panels):
a width that is neither a power of two nor a multiple of 128; more than 65535 rows (GPU
panels); a nonzero storage offset; zero, tiny and eps-scale rows; an eps other than the
default; softcap: saturated ties in single-row inputs and a row whose only maximum is its
last element. (tests/trial/test_input_domain.py plants defects for the rest of the domain:
offset 0, large and non-finite rows, drawn eps and cap, extra shapes, 65537 CPU rows.) (`row_strided` needs nothing new: both panels already
run every case in every layout of the operator.)

For each item a planted defect below (its docstring says what is wrong) passes the panel
without the item, which each test shows, by switching the item off (`without`) or on the
panel's cases that lack it, and fails the gate with it. Defects that wrap the
`kerneltrial` entry points run as Triton kernels (interpreted on a CPU); defects checked
on GPU-panel cases are torch code making the kernel's mistake, so that a CPU checks a
GPU-sized case in seconds. Checks use `thorough=False`: each defect shows in the checked
call; the anti-cheat calls add nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
import triton

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops import softcap_argmax as sa
from kerneltrial.ops import softcap_inputs as si
from kerneltrial.ops.registry import Case, Impl, Operator, Outputs, all_ops, get_op
from kerneltrial.trial.gate import CheckResult, check

SEEDS = (0, 1)  # the gate's seeds (check --seeds 2, the shipped protocols)
TILE = 128
NORM_OPS = (
    "rmsnorm",
    "rmsnorm_fp32",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "zimage_qk_rmsnorm",
    "zimage_qk_rmsnorm_pair",
)
DEFAULT_EPS = {name: 1e-5 if name.startswith("zimage") else 1e-6 for name in NORM_OPS}
ALL_OPS = tuple(op.name for op in all_ops())


def rows_of(case: Case) -> int:
    return inp.numel(case.shape[:-1])


def odd_width(case: Case) -> bool:
    """Neither a power of two nor a multiple of 128."""
    n = case.shape[-1]
    return n % TILE != 0 and n & (n - 1) != 0


def expand(op: Operator, cases: Iterable[Case]) -> list[Case]:
    """The cases in every layout of the operator, as `kerneltrial check` expands a panel."""
    return [Case(c.shape, c.dtype, layout) for c in cases for layout in op.layouts]


def by_size(cases: Iterable[Case]) -> list[Case]:
    return sorted(cases, key=lambda c: inp.numel(c.shape))


def arm(op: Operator, fn: Callable[..., Any]) -> Impl:
    return Impl(op=op.name, name="planted", kind="user", loader=lambda: fn)


def first_failure(
    op: Operator, fn: Callable[..., Any], cases: Iterable[Case], seeds: Iterable[int] = SEEDS
) -> tuple[Case, CheckResult] | None:
    """The first (case, failed check) of `fn` over the cases and seeds, or None if all pass."""
    impl = arm(op, fn)
    for case in cases:
        for seed in seeds:
            result = check(op, impl, case, seed, launch.device(), thorough=False)
            if not result.passed:
                return case, result
    return None


def caught(
    op: Operator, fn: Callable[..., Any], cases: Iterable[Case], seeds: Iterable[int] = SEEDS
) -> tuple[Case, CheckResult]:
    failure = first_failure(op, fn, cases, seeds)
    assert failure is not None, f"{op.name}: the planted defect passes the panel"
    return failure


def with_special_rows(op: Operator) -> list[Case]:
    """The small panel's cases that hold every special row (in every layout): the Triton
    defects are checked on these alone, to keep the interpreter's time down."""
    return expand(op, [c for c in op.small_cases if rows_of(c) > len(inp.NORM_ROWS)])


def passes(op: Operator, fn: Callable[..., Any], case: Case, seed: int) -> bool:
    result = check(op, arm(op, fn), case, seed, launch.device(), thorough=False)
    return result.passed


@pytest.fixture
def without(monkeypatch):
    """Switch one coverage item of make_inputs off: the panel as it was before the item."""

    def switch_off(item: str) -> None:
        if item == "special rows":
            monkeypatch.setattr(inp, "pick_rows", lambda *args, **kwargs: {})
        elif item == "drawn eps":
            monkeypatch.setattr(inp, "draw_eps", lambda gen, default: default)
        elif item == "offset":
            monkeypatch.setattr(inp, "draw_offset", lambda dtype, gen: 0)
        elif item == "single-row saturation":  # the odd rows only, as before
            monkeypatch.setattr(
                si, "saturated_rows", lambda n, seed, device, skip=(): torch.arange(1, n, 2, device=device)
            )
        else:
            raise ValueError(item)

    return switch_off


# ---- torch stand-ins for kernels: outputs computed by a formula, returned or written in place


def emulated(op: Operator, values: Callable[..., Outputs]) -> Callable[..., Any]:
    """An arm whose outputs are `values(*args)`: returned, or for an in-place operator
    written into its leading arguments (x, residual: the in-place outputs come first)."""

    def run(*args: Any) -> Any:
        outs = values(*args)
        if op.inplace:
            for target, out in zip(args, outs, strict=False):
                target.copy_(out)
            return None
        return outs[0] if len(outs) == 1 else outs

    return run


def with_eps(op: Operator, eps: float) -> Callable[..., Any]:
    """The `kerneltrial` entry point (Triton) called with `eps` instead of the eps it is given."""
    fn = op.impl("kerneltrial").resolve()
    return lambda *args: fn(*args[:-1], eps)


# ---- drawn eps ----------------------------------------------------------------------------


@pytest.mark.parametrize("op_name", NORM_OPS)
def test_a_kernel_that_hard_codes_its_default_eps_is_caught(op_name, without):
    """PLANTED: the kerneltrial kernels with eps fixed at the operator's default (1e-6;
    Z-Image 1e-5), ignoring the eps argument. Caught on a seed that draws another eps, in the
    eps-scale row, where the result depends on eps; with the default eps it passes."""
    op = get_op(op_name)
    defect = with_eps(op, DEFAULT_EPS[op_name])
    case, result = caught(op, defect, with_special_rows(op))
    assert "differs from the reference" in result.message, result.message
    without("drawn eps")
    assert passes(op, defect, case, result.seed)


# ---- zero rows ----------------------------------------------------------------------------


@pytest.mark.parametrize("op_name", NORM_OPS)
def test_a_kernel_without_eps_writes_nan_on_a_zero_row(op_name, without):
    """PLANTED: the kerneltrial kernels with eps = 0, y = x / rms(x): on random rows eps
    moves the result by ~1e-6 relative and this passes; a zero row is 0 * rsqrt(0) = NaN."""
    op = get_op(op_name)
    defect = with_eps(op, 0.0)
    case, result = caught(op, defect, with_special_rows(op))
    assert "NaN element(s)" in result.message, result.message
    without("special rows")
    assert passes(op, defect, case, result.seed)


def skips_zero_rows(op: Operator) -> Callable[..., Any]:
    """PLANTED: treats an all-zero input row as padding and skips it, leaving its output row
    unwritten (as if the output were zeroed: torch.empty is not)."""

    def values(*args: torch.Tensor) -> Outputs:
        x, out = args[0], op.reference(*args)[0]
        written = torch.empty_like(out)
        keep = (x != 0).any(dim=-1)
        written[keep] = out[keep]
        return (written,)

    return emulated(op, values)


@pytest.mark.parametrize("op_name", ["silu_and_mul", "sigmoid_gate_mul"])
def test_a_kernel_that_skips_zero_rows_is_caught(op_name, without):
    op = get_op(op_name)
    case, result = caught(op, skips_zero_rows(op), expand(op, op.small_cases))
    assert "NaN element(s)" in result.message, result.message
    without("special rows")
    assert passes(op, skips_zero_rows(op), case, result.seed)


LANES = 1024


def keeps_each_lanes_last_maximum(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """PLANTED: a per-lane running maximum over 1024-element chunks updated with `>=`
    instead of `>`, so each lane keeps its LAST maximum; lanes are then merged by the
    smallest index. The random ties are a few copies at random positions, never two in
    one lane, and the answer is right; in a row of zeros every lane holds ties, and the
    answer is the last chunk's first lane instead of 0."""
    capped = cap * torch.tanh(logits.float() / cap)
    n_rows, n = capped.shape
    chunks = triton.cdiv(n, LANES)
    padded = torch.full((n_rows, chunks * LANES), float("-inf"))
    padded[:, :n] = capped
    lanes = padded.view(n_rows, chunks, LANES)
    lane_max = lanes.amax(dim=1)
    last_chunk = chunks - 1 - (lanes.flip(1) == lane_max[:, None, :]).int().argmax(dim=1)
    index = last_chunk * LANES + torch.arange(LANES)
    top = lane_max.amax(dim=1, keepdim=True)
    return torch.where(lane_max == top, index, n).amin(dim=1)


def test_softcap_kernel_keeping_the_last_maximum_of_a_lane_is_caught_by_a_zero_row(without):
    op = get_op(sa.NAME)
    case, result = caught(op, keeps_each_lanes_last_maximum, expand(op, op.small_cases))
    assert "differs from the reference" in result.message, result.message
    without("special rows")
    assert passes(op, keeps_each_lanes_last_maximum, case, result.seed)


# ---- tiny rows ----------------------------------------------------------------------------


def guards_zero_rows_instead_of_eps(op: Operator) -> Callable[..., Any]:
    """PLANTED: no eps; rows that are exactly zero are special-cased to 0 instead (the
    formula with eps = 0, NaN rows replaced by 0). Passes zero rows and, on random rows,
    the eps it drops is invisible; a tiny row is not zero, but its squares underflow to 0
    in fp32: x * rsqrt(0) = Inf."""

    def values(*args: Any) -> Outputs:
        outs = op.reference(*args[:-1], 0.0)
        return tuple(torch.where(torch.isnan(o), torch.zeros_like(o), o) for o in outs)

    return emulated(op, values)


@pytest.mark.parametrize("op_name", NORM_OPS)
def test_a_kernel_guarding_exact_zeros_instead_of_eps_overflows_on_a_tiny_row(op_name, without):
    op = get_op(op_name)
    defect = guards_zero_rows_instead_of_eps(op)
    case, result = caught(op, defect, expand(op, op.small_cases))
    assert "Inf element(s)" in result.message, result.message
    without("special rows")
    assert passes(op, defect, case, result.seed)


def cancelling_tanh(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """PLANTED: tanh written as (e^2y - 1) / (e^2y + 1) in fp32. It orders random and
    saturated logits as tanh does, but e^2y rounds to 1 for |y| < 3e-8: a row of tiny logits
    caps to all zeros, every element ties, and index 0 wins instead of the row's maximum."""
    e = torch.exp(2.0 * logits.float() / cap)
    return torch.argmax(cap * ((e - 1.0) / (e + 1.0)), dim=-1)


def test_softcap_kernel_whose_tanh_cancels_near_zero_is_caught_by_a_tiny_row(without):
    op = get_op(sa.NAME)
    case, result = caught(op, cancelling_tanh, expand(op, op.small_cases))
    assert "differs from the reference" in result.message, result.message
    without("special rows")
    assert passes(op, cancelling_tanh, case, result.seed)


# ---- storage offset -----------------------------------------------------------------------


def from_storage_start(op: Operator) -> Callable[..., Any]:
    """PLANTED: the kerneltrial kernels handed every tensor rebuilt from the start of its
    storage (its storage_offset() ignored, as a kernel that takes untyped_storage().data_ptr()
    does). Fresh tensors start at offset 0, and there it is right."""
    fn = op.impl("kerneltrial").resolve()

    def run(*args: Any) -> Any:
        return fn(*(torch.as_strided(a, a.shape, a.stride(), 0) if isinstance(a, torch.Tensor) else a for a in args))

    return run


@pytest.mark.parametrize("op_name", ALL_OPS)
def test_a_kernel_that_ignores_the_storage_offset_is_caught(op_name, without):
    """Caught by the gate, whose guard keeps the offsets make_inputs draws (and whose repeated
    call moves them): a seed whose inputs sit at nonzero offsets fails the defect; with every
    offset 0 it passes."""
    op = get_op(op_name)
    case = Case(by_size(c for c in op.small_cases if rows_of(c) > 1)[0].shape)
    defect = from_storage_start(op)
    seed = next(s for s in range(20) if op.make_inputs(case, s, launch.device())[first_tensor(op)].storage_offset())
    assert not check(op, arm(op, defect), case, seed, launch.device()).passed
    without("offset")
    assert check(op, arm(op, defect), case, seed, launch.device(), thorough=False).passed


def first_tensor(op: Operator) -> str:
    return next(iter(op.make_inputs(Case(op.small_cases[0].shape), 0, launch.device())))


def test_make_inputs_draws_offset_zero_and_nonzero_offsets():
    for op in all_ops():
        offsets = {
            t.storage_offset() > 0
            for s in range(8)
            for t in op.make_inputs(Case(op.small_cases[0].shape), s, launch.device()).values()
            if isinstance(t, torch.Tensor)
        }
        assert offsets == {True, False}, op.name


# ---- softcap: saturated ties in single-row inputs ----------------------------------------


def raw_argmax_when_decoding(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """PLANTED: a decode fast path: for a single row, tanh being monotonic, it takes the
    argmax of the raw logits; several rows go through the capped formula. 400 and 500 both
    cap to exactly 30.0 in fp32 and the earlier wins; the raw argmax returns the later 500."""
    if logits.shape[0] == 1:
        return torch.argmax(logits, dim=-1)
    return torch.argmax(cap * torch.tanh(logits.float() / cap), dim=-1)


@pytest.mark.parametrize("panel", ["small_cases", "gpu_cases"])
def test_softcap_decode_path_taking_the_raw_argmax_is_caught(panel, without):
    op = get_op(sa.NAME)
    single = by_size(c for c in getattr(op, panel) if rows_of(c) == 1)
    case, result = caught(op, raw_argmax_when_decoding, expand(op, single))
    assert result.seed % 2 == 1 and "differs from the reference" in result.message, result.message
    without("single-row saturation")
    assert passes(op, raw_argmax_when_decoding, case, result.seed)


def test_softcap_single_rows_hold_saturated_ties_for_odd_seeds():
    values = si.make_inputs(Case((1, 5120)), 1, launch.device())
    logits, cap = values["logits"], values["cap"]
    capped = cap * torch.tanh(logits.float() / cap)
    assert int((capped == cap).sum()) >= 2
    assert int(torch.argmax(logits)) != int(si.reference(logits, cap)[0])


# ---- width: neither a power of two nor a multiple of 128 ---------------------------------


def drops_partial_tile(op: Operator) -> Callable[..., Any]:
    """PLANTED: a loop over 128-column tiles with no tail: only the first N - N % 128
    columns are computed (statistics included) and written; the rest of the output stays
    unwritten (in place: unchanged). Right whenever the width is a multiple of 128."""

    def widened(part: torch.Tensor, width: int) -> torch.Tensor:
        out = torch.empty((*part.shape[:-1], width), dtype=part.dtype, device=part.device)
        out[..., : part.shape[-1]] = part
        return out

    def run(*args: Any) -> Any:
        n = args[0].shape[-1]
        if op.name == "silu_and_mul":
            d = n // 2
            k = d - d % TILE
            return widened(op.reference(torch.cat([args[0][..., :k], args[0][..., d : d + k]], dim=-1))[0], d)
        k = n - n % TILE
        outs = op.reference(*[a[..., :k] if isinstance(a, torch.Tensor) and a.shape[-1] == n else a for a in args])
        if op.exact:  # softcap: the argmax of the first k columns
            return outs[0]
        if op.inplace:
            for target, out in zip(args, outs, strict=False):
                target[..., :k].copy_(out)
            return None
        outs = tuple(widened(o, n) for o in outs)
        return outs[0] if len(outs) == 1 else outs

    return run


@pytest.mark.parametrize("op_name", ALL_OPS)
@pytest.mark.parametrize("panel", ["small_cases", "gpu_cases"])
def test_a_kernel_assuming_a_multiple_of_128_columns_is_caught(op_name, panel):
    """On the panel's smallest case of an odd width (unwritten columns, or for softcap the
    tail row's answer missed); the GPU panels had none for silu, Z-Image and softcap."""
    op = get_op(op_name)
    defect = drops_partial_tile(op)
    cases = getattr(op, panel)
    caught(op, defect, expand(op, by_size(c for c in cases if odd_width(c))[:1]))
    if panel == "small_cases":  # and it passes every case of a width that is a multiple of 128
        assert (
            first_failure(
                op,
                defect,
                expand(op, [c for c in cases if c.shape[-1] % (2 * TILE if op_name == "silu_and_mul" else TILE) == 0]),
            )
            is None
        )


def test_softcap_tail_row_has_its_only_maximum_last():
    """A kernel dropping a partial last chunk misses the answer of this row whatever the
    chunk: it is the row's last element."""
    values = si.make_inputs(Case((3, 1500)), 0, launch.device())
    answers = si.reference(values["logits"], values["cap"])[0].tolist()
    assert 1499 in answers


# ---- more than 65535 rows -----------------------------------------------------------------


def no_grid_stride_loop(op: Operator) -> Callable[..., Any]:
    """PLANTED: one program per row on a grid capped at 65535 programs, without the
    grid-stride loop: rows from 65535 on are never written (in place: left unchanged)."""

    def first_rows(t: torch.Tensor) -> torch.Tensor:
        return t[: launch.MAX_GRID] if t.dim() == 1 else t.reshape(-1, t.shape[-1])[: launch.MAX_GRID]

    def values(*args: Any) -> Outputs:
        outs = op.reference(*args)
        cut = []
        for target, out in zip(args if op.inplace else outs, outs, strict=False):
            written = target.clone() if op.inplace else torch.empty_like(out)
            first_rows(written).copy_(first_rows(out))
            cut.append(written)
        return tuple(cut)

    return emulated(op, values)


@pytest.mark.parametrize("op_name", ALL_OPS)
def test_a_kernel_without_a_grid_stride_loop_is_caught_on_the_gpu_panel(op_name):
    """The GPU panel's smallest case of more than 65535 rows, checked on the CPU."""
    op = get_op(op_name)
    defect = no_grid_stride_loop(op)
    many = by_size(c for c in op.gpu_cases if rows_of(c) > launch.MAX_GRID)
    _, result = caught(op, defect, expand(op, many[:1]), seeds=(0,))
    assert "differs" in result.message or "NaN" in result.message, result.message
    assert first_failure(op, defect, expand(op, op.small_cases[:2]), seeds=(0,)) is None  # fewer rows: right


# ---- what the panels and make_inputs hold -------------------------------------------------


@pytest.mark.parametrize("op_name", ALL_OPS)
def test_panels_hold_an_odd_width_and_the_gpu_panel_more_than_65535_rows(op_name):
    op = get_op(op_name)
    assert any(odd_width(c) for c in op.small_cases) and any(odd_width(c) for c in op.gpu_cases)
    assert any(rows_of(c) > launch.MAX_GRID for c in op.gpu_cases)


@pytest.mark.parametrize("op_name", ALL_OPS)
def test_make_inputs_draws_zero_and_tiny_rows(op_name):
    op = get_op(op_name)
    case = by_size(c for c in op.small_cases if rows_of(c) >= 4)[0]
    for seed in SEEDS:
        values = op.make_inputs(case, seed, launch.device())
        x = next(v for v in values.values() if isinstance(v, torch.Tensor)).float()
        rows = x.reshape(-1, x.shape[-1]).abs().amax(dim=-1)
        assert bool((rows == 0).any()), "a zero row"
        assert bool(((rows > 0) & (rows < 1e-20)).any()), "a tiny row"
        if op_name in NORM_OPS:
            scale = math.sqrt(values["eps"])
            assert bool(((rows > scale / 2) & (rows < scale * 8)).any()), "an eps-scale row"


@pytest.mark.parametrize("op_name", NORM_OPS)
def test_make_inputs_draws_eps_other_than_the_default(op_name):
    op = get_op(op_name)
    eps = {op.make_inputs(Case(op.small_cases[0].shape), seed, launch.device())["eps"] for seed in range(8)}
    assert DEFAULT_EPS[op_name] in eps and len(eps) > 2


@pytest.mark.parametrize("op_name", ["zimage_qk_rmsnorm", "zimage_qk_rmsnorm_pair"])
def test_zimage_returns_contiguous_outputs_and_the_gate_checks_it(op_name):
    """The interface says "new contiguous tensor": an arm returning a strided view fails."""
    op = get_op(op_name)
    assert op.contiguous_outputs

    def strided(*args: Any) -> Any:
        outs = op.reference(*args)
        views = tuple(torch.cat([o, o], dim=-1)[..., : o.shape[-1]] for o in outs)
        return views[0] if len(views) == 1 else views

    result = check(op, arm(op, strided), Case((2, 3, 80)), 0, launch.device(), thorough=False)
    assert not result.passed and "not contiguous" in result.message, result.message
