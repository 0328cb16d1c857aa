"""The correctness gate: every arm must compute the operator on fresh inputs before it is timed.

One check = one (case, seed, arm), drawn under the active inputs seed (ops/inputs.py):
1. fresh random inputs for the seed (storage offsets, special rows, NaN/Inf, eps or cap
   drawn); the official formula (`reference`) and the float64 `oracle` are computed on copies;
2. the arm gets private copies inside canary-guarded buffers (`guard`), at the drawn storage
   offsets; a seeded, varying number of unchecked calls (on other values, the same scalars)
   comes first, so the checked call is not the n-th call of a fixed count;
3. outputs must not contain what a kernel leaves behind unwritten (`poison`): on a GPU the caching
   allocator's free blocks of the outputs' sizes are filled with NaN before the call; on a
   CPU (whose allocator hands out fresh pages) torch.empty* is patched to poison while the
   arm runs (a kernel can see that patch, and the gate's call stack: docs/CHECKS.md, "What a kernel can still do",
   says what it can still do);
4. the arm runs; the current stream is synchronised;
5. outputs must have the reference's shape and dtype (contiguous where the interface says
   so), be NaN and +-Inf exactly where the reference is (the reference's propagation of
   non-finite inputs is the rule), and lie within the operator's tolerance of both the
   reference and the oracle (integer outputs, and `exact` checks: equal to the reference bit
   for bit, so -0.0 differs from +0.0; any NaN equals any NaN: payloads and the sign of a NaN
   are not compared, as hardware propagates them differently);
6. every byte of the guarded buffers must hold what it must: inputs unchanged (except the
   documented in-place outputs), canaries and strided padding untouched;
7. anti-cheat calls (`thorough`, the default): no output may alias an input or the
   reference's result, nor the arm's previous output while that is still alive (a
   persistent buffer); a repeated call on the same values with every tensor moved to the
   other kind of storage offset (0 when the first input sat at a nonzero one, else
   OTHER_OFFSET_BYTES) must be right and bit-identical (offset-dependent kernels, races);
   results must follow new inputs in fresh buffers and new values in the same buffers
   (memoisation keyed on pointers or shapes); then one call on each extra shape drawn for
   the check (ops/inputs.py `extra_cases`: real model widths, odd row counts). Results are
   read after synchronising only the current stream, so work left unsynchronised on a side
   stream shows up as wrong.
The runner applies steps 5 and 6 to a timed call of every sample too (`timed.TimedArm`).
With a target active (`check`/`run --target`), a Triton launch over its grid limits fails
the check with the kernel's name and grid (`targets`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops.registry import Case, Impl, Inputs, Operator, Outputs, Tolerance
from kerneltrial.rundir import streams
from kerneltrial.trial import guard, targets
from kerneltrial.trial.poison import poison_free_blocks, poisoned_allocations

# Upper edges of the ulp histogram bins (distance from the reference in ulps of the output
# dtype): exactly 0, (0, 1], (1, 2], (2, 4], (4, 16], and a last bin for everything above.
ULP_BIN_EDGES = (0.0, 1.0, 2.0, 4.0, 16.0)
EXTRA_CALLS_MAX = 3  # the gate makes 1..1+EXTRA_CALLS_MAX unchecked calls before the checked one
# Those calls run on other values (streams.WARMUP_SEED_OFFSET): a caching allocator that hands the
# checked call a block an unchecked call wrote must not hold the right answer (GPU poisoning relies
# on free blocks). They take the checked call's scalars (eps, cap), so a compiled peer compiles
# during the warm-up, not during the checked call.
OTHER_OFFSET_BYTES = 256  # the repeated call's storage offset when the checked call's first input sat at 0


@dataclass(frozen=True)
class Drawn:
    """What the checked call of a check ran on (a reviewer rebuilds the values with
    `make_inputs(case, seed)` under `inputs_seed`): each tensor's storage offset in bytes, the
    scalar arguments, how many input elements are NaN or +-Inf, the largest finite |input|,
    the storage offset of the repeated call (thorough checks) and the extra shapes checked."""

    offsets: dict[str, int]
    scalars: dict[str, float]
    nonfinite: int
    absmax: float
    other_offset: int | None = None
    extra: list[str] = field(default_factory=list)


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
    inputs_seed: int | None = None  # the inputs seed active for the check (ops/inputs.py)
    drawn: Drawn | None = None

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Difference:
    max_abs: float
    max_rel: float
    ulp: float
    within: bool
    first_bad: tuple[int, ...] | None = None  # index of the first element outside the bound


# A reference row no larger than this is the result of a zero or TINY input row (ops/inputs.py:
# normal values scaled by 2**-80 or less, so |x| / sqrt(eps) is a few 2**-70 at most; an ordinary
# row's largest output is of order 1): there only eps keeps rsqrt finite.
TINY_REFERENCE = 2.0**-60


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
    """(out, expected, error) in float64, CHUNK elements at a time: the error is 0 where both
    are equal (the same infinity included) or both NaN, inf where only one is NaN or the
    infinities differ, else |out - expected|."""
    o_flat, e_flat = out.reshape(-1), expected.reshape(-1)
    for start in range(0, o_flat.numel(), CHUNK):
        o, e = o_flat[start : start + CHUNK].double(), e_flat[start : start + CHUNK].double()
        nan_o, nan_e = torch.isnan(o), torch.isnan(e)
        err = torch.where(o == e, torch.zeros_like(o), (o - e).abs())
        err = torch.where(nan_o | nan_e, torch.where(nan_o & nan_e, 0.0, math.inf), err)
        yield o, e, err


def _scaled(err: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """err / scale, 0 where err is 0 and inf where the quotient is undefined."""
    return torch.where(err == 0, err, (err / scale).nan_to_num(nan=math.inf))


def _same_bits(o: torch.Tensor, e: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
    """Equal bit for bit (float64 holds every value of a narrower dtype exactly): equal, with
    the same sign (-0.0 is not +0.0), or both NaN (NaN payloads are not compared)."""
    nan = torch.isnan(o) & torch.isnan(e)
    return nan | ((err == 0) & (torch.signbit(o) == torch.signbit(e)))


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
                ulps = _scaled(err, ulp_of(e, g.dtype))
            else:
                ulps = torch.where(err == 0, err, torch.full_like(err, math.inf))
            counts += torch.bincount(torch.bucketize(ulps, edges), minlength=len(counts)).cpu()
    return [int(c) for c in counts]


def first_index(mask: torch.Tensor, shape: tuple[int, ...], start: int = 0) -> tuple[int, ...]:
    """The index in `shape` of the first True of the flat `mask`, whose element 0 is flat
    element `start` (row-major, as `reshape(-1)` orders them)."""
    flat = start + int(mask.reshape(-1).nonzero()[0, 0])
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def difference(out: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None) -> Difference:
    """Largest differences of `out` from `expected`, and the first element outside the bound;
    `tol` None means equal bit for bit (`_same_bits`). NaN matches NaN and an infinity the same
    infinity, under any tolerance."""
    max_abs = max_rel = max_ulp = 0.0
    first_bad: tuple[int, ...] | None = None
    for k, (o, e, err) in enumerate(_chunks(out, expected)):
        rel = _scaled(err, e.abs().clamp_min(1e-30))
        ulp = _scaled(err, ulp_of(e, out.dtype)) if out.is_floating_point() else err
        if tol is None:
            bound = _same_bits(o, e, err)
        else:  # an infinity is within no tolerance of another value
            bound = (err == 0) | ((err <= tol.atol + tol.rtol * e.abs()) & torch.isfinite(e))
        if first_bad is None and not bool(bound.all()):
            first_bad = first_index(~bound, tuple(out.shape), k * CHUNK)
        max_abs, max_rel, max_ulp = (
            max(max_abs, float(err.max())),
            max(max_rel, float(rel.max())),
            max(max_ulp, float(ulp.max())),
        )
    return Difference(max_abs, max_rel, max_ulp, first_bad is None, first_bad)


def non_finite(label: str, what: str, bad: torch.Tensor, reference: torch.Tensor, otherwise: str) -> str:
    """The failure of output elements that are `what` (NaN or Inf) where the reference is not:
    how many, the first index, and the likely cause. When every such row is wholly bad and its
    reference is zero or tiny (a zero or TINY input row), the cause named is a dropped eps."""
    message = (
        f"{label} has {int(bad.sum())} {what} element(s) (the first at index {first_index(bad, tuple(bad.shape))})"
    )
    if bad.dim() >= 1 and bad.shape[-1] > 0:
        rows = bad.reshape(-1, bad.shape[-1])
        hit = rows.any(dim=1)
        tiny = reference.reshape(-1, bad.shape[-1]).abs().amax(dim=1) <= TINY_REFERENCE
        if bool((rows[hit].all(dim=1) & tiny[hit]).all()):
            return (
                f"{message} in whole rows where the reference is zero or below {TINY_REFERENCE:g} (a zero or tiny "
                "input row, where only eps keeps rsqrt finite): likely a kernel that drops eps from the mean square"
            )
    return f"{message}: {otherwise}"


# Output elements no correct kernel writes where the reference holds a number: (name, test, the cause
# named unless `non_finite` finds a dropped eps)
NON_FINITE: tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor], str], ...] = (
    ("NaN", torch.isnan, "unwritten, invalid, or not finished when the current stream was synchronised"),
    ("Inf", torch.isinf, "an overflow where the reference is finite?"),
)


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
        for what, test, otherwise in NON_FINITE:
            bad = test(g) & ~test(r) if g.is_floating_point() else None
            if bad is not None and bool(bad.any()):
                return _fail(non_finite(label, what, bad, r, otherwise))
        finite = torch.isfinite(g) & ~torch.isfinite(r) if g.is_floating_point() else None
        if finite is not None and bool(finite.any()):
            return _fail(
                f"{label} has {int(finite.sum())} finite element(s) where the reference is NaN or Inf (the first at "
                f"index {first_index(finite, tuple(finite.shape))}): non-finite inputs must propagate as the official "
                "formula propagates them"
            )
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
                at = d.first_bad or ()
                return (
                    worst,
                    f"{label} differs from the {against}: max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g} ({rule}); "
                    f"first at index {at}: {g[at].item():.6g}, expected {expected_values[at].item():.6g}",
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
    (inputs seed, case, seed, arm) so the checked call is not at a position a kernel could count to."""
    digest = hashlib.sha256(f"{inp.active_inputs_seed()}/{case.id}/{seed}/{arm}".encode()).digest()
    return 1 + digest[0] % (EXTRA_CALLS_MAX + 1)


def _finite_extent(t: torch.Tensor) -> tuple[int, float]:
    """(non-finite elements, largest finite |x|) of `t`, about CHUNK elements at a time (no
    temporary of a GPU panel's size: a 65536 x 12288 input is 1.6 GB)."""
    rows = max(1, CHUNK // max(1, t[0].numel()))
    nonfinite, largest = 0, 0.0
    for part in t.split(rows):
        finite = torch.isfinite(part)
        nonfinite += int((~finite).sum())
        if part.numel():
            largest = max(largest, float(torch.where(finite, part.abs(), 0).amax()))
    return nonfinite, largest


def describe(values: Inputs, g: guard.Guarded) -> Drawn:
    """What a checked call runs on (`Drawn`): the arm's storage offsets, scalars, non-finite count, largest |x|."""
    extents = [_finite_extent(v) for v in values.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return Drawn(
        offsets={name: t.storage_offset() * t.element_size() for name, t in zip(g.views, g.tensors, strict=True)},
        scalars={k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        nonfinite=sum(n for n, _ in extents),
        absmax=max((m for _, m in extents), default=0.0),
    )


def other_offset(g: guard.Guarded) -> int:
    """The repeated call's storage offset in bytes: 0 when the checked call's first input sat at a
    nonzero offset, else OTHER_OFFSET_BYTES."""
    return 0 if g.tensors[0].storage_offset() else OTHER_OFFSET_BYTES


def moved(
    op: Operator,
    fn: Callable[..., Any],
    case: Case,
    values: Inputs,
    expect: tuple[Outputs, Outputs],
    first: Outputs,
    offset: int,
    exact: bool,
    device: torch.device,
) -> str:
    """The same values again, every input at storage offset `offset` bytes: right, bit-identical
    to the first call (`first`), and not in the first call's output buffer."""
    same = guard.guard(values, offset_bytes=offset)
    again = call(op, fn, same.inputs, device, first)
    message = persistent(op, again, first)
    if message:
        return message
    _, wrong = checked_outputs(op, case, same, values, again, *expect, exact)
    if wrong:
        return f"storage offset: with its inputs at offset {offset} bytes the {wrong}; address tensors from their data pointers"
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        diff = difference(b, a, None)
        if not diff.within:
            return (
                f"non-deterministic: a repeated call on the same input (at storage offset {offset}) changed "
                f"output {i} (max abs {diff.max_abs:.3g}); a race in a reduction?"
            )
    return ""


def stale(op: Operator, fn: Callable[..., Any], case: Case, seed: int, device: torch.device, exact: bool) -> str:
    """New inputs in fresh buffers, then new values written into the same buffers, must give new results."""
    values = op.make_inputs(case, seed + streams.FRESH_SEED_OFFSET, device)
    fresh = guard.guard(values)
    reference, oracle = expected(op, values)
    _, message = checked_outputs(
        op, case, fresh, values, call(op, fn, fresh.inputs, device, reference), reference, oracle, exact
    )
    if message:
        return (
            f"stale result: on new inputs in fresh buffers the {message}; results must follow the inputs (memoisation?)"
        )
    values = op.make_inputs(case, seed + streams.SAME_BUFFERS_SEED_OFFSET, device)
    guard.write(fresh, values)
    reference, oracle = expected(op, values)
    _, message = checked_outputs(
        op, case, fresh, values, call(op, fn, fresh.inputs, device, reference), reference, oracle, exact
    )
    if message:
        return f"stale result: on new values in the same buffers the {message}; results must not be cached by pointer or shape"
    return ""


def raised_message(exc: Exception) -> str:
    """How a check names an exception an arm raised: its type and first line."""
    return f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def extra_shapes(
    op: Operator, fn: Callable[..., Any], extras: list[Case], seed: int, device: torch.device, exact: bool
) -> str:
    """One checked call on each extra shape drawn for the check (ops/inputs.py `extra_cases`)."""
    for k, extra in enumerate(extras):
        values = op.make_inputs(extra, streams.extra_seed(seed, k), device)
        g = guard.guard(values)
        reference, oracle = expected(op, values)
        try:
            got = call(op, fn, g.inputs, device, reference)
        except Exception as exc:  # an arm may fail in any way: named with the shape it failed on
            return f"at the drawn shape {extra.id}: {raised_message(exc)}"
        _, message = checked_outputs(op, extra, g, values, got, reference, oracle, exact)
        if message:
            return f"at the drawn shape {extra.id}: {message}"
    return ""


def check(
    op: Operator, impl: Impl, case: Case, seed: int, device: torch.device, thorough: bool = True, exact: bool = False
) -> CheckResult:
    """Run one correctness check of `impl` on `case` with inputs drawn from `seed` (under the
    active inputs seed).

    `thorough` adds the anti-cheat calls: outputs must not alias inputs, the reference or
    the previous output; a repeated call on the same values at the other kind of storage
    offset must give right, bit-identical outputs; results must follow new inputs in fresh
    buffers and new values written into the same buffers; the extra shapes drawn for the
    check must be right too. `exact` requires bit-identical output to the reference."""
    drawn: Drawn | None = None

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
            inp.active_inputs_seed(),
            drawn,
        )

    fn = impl.resolve()
    if fn is None:
        return result(None, f"unavailable: {impl.reason}")
    launches = targets.seen()  # an over-limit launch fails the check even if the arm caught the error
    try:
        values = op.make_inputs(case, seed, device)
        scalars = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
        reference, oracle = expected(op, values)
        for _ in range(extra_calls(case, seed, impl.name)):  # warm-up: JIT/compile outside the checked call,
            warm = op.values_with(case, seed + streams.WARMUP_SEED_OFFSET, device, scalars)  # on other values
            fn(*guard.guard(warm).inputs.values())
        inputs = guard.guard(values)
        drawn = describe(values, inputs)
        got = call(op, fn, inputs.inputs, device, reference)
        diff, message = checked_outputs(op, case, inputs, values, got, reference, oracle, exact)
        hist = ulp_histogram(got, reference)
        if not message and thorough:
            extras = [c for c in inp.extra_cases(op, case, seed) if impl.draws_extra(c)]
            drawn = replace(drawn, other_offset=other_offset(inputs), extra=[c.id for c in extras])
            message = (
                aliasing(op, got, inputs.inputs, reference)
                or moved(op, fn, case, values, (reference, oracle), got, drawn.other_offset or 0, exact, device)
                or stale(op, fn, case, seed, device, exact)
                or extra_shapes(op, fn, extras, seed, device, exact)
            )
    except Exception as exc:  # an arm may fail in any way; the gate records it
        raised = raised_message(exc)
        return result(None, targets.first_since(launches) or raised)
    finally:
        settle(device)
    return result(diff, targets.first_since(launches) or message, hist)
