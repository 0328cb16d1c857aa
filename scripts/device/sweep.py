"""Leads, not results: time launch-geometry variants of our kernels and print, per variant,
the median and spread of the per-call time, the registers and spills of what it compiled,
and its largest difference from the operator's control. A sweep chooses what a trial
measures; only trials (kerneltrial run) produce published numbers.

Timing is the trial runner's own timer (CUDA events, cold L2), so a lead here is measured
the way the trial will measure it.

Usage on the device: python3 scripts/device/sweep.py [GROUP...]   (groups: see GROUPS)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from statistics import median

import torch

from kerneltrial.ops import registry
from kerneltrial.ops import rms_norm, silu_and_mul, softcap_argmax
from kerneltrial.trial.timing import calls_for, make_timer

SAMPLES = 15
SAMPLE_NS = 200_000

Variant = tuple[str, Callable[..., object]]


def compiled_kernels() -> dict[int, object]:
    """Every kernel Triton has compiled so far in this process, by id."""
    found = {}
    for fn in (rms_norm._rms_norm_rows, rms_norm._rms_norm_wide, silu_and_mul._silu_and_mul_tiles,
               softcap_argmax._argmax_stream, softcap_argmax._argmax_spans, softcap_argmax._merge_parts):
        for caches in getattr(fn, "device_caches", {}).values():  # the interpreter compiles nothing
            found.update({id(k): k for k in caches[0].values()})
    return found


def fresh(inputs: dict[str, object]) -> dict[str, object]:
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in inputs.items()}


def sweep(op_name: str, shape: tuple[int, ...], variants: list[Variant], dtype: str = "bfloat16") -> None:
    op = registry.get_op(op_name)
    case = registry.Case(shape, dtype)
    device = torch.device("cuda")
    inputs = op.make_inputs(case, 0, device)
    args = fresh(inputs)
    control = op.outputs(args, impl(op_name, "control")(**args))[0].double()
    timer = make_timer("cuda-events", "cold")
    mb = op.bytes_moved(case) / 1e6
    print(f"\n## {op_name} {shape} {dtype}: {mb:.1f} MB")
    rows = []
    for label, fn in variants:
        before = set(compiled_kernels())
        args = fresh(inputs)
        try:
            out = op.outputs(args, fn(**args))[0]
        except Exception as exc:  # a variant that does not compile is a lead too
            print(f"{label:32s} FAILED {type(exc).__name__}: {str(exc)[:120]}")
            continue
        new = [k for i, k in compiled_kernels().items() if i not in before]
        regs = ",".join(f"{getattr(k, 'n_regs', '?')}r/{getattr(k, 'n_spills', '?')}s" for k in new) or "cached"
        diff = float((out.double() - control).abs().max())
        call = partial(fn, **args)
        calls = calls_for(timer, call, SAMPLE_NS)
        per_call = sorted(timer.sample(call, calls) / calls / 1000 for _ in range(SAMPLES))
        med = median(per_call)
        rows.append((med, label))
        print(f"{label:32s} {med:8.2f} us  min {per_call[0]:7.2f}  max {per_call[-1]:7.2f}  "
              f"{mb / med:6.0f} GB/s  {regs:14s} diff {diff:.3g}", flush=True)
    rows.sort()
    print("fastest: " + ", ".join(f"{label} {t:.2f}" for t, label in rows[:3]))


def impl(op_name: str, name: str) -> Callable[..., object] | None:
    """A registered arm's callable; None when it is not installed here (a missing peer)."""
    return registry.get_op(op_name).impl(name).resolve()


def arms(op_name: str, *names: str) -> list[Variant]:
    """The registered arms among `names` that are available here."""
    op = registry.get_op(op_name)
    return [(name, fn) for name in names if name in op.impls and (fn := impl(op_name, name)) is not None]


def rmsnorm_group(op_name: str, rbw: bool) -> None:
    for shape in ((4096, 4096), (4096, 5120), (4096, 8192), (2048, 14336), (1024, 16384)):
        variants: list[Variant] = [(f"rows_w{w}", partial(rms_norm.rms_norm_rows, round_before_weight=rbw, num_warps=w))
                                   for w in (4, 8, 16, 32)]
        variants += [(f"wide_c{c}_w{w}", partial(rms_norm.rms_norm_wide, round_before_weight=rbw, chunk=c, num_warps=w))
                     for c in (1024, 2048, 4096, 8192) for w in (4, 8, 16) if c // (32 * w) >= 2]
        variants += arms(op_name, "kerneltrial", "torch_compile", "liger", "flaggems")
        sweep(op_name, shape, variants)


def softcap_group() -> None:
    name = softcap_argmax.NAME
    for rows in (1, 2, 4, 16, 64, 256):
        variants: list[Variant] = []
        for parts in (32, 64, 128, 256, 512):
            for chunk, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
                if rows * parts <= 4096:
                    variants.append((f"stream_p{parts}_c{chunk}_w{warps}",
                                     partial(softcap_argmax.argmax_stream, parts=parts, chunk=chunk, num_warps=warps)))
        for chunk, warps, programs in ((2048, 4, 528), (4096, 8, 264), (8192, 8, 264), (8192, 8, 528), (4096, 4, 528)):
            variants.append((f"stream_c{chunk}_w{warps}_g{programs}",
                             partial(softcap_argmax.argmax_stream, chunk=chunk, num_warps=warps, programs=programs)))
        variants += arms(name, "kerneltrial", "split_p256_c1024_w4", "torch_eager")
        sweep(name, (rows, 262144), variants)


def silu_group() -> None:
    for tokens in (2048, 4096, 16384):
        variants: list[Variant] = [
            (f"tile_r{r}_d{d}_w{w}", partial(silu_and_mul.silu_and_mul_tiles, block_rows=r, block_d=d, num_warps=w))
            for r in (1, 2) for d in (1024, 2048, 4096) for w in (2, 4, 8, 16) if r * d // (32 * w) >= 4 and r * d // (32 * w) <= 32
        ]
        variants += arms("silu_and_mul", "kerneltrial", "torch_compile", "liger")
        sweep("silu_and_mul", (tokens, 12288), variants)


GROUPS: dict[str, Callable[[], None]] = {
    "rmsnorm": partial(rmsnorm_group, "rmsnorm", True),
    "rmsnorm_fp32": partial(rmsnorm_group, "rmsnorm_fp32", False),
    "softcap": softcap_group,
    "silu": silu_group,
}

if __name__ == "__main__":
    registry.load_builtin_ops()
    for group in sys.argv[1:] or list(GROUPS):
        GROUPS[group]()
