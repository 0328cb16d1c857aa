"""vllm-plugin-FL dispatch plugin: our kernels as vendor `kerneltrial` OpImpls.

Found by vllm_fl.dispatch's discovery through the entry-point group `vllm_fl.plugin`
(pyproject.toml) or `VLLM_FL_PLUGIN_MODULES=kerneltrial.plugins.vllm_fl`; discovery calls
`register(registry)` in every process that initialises the dispatch manager. Registered:

    OpImpl(op_name="rms_norm",     impl_id="vendor.kerneltrial", kind=VENDOR, vendor="kerneltrial")
    OpImpl(op_name="silu_and_mul", impl_id="vendor.kerneltrial", kind=VENDOR, vendor="kerneltrial")

called as vllm_fl's layers call them (vllm_fl/ops/layernorm.py, activation.py):
`fn(layer, x, residual)` -> out, or (x, residual) after the in-place fused add; `fn(layer, x)`.
Priority 0, below every built-in vendor, so the policy picks ours only where it names it:
`VLLM_FL_PER_OP="rms_norm=vendor:kerneltrial;silu_and_mul=vendor:kerneltrial"` (one token per
op: with a second token the dispatcher may fall back, which the call records show as errors).
A candidate arm serves its own module's kernels with KERNELTRIAL_KERNELS=pkg.mod.
"""

from __future__ import annotations

from typing import Any

import torch

from kerneltrial.plugins import DISPATCH_OPS, FL_IMPL_ID, FL_VENDOR, kernels_module
from kerneltrial.plugins import ops as kt_ops
from kerneltrial.plugins.records import PluginLoad, record_load

PRIORITY = 0  # below BackendPriority.VENDOR (100) of the built-in vendors: chosen only when named


def rms_norm(layer: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
    """The FL `rms_norm` signature: weight and epsilon come from the calling RMSNorm layer."""
    if getattr(layer, "variance_size_override", None) is not None:
        kt_ops.refuse(
            "rms_norm" if residual is None else "fused_add_rms_norm",
            "kerneltrial's rms_norm normalises over the whole row; var_hidden_size is unsupported",
        )
    if residual is None:
        return kt_ops.rms_norm(x, layer.weight, layer.variance_epsilon)
    kt_ops.fused_add_rms_norm(x, residual, layer.weight, layer.variance_epsilon)
    return x, residual


def silu_and_mul(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """The FL `silu_and_mul` signature (`layer` may be None: vllm_fl's fused MoE passes None)."""
    return kt_ops.silu_and_mul(x)


_FL_FNS = {"rms_norm": rms_norm, "silu_and_mul": silu_and_mul}


def register(registry: Any) -> None:
    """Register our OpImpls into a vllm_fl.dispatch OpRegistry (idempotent per registry)."""
    from vllm_fl.dispatch.types import BackendImplKind, OpImpl

    module = kernels_module()
    try:
        kernels = kt_ops.load_kernels(module)
        kt_ops.install(kernels)
    except Exception as e:
        record_load(PluginLoad("vllm_fl", module, (), f"{type(e).__name__}: {e}"))
        raise  # FL's discovery logs it and carries on; the record keeps the reason
    served = tuple(op for op in DISPATCH_OPS if kernels.serves(op))
    for op in served:
        if registry.get_implementation(op, FL_IMPL_ID) is None:
            registry.register_impl(
                OpImpl(
                    op_name=op,
                    impl_id=FL_IMPL_ID,
                    kind=BackendImplKind.VENDOR,
                    fn=_FL_FNS[op],
                    vendor=FL_VENDOR,
                    priority=PRIORITY,
                )
            )
    record_load(PluginLoad("vllm_fl", module, served))
