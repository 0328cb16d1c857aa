"""scipy's Wilson interval (metrics and verify_accuracy) is the textbook score interval, no continuity correction."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from kerneltrial.serving import metrics, verify_accuracy


def closed_form(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson (1927) as the hand-written versions computed it before scipy's replaced them."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (0.0 if k == 0 else c - h, 1.0 if k == n else c + h)


@pytest.mark.parametrize("wilson", [metrics.wilson_interval, verify_accuracy._wilson])
def test_scipy_wilson_equals_the_closed_form(wilson):
    for confidence in (0.9, 0.95, 0.99):
        for n in (*range(1, 41), 105, 500):
            for k in range(n + 1):
                lo, hi = wilson(k, n, confidence)
                want = closed_form(k, n, confidence)
                assert lo == pytest.approx(want[0], abs=1e-12) and hi == pytest.approx(want[1], abs=1e-12)
                assert 0.0 <= lo <= k / n <= hi <= 1.0
        assert wilson(0, 7, confidence)[0] == 0.0 and wilson(7, 7, confidence)[1] == 1.0  # exact ends
    assert wilson(0, 0, 0.95) == (0.0, 1.0)
