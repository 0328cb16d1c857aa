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

from kerneltrial.ops import launch, registry, rms_norm, softcap_argmax, zimage_qk_rmsnorm
from kerneltrial.trial.timing import calls_for, make_timer

SAMPLES = 15
SAMPLE_NS = 200_000

Variant = tuple[str, Callable[..., object]]


def compiled_kernels() -> dict[int, object]:
    """Every kernel Triton has compiled so far in this process, by id."""
    found = {}
    for fn in (
        rms_norm._rms_norm_rows,
        rms_norm._rms_norm_wide,
        zimage_qk_rmsnorm._qk_norm,
        softcap_argmax._argmax_stream,
        softcap_argmax._argmax_spans,
    ):
        jit = fn.fn if isinstance(fn, launch.Direct) else fn  # kerneltrial's kernels are Directs
        for caches in getattr(jit, "device_caches", {}).values():  # the interpreter compiles nothing
            found.update({id(k): k for k in caches[0].values()})
    return found


def sweep(
    op_name: str, shape: tuple[int, ...], variants: list[Variant], dtype: str = "bfloat16", layout: str = "contiguous"
) -> None:
    op = registry.get_op(op_name)
    case = registry.Case(shape, dtype, layout)
    device = torch.device("cuda")
    args = op.make_inputs(case, 0, device)  # fresh per arm: clone() would densify a strided layout
    control = op.outputs(args, impl(op_name, "control")(*args.values()))[0].double()
    timer = make_timer("cuda-events", "cold")
    mb = op.bytes_moved(case) / 1e6
    print(f"\n## {op_name} {shape} {dtype} {layout}: {mb:.1f} MB")
    rows = []
    for label, fn in variants:
        before = set(compiled_kernels())
        args = op.make_inputs(case, 0, device)
        try:
            out = op.outputs(args, fn(*args.values()))[0]
        except Exception as exc:  # a variant that does not compile is a lead too
            print(f"{label:32s} FAILED {type(exc).__name__}: {str(exc)[:120]}")
            continue
        new = [k for i, k in compiled_kernels().items() if i not in before]
        regs = ",".join(f"{getattr(k, 'n_regs', '?')}r/{getattr(k, 'n_spills', '?')}s" for k in new) or "cached"
        diff = float((out.double() - control).abs().max())
        call = partial(fn, *args.values())
        calls = calls_for(timer, call, SAMPLE_NS)
        per_call = sorted(timer.sample(call, calls) / calls / 1000 for _ in range(SAMPLES))
        med = median(per_call)
        rows.append((med, label))
        print(
            f"{label:32s} {med:8.2f} us  min {per_call[0]:7.2f}  max {per_call[-1]:7.2f}  "
            f"{1000 * mb / med:6.0f} GB/s  {regs:14s} diff {diff:.3g}",
            flush=True,
        )
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
    shapes = [
        ((4096, 2048), "bfloat16"),
        ((16384, 2048), "bfloat16"),
        ((4096, 4096), "bfloat16"),
        ((4096, 5120), "bfloat16"),
        ((4096, 8192), "bfloat16"),
        ((2048, 14336), "bfloat16"),
        ((1024, 16384), "bfloat16"),
    ]
    if not rbw:
        shapes += [((4096, 2048), "float32"), ((16384, 2048), "float32"), ((4096, 4096), "float32")]
    for shape, dtype in shapes:
        variants: list[Variant] = [
            (f"rows_w{w}", partial(rms_norm.rms_norm_rows, round_before_weight=rbw, num_warps=w)) for w in (4, 8, 16)
        ]
        if shape[1] <= 2048:
            variants += [
                (f"rows_r{r}_w{w}", partial(rms_norm.rms_norm_rows, round_before_weight=rbw, block_rows=r, num_warps=w))
                for r, w in ((2, 4), (4, 4), (4, 8))
            ]
        variants += [
            (f"wide_c{c}_w{w}", partial(rms_norm.rms_norm_wide, round_before_weight=rbw, chunk=c, num_warps=w))
            for c, w in ((2048, 8), (4096, 16))
        ]
        variants += arms(op_name, "kerneltrial", "torch_compile", "liger", "flaggems")
        sweep(op_name, shape, variants, dtype)


def softcap_group() -> None:
    name = softcap_argmax.NAME
    shapes = [(rows, 262144) for rows in (1, 2, 4, 16, 64, 256)] + [(2048, 130560)]
    for shape in shapes:
        variants: list[Variant] = [
            (f"stream_c{c}_w{w}_g{g}", partial(softcap_argmax.argmax_stream, chunk=c, num_warps=w, programs=g))
            for c, w in ((1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8))
            for g in (264, 528, 1056)
        ]
        variants += arms(name, "kerneltrial", "torch_eager")
        sweep(name, shape, variants)


def zimage_group() -> None:
    for tokens in (256, 1024, 4096, 32768):
        for layout in ("contiguous", "qkv_slice"):
            variants: list[Variant] = [
                (f"packed_r{r}_w{w}", partial(zimage_qk_rmsnorm.qk_norm, block_rows=r, num_warps=w))
                for r in (8, 16, 32, 64)
                for w in (2, 4, 8, 16)
                if 2 <= r * 128 // (32 * w) <= 64
            ]
            variants += arms("zimage_qk_rmsnorm", "kerneltrial", "torch_compile")
            sweep("zimage_qk_rmsnorm", (tokens, 30, 128), variants, layout=layout)


GROUPS: dict[str, Callable[[], None]] = {
    "rmsnorm": partial(rmsnorm_group, "rmsnorm", True),
    "rmsnorm_fp32": partial(rmsnorm_group, "rmsnorm_fp32", False),
    "softcap": softcap_group,
    "zimage": zimage_group,
}

if __name__ == "__main__":
    registry.load_builtin_ops()
    for group in sys.argv[1:] or list(GROUPS):
        GROUPS[group]()
