"""silu_and_mul: vLLM rounding, edge shapes, bounded grids, in-place reads, and the gate rejecting wrong kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerneltrial.ops import launch
from kerneltrial.ops import silu_and_mul as sam
from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial.gate import check
from tests.launches import LaunchRecorder

KERNELS = ("control", "packed_r4_w4", "packed_r16_w4", "tile1024_w4", "tile2048_w4", "tile2048_w8", "kerneltrial")


@pytest.fixture
def op():
    return get_op("silu_and_mul")


@pytest.fixture
def launches(monkeypatch):
    """Every launch of the kernel as (grid, positional args), recorded as it happens."""
    recorder = LaunchRecorder(sam._silu_and_mul_tiles)
    monkeypatch.setattr(sam, "_silu_and_mul_tiles", recorder)
    return recorder


def as_impl(name: str, fn) -> Impl:
    return Impl(op="silu_and_mul", name=name, kind="candidate", loader=lambda: fn)


def passes(op, impl: Impl, case: Case, device) -> None:
    result = check(op, impl, case, seed=3, device=device)
    assert result.passed, f"{impl.name} on {case.id}: {result.message}"


@pytest.mark.parametrize("name", ["control", "tile1024_w4", "kerneltrial"])
def test_kernels_round_where_vllm_rounds(op, name, device):
    """silu is rounded to bf16 before the multiply, as in vLLM; a round-once result differs often."""
    x = op.make_inputs(Case((16, 3072), layout="row_strided"), 0, device)["x"]
    out = op.impl(name).resolve()(x)
    reference = op.reference(x)[0]
    round_once = (F.silu(x[:, :1536].float()) * x[:, 1536:].float()).to(x.dtype)
    assert (out != reference).float().mean() <= 1e-3
    assert (round_once != reference).float().mean() > 0.1


def test_tolerance_accepts_a_round_once_fp32_kernel(op, device):
    def fp32_to_the_store(x):
        d = x.shape[-1] // 2
        return (F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)

    for layout in op.layouts:
        passes(op, as_impl("round_once", fp32_to_the_store), Case((8, 3072), layout=layout), device)


@pytest.mark.parametrize("shape", [(1, 10240), (3, 3074), (2, 2, 2 * 1537)])
@pytest.mark.parametrize("name", KERNELS)
def test_edge_shapes(op, name, shape, device):
    """One row, d = 5120, and odd non-power-of-two d (1537 in three dimensions), in both layouts."""
    for layout in op.layouts:
        passes(op, op.impl(name), Case(shape, layout=layout), device)


def test_more_than_65535_rows_through_the_packed_dispatcher(op, launches, device):
    passes(op, op.impl("kerneltrial"), Case((70000, 8)), device)
    assert any(args[2] == 70000 for _, args in launches), "the dispatcher launched no kernel over the 70000 rows"
    assert all(grid[0] <= launch.MAX_GRID for grid, _ in launches)  # also the extra shapes the gate draws


@pytest.mark.parametrize("name", KERNELS)
def test_grid_stride_loop_covers_every_row_and_tile(op, name, launches, monkeypatch, device):
    monkeypatch.setattr(launch, "MAX_GRID", 3)
    passes(op, op.impl(name), Case((9, 5000), layout="row_strided"), device)
    grids = {grid for grid, _ in launches}  # the gate's 1-D extra shape is one row: one program
    assert (3,) in grids and all(grid[0] <= 3 for grid in grids), grids


def test_row_strided_input_is_read_in_place(op, launches, device):
    x = op.make_inputs(Case((2, 3, 200), layout="row_strided"), 0, device)["x"]
    sam.silu_and_mul_auto(x)
    ((_, args),) = launches
    assert args[0].data_ptr() == x.data_ptr() and args[4] == x.stride(-2) > 200


def test_output_is_fresh_contiguous_of_half_width(device):
    x = torch.randn(2, 3, 64, device=device, dtype=torch.bfloat16)
    out = sam.silu_and_mul_auto(x)
    assert out.shape == (2, 3, 32) and out.is_contiguous() and out.data_ptr() != x.data_ptr()


def test_odd_width_is_rejected(device):
    with pytest.raises(ValueError, match="even last dimension"):
        sam.silu_and_mul_tiles(torch.randn(4, 7, device=device))


def test_flaggems_adapter_passes_the_gate_and_up_halves(op, device):
    x = op.make_inputs(Case((3, 10)), 0, device)["x"]
    adapted = sam.flaggems_halves(lambda a, b: F.silu(a) * b)
    assert torch.equal(adapted(x), op.reference(x)[0])


def test_bytes_moved_reads_2d_and_writes_d_per_row(op):
    assert op.bytes_moved(Case((4096, 12288))) == 4096 * (12288 + 6144) * 2


# ---- deliberately wrong kernels the gate must reject ----------------------------------


def skips_last_row(x):
    rows = x.reshape(-1, x.shape[-1])
    n, d = rows.shape[0], rows.shape[1] // 2
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    sam._silu_and_mul_tiles[(1,)](
        rows, y, n - 1, d, rows.stride(0), y.stride(0), BLOCK_ROWS=1, BLOCK_D=launch.next_pow2(d)
    )
    return y


def swaps_gate_and_up(x):
    d = x.shape[-1] // 2
    return sam.silu_and_mul_tiles(torch.cat([x[..., d:], x[..., :d]], dim=-1))


def writes_into_its_input(x):
    rows = x.reshape(-1, x.shape[-1])
    n, d = rows.shape[0], rows.shape[1] // 2
    up = rows[:, d:]
    sam._silu_and_mul_tiles[(n,)](
        rows, up, n, d, rows.stride(0), up.stride(0), BLOCK_ROWS=1, BLOCK_D=launch.next_pow2(d)
    )
    return up.clone()


@pytest.mark.parametrize(
    "wrong,message",
    [
        (skips_last_row, "NaN element(s)"),
        (swaps_gate_and_up, "differs from the reference"),
        (writes_into_its_input, "modified its input(s) x"),
    ],
)
def test_gate_rejects_wrong_kernels(op, wrong, message, device):
    result = check(op, as_impl(wrong.__name__, wrong), Case((4, 200)), seed=0, device=device)
    assert not result.passed and message in result.message
