"""Graph mode: each arm's call of a case captured once in a CUDA graph and replayed, as vLLM
serves decode (issue 27, item 1).

A case's arms share its static buffers: the token ids (and, in decode, the cache position)
that every replay reads, and the static KV cache it writes. A timed call copies the call's
fresh inputs into those buffers and replays the arm's graph; its logits land in the graph's
static output. Capture follows vLLM's recipe: a few eager calls on a side stream (Triton's
and inductor's compilation, cuBLAS's handles), then one call under `torch.cuda.graph`, every
graph of a case in one memory pool (one replays at a time, its output read before the next).
An arm whose call cannot be captured (a host synchronisation such as `.item()`, a
host-to-device copy, an allocation the capture refuses) raises `CaptureFailed` with the
reason; the runner records it and leaves the arm out of that case.

On a CPU there is no CUDA graph. `IdentityGraph` stands in, so that the runner's capture,
replay, check and record paths run in the CPU tests: its "replay" calls the captured
function again and copies the result into the output of the first call. It is not a graph:
Python runs on every replay (a CUDA graph replays only the kernels its capture launched), so
it proves the bookkeeping, never what capture freezes; tests/model/test_graph_cuda.py
covers that where CUDA exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

WARMUP_CALLS = 3  # eager calls before capture, as vLLM's warm-up: compile and allocate outside the graph


class CaptureFailed(RuntimeError):
    """An arm's call that cannot be captured in a CUDA graph; the message is the reason."""


class Graph(Protocol):
    def replay(self) -> None: ...


@dataclass
class IdentityGraph:
    """The CPU stand-in: replay runs `fn` again and writes its result into `output`."""

    fn: Callable[[], torch.Tensor]
    output: torch.Tensor

    def replay(self) -> None:
        self.output.copy_(self.fn())


@dataclass
class Captured:
    """One arm's graph of one case and its static output (valid until the next replay of any
    graph of the case)."""

    graph: Graph
    output: torch.Tensor
    calls: int  # how many times capturing ran the call (its warm-up and the captured call)


def new_pool(device: torch.device) -> Any:
    """The memory pool a case's graphs share (None on a CPU)."""
    return torch.cuda.graph_pool_handle() if device.type == "cuda" else None


def capture(fn: Callable[[], torch.Tensor], device: torch.device, pool: Any) -> Captured:
    """`fn` (one call on the case's static buffers) captured after WARMUP_CALLS eager calls.
    The caller restores whatever those calls wrote (the KV cache). After a CaptureFailed the
    pool is spent: capture the next arm into a `new_pool`."""
    try:
        return _cuda_capture(fn, device, pool) if device.type == "cuda" else _identity(fn)
    except Exception as exc:  # an arm may raise anything while captured; the reason is what matters
        if device.type == "cuda":
            _recover(device)
        raise CaptureFailed(f"cannot be captured in a CUDA graph: {type(exc).__name__}: {_first_line(exc)}") from exc


def _identity(fn: Callable[[], torch.Tensor]) -> Captured:
    graph = IdentityGraph(fn, fn().clone())
    return Captured(graph, graph.output, calls=1)


def _cuda_capture(fn: Callable[[], torch.Tensor], device: torch.device, pool: Any) -> Captured:
    """vLLM's recipe with torch's capture calls made by hand: `torch.cuda.graph` leaves the
    capture stream current and the pool recording when its capture_end raises (as it does
    after an arm's host synchronisation), and every later capture then fails."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            fn()
    current.wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream(device)):  # left on every path
        graph.capture_begin(pool=pool)
        try:
            output = fn()
        except BaseException:
            _end_failed(graph, device, pool)
            raise
        try:
            graph.capture_end()
        except BaseException:
            _release(device, pool)
            raise
    return Captured(graph, output, calls=WARMUP_CALLS + 1)


def _end_failed(graph: torch.cuda.CUDAGraph, device: torch.device, pool: Any) -> None:
    """End a capture the call broke: the stream leaves capture mode; a capture_end that raises
    (an invalidated capture) leaves the pool recording, so release it."""
    try:
        graph.capture_end()
    except RuntimeError:
        _release(device, pool)


def _release(device: torch.device, pool: Any) -> None:
    """What CUDAGraph.capture_end skips when cudaStreamEndCapture fails: stop routing the
    capture's allocations to the pool and drop its reference (torch's private calls, as
    torch.cuda.memory.use_mem_pool makes them)."""
    try:
        torch._C._cuda_endAllocateToPool(device.index or 0, pool)
        torch._C._cuda_releasePool(device.index or 0, pool)
    except (AttributeError, RuntimeError):
        pass  # another torch: the pool stays spent, and the runner moves on to a new one


def _recover(device: torch.device) -> None:
    """After a failed capture: the stream must accept work again (a capture left open would
    poison every later launch); a device error that survives this is not the arm's alone."""
    try:
        torch.cuda.synchronize(device)
    except RuntimeError as exc:
        raise RuntimeError(f"the device did not recover from a failed CUDA graph capture: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
