"""The correctness gate: every arm must compute the operator on fresh inputs before it is timed.

One check = one (case, seed, arm):
1. fresh random inputs for the seed; the official formula (`reference`) and the float64
   `oracle` are computed on copies;
2. the arm gets private copies inside canary-guarded buffers (`guard`), at a nonzero
   storage offset; a seeded, varying number of unchecked calls comes first, so the
   checked call is not the n-th call of a fixed count;
3. outputs must not contain what a kernel leaves behind unwritten: on a GPU the caching
   allocator's free blocks of the outputs' sizes are filled with NaN before the call; on a
   CPU (whose allocator hands out fresh pages) torch.empty* is patched to poison while the
   arm runs (a kernel can see that patch, and the gate's call stack: docs/DESIGN.md, "Checks",
   says what it can still do);
4. the arm runs; the current stream is synchronised;
5. outputs must have the reference's shape and dtype (contiguous where the interface says
   so), hold no NaN the reference does not hold, and lie within the operator's tolerance
   of both the reference and the oracle (integer outputs, and `exact` checks: equal to the
   reference bit for bit);
6. every byte of the guarded buffers must hold what it must: inputs unchanged (except the
   documented in-place outputs), canaries and strided padding untouched;
7. anti-cheat calls (`thorough`, the default): no output may alias an input or the
   reference's result, nor the arm's previous output while that is still alive (a
   persistent buffer); a repeated call on the same input must be bit-identical (races);
   results must follow new inputs in fresh buffers and new values in the same buffers
   (memoisation keyed on pointers or shapes). Results are read after synchronising only
   the current stream, so work left unsynchronised on a side stream shows up as wrong.
The runner applies steps 5 and 6 to a timed call of every sample too (`timed.TimedArm`).
With a target active (`check`/`run --target`), a Triton launch over its grid limits fails
the check with the kernel's name and grid (`targets`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kerneltrial.ops.registry import Case, Impl, Inputs, Operator, Outputs, Tolerance
from kerneltrial.trial import guard, targets
from kerneltrial.trial.poison import poison_free_blocks, poisoned_allocations

# Upper edges of the ulp histogram bins (distance from the reference in ulps of the output
# dtype): exactly 0, (0, 1], (1, 2], (2, 4], (4, 16], and a last bin for everything above.
ULP_BIN_EDGES = (0.0, 1.0, 2.0, 4.0, 16.0)
EXTRA_CALLS_MAX = 3  # the gate makes 1..1+EXTRA_CALLS_MAX unchecked calls before the checked one
# Those calls run on other values: a caching allocator that hands the checked call a block an
# unchecked call wrote must not hold the right answer (GPU poisoning relies on free blocks).
# Even: the warm-up values keep the checked call's eps (eps alternates with the seed's parity), so a
# compiled peer compiles during the warm-up, not during the checked call.
WARMUP_SEED_OFFSET = 1_000_004


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
    ulp_hist: list[int] = field(default_factory=lambda: [0] * (len(ULP_BIN_EDGES) + 1))

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Difference:
    max_abs: float
    max_rel: float
    ulp: float
    within: bool


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a view (a strided slice reads only part of it)."""
    return t._base if t._base is not None else t


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


# Elements per pass of the float64 comparisons: bounds their temporaries (a 65536x12288
# silu_and_mul output compared in one pass took ~2 s per timed check on the H200, fighting the
# caching allocator for tens of GB of float64 temporaries; silu_and_mul-t1, first attempt).
CHUNK = 1 << 24


def _chunks(out: torch.Tensor, expected: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(out, expected, |out - expected| with NaN as inf) in float64, CHUNK elements at a time."""
    o_flat, e_flat = out.reshape(-1), expected.reshape(-1)
    for start in range(0, o_flat.numel(), CHUNK):
        o, e = o_flat[start : start + CHUNK].double(), e_flat[start : start + CHUNK].double()
        err = (o - e).abs()
        yield o, e, torch.where(torch.isnan(o) | torch.isnan(e), torch.full_like(err, math.inf), err)


def ulp_histogram(got: Outputs, reference: Outputs) -> list[int]:
    """Counts of output elements per ulp bin (ULP_BIN_EDGES) against the reference: ulps of the
    output dtype; integer outputs fall in the first bin when equal, else the last."""
    counts = torch.zeros(len(ULP_BIN_EDGES) + 1, dtype=torch.int64)
    for g, r in zip(got, reference, strict=False):
        if g.shape != r.shape or g.numel() == 0:
            continue
        edges = torch.tensor(ULP_BIN_EDGES, dtype=torch.float64, device=g.device)
        for _, e, err in _chunks(g, r):
            if g.is_floating_point():
                ulps = torch.where(err == 0, err, err / ulp_of(e, g.dtype))
            else:
                ulps = torch.where(err == 0, err, torch.full_like(err, math.inf))
            counts += torch.bincount(torch.bucketize(ulps, edges), minlength=len(counts)).cpu()
    return [int(c) for c in counts]


def difference(out: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None) -> Difference:
    """Largest differences of `out` from `expected`; `tol` None means exact equality."""
    max_abs = max_rel = max_ulp = 0.0
    within = True
    for _, e, err in _chunks(out, expected):
        rel = (err / e.abs().clamp_min(1e-30)).nan_to_num(nan=math.inf)
        ulp = (err / ulp_of(e, out.dtype)).nan_to_num(nan=math.inf) if out.is_floating_point() else err
        within = within and bool((err == 0).all() if tol is None else (err <= tol.atol + tol.rtol * e.abs()).all())
        max_abs, max_rel, max_ulp = (
            max(max_abs, float(err.max())),
            max(max_rel, float(rel.max())),
            max(max_ulp, float(ulp.max())),
        )
    return Difference(max_abs, max_rel, max_ulp, within)


def _fail(message: str) -> tuple[Difference, str]:
    return Difference(math.inf, math.inf, math.inf, False), message


def compare(
    op: Operator, case: Case, got: Outputs, reference: Outputs, oracle: Outputs, exact: bool = False
) -> tuple[Difference, str]:
    """Check `got` against both the reference and the oracle; '' when it passes. `exact`
    (or an integer operator) requires bit-identical output to the reference; the float64
    oracle is then still compared within the operator's tolerance."""
    if len(got) != len(reference):
        return _fail(f"returned {len(got)} outputs, expected {len(reference)}")
    tol = op.tolerance(case.dtype) if not op.exact else None
    worst = Difference(0.0, 0.0, 0.0, True)
    for i, (g, r, o) in enumerate(zip(got, reference, oracle, strict=True)):
        label = f"output {i}" if len(got) > 1 else "output"
        if g.shape != r.shape:
            return _fail(f"{label} has shape {tuple(g.shape)}, expected {tuple(r.shape)}")
        if g.dtype != r.dtype:
            return _fail(f"{label} has dtype {g.dtype}, expected {r.dtype}")
        if op.contiguous_outputs and not op.inplace and not g.is_contiguous():
            return _fail(
                f"{label} is not contiguous (strides {tuple(g.stride())}); the interface returns a contiguous tensor"
            )
        if g.is_floating_point() and bool((torch.isnan(g) & ~torch.isnan(r)).any()):
            count = int((torch.isnan(g) & ~torch.isnan(r)).sum())
            return _fail(
                f"{label} has {count} NaN element(s): unwritten, invalid, or not finished when the current stream was synchronised"
            )
        if g.is_floating_point() and bool((torch.isinf(g) & ~torch.isinf(r)).any()):
            count = int((torch.isinf(g) & ~torch.isinf(r)).sum())
            return _fail(f"{label} has {count} Inf element(s) where the reference is finite (overflow?)")
        checks = (("reference", r, None if exact else tol), ("float64 oracle", o.to(r.dtype) if op.exact else o, tol))
        for against, expected_values, bound in checks:
            d = difference(g, expected_values, bound)
            worst = Difference(
                max(worst.max_abs, d.max_abs),
                max(worst.max_rel, d.max_rel),
                max(worst.ulp, d.ulp),
                worst.within and d.within,
            )
            if not d.within:
                rule = "exact equality" if bound is None else f"rtol {bound.rtol}, atol {bound.atol}"
                return (
                    worst,
                    f"{label} differs from the {against}: max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g} ({rule})",
                )
    return worst, ""


def synchronize(device: torch.device) -> None:
    """Wait for the *current* stream only: work an arm leaves on another stream without
    making the current stream wait for it is not complete when results are read (a defect)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def settle(device: torch.device) -> None:
    """Wait for every stream of the device before the next arm or check: work an arm left on a
    side stream must not run into another arm's time, nor write into memory that the caching
    allocator has handed to another tensor meanwhile (a planted side-stream arm corrupted the
    honest arms' checks before this: results/archive/h200-planted/rmsnorm-cheats-r1)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call(op: Operator, fn: Callable[..., Any], inputs: Inputs, device: torch.device, like: Outputs) -> Outputs:
    """One poisoned call of `fn`, read back after synchronising the current stream."""
    poison_free_blocks(like)
    with poisoned_allocations(device):
        returned = fn(*inputs.values())
    synchronize(device)
    return op.outputs(inputs, returned)


def expected(op: Operator, inputs: Inputs) -> tuple[Outputs, Outputs]:
    """The reference and the oracle for `inputs`, computed on copies."""
    return op.reference(*clone_inputs(inputs).values()), op.oracle(*clone_inputs(inputs).values())


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two non-empty tensors live in the same storage (empty tensors share nothing)."""
    return a.numel() > 0 and b.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def aliasing(op: Operator, got: Outputs, inputs: Inputs, reference: Outputs) -> str:
    """An out-of-place result must live in fresh memory: not an input's, not the reference's."""
    if op.inplace:
        return ""
    tensors = {name: v for name, v in inputs.items() if isinstance(v, torch.Tensor)}
    for i, out in enumerate(got):
        if any(out is r or shares_storage(out, r) for r in reference):
            return "aliasing: returned the reference's own output instead of computing it"
        for name, v in tensors.items():
            if shares_storage(out, v):
                return f"aliasing: output {i} shares memory with input {name!r}; return a fresh tensor"
    return ""


def persistent(op: Operator, got: Outputs, previous: Outputs) -> str:
    """An out-of-place result must not reuse the storage of the arm's previous result while
    the caller still holds it (a persistent output buffer hides races and stale results)."""
    if op.inplace:
        return ""
    for i, out in enumerate(got):
        if any(shares_storage(out, p) for p in previous):
            return (
                f"returns a persistent buffer: output {i} shares storage with the arm's previous output, "
                "which the caller still holds; allocate a fresh output per call"
            )
    return ""


def checked_outputs(
    op: Operator,
    case: Case,
    g: guard.Guarded,
    values: Inputs,
    got: Outputs,
    reference: Outputs,
    oracle: Outputs,
    exact: bool,
) -> tuple[Difference, str]:
    """The rules every checked call obeys (gate and timed checks): the outputs match, and
    every byte of the guarded inputs holds what it must."""
    diff, message = compare(op, case, got, reference, oracle, exact)
    return diff, message or guard.problems(op, g, values)


def extra_calls(case: Case, seed: int, arm: str) -> int:
    """How many unchecked calls precede the checked one: 1..1+EXTRA_CALLS_MAX, seeded per
    (case, seed, arm) so the checked call is not at a position a kernel could count to."""
    digest = hashlib.sha256(f"{case.id}/{seed}/{arm}".encode()).digest()
    return 1 + digest[0] % (EXTRA_CALLS_MAX + 1)


def repeated(
    op: Operator, fn: Callable[..., Any], case: Case, seed: int, device: torch.device, first: Outputs, exact: bool
) -> str:
    """Extra calls that expose persistent buffers, caching, stale results and races (see `check`)."""
    same = guard.guard(op.make_inputs(case, seed, device))
    again = call(op, fn, same.inputs, device, first)
    message = persistent(op, again, first)
    if message:
        return message
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        if not torch.equal(a, b):
            diff = difference(b, a, None)
            return f"non-deterministic: a repeated call on the same input changed output {i} (max abs {diff.max_abs:.3g}); a race in a reduction?"
    values = op.make_inputs(case, seed + 7919, device)
    fresh = guard.guard(values)
    reference, oracle = expected(op, values)
    _, message = checked_outputs(
        op, case, fresh, values, call(op, fn, fresh.inputs, device, reference), reference, oracle, exact
    )
    if message:
        return (
            f"stale result: on new inputs in fresh buffers the {message}; results must follow the inputs (memoisation?)"
        )
    values = op.make_inputs(case, seed + 104729, device)
    guard.write(fresh, values)
    reference, oracle = expected(op, values)
    _, message = checked_outputs(
        op, case, fresh, values, call(op, fn, fresh.inputs, device, reference), reference, oracle, exact
    )
    if message:
        return f"stale result: on new values in the same buffers the {message}; results must not be cached by pointer or shape"
    return ""


def check(
    op: Operator, impl: Impl, case: Case, seed: int, device: torch.device, thorough: bool = True, exact: bool = False
) -> CheckResult:
    """Run one correctness check of `impl` on `case` with inputs drawn from `seed`.

    `thorough` adds the anti-cheat calls: outputs must not alias inputs, the reference or
    the previous output; a repeated call on the same input must give bit-identical outputs;
    results must follow new inputs in fresh buffers and new values written into the same
    buffers. `exact` requires bit-identical output to the reference."""

    def result(diff: Difference | None, message: str, hist: list[int] | None = None) -> CheckResult:
        d = diff or Difference(math.nan, math.nan, math.nan, False)
        return CheckResult(
            case.id,
            seed,
            impl.name,
            not message,
            d.max_abs,
            d.max_rel,
            d.ulp,
            message,
            hist or [0] * (len(ULP_BIN_EDGES) + 1),
        )

    fn = impl.resolve()
    if fn is None:
        return result(None, f"unavailable: {impl.reason}")
    launches = targets.seen()  # an over-limit launch fails the check even if the arm caught the error
    try:
        values = op.make_inputs(case, seed, device)
        reference, oracle = expected(op, values)
        for _ in range(extra_calls(case, seed, impl.name)):  # warm-up: JIT/compile outside the checked call, on
            fn(*guard.guard(op.make_inputs(case, seed + WARMUP_SEED_OFFSET, device)).inputs.values())  # other values
        inputs = guard.guard(values)
        got = call(op, fn, inputs.inputs, device, reference)
        diff, message = checked_outputs(op, case, inputs, values, got, reference, oracle, exact)
        hist = ulp_histogram(got, reference)
        if not message and thorough:
            message = aliasing(op, got, inputs.inputs, reference) or repeated(op, fn, case, seed, device, got, exact)
    except Exception as exc:  # an arm may fail in any way; the gate records it
        raised = f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return result(None, targets.first_since(launches) or raised)
    finally:
        settle(device)
    return result(diff, targets.first_since(launches) or message, hist)
