"""The FLOP counts of the built-in operators (`Operator.flops`): the numerator of a trial's
achieved TFLOPS (kernel/summary_cases.py), where a count is meaningful.

What is counted, for every operator: one FLOP per floating-point add, subtract, multiply or
divide, and one per evaluation of exp, tanh or rsqrt (a transcendental counts as one, as
nvbench and tritonbench count it). Not counted: loads, stores, dtype conversions, index
arithmetic, comparisons (an argmax's) and the cache or position lookups of rotary. A count is
what the operator's formula needs, not what a kernel happens to execute: a kernel that
recomputes a value, or precomputes one per row, changes its time, never its count.
"""

from __future__ import annotations

import math

from kerneltrial.ops.spec import Case

# per element of x: square it, add it into the row's sum, scale it by the row's rstd, multiply by
# the weight; per row: divide the sum by the width (the mean), add eps, take its rsqrt
NORM_PER_ELEMENT = 4
NORM_PER_ROW = 3
SIGMOID = 4  # 1 / (1 + exp(-g)): negate, exp, add 1, divide


def _elements_and_rows(case: Case) -> tuple[int, int]:
    """Elements of x and its rows (every dimension but the last)."""
    n = math.prod(case.shape)
    return n, n // case.shape[-1]


def rmsnorm(case: Case) -> int:
    """rmsnorm, rmsnorm_fp32 and zimage_qk_rmsnorm: 4 FLOPs per element (square, sum, scale by
    rstd, weight) and 3 per row (mean, + eps, rsqrt)."""
    n, rows = _elements_and_rows(case)
    return NORM_PER_ELEMENT * n + NORM_PER_ROW * rows


def rmsnorm_pair(case: Case) -> int:
    """zimage_qk_rmsnorm_pair: Q and K, each normalised as `rmsnorm` counts it."""
    return 2 * rmsnorm(case)


def fused_add_rmsnorm(case: Case) -> int:
    """fused_add_rmsnorm: `rmsnorm`'s count plus 1 FLOP per element (residual = x + residual)."""
    n, _ = _elements_and_rows(case)
    return rmsnorm(case) + n


def gemma_fused_add_rmsnorm(case: Case) -> int:
    """gemma_fused_add_rmsnorm: `fused_add_rmsnorm`'s count plus 1 FLOP per element (the weight's 1 + w)."""
    n, _ = _elements_and_rows(case)
    return fused_add_rmsnorm(case) + n


def silu_and_mul(case: Case) -> int:
    """silu_and_mul, x [..., 2d] -> [..., d]: 6 FLOPs per output element: the gate's sigmoid (4:
    negate, exp, add 1, divide), times the gate (silu), times the up half."""
    n, _ = _elements_and_rows(case)
    return (SIGMOID + 2) * (n // 2)


def sigmoid_gate_mul(case: Case) -> int:
    """sigmoid_gate_mul, out = x * sigmoid(gate): 4 FLOPs per gate (its sigmoid) and 1 per output
    element (the multiply); a `row_gate` case has one gate per row, every other one per element."""
    n, rows = _elements_and_rows(case)
    gates = rows if case.layout == "row_gate" else n
    return SIGMOID * gates + n


def softcap_row_argmax(case: Case) -> int:
    """softcap_row_argmax: 3 FLOPs per logit (cap * tanh(logit / cap): divide, tanh, multiply);
    the argmax's comparisons are not counted."""
    n, _ = _elements_and_rows(case)
    return 3 * n


def rotary(case: Case) -> int:
    """rotary_embedding and rotary_embedding_gptj, shape (tokens, q_heads, kv_heads, rotary_dim):
    3 FLOPs per rotated element of Q and K: each pair (a, b) becomes (a cos - b sin, b cos + a sin),
    4 multiplies and 2 adds per pair. The cos/sin lookup by position is not counted."""
    tokens, q_heads, kv_heads, rotary_dim = case.shape
    return 3 * tokens * (q_heads + kv_heads) * rotary_dim
