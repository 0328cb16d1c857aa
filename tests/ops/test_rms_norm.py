"""RMSNorm specifics: the dispatcher's measured rules, > 65535 rows, the grid-stride loop."""

from __future__ import annotations

import pytest

from kerneltrial.ops import launch
from kerneltrial.ops import rms_norm as rn
from kerneltrial.ops.registry import Case, get_op
from kerneltrial.trial.gate import check


@pytest.mark.parametrize(
    "n,expected",
    [
        (300, ("rows", 4, 4)),
        (1024, ("rows", 2, 4)),
        (2048, ("rows", 1, 4)),
        (4096, ("rows", 1, 4)),
        (5120, ("rows", 1, 8)),
        (14336, ("rows", 1, 8)),
        (16384, ("rows", 1, 8)),
        (16385, ("wide", None, None)),
    ],
)
def test_dispatcher_rules(n, expected):
    """(kernel, rows per step, warps): narrow rows packed to DISPATCH.pack_to elements, 4 or 8 warps."""
    plan = rn.auto_launch(2, n, launch.MAX_GRID)
    assert (("wide", None, None) if plan.wide else ("rows", plan.block_rows, plan.num_warps)) == expected
    if plan.wide:
        assert (plan.block_n, plan.num_warps) == (rn.DISPATCH.wide.chunk, 8)


def test_more_than_65535_rows(device):
    """Row indices beyond 65535 through the entry point (256 rows per step at this width, so
    the interpreter runs 257 programs; the grid cap itself is exercised with MAX_GRID = 3 below)."""
    op = get_op("rmsnorm")
    result = check(op, op.impl("kerneltrial"), Case((65600, 8)), seed=0, device=device, thorough=False)
    assert result.passed, result.message


@pytest.mark.parametrize("name", ["control", "packed_r4_w4", "wide", "kerneltrial"])
def test_grid_stride_loop_covers_every_row(monkeypatch, name, device):
    monkeypatch.setattr(launch, "MAX_GRID", 3)
    for op_name in ("rmsnorm", "rmsnorm_fp32"):
        op = get_op(op_name)
        result = check(op, op.impl(name), Case((11, 300), layout="row_strided"), seed=1, device=device)
        assert result.passed, f"{op_name}/{name}: {result.message}"
