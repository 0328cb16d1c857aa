"""The MATH-500 gate's statistics: accuracy, its interval, the gate rule, and the probability that a
model exactly at the gate passes.

n problems, k samples each (AccuracySpec.samples); c_i = problem i's correct samples, T = sum c_i.

- accuracy = T / (n k), which is the mean over problems of each problem's share c_i / k (every
  problem has k samples: the run records them and verify checks it).
- interval, k = 1: the Wilson score interval of T in n (scipy's, no continuity correction), as
  before samples existed, so older runs recompute identically.
- interval, k > 1: samples of one problem are correlated (an easy problem is answered right k
  times), so the n k samples are worth fewer independent ones. The interval is Wilson's on the
  effective sample size n k / deff, with the design effect estimated from the per-problem shares:
  deff = max(1, Var_problems / Var_independent), Var_problems = s^2 / n (s^2 the sample variance
  of c_i / k over problems: the problem-level variance of the mean), Var_independent = p (1 - p) /
  (n k). In integers: deff = k n (n Q - T^2) / ((n - 1) T (n k - T)), Q = sum c_i^2. deff >= 1:
  never narrower than n k independent samples; a single problem (n = 1) counts as one sample.
  Its assumption: problems are a random sample of the level, exchangeable within a problem.
- rule "point": accuracy >= gate; "lower_bound": the interval's lower end >= gate. Either also
  needs no failed request and the preregistered n (accuracy.required_n).
- pass_probability_at_gate: P(the rule passes) for a model whose every sample is correct with
  probability exactly `gate`, independently (every problem equally hard), with this n and k: for
  k = 1 the binomial sum over the outcomes the rule passes; for k > 1 (point) the same over n k
  samples, (lower_bound) an exact sum over the joint law of (T, Q) (a dynamic programme over
  problems). Independence is the case most favourable to the lower_bound rule: problems of
  unequal difficulty raise deff, widen the interval and lower the probability. For the point rule
  the figure is about one half whatever n: the gate then tells a model at 0.95 from one below it
  no better than a coin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kerneltrial.serving.metrics import wilson_interval as wilson

GateRule = Literal["point", "lower_bound"]
# Seed of problem i's sample j: seed + i + j * SEED_STRIDE (j = 0: seed + i, the seed before samples).
SEED_STRIDE = 1_000_000
# Largest (T, Q) table the exact lower_bound probability builds (float64 cells; 105 problems of 8
# samples need 5.6 million, a few seconds); beyond it the probability is not computed (None).
MAX_DP_CELLS = 8_000_000
PASS_PROBABILITY_ASSUMPTION = (
    "P(the rule passes) for a model whose every sample is correct with probability exactly the gate, "
    "independently (every problem equally hard), with this n and samples per problem"
)
WILSON = "wilson"
WILSON_DEFF = "wilson-design-effect"


@dataclass(frozen=True)
class GateFigures:
    """One arm's gate figures from its per-problem correct counts."""

    n: int  # problems
    samples: int  # k per problem
    correct: int  # T: correct samples over all problems
    accuracy: float
    ci_low: float
    ci_high: float
    interval: str  # WILSON (k = 1) or WILSON_DEFF (k > 1)
    design_effect: float  # 1.0 for k = 1


def sample_seed(seed: int, index: int, sample: int) -> int:
    """The sampling seed of problem `index`'s sample `sample`."""
    return seed + index + sample * SEED_STRIDE


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def _deff_wilson(
    t: np.ndarray, q: np.ndarray, n: int, k: int, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, deff) for totals t and sums of squares q of n problems of k samples (k > 1)."""
    t, q = t.astype(np.float64), q.astype(np.float64)
    m = n * k
    with np.errstate(divide="ignore", invalid="ignore"):
        deff = k * n * (n * q - t * t) / ((n - 1) * t * (m - t)) if n > 1 else np.full_like(t, float(k))
    deff = np.where(np.isfinite(deff), np.maximum(deff, 1.0), 1.0)
    eff = m / deff
    p, z2 = t / m, _z(confidence) ** 2
    centre = (p + z2 / (2 * eff)) / (1 + z2 / eff)
    half = math.sqrt(z2) / (1 + z2 / eff) * np.sqrt(p * (1 - p) / eff + z2 / (4 * eff * eff))
    low = np.where(t == 0, 0.0, np.clip(centre - half, 0.0, 1.0))  # exact ends, as Wilson's
    return low, np.where(t == m, 1.0, np.clip(centre + half, 0.0, 1.0)), deff


def gate_figures(counts: list[int], samples: int, confidence: float) -> GateFigures:
    """Accuracy and interval of problems with `counts` correct samples of `samples` each."""
    n, t = len(counts), sum(counts)
    acc = t / (n * samples) if n else 0.0
    if samples == 1 or n == 0:
        lo, hi = wilson(t, n * samples, confidence)
        return GateFigures(n, samples, t, acc, lo, hi, WILSON if samples == 1 else WILSON_DEFF, 1.0)
    q = sum(c * c for c in counts)
    low, high, deff = _deff_wilson(np.array([t]), np.array([q]), n, samples, confidence)
    return GateFigures(n, samples, t, acc, float(low[0]), float(high[0]), WILSON_DEFF, float(deff[0]))


def rule_passes(figures: GateFigures, gate: float, rule: GateRule) -> bool:
    """The stated rule on the figures (the request errors and n are checked beside it)."""
    return figures.accuracy >= gate if rule == "point" else figures.ci_low >= gate


def pass_probability(n: int, samples: int, gate: float, confidence: float, rule: GateRule) -> float | None:
    """P(rule passes | every sample correct with probability `gate`, independently), n problems of
    `samples` each; None when the exact lower_bound sum would need more than MAX_DP_CELLS cells."""
    from scipy.stats import binom

    m = n * samples
    if n <= 0:
        return 0.0
    pmf = binom.pmf(np.arange(m + 1), m, gate).tolist()
    if rule == "point":  # the outcomes x of the n k samples whose accuracy x / (n k) reaches the gate
        return math.fsum(pmf[x] for x in range(m + 1) if x / m >= gate)
    if samples == 1:  # those whose Wilson lower end reaches it
        return math.fsum(pmf[x] for x in range(m + 1) if wilson(x, n, confidence)[0] >= gate)
    return _lower_bound_probability(n, samples, gate, confidence)


def _lower_bound_probability(n: int, k: int, gate: float, confidence: float) -> float | None:
    """The exact lower_bound pass probability for k > 1: the law of (T, Q) built problem by problem."""
    from scipy.stats import binom

    rows, cols = n * k + 1, n * k * k + 1
    if rows * cols > MAX_DP_CELLS:
        return None
    per = binom.pmf(np.arange(k + 1), k, gate)
    table = np.zeros((rows, cols))
    table[0, 0] = 1.0
    for i in range(n):
        r, c = i * k + 1, i * k * k + 1  # the cells reachable after i problems
        step = np.zeros((r + k, c + k * k))
        for x in range(k + 1):
            step[x : x + r, x * x : x * x + c] += per[x] * table[:r, :c]
        table[: r + k, : c + k * k] = step
    t_idx, q_idx = np.nonzero(table)
    low, _, _ = _deff_wilson(t_idx, q_idx, n, k, confidence)
    return float(math.fsum(table[t_idx, q_idx][low >= gate].tolist()))
