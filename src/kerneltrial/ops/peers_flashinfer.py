"""Adapters for FlashInfer's kernels: the `flashinfer` peer (PyPI `flashinfer-python`, imported as
`flashinfer`). The public functions and signatures, as FlashInfer 0.6-0.7 defines them
(flashinfer/norm/__init__.py, flashinfer/activation.py):

    flashinfer.norm.rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None) -> Tensor
    flashinfer.norm.fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None
    flashinfer.norm.gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None) -> Tensor
    flashinfer.norm.gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None
    flashinfer.activation.silu_and_mul(input, out=None, enable_pdl=None) -> Tensor

`enable_pdl` is left at its default, as FlashInfer's users call it (programmatic dependent
launch where the device supports it: Hopper on). Which kernel each operator gets, and how its
contract differs from the operator's (judged by the operator's own tolerance; none is loosened):
- rmsnorm: `norm.rmsnorm` into a fresh tensor through `out`. It rounds once, after the weight
  (`float(x) * rms_rcp * float(w)`, include/flashinfer/norm.cuh RMSNormKernel); the operator
  rounds before the weight. Rows are passed with their row stride (the kernel takes
  `stride_input`), so `row_strided` runs without a copy; fp16/bf16 only (its JIT dispatch).
- rmsnorm_fp32: `norm.rmsnorm`: the operator's contract exactly (fp32 statistics and product,
  one rounding); float32 cases raise (fp16/bf16 only), a named failure.
- fused_add_rmsnorm: `norm.fused_add_rmsnorm`, in place like the operator (residual += input;
  input = rmsnorm(residual) * weight): statistics and output of the unrounded fp32 sum, one
  rounding after the weight (the operator: statistics of the stored sum, rounding before the
  weight); rows with their row strides (`stride_input`, `stride_residual`).
- gemma_fused_add_rmsnorm: `norm.gemma_fused_add_rmsnorm`, in place, (1 + w) in fp32 from the
  unrounded sum (the operator: the stored sum).
- silu_and_mul: `activation.silu_and_mul`, out of place: fp32 silu and product, one rounding
  (the operator rounds silu first, as vLLM). Contiguous rows only (the kernel indexes
  token * 2d); it raises ValueError for rows whose bytes are not a multiple of 16.
- rotary_embedding, rotary_embedding_gptj: `rope.apply_rope_with_cos_sin_cache_inplace(positions, query,
  key, head_size, cos_sin_cache, is_neox)`, in place on [tokens, heads * head_size] views over whole
  heads (rotary_dim from the cache's width); it takes a float32 cache, converted per call.
- `norm.gemma_rmsnorm` has no kerneltrial operator (Gemma's norm without the add): not registered.
FlashInfer 0.6 on runs its norm kernels through CuTe DSL when nvidia-cutlass-dsl imports and
through its JIT CUDA build otherwise (`_USE_CUDA_NORM`, also forced by FLASHINFER_USE_CUDA_NORM=1);
the adapters call the public function either way, so the kernel timed is the one a user of the
same installation gets.

Availability, each a one-line reason: the package, a CUDA device, then the JIT: FlashInfer
builds its CUDA kernels at first use with nvcc (found as peers.require_nvcc says) and ninja,
unless the prebuilt `flashinfer_jit_cache` package is installed.

Carrying it to the GPU machine (64 MiB per call; measured with `pip download --no-deps`,
docs/NOTES.md): flashinfer-python 0.7.4 is a 101.3 MB wheel (43 MiB of it the CUDA sources of
every kernel family) and would need slimming; 0.6.7.post3 is 9.2 MB, fits whole and is the one
scripts/device/fetch_wheels.sh fetches: with apache-tvm-ffi and nvidia-ml-py alone it imports
flashinfer.norm and flashinfer.activation, whose signatures are the five above (measured with
inspect.signature). nvidia-cutlass-dsl-libs-cu12 4.8.1 (87.4 MiB, one 69.3 MiB compressed .so)
cannot be carried in one call nor slimmed: without it FlashInfer's norms take their JIT CUDA path.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import torch

from kerneltrial.ops import launch
from kerneltrial.ops.peers import Loader, import_attr, require_cuda, require_installed, require_nvcc
from kerneltrial.ops.rotary import whole_heads
from kerneltrial.ops.spec import Arm, Unavailable

PACKAGE = "flashinfer-python"
MODULE = "flashinfer"
JIT_CACHE = "flashinfer_jit_cache"  # FlashInfer's prebuilt kernels (PyPI flashinfer-jit-cache)


def require_jit() -> None:
    """FlashInfer's JIT CUDA build: its prebuilt cache, else nvcc and ninja (module docstring)."""
    try:
        require_installed(JIT_CACHE, "flashinfer-jit-cache")
        return
    except Unavailable:
        pass
    require_nvcc("FlashInfer's JIT CUDA kernels")
    if shutil.which("ninja") is None:
        raise Unavailable("FlashInfer's JIT CUDA kernels build with ninja; none on PATH (pip install ninja)")


def flashinfer_loader(module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]]) -> Loader:
    """Loader for `flashinfer.<module>.<attr>`; `adapt` wraps it into the operator's signature."""

    def load() -> Callable[..., Any]:
        require_installed(MODULE, PACKAGE)
        require_cuda("FlashInfer")
        require_jit()
        return adapt(import_attr(f"{MODULE}.{module}", attr, PACKAGE))

    return load


def flashinfer(
    module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]], doc: str, layouts: tuple[str, ...] | None = None
) -> Arm:
    """The `flashinfer` peer: `flashinfer.<module>.<attr>` wrapped by `adapt` (`flashinfer_loader`).
    Aligned pointers only (`Impl.aligned`): its kernels load 16-byte vectors (`vec_t`) from the
    data pointers as given; a misaligned one would fault, a sticky CUDA error in the harness
    (from its sources, not yet run misaligned on a GPU)."""
    return Arm(
        "flashinfer", flashinfer_loader(module, attr, adapt), f"FlashInfer: {doc}", layouts=layouts, aligned=True
    )


# ---- adapters (each takes FlashInfer's function, returns the operator's signature) --------


def rmsnorm_out(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`rmsnorm(input, weight, eps, out=...)` on a [rows, N] view, into a fresh tensor."""

    def run(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        rows = launch.as_rows(x)
        y = x.new_empty(x.shape)
        fn(rows, weight, eps=eps, out=y.view(rows.shape))
        return y

    return run


def fused_add_in_place(fn: Callable[..., None]) -> Callable[..., None]:
    """`fused_add_rmsnorm(input, residual, weight, eps)` (or its Gemma twin) on [rows, N] views, in place."""

    def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        fn(launch.in_place_rows(x, "x"), launch.in_place_rows(residual, "residual"), weight, eps=eps)

    return run


def silu_and_mul(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`silu_and_mul(input)`: a fresh [..., d] tensor."""
    return lambda x: fn(x)


def rope_in_place(fn: Callable[..., None], neox: bool) -> Callable[..., None]:
    """`rope.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
    is_neox)` on [tokens, heads * head_size] views over whole heads (ops/rotary.py `whole_heads`);
    the cache converted to the float32 it requires, per call."""

    def run(query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> None:
        q, k, head_size = whole_heads(query, key)
        fn(positions, q, k, head_size, cos_sin_cache.float(), is_neox=neox)

    return run
