"""Target profiles (the limits of the chips a kernel is shipped to) and the launch hook that
enforces them.

A package that runs on the H200 can still be rejected elsewhere: the Track 1 workflow's
submissions were rejected on Ascend for grids over 65535 programs in a dimension, a limit
NVIDIA GPUs do not have in x. While a target is active (`targeting`), every Triton launch in
this process, kerneltrial's kernels and users' alike, is checked before it runs: a grid over
the target's limit raises `GridLimitError` naming the kernel and the grid, and is recorded,
so an arm that catches the error still fails its check (`first_since`).

The hook wraps `run` of Triton's `JITFunction` (compiled kernels) and `InterpretedFunction`
(the CPU interpreter): `kernel[grid](...)`, autotuned and heuristic kernels all end in
`run(*args, grid=..., warmup=..., **kwargs)` with the final meta-parameters (stable across
Triton 3.x), and a callable grid is evaluated there with the bound arguments, as Triton does.
`CompiledKernel.__getitem__` is wrapped too: launchers that cache compiled kernels (FlagGems'
LibEntry) call it directly with a 3-tuple grid.

Standard library only, nothing of kerneltrial: the processes where no kerneltrial module is
importable load this file by its path. An isolated worker (trial/worker.py) checks its arm's
launches with the harness's target, and the harness counts what the worker refused (`note`);
the package interface check runs the same worker from a copy.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    """A chip family's launch limits."""

    name: str
    max_grid: tuple[int, int, int]  # programs per grid dimension (x, y, z)
    notes: str

    def violation(self, kernel: str, grid: tuple[int, ...]) -> str:
        """Why launching `kernel` on `grid` fails on this target, or '' when it does not."""
        over = [axis for axis, (n, limit) in enumerate(zip(grid, self.max_grid, strict=False)) if n > limit]
        if len(grid) > 3 or over:
            limits = ", ".join(f"{'xyz'[i]} <= {limit}" for i, limit in enumerate(self.max_grid))
            return (
                f"kernel {kernel} launched grid {tuple(grid)}, over the {self.name} limit ({limits}); "
                "loop over the work inside fewer programs (a grid-stride loop)"
            )
        return ""

    def record(self) -> dict[str, Any]:
        """What a run's plan.json records about the target."""
        return {"name": self.name, "max_grid": list(self.max_grid)}


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "ascend",
            (65535, 65535, 65535),
            "Huawei Ascend (triton-ascend): at most 65535 programs per grid dimension; the Track 1 "
            "workflow's packages with larger grids were rejected there",
        ),
        Target(
            "nvidia",
            (2**31 - 1, 65535, 65535),
            "NVIDIA CUDA: gridDim.x up to 2**31-1, y and z up to 65535 (CUDA C++ Programming Guide, "
            "technical specifications per compute capability)",
        ),
    )
}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


class GridLimitError(RuntimeError):
    """A Triton launch whose grid the active target cannot run."""


@dataclass
class _Session:
    target: Target
    violations: list[str] = field(default_factory=list)


_session: _Session | None = None


def seen() -> int:
    """How many over-limit launches the active target has refused so far (0 without a target)."""
    return len(_session.violations) if _session else 0


def first_since(mark: int) -> str:
    """The first over-limit launch refused after `seen()` returned `mark`, or ''."""
    return _session.violations[mark] if _session and len(_session.violations) > mark else ""


def note(message: str) -> None:
    """Count an over-limit launch refused in another process (an isolated worker, trial/remote.py)
    as if it had been refused here, so `first_since` reports it."""
    if _session is not None and message:
        _session.violations.append(message)


def _refuse(kernel: str, grid: Any) -> None:
    assert _session is not None
    message = _session.target.violation(kernel, tuple(int(n) for n in grid))
    if message:
        _session.violations.append(message)
        raise GridLimitError(message)


def _checked_run(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if not warmup and _session is not None:
            fn = self.fn  # the Python function under @triton.jit
            dims = grid
            if callable(grid):
                signature = inspect.signature(fn)
                try:
                    bound = signature.bind_partial(
                        *args, **{k: v for k, v in kwargs.items() if k in signature.parameters}
                    )
                except TypeError:  # bad arguments: Triton raises its own error below
                    return original(self, *args, grid=grid, warmup=warmup, **kwargs)
                bound.apply_defaults()
                dims = grid(dict(bound.arguments))
            _refuse(getattr(fn, "__name__", repr(fn)), dims)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    return run


def _checked_getitem(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def getitem(self: Any, grid: Any) -> Any:
        if _session is not None:
            _refuse(getattr(self, "name", repr(self)), grid)
        return original(self, grid)

    return getitem


def _launchers() -> list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return [
        (JITFunction, "run", _checked_run),
        (InterpretedFunction, "run", _checked_run),
        (CompiledKernel, "__getitem__", _checked_getitem),
    ]


@contextmanager
def targeting(target: Target | None) -> Iterator[None]:
    """Check every Triton launch against `target` inside the block (nothing when None)."""
    global _session
    if target is None:
        yield
        return
    if _session is not None:
        raise RuntimeError(f"target {_session.target.name} is already active; targets do not nest")
    originals = [(owner, name, owner.__dict__.get(name), wrap) for owner, name, wrap in _launchers()]
    for owner, name, _, wrap in originals:
        setattr(owner, name, wrap(getattr(owner, name)))
    _session = _Session(target)
    try:
        yield
    finally:
        for owner, name, original, _ in originals:
            if original is None:  # inherited: drop the wrapper, the base class's method shows again
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        _session = None
