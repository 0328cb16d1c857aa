"""Leads, not results (issue 16 items 2 and 1): what limits mid-size bandwidth, and where an
entry point's host time goes.

Part 1, bandwidth against traffic. For traffic of 2-512 MB, the device time per call (an
event pair around each call, a spin kernel ahead so the host is never the bottleneck) of a
torch copy of the same bytes and of each operator's `kerneltrial` arm and installed peers,
under three L2 conditions before each call:
  dirty: `add_(1)` over a buffer twice the L2 (the trial timer's cold flush: L2 left dirty),
  clean: a read (`sum`) of the same buffer (L2 left holding clean lines),
  none:  nothing (what the previous call left in L2).
Bandwidth is bytes moved / time; "% big" is against a 1 GiB copy, "% same" against the copy of
the same traffic under the same condition. A row-count sweep of rmsnorm at 7168 columns shows
whether time steps with the waves of programs (wave quantisation).

Part 2, host time per call (the runner's host-stage method: back-to-back calls, no sync inside)
of pieces of rmsnorm's entry point at one row: a one-argument empty Triton kernel, an empty
kernel with rmsnorm's argument list, rmsnorm's kernel launched directly with a prepared plan
and output, the output allocation alone, the cached launch decision alone, and the entry point.

Part 3 (`--softcap`, alone): softcap_row_argmax at 4-64 MB, every registered implementation
beside read-only torch reductions of the same logits (the size-matched read-only ceiling).

Part 4 (`--worst`, alone): every registered implementation at the wider panels' worst cases.

Usage on the device: python3 scripts/device/midsize.py [--softcap | --worst] (it needs CUDA events: exit 2 without a
GPU). Tables are printed last; with $OUT set, also $OUT/midsize.txt
and $OUT/midsize.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

import torch
import triton
import triton.language as tl

from kerneltrial.ops import launch, registry
from kerneltrial.ops import rms_norm as rn
from kerneltrial.trial.timing import l2_bytes

MB = 1 << 20
TRAFFIC_MB = (2, 4, 8, 16, 32, 64, 128, 512)
CALLS, REPEATS = 20, 7
PEERS = ("kerneltrial", "torch_eager", "liger", "flaggems")
# (operator, row width in the case shape, bytes per row): the case is (rows, *width)
WIDTHS: dict[str, tuple[tuple[int, ...], ...]] = {
    "rmsnorm": ((1536,), (4096,), (7168,)),
    "fused_add_rmsnorm": ((5120,),),
    "silu_and_mul": ((28672,),),
    "sigmoid_gate_mul": ((4096,),),
    "softcap_row_argmax": ((151936,),),
    "zimage_qk_rmsnorm": ((30, 128),),
}


@triton.jit
def _empty1(X):
    tl.store(X + tl.program_id(0), 1.0)


@triton.jit
def _empty_like_rmsnorm(X, W, Y, n_rows, stride, n, out_stride, eps, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    if tl.program_id(0) == 0:
        tl.store(Y, tl.load(X))


@dataclass(frozen=True)
class Bandwidth:
    what: str  # "copy" or "<op> <arm>"
    case: str
    traffic: int  # bytes moved per call
    condition: str  # dirty | clean | none
    us: float  # median per call


@dataclass(frozen=True)
class HostPiece:
    piece: str
    us: float


def device_us(call: Callable[[], object], before: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over `repeats` samples of device microseconds per call, an event pair per call."""
    call()
    samples = []
    for _ in range(repeats):
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        torch.cuda._sleep(2_000_000 * calls // 20 + 1_000_000)
        for start, end in pairs:
            before()
            start.record()
            call()
            end.record()
        pairs[-1][1].synchronize()
        samples.append(sum(s.elapsed_time(e) for s, e in pairs) * 1e3 / calls)
    return median(samples)


def conditions(device: torch.device) -> dict[str, Callable[[], object]]:
    buf = torch.empty(2 * l2_bytes() // 4, dtype=torch.float32, device=device)
    return {"dirty": lambda: buf.add_(1), "clean": lambda: buf.sum(), "none": lambda: None}


def op_case(op: registry.Operator, width: tuple[int, ...], traffic: int) -> registry.Case:
    """The case of `op` with rows of `width` whose traffic is nearest `traffic` bytes."""
    per_row = op.bytes_moved(registry.Case((1024, *width))) / 1024
    return registry.Case((max(1, round(traffic / per_row)), *width))


def bandwidth_part(sizes: tuple[int, ...], calls: int, repeats: int) -> list[Bandwidth]:
    device = launch.device()
    found = []
    conds = conditions(device)
    big = torch.empty(512 * MB // 2, dtype=torch.bfloat16, device=device)
    big_dst = torch.empty_like(big)
    for cond, before in conds.items():
        found.append(
            Bandwidth("copy", "1GiB", 2 * big.numel() * 2, cond, device_us(lambda: big_dst.copy_(big), before, 5, 3))
        )
    for traffic in sizes:
        src = torch.empty(traffic // 4, dtype=torch.bfloat16, device=device)
        dst = torch.empty_like(src)
        for cond, before in conds.items():
            found.append(
                Bandwidth(
                    "copy",
                    f"{traffic // MB}MB",
                    traffic,
                    cond,
                    device_us(lambda s=src, d=dst: d.copy_(s), before, calls, repeats),
                )
            )
        for name, widths in WIDTHS.items():
            op = registry.get_op(name)
            for width in widths:
                case = op_case(op, width, traffic)
                args = list(op.make_inputs(case, 0, device).values())
                for arm in PEERS:
                    impl = op.impls.get(arm)
                    fn = impl.resolve() if impl else None
                    if fn is None:
                        continue
                    for cond, before in conds.items():
                        us = device_us(lambda fn=fn, a=args: fn(*a), before, calls, repeats)
                        found.append(Bandwidth(f"{name} {arm}", case.id, op.bytes_moved(case), cond, us))
    return found


def wave_sweep(calls: int, repeats: int) -> list[Bandwidth]:
    """rmsnorm (kerneltrial) at 7168 columns, 128-1024 rows: time against rows, dirty flush."""
    device = launch.device()
    op = registry.get_op("rmsnorm")
    fn = op.impl("kerneltrial").resolve()
    before = conditions(device)["dirty"]
    found = []
    for rows in range(128, 1025, 32):
        case = registry.Case((rows, 7168))
        args = list(op.make_inputs(case, 0, device).values())
        found.append(
            Bandwidth(
                "rmsnorm kerneltrial",
                case.id,
                op.bytes_moved(case),
                "dirty",
                device_us(lambda a=args: fn(*a), before, calls, repeats),
            )
        )
    return found


def softcap_part(calls: int, repeats: int) -> list[Bandwidth]:
    """softcap_row_argmax at 4-64 MB (vocabulary 151936), dirty flush: every registered
    implementation, and read-only torch reductions of the same logits (`amax`, `argmax`) as
    the size-matched read-only ceiling."""
    device = launch.device()
    op = registry.get_op("softcap_row_argmax")
    before = conditions(device)["dirty"]
    found = []
    for traffic in (4 * MB, 16 * MB, 64 * MB):
        case = op_case(op, (151936,), traffic)
        args = list(op.make_inputs(case, 0, device).values())
        logits = args[0]
        arms: dict[str, Callable[[], object]] = {
            "torch amax (read-only)": lambda x=logits: x.amax(dim=-1),
            "torch argmax (read-only)": lambda x=logits: x.argmax(dim=-1),
        }
        for name, impl in op.impls.items():
            fn = impl.resolve()
            if fn is not None and name not in ("torch_eager", "torch_compile", "control"):
                arms[name] = lambda fn=fn, a=args: fn(*a)
        for name, call in arms.items():
            found.append(
                Bandwidth(
                    f"softcap {name}", case.id, op.bytes_moved(case), "dirty", device_us(call, before, calls, repeats)
                )
            )
    return found


# The panels' worst cases against the fastest peer (results/archive/h200/*-panel, docs/NOTES.md): does any
# registered geometry of ours reach the peer (the dispatcher chose wrong) or none (the kernel's limit)?
WORST = (
    ("rmsnorm_fp32", (777, 7168), "row_strided"),
    ("rmsnorm_fp32", (777, 7168), "contiguous"),
    ("rmsnorm_fp32", (512, 7168), "contiguous"),
    ("gemma_fused_add_rmsnorm", (100, 3584), "contiguous"),
    ("silu_and_mul", (1, 57344), "contiguous"),
    ("silu_and_mul", (1, 17920), "contiguous"),
)


def worst_part(calls: int, repeats: int) -> list[Bandwidth]:
    """Every registered implementation (torch_compile included) at the panels' worst cases, dirty flush."""
    device = launch.device()
    before = conditions(device)["dirty"]
    found = []
    for name, shape, layout in WORST:
        op = registry.get_op(name)
        case = registry.Case(shape, layout=layout)
        args = list(op.make_inputs(case, 0, device).values())
        for arm, impl in op.impls.items():
            fn = impl.resolve() if impl.supports(case) else None
            if fn is None or arm == "torch_eager":
                continue
            try:
                us = device_us(lambda fn=fn, a=args: fn(*a), before, calls, repeats)
            except Exception as error:  # a candidate that declines the shape: say so, keep going
                print(f"{name} {arm} {case.id}: {type(error).__name__}: {error}", file=sys.stderr)
                continue
            found.append(Bandwidth(f"{name} {arm}", case.id, op.bytes_moved(case), "dirty", us))
    return found


def host_us(fn: Callable[[], object], calls: int = 200, repeats: int = 7) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
    torch.cuda.synchronize()
    return median(samples)


def host_part() -> list[HostPiece]:
    device = launch.device()
    x = torch.randn(1, 2048, dtype=torch.bfloat16, device=device)
    w = torch.randn(2048, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    one = torch.zeros(1, device=device)
    plan = rn.auto_launch(1, 2048, launch.MAX_GRID)
    entry = registry.get_op("rmsnorm").impl("kerneltrial").resolve()
    pieces: dict[str, Callable[[], object]] = {
        "empty kernel, 1 argument": lambda: _empty1[(1,)](one),
        "empty kernel, rmsnorm's 8 arguments + 2 constexpr": lambda: _empty_like_rmsnorm[(1,)](
            x, w, y, 1, 2048, 2048, 2048, 1e-6, BLOCK_ROWS=1, BLOCK_N=2048
        ),
        "rmsnorm kernel, prepared plan and output": lambda: rn._rms_norm_rows[plan.grid](
            x,
            w,
            y,
            1,
            2048,
            2048,
            2048,
            1e-6,
            BLOCK_ROWS=plan.block_rows,
            BLOCK_N=plan.block_n,
            ROUND_BEFORE_WEIGHT=True,
            num_warps=plan.num_warps,
        ),  # fmt: skip
        "output allocation (new_empty)": lambda: x.new_empty(x.shape),
        "cached launch decision": lambda: rn.auto_launch(1, 2048, launch.MAX_GRID),
        "as_rows": lambda: launch.as_rows(x),
        "entry point (kerneltrial arm)": lambda: entry(x, w, 1e-6),
        "torch eager (registered arm)": lambda: registry.get_op("rmsnorm").impl("torch_eager").resolve()(x, w),
    }
    return [HostPiece(name, host_us(fn)) for name, fn in pieces.items()]


def tables(found: list[Bandwidth], waves: list[Bandwidth], host: list[HostPiece]) -> list[str]:
    big = {b.condition: b.traffic / b.us for b in found if b.case == "1GiB"}
    same = {(b.traffic, b.condition): b.traffic / b.us for b in found if b.what == "copy" and b.case != "1GiB"}
    lines = ["copy 1 GiB: " + ", ".join(f"{c} {bw / 1e3:.0f} GB/s" for c, bw in big.items())]
    lines.append(f"{'what':<32} {'case':<22} {'MB':>6} {'cond':<5} {'us':>8} {'GB/s':>7} {'%big':>5} {'%same':>5}")
    for b in found:
        if b.case == "1GiB":
            continue
        bw = b.traffic / b.us
        nearest = min((t for t, c in same if c == b.condition), key=lambda t: abs(t - b.traffic))
        lines.append(
            f"{b.what:<32} {b.case:<22} {b.traffic / MB:>6.1f} {b.condition:<5} {b.us:>8.2f} {bw / 1e3:>7.0f} "
            f"{100 * bw / big[b.condition]:>5.0f} {100 * bw / same[(nearest, b.condition)]:>5.0f}"
        )
    lines += ["", "wave sweep: rmsnorm kerneltrial at 7168 columns, dirty flush"]
    lines += [f"  {b.case:<22} {b.us:>8.2f} us  {100 * b.traffic / b.us / big['dirty']:>5.0f}% big" for b in waves]
    lines += ["", "host us per call (rmsnorm 1x2048)"] + [f"  {h.piece:<52} {h.us:>6.1f}" for h in host]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--softcap", action="store_true", help="only the softcap section (part 3)")
    parser.add_argument("--worst", action="store_true", help="only the panels' worst cases (part 4)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or launch.interpreted():
        print("midsize.py needs a CUDA GPU (it times with CUDA events)", file=sys.stderr)
        return 2
    registry.load_builtin_ops()
    if args.softcap or args.worst:
        found = softcap_part(CALLS, REPEATS) if args.softcap else worst_part(CALLS, REPEATS)
        text = "\n".join(f"{b.what:<36} {b.case:<30} {b.traffic / MB:>6.1f} MB {b.us:>8.2f} us" for b in found)
        print(text)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"midsize-{'softcap' if args.softcap else 'worst'}.txt").write_text(text + "\n")
        return 0
    found = bandwidth_part(tuple(t * MB for t in TRAFFIC_MB), CALLS, REPEATS)
    waves = wave_sweep(CALLS, REPEATS)
    host = host_part()
    text = "\n".join(tables(found, waves, host))
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "midsize.txt").write_text(text + "\n")
        record = {"bandwidth": [asdict(b) for b in found + waves], "host": [asdict(h) for h in host]}
        Path(out, "midsize.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
