"""Random inputs for operators: seeded, on the target device, never zeros.

Layouts shared by several operators:
- `contiguous`: a fresh contiguous tensor;
- `row_strided`: the first N columns of a wider tensor (a row stride larger than N),
  the layout of a slice taken from a bigger activation.
"""

from __future__ import annotations

import torch

ROW_PAD = 64  # extra columns of the wider tensor behind a `row_strided` view


def generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values (times `scale`) rounded to `dtype`."""
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def with_layout(shape: tuple[int, ...], layout: str, dtype: torch.dtype, gen: torch.Generator, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    """A random tensor of `shape` in `contiguous` or `row_strided` layout."""
    if layout == "contiguous":
        return randn(shape, dtype, gen, device, scale)
    if layout == "row_strided":
        wide = randn((*shape[:-1], shape[-1] + ROW_PAD), dtype, gen, device, scale)
        return wide[..., : shape[-1]]
    raise ValueError(f"unknown layout {layout!r}; expected 'contiguous' or 'row_strided'")


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
