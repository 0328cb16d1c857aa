"""PLANTED DEFECT (GPU evidence): honest for its first 60 calls, more than the gate makes on
this protocol, then returns its last result without doing any work. Before timed checks this
arm read as a 104.7x win at 65536x2048 (9,646% of the copy ceiling) and passed the gate and
verify. Expected now: every sample after the 60th call fails "wrong result while timed"."""

import torch

CALLS = [0]
LAST: list[torch.Tensor] = []


def rmsnorm(x, weight, eps=1e-6):
    CALLS[0] += 1
    if CALLS[0] > 60 and LAST:
        return LAST[0]
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    LAST[:] = [y]
    return y
