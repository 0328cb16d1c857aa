"""Make the Triton interpreter round float32 -> bfloat16 to nearest even, as GPUs do.

The interpreter of the pip Triton (3.x) converts float32 to bfloat16 by truncating the
mantissa (and its `fp_downcast_rounding="rtne"` path drops the carry into the exponent),
while every GPU backend rounds to nearest even (`cvt.rn.bf16.f32`). Left alone, a correct
kernel run on the CPU differs from the official formula by up to two bf16 ulps and the
correctness gate could not tell a rounding bug from the interpreter's. `patch()` replaces
that one conversion with torch's round-to-nearest-even; every other conversion is Triton's.
Nothing of kerneltrial is imported: the package interface check's worker runs a copy of this
file (trial/worker.py loads it by path; the package interface check copies it).
"""

from __future__ import annotations

import numpy as np
import torch


def patch() -> None:
    """Idempotently route the interpreter's float32 -> bfloat16 conversion through torch."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    if getattr(original, "kerneltrial_patched", False):
        return

    def convert(data, input_dtype, output_dtype, rounding_mode):  # type: ignore[no-untyped-def]
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            as_f32 = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            return as_f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(np.shape(data))
        return original(data, input_dtype, output_dtype, rounding_mode)

    convert.kerneltrial_patched = True  # type: ignore[attr-defined]
    interpreter._convert_float = convert
