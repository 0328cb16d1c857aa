"""Every operator x implementation x layout passes the correctness gate on its small cases."""

from __future__ import annotations

import pytest

from kerneltrial.ops.registry import Case, all_ops
from kerneltrial.trial.gate import check

SKIP_PEERS = {"torch_compile"}  # compiled on first use per shape: covered once in test_peers.py


def _params():
    for op in all_ops():
        for impl in op.impls.values():
            if impl.name in SKIP_PEERS:
                continue
            for layout in op.layouts:
                yield pytest.param(op.name, impl.name, layout, id=f"{op.name}-{impl.name}-{layout}")


@pytest.mark.parametrize("op_name,impl_name,layout", list(_params()))
def test_gate_passes(op_name, impl_name, layout, device):
    op = next(o for o in all_ops() if o.name == op_name)
    impl = op.impl(impl_name)
    if not impl.available:
        pytest.skip(impl.reason)
    cases = [Case(c.shape, c.dtype, layout) for c in op.small_cases]
    cases = [c for c in cases if impl.supports(c)]
    assert cases, f"{op_name}/{impl_name} supports none of the small cases in layout {layout}"
    for seed, case in enumerate(cases):  # seeds 0, 1, 2, ...: a drawn eps each (inputs.draw_eps)
        # the anti-cheat calls and the drawn extra shapes once per arm and layout (tests/trial covers
        # each of them); every small case is checked on its own fresh inputs
        result = check(op, impl, case, seed=seed, device=device, thorough=seed == 0)
        assert result.passed, f"{case.id}: {result.message}"
