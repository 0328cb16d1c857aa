"""Adapter for QuACK's RMSNorm: the `quack` peer (PyPI `quack-kernels`, imported as `quack`;
CuTe DSL kernels compiled at first use through nvidia-cutlass-dsl and apache-tvm-ffi). Its
public function, as quack/rmsnorm.py defines it (quack-kernels 0.3-0.6, exported as `quack.rmsnorm`):

    quack.rmsnorm.rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None,
                          residual_dtype=None, eps=1e-6, prenorm=False) -> Tensor

`eps` is the seventh parameter: the adapter passes it by keyword (positionally it would land in
`bias`). Contract, against each operator registered (judged by the operator's own tolerance):
- rmsnorm_fp32: the operator's contract (fp32 sum of squares, rstd with fast-math rsqrt, the
  product with the weight in fp32, one rounding to the output dtype); fp16, bf16 and fp32.
- rmsnorm: the same kernel, so one rounding after the weight (the operator rounds before it).
Rows: it flattens x to [rows, N] (`reshape`) and compiles for a dynamic row stride with unit
column stride (quack/compile_utils.py make_fake_tensor), so `row_strided` runs without a copy.
Its fused residual path returns new tensors (not the operator's in-place contract): not used.

Availability, each a one-line reason: the package, a CUDA device, compute capability 9.0 or
newer (its README: H100, B200/B300 or RTX 50; the kernels use thread-block clusters), then the
CuTe DSL compiler (nvidia-cutlass-dsl, imported as `cutlass`).

Carrying it to the GPU machine (64 MiB per call; `pip download --no-deps`): quack-kernels 0.6.5
is a 0.7 MB wheel and torch-c-dlpack-ext 0.9 MB, but nvidia-cutlass-dsl 4.8.1 needs
nvidia-cutlass-dsl-libs-cu12 (87.4 MiB, one 69.3 MiB compressed .so, nothing to slim) and -libs-base
(2.9 MiB): the compiler does not fit one call, so on that machine the peer is unavailable with
the reason above unless the wheel is split across two calls of a warm machine (docs/NOTES.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kerneltrial.ops.peers import Loader, import_attr, require_cuda, require_installed
from kerneltrial.ops.spec import Arm, Unavailable

PACKAGE = "quack-kernels"
MODULE = "quack"
MIN_CAPABILITY = (9, 0)


def require_capability() -> None:
    """QuACK's kernels need Hopper or newer (module docstring)."""
    found = torch.cuda.get_device_capability()
    if found < MIN_CAPABILITY:
        raise Unavailable(
            f"QuACK's CuTe DSL kernels need compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer; "
            f"this GPU is {found[0]}.{found[1]}"
        )


def quack_loader(adapt: Callable[[Any], Callable[..., Any]]) -> Loader:
    """Loader for `quack.rmsnorm.rmsnorm`; `adapt` wraps it into the operator's signature."""

    def load() -> Callable[..., Any]:
        require_installed(MODULE, PACKAGE)
        require_cuda("QuACK")
        require_capability()
        import_attr("cutlass.cute", "compile", "nvidia-cutlass-dsl")
        return adapt(import_attr(f"{MODULE}.rmsnorm", "rmsnorm", PACKAGE))

    return load


def quack(doc: str) -> Arm:
    """The `quack` peer of an RMSNorm operator; aligned pointers only (`Impl.aligned`): its CuTe DSL
    kernels take their tensors with an assumed 16-byte alignment (from its sources, not yet run
    misaligned on a GPU)."""
    return Arm("quack", quack_loader(rmsnorm), f"QuACK: {doc}", aligned=True)


def rmsnorm(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`rmsnorm(x, weight, eps=...)`: eps by keyword (module docstring)."""
    return lambda x, weight, eps=1e-6: fn(x, weight, eps=eps)
