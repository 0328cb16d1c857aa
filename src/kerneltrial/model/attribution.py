"""Where one call's time goes: the routed operators' share, the device's busy time.

One profiled call per arm and case after the rounds. In eager mode the router names every
routed call for the profiler (`Router.annotate`), and a kernel belongs to the region whose
device-side range holds its start. A CUDA graph's replay carries no such ranges (Python
does not run), so in graph mode the arm's call is profiled twice: once eagerly on the same
static buffers, annotated, which labels each kernel of the call in launch order, and once
as a replay, which gives each kernel's time under the graph. The replay runs the kernels its
capture recorded, in launch order; each replayed kernel takes the label of the eager kernel
it matches in the two name sequences (`align`). When a region kernel of the eager call has
no match, the graph case has no region rows (its share is unknown, never guessed).
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kerneltrial.model.build import REGION, Router

Regions = dict[str, tuple[int, int]]  # region -> (ns, calls); `total` (device time) and `wall` too
Kernels = dict[str, dict[str, tuple[int, int]]]  # region -> kernel name -> (ns, count)
Labelled = list[tuple[str, str | None, int]]  # the call's kernels in start order: (name, region, ns)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Profiled:
    events: list[Any]
    wall_ns: int
    table: str


def profile(call: Callable[[], object], device: torch.device) -> Profiled:
    """One call under the profiler (after one unprofiled call), synchronised; its events,
    its host time and the profiler's table (sorted by device time on a GPU)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    gpu = device.type == "cuda"
    call()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
        start = time.perf_counter_ns()
        call()
        synchronize(device)
        wall = time.perf_counter_ns() - start
    sort = "self_device_time_total" if gpu else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=80) + "\n"
    return Profiled(events=list(prof.events()), wall_ns=wall, table=table)


def annotated(router: Router, call: Callable[[], object], device: torch.device) -> Profiled:
    router.annotate = True
    try:
        return profile(call, device)
    finally:
        router.annotate = False


def attribute_eager(
    router: Router, call: Callable[[], object], device: torch.device, table: Path
) -> tuple[Regions, Kernels]:
    """region -> (ns, calls) of one profiled call: each routed operator, `total` (the device
    time of all kernels of the call on a GPU; its host time on a CPU) and `wall` (the call's
    host time, synchronised); on a GPU the kernels each region launched. The profiler's own
    table of the call goes to `table`, for a reader who asks where the rest of the time went."""
    run = annotated(router, call, device)
    table.write_text(run.table)
    if device.type != "cuda":
        found = host_regions(run.events)
        return found | {"total": (run.wall_ns, 1), "wall": (run.wall_ns, 1)}, {}
    ranges = region_ranges(run.events)
    found = {name: (0, calls) for name, calls in ranges.calls.items()}
    kernels = labelled_kernels(run.events, ranges)
    return _with_totals(found, kernels, run.wall_ns)


def attribute_graph(
    router: Router, eager_call: Callable[[], object], replay: Callable[[], object], device: torch.device, table: Path
) -> tuple[Regions, Kernels]:
    """The same figures for a graph replay. On a CPU the stand-in graph runs the Python call,
    so its regions are measured in the replay itself."""
    if device.type != "cuda":
        return attribute_eager(router, replay, device, table)
    eager = annotated(router, eager_call, device)
    ranges = region_ranges(eager.events)
    run = profile(replay, device)
    table.write_text(run.table)
    timed = [(name, ns) for name, _, ns in labelled_kernels(run.events, Ranges(spans=[], calls={}))]
    labels = align(labelled_kernels(eager.events, ranges), timed)
    if labels is None:
        return _with_totals({}, [(name, None, ns) for name, ns in timed], run.wall_ns)
    return _with_totals({name: (0, calls) for name, calls in ranges.calls.items()}, labels, run.wall_ns)


def align(annotated: Labelled, replayed: list[tuple[str, int]]) -> Labelled | None:
    """The replay's kernels, each with the label of the annotated eager call's kernel it
    matches: the two name sequences are matched by difflib's longest common blocks, so a
    kernel the capture path adds or swaps outside the regions (transformers materialises the
    causal mask while a stream captures, and SDPA then picks another kernel) shifts nothing.
    None unless every region kernel of the eager call is matched."""
    eager_names = [name for name, _, _ in annotated]
    matcher = difflib.SequenceMatcher(None, eager_names, [name for name, _ in replayed], autojunk=False)
    label_of: dict[int, str] = {}
    for block in matcher.get_matching_blocks():
        for offset in range(block.size):
            region = annotated[block.a + offset][1]
            if region is not None:
                label_of[block.b + offset] = region
    if len(label_of) != sum(region is not None for _, region, _ in annotated):
        return None
    return [(name, label_of.get(j), ns) for j, (name, ns) in enumerate(replayed)]


def _with_totals(found: Regions, kernels: Labelled, wall_ns: int) -> tuple[Regions, Kernels]:
    """Add each labelled kernel to its region; `total` is all kernels' time, `wall` the call's."""
    names: Kernels = {region: {} for region in found}
    for name, region, ns in kernels:
        if region is None:
            continue
        total, calls = found[region]
        found[region] = (total + ns, calls)
        k_ns, count = names[region].get(name, (0, 0))
        names[region][name] = (k_ns + ns, count + 1)
    return found | {"total": (sum(ns for _, _, ns in kernels), 1), "wall": (wall_ns, 1)}, names


def host_regions(events: list[Any]) -> Regions:
    """On a CPU: each region's host time (its record_function ranges); no device time, no kernels."""
    found: Regions = {}
    for e in events:
        if e.name.startswith(REGION):
            ns, calls = found.get(e.name.removeprefix(REGION), (0, 0))
            found[e.name.removeprefix(REGION)] = (ns + round(e.cpu_time_total * 1000), calls + 1)
    return found


@dataclass(frozen=True)
class Ranges:
    """The device-side ranges of the routed regions, sorted by start: (start, end, region)."""

    spans: list[tuple[float, float, str]]
    calls: dict[str, int]

    def region_at(self, start: float) -> str | None:
        i = bisect.bisect_right(self.spans, (start, float("inf"), "")) - 1
        return self.spans[i][2] if i >= 0 and start < self.spans[i][1] else None


def region_ranges(events: list[Any]) -> Ranges:
    """A record_function leaves a device-side range spanning the kernels launched inside it.
    Counted on the device because the host-side tree misses kernels launched outside ATen
    (Triton's launcher): the first H200 runs attributed no time to our kernels
    (results/archive/h200/minicpm5-2b-model-r2)."""
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith(REGION)]
    spans = sorted((e.time_range.start, e.time_range.end, e.name.removeprefix(REGION)) for e in device)
    calls: dict[str, int] = {}
    for _, _, name in spans:
        calls[name] = calls.get(name, 0) + 1
    return Ranges(spans=spans, calls=calls)


def labelled_kernels(events: list[Any], ranges: Ranges) -> Labelled:
    """The call's device kernels in start order, each with the region holding its start."""
    kernels = sorted(
        (e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and _is_kernel(e)),
        key=lambda e: e.time_range.start,
    )
    return [(k.name, ranges.region_at(k.time_range.start), round(k.time_range.elapsed_us() * 1000)) for k in kernels]


def _is_kernel(event: Any) -> bool:
    return not event.name.startswith(REGION) and not getattr(event, "is_user_annotation", False)
