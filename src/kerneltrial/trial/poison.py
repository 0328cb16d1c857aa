"""Poisoned outputs (the gate's step 3): memory an arm's outputs may come from is filled with a
value no correct kernel leaves behind, so an element the arm never writes shows as wrong.

On a GPU the caching allocator's free blocks of the outputs' sizes are filled with NaN before
the call (`poison_free_blocks`); on a CPU, whose allocator returns fresh zeroed pages,
torch.empty* is patched to poison while the arm runs (`poisoned_allocations`).

Torch and the standard library only, nothing of kerneltrial, on purpose: the processes where no
kerneltrial module is importable load this file by its path, so an arm there is poisoned the
same way as in the gate (trial/gate.py): the isolated worker (trial/worker.py) and the package
interface check, which runs that worker from a copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with a value no correct kernel leaves behind: NaN, or the integer minimum."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(math.nan)
    elif t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


@contextmanager
def poisoned_allocations(device: torch.device) -> Iterator[None]:
    """On a CPU, torch.empty / empty_like / empty_strided / Tensor.new_empty return poisoned
    tensors while active (the CPU allocator returns fresh zeroed pages, so pre-filling freed
    memory does not reach the arm). On a GPU nothing is patched: see `poison_free_blocks`."""
    if device.type == "cuda":
        yield
        return
    originals: dict[tuple[Any, str], Callable[..., torch.Tensor]] = {
        (torch, "empty"): torch.empty,
        (torch, "empty_like"): torch.empty_like,
        (torch, "empty_strided"): torch.empty_strided,
        (torch.Tensor, "new_empty"): torch.Tensor.new_empty,
    }

    def poisoning(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        return lambda *args, **kwargs: poison(fn(*args, **kwargs))

    try:
        for (owner, name), fn in originals.items():
            setattr(owner, name, poisoning(fn))
        yield
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)


def poison_free_blocks(like: Sequence[torch.Tensor], copies: int = 4) -> None:
    """Allocate, poison and free `copies` blocks the size of each expected output, so the
    caching allocator hands poisoned memory to an arm that allocates its outputs in any way."""
    blocks = [poison(torch.empty(t.numel(), dtype=t.dtype, device=t.device)) for t in like for _ in range(copies)]
    del blocks


def spoil(blocks: Sequence[torch.Tensor]) -> None:
    """Fill byte views (uint8) with 0xFF (NaN in every float dtype, -1 in the integer ones) before
    their memory is freed: a GPU allocation the driver later serves from the same pages (once the
    cache is given back) then holds poison, not the right answer of an earlier call."""
    for block in blocks:
        block.fill_(255)


def poison_before_call(
    args: Sequence[torch.Tensor], returned: Sequence[torch.Tensor], device: torch.device, last: tuple[int, ...]
) -> tuple[int, ...]:
    """Poison free blocks before an isolated worker's gate call; the byte sizes of its tensor `args`
    returned, for the next call's `last`. While they stay `last` (a case's warm-up and checked calls)
    blocks the size of the `returned` outputs of the last call are poisoned (else of the arguments).
    On a GPU, when they change (a new case, or one of a check's extra shapes), the caching allocator
    first gives back the free blocks it keeps, and blocks of the arguments' sizes are poisoned as
    well: an emptied cache holds none of this call's sizes, and a norm's or a gate's outputs have its
    arguments' sizes. Without the emptying a worker's cache of poisoned blocks, clones and outputs of
    every earlier size grows until the harness runs out of memory (the first CUDA package check on
    an H100: 72 of 79 GiB held by the worker at the last case). The worker now gives its cache back
    after every fetch as well (trial/worker.py `on_fetch`), having `spoil`ed its copies of the last
    outputs and inputs and the last outputs it holds: within a case an allocation of another size
    than the last outputs' comes from the driver holding that poison or older memory of the arm."""
    sizes = tuple(t.numel() * t.element_size() for t in args)
    emptied = device.type == "cuda" and sizes != last
    if emptied:
        torch.cuda.empty_cache()
    poison_free_blocks([*returned, *args] if emptied else (list(returned) or list(args)))
    return sizes
