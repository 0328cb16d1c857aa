"""Peers: torch.compile passes the gate (compiled once, outside the checked call); missing
peers are skipped with a reason, never an error."""

from __future__ import annotations

import pytest
import torch

from kerneltrial.ops.peers import compiled
from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial.gate import check


@pytest.mark.slow
def test_a_torch_compiled_arm_passes_the_gate(device):
    """Compiled outside the poisoned call (the gate's warm-up), dynamo traces cleanly."""
    op = get_op("rmsnorm")

    def eager(x, weight, eps=1e-6):
        return op.reference(x, weight, eps)[0]

    impl = Impl(op=op.name, name="compiled", kind="peer", loader=compiled(eager, require_gpu=False))
    result = check(op, impl, Case((4, 64)), seed=0, device=device)
    assert result.passed, result.message


@pytest.mark.skipif(torch.cuda.is_available(), reason="peers that need CUDA are available on a GPU")
@pytest.mark.parametrize("peer", ["liger", "flaggems", "torch_compile"])
def test_missing_peer_is_skipped_with_a_reason(peer):
    impl = get_op("rmsnorm").impl(peer)
    assert not impl.available
    assert impl.reason
    result = check(get_op("rmsnorm"), impl, Case((2, 32)), seed=0, device=torch.device("cpu"))
    assert not result.passed and result.message.startswith("unavailable:")


def test_a_compiled_peer_never_falls_back_to_eager_after_eight_shapes():
    """Dynamo's default recompile limit (8) silently ran eager code from the ninth shape on."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    fn = compiled(lambda x: x * 2, require_gpu=False, backend="eager")()
    torch._dynamo.reset()
    counters.clear()
    for n in range(1, 13):
        assert torch.equal(fn(torch.ones(n)), torch.full((n,), 2.0))
    assert counters["stats"]["unique_graphs"] == 12  # one graph per shape, none run eagerly
