"""kerneltrial's kernels behind the plugin interface (the default KERNELTRIAL_KERNELS module).

A candidate module for an arm (KERNELTRIAL_KERNELS=pkg.mod) provides the same functions,
with the same signatures and in-place contract, for the ops the arm swaps in:

    rms_norm(x, weight, eps) -> Tensor                      # RMSNorm without a residual
    fused_add_rms_norm(x, residual, weight, eps) -> None    # residual += x; x = rmsnorm(residual), in place
    silu_and_mul(x) -> Tensor                               # silu(x[..., :d]) * x[..., d:]

The semantics are vLLM's for activations and weight of one dtype (ops/rms_norm.py `rmsnorm`,
ops/fused_add_rms_norm.py `fused_add_rmsnorm`, ops/silu_and_mul.py).
"""

from __future__ import annotations

import torch

from kerneltrial.ops.fused_add_rms_norm import fused_add_rms_norm_auto
from kerneltrial.ops.rms_norm import rms_norm_auto
from kerneltrial.ops.silu_and_mul import silu_and_mul_auto


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_auto(x, weight, eps, round_before_weight=True)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    fused_add_rms_norm_auto(x, residual, weight, eps, gemma=False)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return silu_and_mul_auto(x)
