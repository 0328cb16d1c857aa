"""Operators, their Triton kernels and the registry that names them.

On a machine without a CUDA device, Triton kernels can only run through the Triton
interpreter, which Triton selects from TRITON_INTERPRET when a kernel is decorated.
Importing this package therefore sets TRITON_INTERPRET=1 when no GPU is visible (unless
the variable is already set), before any kernel module is imported, and fixes the
interpreter's bfloat16 rounding (see interpreter_fix.py). Everything that reports timings
labels such runs as interpreter runs, never as GPU performance.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from kerneltrial.ops import interpreter_fix

    interpreter_fix.patch()
