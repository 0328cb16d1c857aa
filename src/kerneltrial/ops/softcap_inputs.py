"""softcap_row_argmax's inputs, reference and oracle (its kernels: ops/softcap_argmax.py, whose
docstring gives the semantics): the drawn cap, logits far below fp32 saturation, planted ties,
saturated and unsaturated pairs, the special rows (a TAIL row whose only maximum is its last
element), and the bytes a call moves."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops.spec import Case, Inputs

CAP = 30.0  # Gemma's final-logit softcap: the usual cap (tests, calibration)
# make_inputs draws the cap log-uniformly in CAP_RANGE (a multiple of 1/16): a kernel that
# hard-codes a cap is wrong wherever the planted pairs below saturate under one cap and not
# the other (for a hard-coded 30: drawn caps below 27.3 or above 57, 82% of the draws).
CAP_RANGE = (2.0, 120.0)
LOGIT_SCALE = 4.0 / 30.0  # random logits ~ N(0, (LOGIT_SCALE * cap)^2): far below saturation
SATURATED = (10.0, 12.0)  # planted logits at these multiples of cap: both cap to exactly cap in fp32
UNSATURATED = (4.8, 4.9)  # a planted pair that does not saturate: the later, larger one wins
SAFE_BELOW = 5.0  # no drawn |logit| lies in [SAFE_BELOW, SATURATED[0]) * cap (see the module doc)
TAIL = "tail"  # a special row of make_inputs whose only maximum is its last element
SPECIAL_ROWS = (inp.ZERO, TAIL, inp.TINY, inp.LARGE, inp.NONFINITE)  # in this order while rows last


def plant_ties(logits: torch.Tensor, gen: torch.Generator) -> None:
    """Copy each row's maximum to a random position in each half of the row, so every row
    has at least two tied maxima (the first index must win)."""
    n_rows, n = logits.shape
    early = torch.randint(0, n // 2, (n_rows, 1), generator=gen, device=logits.device)
    late = torch.randint(n // 2, n, (n_rows, 1), generator=gen, device=logits.device)
    top = logits.max(dim=1, keepdim=True).values
    logits.scatter_(1, torch.cat([early, late], dim=1), top.expand(n_rows, 2))


def draw_cap(gen: torch.Generator) -> float:
    """A cap log-uniform in CAP_RANGE, rounded to a multiple of 1/16 (exact in fp32)."""
    low, high = (math.log(c) for c in CAP_RANGE)
    return round(math.exp(low + (high - low) * inp.uniform(gen)) * 16) / 16


def plant_pair(logits: torch.Tensor, gen: torch.Generator, rows: torch.Tensor, values: tuple[float, float]) -> None:
    """In `rows`, values[0] at a random position of the first half, values[1] of the second."""
    n = logits.shape[-1]
    if rows.numel() == 0:
        return
    early = torch.randint(0, n // 2, rows.shape, generator=gen, device=logits.device)
    late = torch.randint(n // 2, n, rows.shape, generator=gen, device=logits.device)
    logits[rows, early] = values[0]
    logits[rows, late] = values[1]


def plant_large(row: torch.Tensor, r: int, cap: float) -> None:
    """Scale a row as inputs.LARGE does, then move every |logit| in [SAFE_BELOW, SATURATED[0])
    * cap up by that band's width, into saturation (no implementation-defined ties)."""
    v = row.float() * inp.row_factor(inp.LARGE, r)
    a = v.abs()
    band = (a >= SAFE_BELOW * cap) & (a < SATURATED[0] * cap)
    shift = (SATURATED[0] - SAFE_BELOW) * cap
    row.copy_(torch.where(band, v.sign() * (a + shift), v))


def saturated_rows(n_rows: int, seed: int, device: torch.device, skip: tuple[int, ...] = ()) -> torch.Tensor:
    """Every other row: the odd rows for even seeds, the even rows for odd seeds, so that
    single-row inputs (a decode step) are saturated for odd seeds; never the rows in `skip`."""
    rows = torch.arange((seed + 1) % 2, n_rows, 2, device=device)
    return rows[~torch.isin(rows, torch.tensor(skip, dtype=rows.dtype, device=device))]


def plant_saturation(logits: torch.Tensor, gen: torch.Generator, rows: torch.Tensor, cap: float) -> None:
    """In `rows`, put SATURATED[1] * cap at a random position of the second half and
    SATURATED[0] * cap in the first half: distinct logits that cap to the same fp32 value, so
    the earlier, smaller logit is the answer (a kernel that skips tanh, or a decode path that
    takes the raw argmax, or a cap much smaller than `cap`, returns the later one)."""
    plant_pair(logits, gen, rows, (SATURATED[0] * cap, SATURATED[1] * cap))


def plant_tail(row: torch.Tensor) -> None:
    """Make the last element of a (never saturated) row its only maximum: a kernel that
    drops a partial last chunk of the row (assuming the vocabulary is a multiple of its
    chunk) misses the answer."""
    row[-1] = row.max().float() + 1.0


def make_inputs(case: Case, seed: int, device: torch.device, scalars: Mapping[str, Any] | None = None) -> Inputs:
    """A drawn cap (`draw_cap`); logits ~ N(0, (LOGIT_SCALE * cap)^2) at a drawn offset
    (inputs.py, "Coverage") with tied maxima in every row, saturated ties in every other row
    (`saturated_rows`), an unsaturated pair (UNSATURATED * cap, answered by the later one
    unless a kernel's cap is much smaller) in the others, and, in seeded rows (`SPECIAL_ROWS`,
    as many as leave one ordinary row), a row of zeros (every element ties), a TAIL row
    (`plant_tail`), a tiny row (|x| ~ 1e-23 and below: a tanh that cancels near 0, e.g.
    (exp(2y) - 1) / (exp(2y) + 1), caps the whole row to 0), a large row (`plant_large`) and
    a row with a NaN or an Inf. With `scalars` (Operator.values_with), the logits are placed for
    their cap instead of the drawn one: a timed sample keeps its seed's cap, and logits placed for
    another cap land in [SAFE_BELOW, SATURATED[0]) * cap, where implementations may disagree on ties
    (run results/archive/h200/softcap_row_argmax-panel-frozen: 16 false "wrong result while timed"
    rows, the control's among them)."""
    gen = inp.generator(seed, device)
    cap = inp.kept(draw_cap(gen), scalars, "cap")
    logits = inp.with_layout(case.shape, case.layout, case.torch_dtype, gen, device, scale=LOGIT_SCALE * cap)
    picked = inp.pick_rows(inp.rows_of(logits), SPECIAL_ROWS, gen, device)
    tail, large = picked.pop(TAIL, None), picked.pop(inp.LARGE, None)
    unplanted = tuple(r for r in (tail, picked.get(inp.TINY)) if r is not None)  # a tiny pair would not tie
    saturated = saturated_rows(logits.shape[0], seed, device, skip=unplanted)
    others = torch.tensor(
        sorted(set(range(logits.shape[0])) - set(saturated.tolist()) - set(unplanted)), dtype=torch.int64, device=device
    )
    plant_pair(logits, gen, others, (UNSATURATED[0] * cap, UNSATURATED[1] * cap))
    plant_ties(logits, gen)
    plant_saturation(logits, gen, saturated, cap)
    if tail is not None:
        plant_tail(logits[tail])
    if large is not None:
        plant_large(logits[large], large, cap)
    inp.scale_rows(logits, picked)
    return {"logits": logits, "cap": cap}


def reference(logits: torch.Tensor, cap: float) -> tuple[torch.Tensor]:
    """The official formula; torch.argmax returns the first maximal index (documented)."""
    return (torch.argmax(cap * torch.tanh(logits.float() / cap), dim=-1),)


def oracle(logits: torch.Tensor, cap: float) -> tuple[torch.Tensor]:
    """Capped values in float64, rounded once to fp32 (where the semantics place the ties),
    then the smallest index among the maxima (a NaN ranked above every value, as
    torch.argmax ranks it), written out rather than left to argmax."""
    capped = (cap * torch.tanh(logits.double() / cap)).float()
    capped = torch.where(torch.isnan(capped), torch.full_like(capped, math.inf), capped)
    is_max = capped == capped.max(dim=-1, keepdim=True).values
    positions = torch.arange(capped.shape[-1], device=capped.device).expand_as(capped)
    return (torch.where(is_max, positions, capped.shape[-1]).min(dim=-1).values,)


def bytes_moved(case: Case) -> int:
    """Read every logit once, write one int64 per row."""
    size = case.itemsize
    return inp.numel(case.shape) * size + inp.numel(case.shape[:-1]) * 8
