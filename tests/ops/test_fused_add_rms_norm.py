"""fused_add_rmsnorm and gemma_fused_add_rmsnorm: edge shapes, in-place writes, the bounded
grid, rounding fidelity, and wrong variants that the correctness gate must reject."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from kerneltrial.ops import fused_add_rms_norm as fa
from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial.gate import check
from tests.launches import record_launches

OPS = ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm")
GEMMA = {"fused_add_rmsnorm": False, "gemma_fused_add_rmsnorm": True}


def _inputs(op_name: str, shape: tuple[int, ...], layout: str = "contiguous", seed: int = 0):
    inputs = get_op(op_name).make_inputs(Case(shape, layout=layout), seed, launch.device())
    return inputs["x"], inputs["residual"], inputs["weight"]


def _expected(op_name: str, x, residual, weight):
    return get_op(op_name).reference(x.clone(), residual.clone(), weight)


def _assert_matches(x, residual, want_x, want_r) -> None:
    """The residual sum is rounded once, so it is exact; x within the gate's bf16 tolerance
    (a reduction order other than torch's may move an element by one ulp)."""
    torch.testing.assert_close(residual, want_r, rtol=0, atol=0, equal_nan=True)  # inputs hold a NaN row
    torch.testing.assert_close(x, want_x, rtol=0.016, atol=1e-5, equal_nan=True)


def _wrong(op_name: str, name: str, fn) -> Impl:
    return Impl(op=op_name, name=name, kind="user", loader=lambda: fn)


@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("impl_name", ["kerneltrial", "wide", "packed_r4_w8"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 5120), (3, 1536), (5, 3000), (3, 1001), (2, 2, 1000)])
def test_edge_shapes_pass_the_gate(op_name, impl_name, shape, device):
    op = get_op(op_name)
    result = check(op, op.impl(impl_name), Case(shape, layout="row_strided"), seed=7, device=device)
    assert result.passed, result.message


@pytest.mark.parametrize("op_name", OPS)
def test_writes_in_place_through_the_row_stride_and_nowhere_else(op_name):
    x, residual, weight = _inputs(op_name, (5, 300), "row_strided")
    x_base, r_base = x._base.clone(), residual._base.clone()
    want_x, want_r = _expected(op_name, x, residual, weight)
    returned = get_op(op_name).impl("kerneltrial").resolve()(x, residual, weight, 1e-6)
    assert returned is None
    _assert_matches(x, residual, want_x, want_r)
    for name, t, before in (("x", x, x_base), ("residual", residual, r_base)):
        outside = torch.ones(before.shape, dtype=torch.bool)  # the storage around the view: offset and padding
        outside.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(False)
        assert torch.equal(t._base[outside], before[outside]), f"wrote outside {name}'s view of its storage"


@pytest.mark.parametrize(
    "shape,layout,vec",
    [
        ((4, 3000), "contiguous", 8),
        ((4, 3000), "row_strided", 8),
        ((4, 1022), "contiguous", 2),
        ((4, 1001), "contiguous", 1),
        ((1, 4096), "row_strided", 8),
    ],
)
def test_vector_width_divides_the_width_and_every_row_stride(shape, layout, vec):
    x, residual, _ = _inputs("fused_add_rmsnorm", shape, layout)
    strides = (x.view(-1, shape[-1]).stride(0), residual.view(-1, shape[-1]).stride(0))
    assert fa.vector_width(x.element_size(), shape[-1], *strides) == vec


def test_cached_launches_are_keyed_on_strides_and_dtype():
    """Planted: one shape in three layouts whose vector widths differ (bf16 contiguous: 8; bf16
    rows 3001 elements apart: 1; fp32: 4). A cache keyed on the shape alone would launch all
    three with the first width, reading the strided rows at the wrong addresses."""
    gen = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(4, 3000, generator=gen).to(torch.bfloat16),
        torch.randn(4, 3001, generator=gen).to(torch.bfloat16)[:, :3000],
        torch.randn(4, 3000, generator=gen),
    ]
    plans = [fa.auto_launch(4, 3000, (t.stride(0), t.stride(0)), t.element_size(), launch.MAX_GRID) for t in tensors]
    assert [p.vec for p in plans] == [8, 1, 4]
    for x in tensors:  # through the entry point, one after the other: each result is right
        residual = torch.randn(x.shape, generator=gen).to(x.dtype)
        weight = torch.randn(3000, generator=gen).to(x.dtype)
        want_x, want_r = _expected("fused_add_rmsnorm", x, residual, weight)
        fa.fused_add_rms_norm_auto(x, residual, weight, 1e-6, gemma=False)
        _assert_matches(x, residual, want_x, want_r)


def test_refuses_a_layout_it_cannot_write_in_place():
    x, residual, weight = _inputs("fused_add_rmsnorm", (8, 8))
    with pytest.raises(ValueError, match="cannot be written in place"):
        fa.fused_add_rms_norm_auto(x.t(), residual, weight, 1e-6, gemma=False)


def launch_grids(monkeypatch) -> list[tuple[int, ...]]:
    """The grid of every launch of either kernel, recorded as it happens."""
    return record_launches(monkeypatch, fa, "_fused_add_rms_norm_rows", "_fused_add_rms_norm_wide")


def test_more_than_65535_rows_of_a_narrow_width(monkeypatch):
    """One flavour suffices: both share the launch (the Gemma flag only changes the weight)."""
    op_name = "fused_add_rmsnorm"
    grids = launch_grids(monkeypatch)
    x, residual, weight = _inputs(op_name, (70_001, 24))
    want_x, want_r = _expected(op_name, x, residual, weight)
    get_op(op_name).impl("kerneltrial").resolve()(x, residual, weight, 1e-6)  # packs 64 rows per step
    assert grids and max(g[0] for g in grids) <= launch.MAX_GRID
    _assert_matches(x, residual, want_x, want_r)


@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("impl_name", ["control", "packed_r4_w8", "persistent", "wide", "kerneltrial"])
def test_grid_stride_loop_covers_every_row_with_three_programs(op_name, impl_name, monkeypatch):
    monkeypatch.setattr(launch, "MAX_GRID", 3)
    grids = launch_grids(monkeypatch)
    x, residual, weight = _inputs(op_name, (53, 1000))  # 14 steps even at 4 rows per step
    want_x, want_r = _expected(op_name, x, residual, weight)
    get_op(op_name).impl(impl_name).resolve()(x, residual, weight, 1e-6)
    assert grids == [(3,)]
    _assert_matches(x, residual, want_x, want_r)


def _formulas(x, residual, weight, eps=1e-6) -> dict[str, torch.Tensor]:
    """The output x under each plausible rounding order."""
    stored = (x.float() + residual.float()).to(x.dtype).float()
    unrounded = x.float() + residual.float()

    def normed(s):
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)

    return {
        "rmsnorm": normed(stored).to(x.dtype) * weight,
        "rmsnorm, unrounded sum": normed(unrounded).to(x.dtype) * weight,
        "rmsnorm, fp32 weight": (normed(stored) * weight.float()).to(x.dtype),
        "gemma": (normed(stored) * (1.0 + weight.float())).to(x.dtype),
        "gemma, unrounded sum": (normed(unrounded) * (1.0 + weight.float())).to(x.dtype),
        "gemma, rounded before weight": normed(stored).to(x.dtype) * (1.0 + weight.float()).to(x.dtype),
    }


@pytest.mark.parametrize("op_name,own", [("fused_add_rmsnorm", "rmsnorm"), ("gemma_fused_add_rmsnorm", "gemma")])
def test_rounds_where_its_formula_rounds(op_name, own):
    """Bit-for-bit agreement with its own formula, clearly less with every other rounding
    order (the gate's tolerance cannot tell them apart, this test can)."""
    x, residual, weight = _inputs(op_name, (64, 1536), seed=3)
    formulas = _formulas(x, residual, weight)
    get_op(op_name).impl("kerneltrial").resolve()(x, residual, weight, 1e-6)
    same = {name: float((x == want).float().mean()) for name, want in formulas.items()}
    assert same[own] >= 0.99, same
    assert all(share <= 0.9 for name, share in same.items() if name != own), same


# ---- wrong variants the gate must reject ------------------------------------------------


def _skips_last_row(x, residual, weight, eps=1e-6):
    fa.fused_add_rms_norm_rows(x[:-1], residual[:-1], weight, eps, gemma=False)


def _forgets_the_residual(x, residual, weight, eps=1e-6):
    fa.fused_add_rms_norm_rows(x, residual.clone(), weight, eps, gemma=False)


def _gemma_by_mutating_the_weight(x, residual, weight, eps=1e-6):
    weight.add_(1.0)
    fa.fused_add_rms_norm_rows(x, residual, weight, eps, gemma=False)


def _writes_a_fresh_tensor(x, residual, weight, eps=1e-6):
    out = x.clone()
    fa.fused_add_rms_norm_rows(out, residual, weight, eps, gemma=False)
    return out


@pytest.mark.parametrize(
    "op_name,variant,message",
    [
        ("fused_add_rmsnorm", _skips_last_row, "output 0 differs from the reference"),
        ("fused_add_rmsnorm", _forgets_the_residual, "output 1 differs from the reference"),
        ("fused_add_rmsnorm", _writes_a_fresh_tensor, "output 0 "),  # x unwritten: its Inf or its values
        ("gemma_fused_add_rmsnorm", _gemma_by_mutating_the_weight, "modified its input(s) weight"),
        ("gemma_fused_add_rmsnorm", partial(fa.fused_add_rms_norm_rows, gemma=False, block_rows=2), "output 0 differs"),
    ],
    ids=["skips-last-row", "forgets-residual", "fresh-tensor", "mutates-weight", "plain-weight-for-gemma"],
)
def test_gate_rejects_wrong_variant(op_name, variant, message, device):
    op = get_op(op_name)
    result = check(op, _wrong(op_name, "wrong", variant), Case((9, 200), layout="row_strided"), seed=1, device=device)
    assert not result.passed
    assert message in result.message, result.message


def test_bytes_moved_counts_two_reads_two_writes_and_the_weight():
    assert get_op("fused_add_rmsnorm").bytes_moved(Case((4096, 2048))) == (4 * 4096 * 2048 + 2048) * 2
