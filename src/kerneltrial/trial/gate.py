"""The correctness gate: every arm must compute the operator on fresh inputs before it is timed.

One check = one (case, seed, arm):
1. fresh random inputs for the seed; the official formula (`reference`) and the float64
   `oracle` are computed on copies;
2. every tensor the arm allocates with torch.empty* is filled with NaN (integers: the
   smallest value) and freed blocks of the outputs' sizes are poisoned too, so an element
   the kernel never writes fails the check;
3. the arm runs; the device is synchronised;
4. outputs must have the reference's shape and dtype, hold no NaN the reference does not
   hold, and lie within the operator's tolerance of both the reference and the oracle
   (integer outputs: exactly equal);
5. inputs (and the whole storage behind a strided view) must be bit-identical to before,
   except the operator's documented in-place outputs, which are checked as outputs;
6. anti-cheat calls (`thorough`, the default): no output may alias an input or the
   reference's result; a repeated call on the same input must be bit-identical (races);
   results must follow new inputs in fresh buffers and new values in the same buffers
   (memoisation keyed on pointers or shapes). Results are read after synchronising only
   the current stream, so work left unsynchronised on a side stream shows up as wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kerneltrial.ops.registry import Case, Impl, Inputs, Operator, Outputs, Tolerance


@dataclass
class CheckResult:
    """One correctness check; a row of correctness.jsonl."""

    case: str
    seed: int
    arm: str
    passed: bool
    max_abs: float
    max_rel: float
    ulp: float
    message: str

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Difference:
    max_abs: float
    max_rel: float
    ulp: float
    within: bool


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with a value no correct kernel leaves behind: NaN, or the integer minimum."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(math.nan)
    elif t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


@contextmanager
def poisoned_allocations() -> Iterator[None]:
    """While active, torch.empty / empty_like / empty_strided / Tensor.new_empty return poisoned tensors."""
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


def poison_free_blocks(like: Outputs) -> None:
    """Allocate, poison and free blocks the size of each expected output, so a caching
    allocator hands poisoned memory to an arm that allocates its outputs another way."""
    for t in like:
        poison(torch.empty(t.numel(), dtype=t.dtype, device=t.device))


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a view (a strided slice reads only part of it)."""
    return t._base if t._base is not None else t


def snapshot_inputs(op: Operator, inputs: Inputs) -> dict[str, torch.Tensor]:
    return {name: storage_of(v).clone() for name, v in inputs.items() if isinstance(v, torch.Tensor) and name not in op.inplace}


def clone_inputs(inputs: Inputs) -> Inputs:
    """Copies that keep each tensor's layout (strides), so the reference sees the same views."""
    out: Inputs = {}
    bases: dict[int, torch.Tensor] = {}
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            base = storage_of(v)
            copy = bases.setdefault(id(base), base.clone())
            out[name] = copy.as_strided(v.shape, v.stride(), v.storage_offset() - base.storage_offset())
        else:
            out[name] = v
    return out


def ulp_of(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` values at the magnitude of each element of `t` (float64)."""
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(t.abs().clamp_min(info.tiny)))
    return torch.exp2(exponent) * info.eps


def difference(out: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None) -> Difference:
    """Largest differences of `out` from `expected`; `tol` None means exact equality."""
    o, e = out.double(), expected.double()
    if o.numel() == 0:
        return Difference(0.0, 0.0, 0.0, True)
    err = (o - e).abs()
    err = torch.where(torch.isnan(o) | torch.isnan(e), torch.full_like(err, math.inf), err)
    rel = err / e.abs().clamp_min(1e-30)
    ulp = err / ulp_of(e, out.dtype) if out.is_floating_point() else err
    within = bool((err == 0).all()) if tol is None else bool((err <= tol.atol + tol.rtol * e.abs()).all())
    return Difference(float(err.max()), float(rel.max()), float(ulp.max()), within)


def compare(op: Operator, case: Case, got: Outputs, reference: Outputs, oracle: Outputs) -> tuple[Difference, str]:
    """Check `got` against both the reference and the oracle; '' when it passes."""
    if len(got) != len(reference):
        return Difference(math.inf, math.inf, math.inf, False), f"returned {len(got)} outputs, expected {len(reference)}"
    tol = None if op.exact else op.tolerance(case.dtype)
    worst = Difference(0.0, 0.0, 0.0, True)
    for i, (g, r, o) in enumerate(zip(got, reference, oracle, strict=True)):
        label = f"output {i}" if len(got) > 1 else "output"
        if g.shape != r.shape:
            return Difference(math.inf, math.inf, math.inf, False), f"{label} has shape {tuple(g.shape)}, expected {tuple(r.shape)}"
        if g.dtype != r.dtype:
            return Difference(math.inf, math.inf, math.inf, False), f"{label} has dtype {g.dtype}, expected {r.dtype}"
        if g.is_floating_point() and bool((torch.isnan(g) & ~torch.isnan(r)).any()):
            count = int((torch.isnan(g) & ~torch.isnan(r)).sum())
            return Difference(math.inf, math.inf, math.inf, False), (
                f"{label} has {count} NaN element(s): unwritten, invalid, or not finished when the current stream was synchronised")
        if g.is_floating_point() and bool((torch.isinf(g) & ~torch.isinf(r)).any()):
            count = int((torch.isinf(g) & ~torch.isinf(r)).sum())
            return Difference(math.inf, math.inf, math.inf, False), f"{label} has {count} Inf element(s) where the reference is finite (overflow?)"
        for against, expected in (("reference", r), ("float64 oracle", o.to(r.dtype) if op.exact else o)):
            d = difference(g, expected, tol)
            worst = Difference(max(worst.max_abs, d.max_abs), max(worst.max_rel, d.max_rel), max(worst.ulp, d.ulp), worst.within and d.within)
            if not d.within:
                bound = "exact equality" if tol is None else f"rtol {tol.rtol}, atol {tol.atol}"
                return worst, f"{label} differs from the {against}: max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g} ({bound})"
    return worst, ""


def changed_inputs(before: dict[str, torch.Tensor], inputs: Inputs) -> list[str]:
    return [name for name, snap in before.items() if not torch.equal(storage_of(inputs[name]), snap)]


def synchronize(device: torch.device) -> None:
    """Wait for the *current* stream only: work an arm leaves on another stream without
    making the current stream wait for it is not complete when results are read (a defect)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def call(op: Operator, fn: Callable[..., Any], inputs: Inputs, device: torch.device, like: Outputs) -> Outputs:
    """One poisoned call of `fn`, read back after synchronising the current stream."""
    poison_free_blocks(like)
    with poisoned_allocations():
        returned = fn(*inputs.values())
    synchronize(device)
    return op.outputs(inputs, returned)


def expected(op: Operator, inputs: Inputs) -> tuple[Outputs, Outputs]:
    """The reference and the oracle for `inputs`, computed on copies."""
    return op.reference(*clone_inputs(inputs).values()), op.oracle(*clone_inputs(inputs).values())


def aliasing(op: Operator, got: Outputs, inputs: Inputs, reference: Outputs) -> str:
    """An out-of-place result must live in fresh memory: not an input's, not the reference's."""
    if op.inplace:
        return ""
    pointers = {name: storage_of(v).untyped_storage().data_ptr() for name, v in inputs.items() if isinstance(v, torch.Tensor)}
    for i, out in enumerate(got):
        if out.numel() == 0:  # empty tensors have no memory to share (their pointers are all 0)
            continue
        ptr = out.untyped_storage().data_ptr()
        if any(out is r or ptr == r.untyped_storage().data_ptr() for r in reference):
            return "aliasing: returned the reference's own output instead of computing it"
        for name, p in pointers.items():
            if ptr == p:
                return f"aliasing: output {i} shares memory with input {name!r}; return a fresh tensor"
    return ""


def repeated(op: Operator, fn: Callable[..., Any], case: Case, seed: int, device: torch.device, first: Outputs) -> str:
    """Extra calls that expose caching, stale results and races (see `check`)."""
    same = op.make_inputs(case, seed, device)
    again = call(op, fn, same, device, first)
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        if not torch.equal(a, b):
            diff = difference(b, a, None)
            return f"non-deterministic: a repeated call on the same input changed output {i} (max abs {diff.max_abs:.3g}); a race in a reduction?"
    fresh = op.make_inputs(case, seed + 7919, device)
    reference, oracle = expected(op, fresh)
    _, message = compare(op, case, call(op, fn, fresh, device, reference), reference, oracle)
    if message:
        return f"stale result: on new inputs in fresh buffers the {message}; results must follow the inputs (memoisation?)"
    new_values = op.make_inputs(case, seed + 104729, device)
    for name, v in fresh.items():
        if isinstance(v, torch.Tensor):
            v.copy_(new_values[name])
    reference, oracle = expected(op, fresh)
    _, message = compare(op, case, call(op, fn, fresh, device, reference), reference, oracle)
    if message:
        return f"stale result: on new values in the same buffers the {message}; results must not be cached by pointer or shape"
    return ""


def check(op: Operator, impl: Impl, case: Case, seed: int, device: torch.device, thorough: bool = True) -> CheckResult:
    """Run one correctness check of `impl` on `case` with inputs drawn from `seed`.

    `thorough` adds the anti-cheat calls: outputs must not alias inputs or the reference;
    a repeated call on the same input must give bit-identical outputs; results must follow
    new inputs in fresh buffers and new values written into the same buffers."""

    def result(diff: Difference | None, message: str) -> CheckResult:
        d = diff or Difference(math.nan, math.nan, math.nan, False)
        return CheckResult(case.id, seed, impl.name, not message, d.max_abs, d.max_rel, d.ulp, message)

    fn = impl.resolve()
    if fn is None:
        return result(None, f"unavailable: {impl.reason}")
    try:
        inputs = op.make_inputs(case, seed, device)
        reference, oracle = expected(op, inputs)
        before = snapshot_inputs(op, inputs)
        fn(*op.make_inputs(case, seed, device).values())  # warm-up on a copy: JIT/compile outside the checked call
        got = call(op, fn, inputs, device, reference)
        diff, message = compare(op, case, got, reference, oracle)
        if not message:
            mutated = changed_inputs(before, inputs)
            if mutated:
                message = f"modified its input(s) {', '.join(mutated)} (only {', '.join(op.inplace) or 'nothing'} may be written)"
        if not message and thorough:
            message = aliasing(op, got, inputs, reference) or repeated(op, fn, case, seed, device, got)
    except Exception as exc:  # an arm may fail in any way; the gate records it
        return result(None, f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return result(diff, message)
