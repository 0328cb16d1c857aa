"""Peers: torch.compile passes the gate (compiled once, outside the checked call); missing
peers are skipped with a reason, never an error."""

from __future__ import annotations

import pytest
import torch

from kerneltrial.ops.registry import Case, get_op
from kerneltrial.trial.gate import check


@pytest.mark.slow
def test_torch_compile_peer_passes_the_gate(device):
    op = get_op("rmsnorm")
    result = check(op, op.impl("torch_compile"), Case((4, 64)), seed=0, device=device)
    assert result.passed, result.message


@pytest.mark.skipif(torch.cuda.is_available(), reason="peers that need CUDA are available on a GPU")
@pytest.mark.parametrize("peer", ["liger", "flaggems"])
def test_missing_peer_is_skipped_with_a_reason(peer):
    impl = get_op("rmsnorm").impl(peer)
    assert not impl.available
    assert impl.reason
    result = check(get_op("rmsnorm"), impl, Case((2, 32)), seed=0, device=torch.device("cpu"))
    assert not result.passed and result.message.startswith("unavailable:")
