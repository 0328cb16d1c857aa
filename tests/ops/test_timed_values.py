"""A timed sample keeps its seed's scalar arguments (eps, cap) for every call (trial/timed.py
`Unit`); each call's tensors must be drawn for those scalars where the values depend on them
(`Operator.values_with`, `inputs.kept`). Planted: an operator without `values_for`, whose value
sets are placed for their own drawn scalars (the defect the frozen softcap panel exposed, and
the normalisations' eps rows)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from kerneltrial.ops import rms_norm as rn
from kerneltrial.ops.registry import Case, Impl, Operator, all_ops, get_op
from kerneltrial.trial.gate import check
from kerneltrial.trial.timed import Unit

CPU = torch.device("cpu")
NORMS = {  # operator: (a case with enough rows for every special row, its normalised input)
    "rmsnorm": (Case((8, 512)), "x"),
    "fused_add_rmsnorm": (Case((8, 512)), "x"),
    "zimage_qk_rmsnorm": (Case((4, 2, 128)), "x"),
    "zimage_qk_rmsnorm_pair": (Case((4, 2, 128)), "k"),
}


def has_eps_row(values: dict, name: str, eps: float) -> bool:
    """Whether a row of `values[name]` has an rms within 4x of sqrt(eps) (the EPS_SCALE row)."""
    x = values[name].float().reshape(-1, values[name].shape[-1])
    rms = x.pow(2).mean(-1).sqrt()
    return bool(((rms > math.sqrt(eps) / 4) & (rms < math.sqrt(eps) * 4)).any())


def eps_rows(op: Operator, case: Case, name: str, seed: int) -> tuple[int, int]:
    """(value sets with an eps row for the kept eps, value sets) of 8 timed calls."""
    eps = op.make_inputs(case, seed, CPU)["eps"]
    unit = Unit.draw(op, case, seed=seed, round_index=0, calls=8, device=CPU)
    assert {v["eps"] for v in unit.pool} == {eps}
    return sum(has_eps_row(v, name, eps) for v in unit.pool), len(unit.pool)


@pytest.mark.parametrize("name", sorted(NORMS))
def test_every_timed_value_set_has_an_eps_row_for_the_eps_it_runs_with(name: str) -> None:
    op = get_op(name)
    case, tensor = NORMS[name]
    found = [eps_rows(op, case, tensor, seed) for seed in range(4)]
    assert all(hit == total for hit, total in found), found
    planted = [eps_rows(replace(op, values_for=None), case, tensor, seed) for seed in range(4)]
    assert sum(hit for hit, _ in planted) < sum(total for _, total in planted), planted


@pytest.mark.parametrize("name", sorted(op.name for op in all_ops()))
def test_a_draw_with_its_own_scalars_is_make_inputs(name: str) -> None:
    """values_with(case, seed, make_inputs' own scalars) is make_inputs(case, seed), bit for bit:
    taking the scalars changes no draw of the stream."""
    op = get_op(name)
    case = op.small_cases[0]
    for seed in (0, 3):
        drawn = op.make_inputs(case, seed, CPU)
        scalars = {k: v for k, v in drawn.items() if not isinstance(v, torch.Tensor)}
        again = op.values_with(case, seed, CPU, scalars)
        assert list(again) == list(drawn)
        for key, value in drawn.items():
            same = torch.equal(again[key], value) if isinstance(value, torch.Tensor) else again[key] == value
            assert same, (name, seed, key)


def test_an_arm_that_raises_on_an_extra_shape_is_named_with_that_shape() -> None:
    """The SGLang kernels raise on hidden sizes they decline ("unsupported hidden_size=896"): the
    gate's message says on which drawn shape, as it does for a wrong result there."""
    case = Case((4, 64))

    def declines_other_widths(x, weight, eps=1e-6):
        if x.shape[-1] != case.shape[-1]:
            raise RuntimeError(f"unsupported hidden_size={x.shape[-1]}")
        return rn.reference_rmsnorm(x, weight, eps)[0]

    arm = Impl(op="rmsnorm", name="narrow", kind="user", loader=lambda: declines_other_widths)
    result = check(get_op("rmsnorm"), arm, case, seed=0, device=CPU)
    assert not result.passed
    assert result.message.startswith("at the drawn shape "), result.message
    assert ": raised RuntimeError: unsupported hidden_size=" in result.message
