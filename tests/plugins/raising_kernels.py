"""A candidate kernels module (KERNELTRIAL_KERNELS) whose rms_norm raises: a planted fault."""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    raise RuntimeError("planted: this candidate's rms_norm fails")


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    raise RuntimeError("planted: this candidate's fused_add_rms_norm fails")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
