"""sigmoid_gate_mul: torch rounding, both gate forms, bounded grids, and the gate rejecting wrong kernels."""

from __future__ import annotations

import pytest
import torch

from kerneltrial.ops import launch
from kerneltrial.ops import sigmoid_gate as sg
from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial.gate import check
from tests.launches import record_launches

KERNELS = ("control", "tile512_w4", "tile1024_w4", "tile2048_w8", "rowtile1024_w4", "rowtile2048_w8", "kerneltrial")
FORMS = ("contiguous", "row_gate")


@pytest.fixture
def op():
    return get_op("sigmoid_gate_mul")


@pytest.fixture
def grids(monkeypatch):
    """The grid of every launch of either kernel, recorded as it happens."""
    return record_launches(monkeypatch, sg, "_sigmoid_gate_row_tiles", "_sigmoid_gate_flat")


def as_impl(name: str, fn) -> Impl:
    return Impl(op="sigmoid_gate_mul", name=name, kind="candidate", loader=lambda: fn)


def passes(op, impl: Impl, case: Case, device) -> None:
    result = check(op, impl, case, seed=5, device=device)
    assert result.passed, f"{impl.name} on {case.id}: {result.message}"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ["control", "tile1024_w4", "rowtile1024_w4", "kerneltrial"])
def test_kernels_round_where_torch_rounds(op, name, form, device):
    """sigmoid is rounded to bf16 before the multiply, as `x * torch.sigmoid(gate)` does."""
    x, gate = op.make_inputs(Case((16, 1000), layout=form), 0, device).values()
    out = op.impl(name).resolve()(x, gate)
    reference = op.reference(x, gate)[0]
    round_once = (x.float() * torch.sigmoid(gate.float())).to(x.dtype)
    assert (out != reference).float().mean() <= 1e-3
    assert (round_once != reference).float().mean() > 0.05


@pytest.mark.parametrize("form", FORMS)
def test_tolerance_accepts_a_round_once_fp32_kernel(op, form, device):
    def fp32_to_the_store(x, gate):
        return (x.float() * torch.sigmoid(gate.float())).to(x.dtype)

    passes(op, as_impl("round_once", fp32_to_the_store), Case((8, 3000), layout=form), device)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", KERNELS)
def test_edge_shapes(op, name, form, device):
    """One row of 5120, ragged rows (1000, 3) whose flat tiles straddle row boundaries."""
    for shape in ((1, 5120), (3, 1000), (2, 2, 3)):
        passes(op, op.impl(name), Case(shape, layout=form), device)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ["tile2048_w8", "kerneltrial"])
def test_more_than_65535_narrow_rows(op, name, form, grids, device):
    passes(op, op.impl(name), Case((70000, 4), layout=form), device)
    assert grids and max(g[0] for g in grids) <= launch.MAX_GRID


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", KERNELS)
def test_grid_stride_loop_covers_every_element(op, name, form, grids, monkeypatch, device):
    monkeypatch.setattr(launch, "MAX_GRID", 3)
    passes(op, op.impl(name), Case((5, 1000), layout=form), device)  # and the extra shapes the gate draws
    assert (3,) in grids and max(g[0] for g in grids) <= 3


def test_row_gate_broadcasts_one_gate_over_its_row(device):
    """Rows gated near 1 and near 0 alternate: an element gated by a neighbouring row's gate shows."""
    x = torch.ones(6, 700, dtype=torch.bfloat16, device=device)
    gate = torch.tensor([[30.0], [-30.0]] * 3, dtype=torch.bfloat16, device=device)
    expected = torch.tensor([1.0, 0.0] * 3, dtype=torch.bfloat16, device=device)[:, None].expand(6, 700)
    for name in KERNELS:
        out = get_op("sigmoid_gate_mul").impl(name).resolve()(x, gate)
        assert torch.allclose(out, expected, atol=1e-12), name


def test_gate_of_another_shape_is_rejected(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="gate must have x's shape"):
        sg.sigmoid_gate_auto(x, torch.randn(4, 2, device=device))


def test_bytes_moved_per_form(op):
    assert op.bytes_moved(Case((1000, 3000))) == 3 * 3_000_000 * 2
    assert op.bytes_moved(Case((1000, 3000), layout="row_gate")) == (2 * 3_000_000 + 1000) * 2


# ---- deliberately wrong kernels the gate must reject ----------------------------------


def skips_last_element(x, gate):
    y = torch.empty_like(x)
    sg._sigmoid_gate_flat[(1,)](x, gate, y, x.numel() - 1, BLOCK=1024, ROW_GATE=False, ROW_WIDTH=1)
    return y


def gates_with_the_next_row(x, gate):
    return sg.sigmoid_gate_flat(x, gate.roll(-1, dims=0), block=1024, num_warps=4)


def writes_into_its_input(x, gate):
    sg._sigmoid_gate_flat[(1,)](x, gate, x, x.numel(), BLOCK=1024, ROW_GATE=False, ROW_WIDTH=1)
    return x.clone()


@pytest.mark.parametrize(
    "wrong,form,message",
    [
        (skips_last_element, "contiguous", "NaN element(s)"),
        (gates_with_the_next_row, "row_gate", "differs from the reference"),
        (writes_into_its_input, "contiguous", "modified its input(s) x"),
    ],
)
def test_gate_rejects_wrong_kernels(op, wrong, form, message, device):
    result = check(op, as_impl(wrong.__name__, wrong), Case((4, 300), layout=form), seed=0, device=device)
    assert not result.passed and message in result.message
