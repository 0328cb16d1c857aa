"""Timing backends: how one sample (`calls` calls of one arm) becomes a number of nanoseconds.

- `cuda-events`: CUDA events on the current stream. Hot L2: one event pair around `calls`
  back-to-back calls. Cold L2: before every call a buffer twice the L2 size is written
  (evicting the inputs), and only the call itself is inside its event pair; the sample is
  the sum over the calls. Before a sample the GPU is given a spin kernel (`_lead`) long
  enough for the host to enqueue the whole sample behind it, so the events time the
  device, not the host's launch overhead (an idle GPU waiting for a Python launch would
  otherwise count that wait as kernel time). An event recorded after the spin tells
  whether the spin had already ended when the host finished enqueuing the sample: then
  the GPU may have waited on the host inside a timed call, so the sample is taken again
  with a lead twice as long (`next_lead`), and the longer lead is kept for later samples;
  a sample that still falls behind at the longest lead (LEAD_CYCLES_MAX) is kept and counted.
  Without this check, arms with a heavy Python wrapper showed a second, slow mode of
  2-4x their kernel time (results/h200/softcap_row_argmax-r3, docs/NOTES.md).
- `cuda-graph`: the `calls` calls captured once into a CUDA graph, its replay timed with
  events: launch overhead removed, hot L2. Reported as such.
- `host-clock`: `time.perf_counter_ns` around the calls, for the Triton interpreter on a
  CPU. Its figures describe the interpreter, never GPU performance.

A sample may carry a `before_last` hook: it runs before the last call, outside every timed
interval (cold: before that call's flush; hot and graph: between two event pairs whose times
are summed). The runner uses it to write the values whose result it checks (runner.TimedArm).
"""

from __future__ import annotations

import time
from statistics import median
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Call = Callable[[], object]

LEAD_CYCLES_PER_CALL = 200_000  # ~100 us of host time per call at ~2 GHz: covers a Python launch
LEAD_CYCLES_MAX = 200_000_000  # ~100 ms: the longest spin a sample may start with


@dataclass(frozen=True)
class Part:
    """`calls` back-to-back calls of `call`, after `before` (untimed) when given."""

    call: Call
    calls: int
    before: Call | None = None

    def prepare(self) -> None:
        if self.before is not None:
            self.before()


@dataclass
class Timer:
    """A backend: `sample(call, calls)` returns the nanoseconds `calls` calls took."""

    name: str
    is_gpu: bool
    cold: bool
    _flush: torch.Tensor | None = field(default=None, repr=False)
    _graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict, repr=False)
    lead_cycles_per_call: int = LEAD_CYCLES_PER_CALL
    retaken: int = 0  # samples taken again because the host fell behind the GPU
    kept_behind: int = 0  # samples kept although the host fell behind (the lead was at its cap)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.add_(1)

    def sample(self, call: Call, calls: int, key: int = 0, before_last: Call | None = None) -> int:
        """Nanoseconds `calls` calls of `call` took; `before_last` runs untimed before the last."""
        parts = [Part(call, calls)] if before_last is None else [Part(call, calls - 1), Part(call, 1, before_last)]
        parts = [p for p in parts if p.calls > 0]
        if self.name == "host-clock":
            return self._host(parts)
        if self.name == "cuda-graph":
            parts = [Part(self._graph(p.call, p.calls, hash((key, p.calls))), 1, p.before) for p in parts]
        measure = self._events_cold if self.cold else self._events_hot
        calls = sum(p.calls for p in parts)
        while True:
            ns, host_behind = measure(parts, calls)
            longer = next_lead(self.lead_cycles_per_call, calls, host_behind)
            if longer is None:
                self.kept_behind += host_behind
                return ns
            self.lead_cycles_per_call = longer
            self.retaken += 1

    def _host(self, parts: list[Part]) -> int:
        total = 0
        for part in parts:
            part.prepare()
            start = time.perf_counter_ns()
            for _ in range(part.calls):
                part.call()
            total += time.perf_counter_ns() - start
        return total

    def _lead(self, calls: int) -> torch.cuda.Event:
        """Keep the GPU busy while the host enqueues `calls` calls; returns an event that
        completes when the spin ends."""
        torch.cuda._sleep(min(LEAD_CYCLES_MAX, self.lead_cycles_per_call * calls))
        done = torch.cuda.Event()
        done.record()
        return done

    def _events_hot(self, parts: list[Part], calls: int) -> tuple[int, bool]:
        """One event pair per part around its back-to-back calls."""
        lead = self._lead(calls)
        pairs = []
        for part in parts:
            part.prepare()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(part.calls):
                part.call()
            end.record()
            pairs.append((start, end))
        host_behind = lead.query()  # the spin ended before the host had enqueued everything
        pairs[-1][1].synchronize()
        return round(sum(s.elapsed_time(e) for s, e in pairs) * 1e6), host_behind

    def _events_cold(self, parts: list[Part], calls: int) -> tuple[int, bool]:
        """One event pair per call, each after a flush of the L2."""
        lead = self._lead(calls)
        pairs = []
        for part in parts:
            part.prepare()
            for _ in range(part.calls):
                self.flush()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                part.call()
                end.record()
                pairs.append((start, end))
        host_behind = lead.query()
        pairs[-1][1].synchronize()
        return round(sum(s.elapsed_time(e) for s, e in pairs) * 1e6), host_behind

    def _graph(self, call: Call, calls: int, key: int) -> Call:
        """The replay of `calls` calls captured into a CUDA graph (captured once per key)."""
        graph = self._graphs.get(key)
        if graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call()  # warm the allocator on the capture stream
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    call()
            self._graphs[key] = graph
        return graph.replay

    def release(self) -> None:
        """Drop captured graphs (they pin their inputs) before the next case."""
        self._graphs.clear()


def next_lead(cycles_per_call: int, calls: int, host_behind: bool) -> int | None:
    """The longer per-call lead to take a sample again with, or None to keep the sample:
    kept when the host stayed ahead, or when the lead is already at LEAD_CYCLES_MAX."""
    if not host_behind or cycles_per_call * calls >= LEAD_CYCLES_MAX:
        return None
    return 2 * cycles_per_call


def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20))


def make_timer(backend: str, l2: str) -> Timer:
    """The backend a protocol asks for; `auto` picks CUDA events on a GPU, else the host clock."""
    gpu = torch.cuda.is_available() and not _interpreted()
    if backend == "auto":
        backend = "cuda-events" if gpu else "host-clock"
    if backend != "host-clock" and not gpu:
        raise ValueError(f"backend {backend!r} needs a CUDA GPU; none is visible here (use backend = 'auto' or 'host-clock')")
    if backend == "cuda-graph" and l2 == "cold":
        raise ValueError("backend 'cuda-graph' times replays on a hot L2; set l2 = 'hot' in the protocol")
    timer = Timer(name=backend, is_gpu=gpu, cold=(l2 == "cold"))
    if gpu and timer.cold:
        timer._flush = torch.empty(2 * l2_bytes() // 4, dtype=torch.float32, device="cuda")
    return timer


def _interpreted() -> bool:
    from kerneltrial.ops.launch import interpreted

    return interpreted()


def label(timer: Timer) -> str:
    if not timer.is_gpu:
        return "host clock, Triton interpreter on a CPU: NOT GPU performance"
    if timer.name == "cuda-graph":
        return "CUDA graph replay, hot L2 (launch overhead removed)"
    return f"CUDA events, {'cold' if timer.cold else 'hot'} L2"


def calls_for(timer: Timer, call: Call, target_ns: float, limit: int = 1000) -> int:
    """Calls per sample so a sample lasts about `target_ns` (at least one call)."""
    single = median([timer.sample(call, 1) for _ in range(3)])
    return max(1, min(limit, round(target_ns / max(single, 1.0))))
