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
  2-4x their kernel time (results/archive/h200/softcap_row_argmax-r3, docs/NOTES.md).
- `cuda-graph`: the `calls` calls captured once into a CUDA graph, its replay timed with
  events: launch overhead removed, hot L2. Reported as such.
- `host-clock`: `time.perf_counter_ns` around the calls, for the Triton interpreter on a
  CPU. Its figures describe the interpreter, never GPU performance.

Host cost (`host_sample`, the runner's host stage) is not a backend: the host clock around
back-to-back calls with nothing synchronised inside, so it measures how long the caller is
blocked per call, whatever the backend of the run.

A sample may carry per-call hooks (`Hooks`): `before(j)` and `after(j)` run around call j,
outside every timed interval. Each call then has its own event pair (hot L2 too: the inputs
`before` just wrote are in L2), and under `cuda-graph` each call is one replay of a graph of
one call. The runner writes fresh values before every call and keeps one call's result for
its check (trial/timed.py).

The module imports nothing of kerneltrial at its top: an isolated worker (trial/worker.py)
loads it by its path and times its arm with the same `Timer` (`timer_for`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

import torch

Call = Callable[[], object]

LEAD_CYCLES_PER_CALL = 200_000  # ~100 us of host time per call at ~2 GHz: covers a Python launch
LEAD_CYCLES_MAX = 200_000_000  # ~100 ms: the longest spin a sample may start with


@dataclass(frozen=True)
class Hooks:
    """Untimed work around each call j of a sample: `before(j)`, the call, `after(j)`."""

    before: Callable[[int], None]
    after: Callable[[int], None]


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

    def sample(self, call: Call, calls: int, key: int = 0, hooks: Hooks | None = None) -> int:
        """Nanoseconds `calls` calls of `call` took; `hooks` run untimed around each call."""
        if self.name == "host-clock":
            return self._host(call, calls, hooks)
        if self.name == "cuda-graph":
            call = self._graph(call, 1 if hooks else calls, key)
            calls_timed = calls if hooks else 1
        else:
            calls_timed = calls
        measure = self._events_cold if self.cold or hooks else self._events_hot
        while True:
            ns, host_behind = measure(call, calls_timed, hooks)
            longer = next_lead(self.lead_cycles_per_call, calls_timed, host_behind)
            if longer is None:
                self.kept_behind += host_behind
                return ns
            self.lead_cycles_per_call = longer
            self.retaken += 1

    def _host(self, call: Call, calls: int, hooks: Hooks | None) -> int:
        if hooks is None:
            start = time.perf_counter_ns()
            for _ in range(calls):
                call()
            return time.perf_counter_ns() - start
        total = 0
        for j in range(calls):
            hooks.before(j)
            start = time.perf_counter_ns()
            call()
            total += time.perf_counter_ns() - start
            hooks.after(j)
        return total

    def _lead(self, calls: int) -> torch.cuda.Event:
        """Keep the GPU busy while the host enqueues `calls` calls; returns an event that
        completes when the spin ends."""
        torch.cuda._sleep(min(LEAD_CYCLES_MAX, self.lead_cycles_per_call * calls))
        done = torch.cuda.Event()
        done.record()
        return done

    def _events_hot(self, call: Call, calls: int, hooks: Hooks | None = None) -> tuple[int, bool]:
        """One event pair around `calls` back-to-back calls."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        lead = self._lead(calls)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        host_behind = lead.query()  # the spin ended before the host had enqueued everything
        end.synchronize()
        return round(start.elapsed_time(end) * 1e6), host_behind

    def _events_cold(self, call: Call, calls: int, hooks: Hooks | None = None) -> tuple[int, bool]:
        """One event pair per call, after its untimed `before` hook and (cold L2) a flush."""
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        lead = self._lead(calls)
        for j, (start, end) in enumerate(pairs):
            if hooks:
                hooks.before(j)
            if self.cold:
                self.flush()
            start.record()
            call()
            end.record()
            if hooks:
                hooks.after(j)
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


CPU_HOST_CALLS = 2  # host-cost calls per sample without a GPU: an interpreted call takes milliseconds


def host_calls(calls: int, is_gpu: bool) -> int:
    """Calls per host-cost sample: the protocol's, capped at CPU_HOST_CALLS without a GPU."""
    return calls if is_gpu else min(calls, CPU_HOST_CALLS)


def host_sample(call: Call, calls: int, is_gpu: bool) -> tuple[int, bool]:
    """Host nanoseconds `calls` back-to-back calls of `call` kept the caller busy, and whether the
    device was behind. The device is synchronised first (an idle queue); nothing synchronises
    inside the sample. `behind`: an event recorded after the clock's second reading had not
    completed when queried right after it, so at t1 the device was still running the sample's
    calls: the host issued them faster than the device ran them (device-bound). The time is then
    the host's issue cost while the launch queue had room, and at most the device's time once it
    filled. Without a GPU the interpreter runs each call to completion: never behind."""
    if is_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    ns = time.perf_counter_ns() - start
    if not is_gpu:
        return ns, False
    done = torch.cuda.Event()
    done.record()
    behind = not done.query()
    done.synchronize()
    return ns, behind


def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20))


def make_timer(backend: str, l2: str) -> Timer:
    """The backend a protocol asks for; `auto` picks CUDA events on a GPU, else the host clock."""
    gpu = torch.cuda.is_available() and not _interpreted()
    if backend == "auto":
        backend = "cuda-events" if gpu else "host-clock"
    if backend != "host-clock" and not gpu:
        raise ValueError(
            f"backend {backend!r} needs a CUDA GPU; none is visible here (use backend = 'auto' or 'host-clock')"
        )
    if backend == "cuda-graph" and l2 == "cold":
        raise ValueError("backend 'cuda-graph' times replays on a hot L2; set l2 = 'hot' in the protocol")
    return timer_for(backend, gpu, l2 == "cold")


def timer_for(backend: str, is_gpu: bool, cold: bool) -> Timer:
    """A Timer of a resolved backend (an isolated worker builds its own with the harness's settings)."""
    timer = Timer(name=backend, is_gpu=is_gpu, cold=cold)
    if is_gpu and cold:
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


def calls_for(timer: Timer, call: Call, target_ns: float, limit: int) -> int:
    """Calls per sample so a sample lasts about `target_ns` (at least one call, at most `limit`:
    the runner passes rundir/streams.py's AUTO_CALLS_LIMIT, which the streams' bounds assume)."""
    single = median([timer.sample(call, 1) for _ in range(3)])
    return max(1, min(limit, round(target_ns / max(single, 1.0))))
