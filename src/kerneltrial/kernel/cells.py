"""Number cells shared by a kernel run's report and figures."""

from __future__ import annotations


def rate(value: float | None) -> str:
    """GB/s or a percentage: one decimal, or three significant digits when small (CPU runs)."""
    return "–" if value is None else format(value, ",.1f" if abs(value) >= 10 else ".3g")
