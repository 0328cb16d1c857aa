"""A stand-in for a kerneltrial kernel (ops/launch.py Direct) that records the grid of every launch,
whichever path the launch then takes (the JITFunction or the kept compiled kernel)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


class LaunchRecorder:
    """Stands in for a Triton kernel and records the grid (and the positional arguments) of every launch."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.grids: list[tuple[int, ...]] = []
        self.args: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        self.grids.append(tuple(grid))

        def launch(*args: Any, **meta: Any) -> Any:
            self.args.append(args)
            return self.kernel[grid](*args, **meta)

        return launch

    def __iter__(self) -> Iterator[tuple[tuple[int, ...], tuple[Any, ...]]]:
        """(grid, positional arguments) of each launch so far."""
        return iter(zip(self.grids, self.args, strict=True))

    def __len__(self) -> int:
        return len(self.grids)


def record_launches(monkeypatch: pytest.MonkeyPatch, module: Any, *names: str) -> list[tuple[int, ...]]:
    """Replace each kernel `names` of `module` by one recorder; the grids of all, in launch order."""
    grids: list[tuple[int, ...]] = []
    for name in names:
        recorder = LaunchRecorder(getattr(module, name))
        recorder.grids = grids
        monkeypatch.setattr(module, name, recorder)
    return grids
