"""The kernels a plugin serves, as opaque torch custom ops that count their calls.

`install(load_kernels(module, ops))` makes torch.ops.kerneltrial.{rms_norm,
fused_add_rms_norm, silu_and_mul} call the module's functions (see kernels.py for the
interface). They are custom ops rather than plain functions because vLLM compiles the
model (torch.compile, Inductor on CPU): a plain Python function would be traced once and
its call counter would run at trace time only, while an opaque op runs, and counts, at
every call. Each call is recorded (records.py) under the kernels' label, as an error when
the kernel raised.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

import torch

from kerneltrial.plugins import DISPATCH_OPS, KERNELS_ENV, OUR_KERNELS, impl_label
from kerneltrial.plugins.records import record_call


@dataclass(frozen=True)
class KernelSet:
    """The functions of one kernels module, by kernel-level op name."""

    module: str
    fns: dict[str, Callable[..., object]]

    @property
    def label(self) -> str:
        return impl_label(self.module)

    def serves(self, dispatch_op: str) -> bool:
        return all(k in self.fns for k in DISPATCH_OPS[dispatch_op])


def load_kernels(module: str, ops: Iterable[str] | None = None) -> KernelSet:
    """Import `module` and take its kernels for the dispatch `ops` (None: every op it has).

    ValueError naming the module and the missing function when it cannot serve them."""
    if module == OUR_KERNELS:
        check_interpreter()
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{KERNELS_ENV}={module!r} cannot be imported ({e}); name an importable module") from e
    wanted = list(DISPATCH_OPS) if ops is None else list(ops)
    fns: dict[str, Callable[..., object]] = {}
    for op in wanted:
        for kernel in DISPATCH_OPS[op]:
            fn = getattr(mod, kernel, None)
            if callable(fn):
                fns[kernel] = fn
            elif ops is not None:
                raise ValueError(
                    f"{KERNELS_ENV}={module!r} has no function {kernel}() needed for {op}; "
                    "see kerneltrial.plugins.kernels for the interface"
                )
    kernels = KernelSet(module, fns)
    if not any(kernels.serves(op) for op in wanted):
        raise ValueError(f"{KERNELS_ENV}={module!r} serves none of {wanted}; see kerneltrial.plugins.kernels")
    return kernels


def check_interpreter() -> None:
    """Without CUDA our Triton kernels run in the Triton interpreter, which needs
    TRITON_INTERPRET=1 before triton is first imported: every @triton.jit function decorated
    earlier (tl.sum, tl.max, ...) stays a compiled-kernel function and fails when an
    interpreted kernel calls it ("Cannot call @triton.jit'd outside of the scope of a
    kernel"). vLLM imports triton before any plugin runs, so on a CPU server the
    environment must set it. ValueError saying so, instead of a failure at the first call."""
    import kerneltrial.ops  # noqa: F401  (sets TRITON_INTERPRET when triton is not imported yet)

    if torch.cuda.is_available():
        return
    import triton.language.standard as std
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(std.sum, InterpretedFunction):
        raise ValueError(
            "no CUDA device and triton was imported without TRITON_INTERPRET=1, so kerneltrial's Triton "
            "kernels cannot run; set TRITON_INTERPRET=1 in the server's environment"
        )


# The active kernels of this process: one set per process (the torch ops are global too).
_active: KernelSet | None = None


def install(kernels: KernelSet) -> None:
    """Route the torch ops to `kernels`; a second, different set in one process is refused."""
    global _active
    if _active is not None and _active.module != kernels.module:
        raise ValueError(f"kernels from {_active.module!r} are already installed; one kernels module per process")
    if not hasattr(torch.ops.kerneltrial, "rms_norm"):
        _define_torch_ops()
    _active = kernels


def refuse(op: str, why: str) -> NoReturn:
    """Count a call the kernels cannot serve as an error of `op`, and raise NotImplementedError."""
    record_call(op, _installed(op).label, ok=False)
    raise NotImplementedError(why)


def _installed(op: str) -> KernelSet:
    if _active is None or op not in _active.fns:
        raise RuntimeError(f"torch.ops.kerneltrial.{op} called before install() gave it a kernel")
    return _active


def _counted(op: str, *args: object) -> object:
    kernels = _installed(op)
    try:
        out = kernels.fns[op](*args)
    except Exception:
        record_call(op, kernels.label, ok=False)
        raise
    record_call(op, kernels.label, ok=True)
    return out


def _define_torch_ops() -> None:
    @torch.library.custom_op("kerneltrial::rms_norm", mutates_args=())
    def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return _counted("rms_norm", x, weight, eps)  # type: ignore[return-value]

    @_rms_norm.register_fake
    def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.custom_op("kerneltrial::fused_add_rms_norm", mutates_args=("x", "residual"))
    def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        _counted("fused_add_rms_norm", x, residual, weight, eps)

    @_fused_add_rms_norm.register_fake
    def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        return None

    @torch.library.custom_op("kerneltrial::silu_and_mul", mutates_args=())
    def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        return _counted("silu_and_mul", x)  # type: ignore[return-value]

    @_silu_and_mul.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.ops.kerneltrial.rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    torch.ops.kerneltrial.fused_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.kerneltrial.silu_and_mul(x)
