"""Leads, not results: the host time of one call (how long a caller is blocked issuing it,
the GPU not the bottleneck) of our `kerneltrial` entry points, of torch eager, and of a
trivial Triton kernel (the floor of any Triton launch), per operator at its smallest GPU
case (one row, or the fewest tokens) and at a mid-size case (the GPU case whose traffic is
nearest MID_BYTES).

Method (issue 16): synchronise, read the clock, issue CALLS calls back to back, read the
clock again without synchronising; host time per call = elapsed / CALLS; the median of
REPEATS such samples. The floor is also measured through the compiled kernel's own
launcher (`CompiledKernel[grid](*args)`, what launchers that cache compiled kernels call),
which skips JITFunction.run's argument binding and cache lookup: the gap between the two
floors is what a direct launch could save per call (n/a where Triton has no compiled kernel,
as in the interpreter). Our entry points launch that way after each specialisation's first call
(ops/launch.py Direct, issue 37); `kerneltrial_jit` is the same entry point with every launch
through JITFunction.run, as before. The installed peers (Liger, FlagGems, SGLang, FlashInfer; not
torch_compile, which compiles per shape) are measured the same way.

Usage on the device: python3 scripts/device/hostcost.py [--smoke]
  --smoke: the first two small cases and a few calls, for a CPU run under TRITON_INTERPRET=1
  (the pipeline only: interpreter times are not host costs of a GPU launch).
The table is printed last; with $OUT set, the full output also goes to $OUT/hostcost.txt and
the measurements to $OUT/hostcost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from statistics import median

import torch
import triton
import triton.language as tl

from kerneltrial.ops import launch, registry

CALLS, REPEATS = 200, 7
SMOKE_CALLS, SMOKE_REPEATS = 3, 2
MID_BYTES = 16e6
ARMS = ("kerneltrial", "kerneltrial_jit", "torch_eager")
PEERS = ("liger", "flaggems", "sglang", "flashinfer")


@triton.jit
def _floor(X):
    tl.store(X + tl.program_id(0), 1.0)


@dataclass(frozen=True)
class Measurement:
    op: str
    case: str
    arm: str
    us_per_call: float | None  # None: the arm is unavailable here
    samples_us: list[float]


def host_us(fn: Callable[[], object], calls: int, repeats: int, sync: Callable[[], None]) -> list[float]:
    """`repeats` samples of host microseconds per call over `calls` back-to-back calls."""
    for _ in range(3):  # compile and warm every cache
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter_ns()
        samples.append((t1 - t0) / calls / 1e3)
    sync()
    return samples


def cases_of(op: registry.Operator, smoke: bool) -> list[registry.Case]:
    """Smallest and mid-size GPU cases (contiguous, the operator's first dtype); the first two
    small cases for a smoke run."""
    if smoke:
        return list(op.small_cases[:2])
    cases = [c for c in op.gpu_cases if c.layout == op.layouts[0] and c.dtype == op.dtypes[0]]
    smallest = min(cases, key=op.bytes_moved)
    mid = min(cases, key=lambda c: abs(op.bytes_moved(c) - MID_BYTES))
    return [smallest] if mid == smallest else [smallest, mid]


def floor_arms(device: torch.device) -> dict[str, Callable[[], object]]:
    x = torch.zeros(1, device=device)
    arms: dict[str, Callable[[], object]] = {"triton_floor": lambda: _floor[(1,)](x)}
    compiled = _floor[(1,)](x)  # a CompiledKernel on a GPU; the interpreter returns none
    if compiled is not None and hasattr(compiled, "__getitem__"):
        direct = compiled[(1, 1, 1)]
        arms["compiled_floor"] = lambda: direct(x)
    return arms


def through_jit(launcher: launch.Direct, grid: tuple[int, ...], args: tuple[object, ...], meta: dict) -> None:
    """Direct.launch without its reuse: every launch through JITFunction.run."""
    launcher.fn[grid](*args, **meta)


def arm_samples(call: Callable[[], object], through: bool, calls: int, repeats: int, sync) -> list[float]:
    """host_us of `call`; with `through`, every kerneltrial launch through JITFunction.run."""
    if not through:
        return host_us(call, calls, repeats, sync)
    reuse = launch.Direct.launch
    launch.Direct.launch = through_jit  # type: ignore[method-assign]
    try:
        return host_us(call, calls, repeats, sync)
    finally:
        launch.Direct.launch = reuse  # type: ignore[method-assign]


def measure(smoke: bool) -> list[Measurement]:
    device = launch.device()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    calls, repeats = (SMOKE_CALLS, SMOKE_REPEATS) if smoke else (CALLS, REPEATS)
    found = []
    for name, fn in floor_arms(device).items():
        samples = host_us(fn, calls, repeats, sync)
        found.append(Measurement("-", "-", name, median(samples), samples))
    if "compiled_floor" not in {m.arm for m in found}:
        found.append(Measurement("-", "-", "compiled_floor", None, []))
    for op in registry.all_ops():
        for case in cases_of(op, smoke):
            for arm in (*ARMS, *(p for p in PEERS if p in op.impls)):
                spec = op.impl(arm.removesuffix("_jit"))
                impl = spec.resolve()
                if impl is None or not impl_takes(spec, case):
                    found.append(Measurement(op.name, case.id, arm, None, []))
                    continue
                args = list(op.make_inputs(case, 0, device).values())
                call = partial(impl, *args)
                samples = arm_samples(call, arm.endswith("_jit"), calls, repeats, sync)
                found.append(Measurement(op.name, case.id, arm, median(samples), samples))
    return found


def impl_takes(impl: registry.Impl, case: registry.Case) -> bool:
    return impl.supports(case) and (impl.widths is None or case.shape[-1] in impl.widths)


def fmt(us: float | None) -> str:
    return "n/a" if us is None else f"{us:.1f}"


def table(found: list[Measurement]) -> list[str]:
    floors = {m.arm: m.us_per_call for m in found if m.op == "-"}
    lines = [
        f"floor: triton launch {fmt(floors['triton_floor'])} us, compiled launcher {fmt(floors['compiled_floor'])} us",
        f"{'operator':<26} {'case':<32} {'ours us':>8} {'via jit':>8} {'eager us':>9} {'fastest peer':>22}",
    ]
    by_key = {(m.op, m.case, m.arm): m.us_per_call for m in found}
    for op, case in dict.fromkeys((m.op, m.case) for m in found if m.op != "-"):
        ours, jit, eager = (by_key[(op, case, arm)] for arm in ARMS)
        peers = [
            (us, m.arm) for m in found if (m.op, m.case) == (op, case) and m.arm in PEERS and (us := m.us_per_call)
        ]
        fastest = f"{min(peers)[1]} {min(peers)[0]:.1f}" if peers else "n/a"
        lines.append(f"{op:<26} {case:<32} {fmt(ours):>8} {fmt(jit):>8} {fmt(eager):>9} {fastest:>22}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny cases, few calls (CPU interpreter check)")
    args = parser.parse_args(argv)
    found = measure(args.smoke)
    lines = [f"{m.op} {m.case} {m.arm}: {fmt(m.us_per_call)} us/call, samples {m.samples_us}" for m in found]
    lines += ["", *table(found)]
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "hostcost.txt").write_text(text + "\n")
        Path(out, "hostcost.json").write_text(json.dumps([asdict(m) for m in found], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
