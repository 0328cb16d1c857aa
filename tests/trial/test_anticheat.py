"""Planted defects a fast-looking wrong kernel could hide behind; the gate names each one."""

from __future__ import annotations

import threading

import torch

from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial import gate

OP = get_op("rmsnorm")
CASE = Case((4, 96))


def reference(x, weight, eps=1e-6):
    return OP.reference(x, weight, eps)[0]


def run(fn) -> gate.CheckResult:
    return gate.check(
        OP, Impl(op=OP.name, name="planted", kind="user", loader=lambda: fn), CASE, seed=3, device=torch.device("cpu")
    )


def test_correct_kernel_passes_all_anticheat_calls():
    assert run(reference).passed


def test_cache_keyed_on_shape_is_caught():
    cache = {}

    def cached(x, weight, eps=1e-6):
        return cache.setdefault(tuple(x.shape), reference(x, weight, eps)).clone()

    result = run(cached)
    # The gate's warm-up calls run on other values, so the cache is already stale at the checked call.
    assert not result.passed and "differs from the reference" in result.message


def test_cache_keyed_on_pointer_is_caught():
    cache = {}

    def cached(x, weight, eps=1e-6):
        return cache.setdefault(x.data_ptr(), reference(x, weight, eps)).clone()

    result = run(cached)
    # Caught at the checked call when the allocator hands its inputs an address a warm-up call
    # (on other values) used, else when new values land in the same buffers.
    assert not result.passed and ("stale result" in result.message or "differs from the reference" in result.message)


def test_nondeterminism_is_caught():
    def noisy(x, weight, eps=1e-6):
        y = reference(x, weight, eps).float()
        return (y * (1 + 0.006 * torch.rand_like(y))).to(x.dtype)  # within tolerance, different each call

    result = run(noisy)
    assert not result.passed and "non-deterministic" in result.message


def test_returning_before_the_result_is_ready_is_caught():
    """Work finished later (here by a thread, on a GPU by a side stream) is not there when read."""
    threads = []

    def late(x, weight, eps=1e-6):
        out = torch.empty(x.shape, dtype=x.dtype)
        done = reference(x, weight, eps)
        t = threading.Timer(0.2, lambda: out.copy_(done))
        t.start()
        threads.append(t)
        return out

    result = run(late)
    for t in threads:
        t.join()
    assert not result.passed and "not finished" in result.message


def test_returning_the_references_output_is_caught(monkeypatch):
    stash = {}
    original = OP.reference

    def spying_reference(*args):
        stash["out"] = original(*args)
        return stash["out"]

    monkeypatch.setattr(OP, "reference", spying_reference)
    result = run(lambda x, weight, eps=1e-6: stash["out"][0])
    assert not result.passed and "reference's own output" in result.message


def test_output_aliasing_an_input_is_named():
    x = torch.randn(4, 8)
    message = gate.aliasing(OP, (x[:, :4],), {"x": x, "weight": torch.randn(8), "eps": 1e-6}, (torch.randn(4, 4),))
    assert "shares memory with input 'x'" in message


def test_inf_where_reference_is_finite_is_named():
    def overflow(x, weight, eps=1e-6):
        y = reference(x, weight, eps)
        y.view(-1)[5] = float("inf")
        return y

    result = run(overflow)
    assert not result.passed and "Inf element" in result.message
