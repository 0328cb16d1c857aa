"""PLANTED DEFECT (GPU only): honest for its first 60 calls, then computes on a side stream it
never makes the caller's stream wait for, after a spin that delays the work; the caller reads
(and the timer's events time) a result that is not there yet. Expected: "wrong result while
timed" (the check synchronises only the current stream) and, where it was timed, a time that
may fall below the launch floor or above the bandwidth ceiling (implausible)."""

import torch

CALLS = [0]
SIDE: list[torch.cuda.Stream] = []


def rmsnorm(x, weight, eps=1e-6):
    CALLS[0] += 1
    if CALLS[0] <= 60:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    if not SIDE:
        SIDE.append(torch.cuda.Stream())
    y = torch.empty_like(x)
    SIDE[0].wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(SIDE[0]):
        torch.cuda._sleep(2_000_000)
        xf = x.float()
        y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight)
    return y
