"""verify's own arithmetic (never kerneltrial.stats): median, quantiles by linear interpolation,
spread, the bootstrap's percentile interval and the contract's resample draw, the gate grammar,
and the comparison of a recorded figure with a recomputed one (relative 1e-9)."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import numpy as np

from kerneltrial.rundir.errors import RunDirError

REL_TOL = 1e-9


def median_of(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def row_medians(matrix: np.ndarray) -> np.ndarray:
    """Median of each row: sort the rows, take the middle (mean of the two middles when even)."""
    ordered = np.sort(matrix, axis=1)
    n = ordered.shape[1]
    mid = n // 2
    return ordered[:, mid] if n % 2 else (ordered[:, mid - 1] + ordered[:, mid]) / 2


def quantile(sorted_values: np.ndarray | list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method), written out."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo]))


def spread(values: list[float]) -> float:
    """(p10 .. p90 range) / median, quantiles by linear interpolation between closest ranks."""
    ordered = sorted(values)
    return (quantile(ordered, 0.9) - quantile(ordered, 0.1)) / median_of(ordered)


def percentile_ci(statistics: np.ndarray, confidence: float) -> tuple[float, float]:
    ordered = np.sort(statistics)
    return quantile(ordered, (1 - confidence) / 2), quantile(ordered, (1 + confidence) / 2)


@functools.lru_cache(maxsize=4)
def resample_indices(seed: int, resamples: int, n: int) -> np.ndarray:
    """The contract's draw. A fresh generator per (case, arm) makes every draw of size n
    identical, so one cached, read-only copy serves them all."""
    indices = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    indices.flags.writeable = False
    return indices


def gate_terms(rule: str) -> tuple[bool, float | None]:
    """(no_loss, minimum geomean) of a gate rule; RunDirError on anything else."""
    no_loss, floor = False, None
    for term in (t.strip() for t in rule.split(" and ")):
        found = re.fullmatch(r"geomean>=(\d+(?:\.\d+)?)", term)
        if term == "no_loss" and not no_loss:
            no_loss = True
        elif found and floor is None:
            floor = float(found.group(1))
        else:
            raise RunDirError(f"plan.json gate {rule!r}: unknown or repeated term {term!r}")
    return no_loss, floor


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b))
    return a == b


def diff(where: str, recorded: dict[str, Any], recomputed: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    return [
        f"{where} {key}: summary {recorded.get(key)!r} != recomputed {recomputed[key]!r}"
        for key in fields
        if not same(recorded.get(key), recomputed[key])
    ]
