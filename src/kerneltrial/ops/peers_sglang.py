"""Adapters for SGLang's kernels: the `sglang` peer, from the `sglang` wheel's kernel namespace
`sglang.kernels.ops.<group>` (version pinned in scripts/device/fetch_wheels.sh, 0.5.23).

Which kernel each operator gets, and how its contract differs from the operator's (every
difference is judged by the operator's own tolerance; none is loosened for SGLang):
- rmsnorm: `layernorm.norm.rmsnorm` (JIT CUDA, tvm-ffi, compiled with nvcc at first use),
  out of place through its `out` argument (without one it overwrites its input). It rounds
  once, after the weight (fp32 to the store); the operator rounds before the weight. Widths:
  64, 128, 256 and multiples of 256 up to 16384; it raises for any other.
- rmsnorm_fp32: `layernorm.rmsnorm_fp32.rmsnorm_fp32` (Triton): the operator's contract
  exactly; contiguous input only (it asserts so).
- fused_add_rmsnorm: `layernorm.norm.fused_add_rmsnorm` (JIT CUDA), in place like the
  operator, with SGLang's default `cast_x_before_out_mul=False`: statistics of the unrounded
  fp32 sum, one rounding after the weight (the operator: statistics of the stored sum,
  rounding before the weight). Contiguous rows only (it checks strides D, 1), widths that
  are multiples of 8 up to 8192.
- gemma_fused_add_rmsnorm: `layernorm.minimax_m3_rmsnorm._gemma_fused_add_rmsnorm_kernel`
  (Triton; SGLang's Gemma fused add on ROCm: on CUDA SGLang calls `sgl_kernel`, the
  precompiled sglang-kernel wheel, not carried). Its wrapper returns new tensors; copying
  them back would charge SGLang two passes its users do not pay, so the kernel is launched
  as its wrapper launches it with the outputs aliased to x and residual (safe: a program
  loads its row of both before storing). It normalises the unrounded fp32 sum (the
  operator: the stored sum). Contiguous only (it writes rows at row * N).
- silu_and_mul: `activation.silu_and_mul` (JIT CUDA, fast math), out of place; fp32 silu
  and product, one rounding (the operator rounds silu first, as vLLM). Contiguous only.
- zimage_qk_rmsnorm (and the Q+K pair, as two calls): `diffusion.norm.
  zimage_qk_rmsnorm_triton.zimage_qk_rmsnorm_native` (Triton), bit-exact with SGLang's eager
  ZImageRMSNorm chain: squares, mean and rsqrt rounded to bf16 (the operator keeps the
  statistics in fp32). bf16, head_dim 128, heads packed; it returns None for anything else
  and the adapter raises, naming that. It takes [B, S, H, D]; a [tokens, H, D] x is viewed
  as [1, tokens, H, D] (no copy).
- softcap_row_argmax: `sampling.softcap_row_argmax.softcap_row_argmax` (Triton) takes fp32
  logits and returns fp32 (max, index) pairs: bf16 logits are converted to fp32 and the
  index column to int64 inside the call, costs SGLang's contract imposes (in SGLang the
  logits are fp32 already).
- rotary_embedding, rotary_embedding_gptj: `attention.rope.apply_rope_with_cos_sin_cache_inplace` (JIT
  CUDA, SGLang's RotaryEmbedding path), in place on [tokens, heads, head_size] views, rope_dim = R;
  a float32 cache, converted per call (its name and signature from SGLang's sources, not yet run).
- sigmoid_gate_mul: no SGLang kernel of that contract was found in 0.5.23.

On the GPU machine the wheel is carried slimmed (scripts/device/slim_wheel.py): sglang/kernels/
whole and the .py files of sglang/srt/, byte-identical; provenance's "sglang 0.5.23" means those
files of that version, not the whole package (results/h200-sglang-probe: `import sglang` itself
fails there, the kernel namespace imports).

Import: SGLang's kernel namespace is imported without running `sglang/__init__.py`. That
file sets TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR (os.environ.setdefault) and patches
transformers: side effects on every other arm and on model trials in the same process; it
also pulls in the frontend (IPython). The namespace needs none of it (its package docstring:
importing it imports no backend). `kernels_package` registers a bare `sglang` package over
the installed directory, unless sglang is imported already; SGLang's code runs unmodified.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import triton

from kerneltrial.ops import launch
from kerneltrial.ops.peers import Loader, import_attr, require_cuda, require_installed, require_nvcc
from kerneltrial.ops.spec import Arm, Unavailable

PACKAGE = "sglang"
NAMESPACE = "sglang.kernels.ops"


def kernels_package() -> None:
    """Make `sglang.kernels` importable without sglang/__init__.py (module docstring)."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable(f"{PACKAGE} is not installed ({PACKAGE})")
    bare = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    bare.submodule_search_locations = list(spec.submodule_search_locations)
    package = types.ModuleType(PACKAGE)
    package.__spec__ = bare
    package.__path__ = bare.submodule_search_locations
    sys.modules[PACKAGE] = package


def require_jit() -> None:
    """SGLang's JIT CUDA kernels compile with nvcc through tvm-ffi at first call (peers.require_nvcc)."""
    require_nvcc("SGLang's JIT CUDA kernels")
    import_attr("tvm_ffi", "load_module", "apache-tvm-ffi")


def sglang_loader(module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]], jit: bool) -> Loader:
    """Loader for `sglang.kernels.ops.<module>.<attr>`; `adapt` wraps it into the operator's signature."""

    def load() -> Callable[..., Any]:
        require_installed(PACKAGE, PACKAGE)
        require_cuda("SGLang")
        if jit:
            require_jit()
        kernels_package()
        return adapt(import_attr(f"{NAMESPACE}.{module}", attr, PACKAGE))

    return load


def sglang(
    module: str,
    attr: str,
    adapt: Callable[[Any], Callable[..., Any]],
    doc: str,
    *,
    jit: bool,
    layouts: tuple[str, ...] | None = None,
    widths: tuple[int, ...] | None = None,
) -> Arm:
    """The `sglang` peer: `sglang.kernels.ops.<module>.<attr>` wrapped by `adapt` (`sglang_loader`;
    `layouts`, `widths`: its contract, see `Impl`). Its JIT CUDA kernels (`jit`) take aligned
    pointers only (`Impl.aligned`: packed vector loads from the pointers as given; from their
    sources, not yet run misaligned on a GPU); its Triton kernels take any."""
    return Arm(
        "sglang",
        sglang_loader(module, attr, adapt, jit),
        f"SGLang: {doc}",
        layouts=layouts,
        widths=widths,
        aligned=jit,
    )


# ---- adapters (each takes SGLang's function, returns the operator's signature) ------------


def rmsnorm_out(fn: Callable[..., None]) -> Callable[..., torch.Tensor]:
    """`rmsnorm(input, weight, out=None, eps)` into a fresh tensor (out=None would write x)."""

    def run(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        rows = launch.as_rows(x)
        y = x.new_empty(x.shape)
        fn(rows, weight, out=y.view(rows.shape), eps=eps)
        return y

    return run


def rmsnorm_fp32(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`rmsnorm_fp32(x, weight, eps)` (positional eps, no default)."""
    return lambda x, weight, eps=1e-6: fn(x, weight, eps)


def fused_add_in_place(fn: Callable[..., None]) -> Callable[..., None]:
    """`fused_add_rmsnorm(input, residual, weight, eps)` on [rows, N] views, in place."""

    def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        n = x.shape[-1]
        fn(x.view(-1, n), residual.view(-1, n), weight, eps)

    return run


def gemma_fused_add_in_place(kernel: Any) -> Callable[..., None]:
    """`_gemma_fused_add_rmsnorm_kernel` launched as `gemma_fused_add_rmsnorm` launches it
    (one row per program, next-pow2 block, its `_num_warps`), outputs aliased to the inputs."""
    num_warps = import_attr(f"{NAMESPACE}.layernorm.minimax_m3_rmsnorm", "_num_warps", PACKAGE)

    def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        n = x.shape[-1]
        xr, rr = x.view(-1, n), residual.view(-1, n)
        block_n = triton.next_power_of_2(n)
        kernel[(xr.shape[0],)](
            xr, rr, weight, xr, rr, n, xr.stride(0), xr.stride(1), rr.stride(0), rr.stride(1), eps,
            BLOCK_N=block_n, num_warps=num_warps(block_n),
        )  # fmt: skip

    return run


def silu_and_mul(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`silu_and_mul(input, out=None)`: a fresh [..., d] tensor."""
    return lambda x: fn(x)


def zimage_qk(fn: Callable[..., torch.Tensor | None]) -> Callable[..., torch.Tensor]:
    """`zimage_qk_rmsnorm_native(x [B, S, H, D], weight, eps)`; None means it declines x."""

    def run(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
        if x.dim() not in (3, 4):
            raise ValueError(f"SGLang's Z-Image QK RMSNorm takes [B, S, H, D]; got {x.dim()} dimensions")
        x4 = x.unsqueeze(0) if x.dim() == 3 else x
        y = fn(x4, weight, eps)
        if y is None:
            raise ValueError(
                f"SGLang's zimage_qk_rmsnorm_native declines {tuple(x.shape)} {x.dtype} strides {x.stride()}: "
                "it takes bf16, head_dim 128, heads packed"
            )
        return y.view(x.shape)

    return run


def zimage_qk_pair(fn: Callable[..., torch.Tensor | None]) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Q, then K: two calls of `zimage_qk` (SGLang's kernel normalises one tensor per launch)."""
    single = zimage_qk(fn)

    def run(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-5
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return single(q, q_weight, eps), single(k, k_weight, eps)

    return run


def softcap_argmax(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`softcap_row_argmax(logits fp32, cap, valid_width, col_offset)` -> fp32 [rows, 2]
    (max, index): fp32 logits in, the index column out as int64."""

    def run(logits: torch.Tensor, cap: float) -> torch.Tensor:
        return fn(logits.float(), cap, logits.shape[1], 0)[:, 1].to(torch.int64)

    return run


def rope_in_place(fn: Callable[..., None], neox: bool) -> Callable[..., None]:
    """`attention.rope.apply_rope_with_cos_sin_cache_inplace(q [tokens, heads, head_size], k,
    cos_sin_cache, positions, is_neox=, rope_dim=)` on views over whole heads, rope_dim = R; the cache
    converted to the float32 it requires, per call."""

    def run(query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> None:
        head_size = query.stride(1)
        q, k = (x.as_strided((x.shape[0], x.shape[1], head_size), (x.stride(0), head_size, 1)) for x in (query, key))
        fn(q, k, cos_sin_cache.float(), positions, is_neox=neox, rope_dim=query.shape[-1])

    return run
