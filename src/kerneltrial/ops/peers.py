"""Adapters for the peers users already run: torch eager, torch.compile, Liger-Kernel, FlagGems.

A peer that is not installed, or cannot run on this machine, raises `Unavailable` from its
loader: `kerneltrial ops` shows the one-line reason and trials skip it; it is never an error.
Each function named after a peer returns its `Arm`; ops/catalog.py lists the arms of each operator.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kerneltrial.ops.spec import Arm, Unavailable

Loader = Callable[[], Callable[..., Any]]


def import_attr(module: str, attr: str, package: str) -> Any:
    """`module.attr`, or Unavailable naming the package to install."""
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise Unavailable(f"{package} is not installed ({exc.name or module})") from exc
    except AttributeError as exc:
        raise Unavailable(f"{package} has no {module}.{attr} in this version") from exc


def require_installed(module: str, package: str) -> None:
    """Unavailable naming the package to install when `module` cannot be found (nothing is imported)."""
    if module not in sys.modules and importlib.util.find_spec(module) is None:
        raise Unavailable(f"{package} is not installed ({module})")


def require_cuda(package: str) -> None:
    if not torch.cuda.is_available():
        raise Unavailable(f"{package} needs a CUDA device; none is visible")


def require_nvcc(what: str) -> None:
    """nvcc, found as SGLang's and FlashInfer's JIT builds find it (SGLang's jit/utils/compile/
    toolchain.py `cuda_home`, FlashInfer's jit/cpp_ext.py `get_cuda_path`): $CUDA_HOME or
    $CUDA_PATH, else nvcc on PATH, else /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    if shutil.which("nvcc") is None and not Path(home, "bin", "nvcc").is_file():
        raise Unavailable(f"{what} need nvcc; none on PATH or in {home}/bin")


RECOMPILE_LIMIT = 1024  # distinct shapes one compiled peer may serve in a process


def allow_many_shapes() -> None:
    """A trial compiles one graph per case. Dynamo's default recompile limit (8) would make a
    compiled peer silently fall back to eager from the ninth shape on, timing torch eager
    under the name torch_compile; raise the limit and make hitting it an error instead."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 4 * RECOMPILE_LIMIT))
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(config, name):
            setattr(config, name, True)


def compiled(fn: Callable[..., Any], require_gpu: bool = True, backend: str = "inductor") -> Loader:
    """torch.compile of the eager formula (static shapes: one graph per shape, as users deploy).

    A peer of a GPU kernel is inductor's GPU (Triton) code; without a GPU inductor compiles
    C++ for the CPU instead, a different compiler (torch 2.13's fails on our in-place bf16
    reductions with `KeyError: 'buf1'`), so the peer is unavailable there unless
    `require_gpu=False` (tests use that, with backend "eager", to exercise dynamo cheaply)."""

    def load() -> Callable[..., Any]:
        if not hasattr(torch, "compile"):
            raise Unavailable("this torch has no torch.compile")
        if require_gpu and not torch.cuda.is_available():
            raise Unavailable("torch.compile peers run on a GPU (inductor's Triton code); none is visible")
        allow_many_shapes()
        return torch.compile(fn, dynamic=False, backend=backend)

    return load


def torch_arms(eager: Callable[..., Any]) -> tuple[Arm, Arm]:
    """The `torch_eager` peer (the operator's eager torch code) and `torch_compile`, its torch.compile."""
    return (
        Arm("torch_eager", lambda: eager, "torch eager formula"),
        Arm("torch_compile", compiled(eager), "torch.compile of the eager formula"),
    )


def liger(module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]]) -> Arm:
    """The `liger` peer: Liger-Kernel's `module.attr` wrapped by `adapt` (`liger_loader`)."""
    return Arm("liger", liger_loader(module, attr, adapt), "Liger-Kernel")


def flaggems(
    attr: str, adapt: Callable[[Any], Callable[..., Any]], doc: str = "FlagGems", layouts: tuple[str, ...] | None = None
) -> Arm:
    """The `flaggems` peer: FlagGems' `attr` wrapped by `adapt` (`flaggems_loader`)."""
    return Arm("flaggems", flaggems_loader(attr, adapt), doc, layouts=layouts)


def liger_loader(module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]]) -> Loader:
    """Loader for a Liger-Kernel function; `adapt` wraps it into the operator's signature."""

    def load() -> Callable[..., Any]:
        require_cuda("Liger-Kernel")
        return adapt(import_attr(module, attr, "liger-kernel"))

    return load


def flaggems_loader(attr: str, adapt: Callable[[Any], Callable[..., Any]]) -> Loader:
    """Loader for a FlagGems function (looked up in flag_gems.ops, then flag_gems)."""

    def load() -> Callable[..., Any]:
        require_cuda("FlagGems")
        try:
            fn = import_attr("flag_gems.ops", attr, "flag_gems")
        except Unavailable:
            fn = import_attr("flag_gems", attr, "flag_gems")
        return adapt(fn)

    return load


def flaggems_at(module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]], doc: str) -> Arm:
    """The `flaggems` peer from a FlagGems module other than flag_gems.ops (e.g. flag_gems.modules)."""

    def load() -> Callable[..., Any]:
        require_cuda("FlagGems")
        return adapt(import_attr(module, attr, "flag_gems"))

    return Arm("flaggems", load, doc)
