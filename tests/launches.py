"""A stand-in for a kerneltrial kernel (ops/launch.py Direct) that records the grid of every launch,
whichever path the launch then takes (the JITFunction or the kept compiled kernel)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


class LaunchRecorder:
    """Stands in for a Triton kernel and records the grid of every launch."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        self.grids.append(tuple(grid))
        return self.kernel[grid]


def record_launches(monkeypatch: pytest.MonkeyPatch, module: Any, *names: str) -> list[tuple[int, ...]]:
    """Replace each kernel `names` of `module` by one recorder; the grids of all, in launch order."""
    grids: list[tuple[int, ...]] = []
    for name in names:
        recorder = LaunchRecorder(getattr(module, name))
        recorder.grids = grids
        monkeypatch.setattr(module, name, recorder)
    return grids
