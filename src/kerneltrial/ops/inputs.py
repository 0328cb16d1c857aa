"""Random inputs for operators: seeded, on the target device, from a domain a kernel cannot learn.

Layouts shared by several operators:
- `contiguous`: a contiguous tensor;
- `row_strided`: the first N columns of a wider tensor (a row stride larger than N),
  the layout of a slice taken from a bigger activation.

The inputs seed. Every generator is seeded from the active *inputs seed* (`drawing`) and the
integer seed a caller derives (the protocol seed, seed + 7919, a timed unit's value set...):
`check`, the package interface check and every `run` draw a fresh inputs seed from the
operating system (recorded: `check` prints it and takes it back with --inputs-seed, plan.json
`inputs_seed`), so the values, offsets, scalars and extra shapes of a run cannot be computed
in advance from its protocol; with none active (tests, old runs) the integer seed alone seeds
the generator, as before. rundir/streams.py lists the integers a seed derives.

Coverage. Every operator's `make_inputs` draws the following, because each one exposes a
wrong kernel that passed the check panel without it (tests/ops/test_coverage.py and
tests/ops/test_domain.py plant one defect per item and show the gate catching it):
- a storage offset per tensor (`randn`): 0 (a fresh allocation) or a multiple of OFFSET_ALIGN
  bytes up to OFFSET_STEPS of them, drawn; the guard keeps it (trial/guard.py) and the gate
  calls every arm once more with the same values at the other kind of offset. 16-byte steps
  keep the alignment Triton specialises on, so a nonzero offset costs a kernel no speed
  (misaligned pointers are an extra shape of the gate's, below);
- special rows (`pick_rows`, `scale_rows`), placed at seeded positions:
  - ZERO, a row of zeros: its norm is 0 and only eps keeps rsqrt finite (a kernel without
    eps writes 0 * inf = NaN); for an argmax, a row of ties across every lane;
  - TINY, a row scaled by 2**-k, k in TINY_EXPONENTS (|x| ~ 1e-31..1e-23; a power of two
    keeps bf16 and fp32 values exact): its squares underflow to 0 in fp32, so a kernel
    that guards exact zero rows instead of adding eps divides by zero, and an argmax
    whose tanh cancels near 0 loses the order of the row;
  - EPS_SCALE, a row scaled to an rms of about sqrt(eps) (the nearest power of two): its
    result depends on eps, so a kernel that ignores or replaces the eps argument is wrong
    there by a factor up to 2.4 (elsewhere eps moves the result by ~1e-6 relative,
    invisible under any tolerance);
  - LARGE, a row scaled by 2**k, k in LARGE_EXPONENTS (|x| up to ~1.6e4): a kernel that
    clamps its inputs (|x| > 32, say) is wrong there;
  - NONFINITE, a row with one NaN, +Inf or -Inf (by the row's index): the official formula
    propagates it (NaN rows, zeros and NaN after an Inf in a norm, the first NaN's index for
    an argmax), and the gate requires the same non-finite elements in the output;
  only as many kinds as leave one ordinary row, in the order given (none in a single-row
  tensor);
- eps (`draw_eps`): the operator's default for a quarter of the draws, else log-uniform in
  EPS_RANGE, so a kernel that hard-codes or special-cases eps values fails;
- extra shapes (`extra_cases`): besides its case, each thorough gate check calls the arm
  on shapes drawn for it: each of the operator's real model widths with probability 1/2
  (1, 3 or 5 rows), and with probability 1/2 one more of odd rows and width, so neither
  the widths nor the number of distinct shapes of a run is the panel's; and (DOMAIN_DRAWS):
  - the check's own case misaligned (`Case.misalign`, ops/placement.py): every tensor an odd
    number of elements (1..15) further into its storage, so no data pointer is 16-byte aligned,
    as in a slice `h[:, 1:]` (the drawn offsets above keep the alignment, so that the timed
    calls run at a fresh allocation's; a kernel that assumes it is wrong only here). Arms
    whose contract takes aligned pointers only (`Impl.aligned`) are not drawn it;
  - a row count drawn log-uniformly in ROWS_RANGE (24..2**17, between and beyond every panel's
    row counts; 24..1024 in the Triton interpreter) at a narrow width, so a kernel wrong on row
    counts no panel holds (100..60000, say) is caught in some check of a run;
  - with probability 1/2 each, a 4-D shape and a 1-D one ([N]; operators whose shape rule
    needs more dimensions, softcap_row_argmax and the Z-Image norms, refuse it).
  In the Triton interpreter the kernels kerneltrial ships take no extra shape of more than
  spec.INTERPRETED_EXTRA_ROWS rows (`Impl.draws_extra`); a GPU checks them on every one.
"""

from __future__ import annotations

import hashlib
import math
import random
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from kerneltrial.ops import launch
from kerneltrial.ops.spec import Case, Operator
from kerneltrial.rundir.streams import EXTRA_SHAPES_MAX

ROW_PAD = 64  # extra columns of the wider tensor behind a `row_strided` view
OFFSET_ALIGN = 16  # bytes: nonzero storage offsets are multiples of this
OFFSET_STEPS = 64  # ... from 1 to this many of them (up to 1 KiB)

ZERO, TINY, EPS_SCALE, LARGE, NONFINITE = "zero", "tiny", "eps_scale", "large", "nonfinite"
NORM_ROWS = (ZERO, TINY, EPS_SCALE, LARGE, NONFINITE)  # special rows of the normalisation operators
TINY_EXPONENTS = (80, 100)  # a TINY row is scaled by 2**-k, k in this range (inclusive)
LARGE_EXPONENTS = (6, 12)  # a LARGE row is scaled by 2**k, k in this range (inclusive)
NONFINITE_VALUES = (math.nan, math.inf, -math.inf)  # what a NONFINITE row holds, by its index
EPS_RANGE = (1e-8, 1e-4)  # eps drawn log-uniformly in this range (or the operator's default)
INPUTS_SEED_BITS = 63

_active: list[int | None] = [None]  # the inputs seed `drawing` made active (every thread sees it)


def new_inputs_seed() -> int:
    """A fresh inputs seed from the operating system's randomness."""
    return secrets.randbits(INPUTS_SEED_BITS)


@contextmanager
def drawing(inputs_seed: int | None) -> Iterator[None]:
    """Seed every generator from `inputs_seed` (and the caller's integer seed) while active, in
    every thread (`check` runs each check in a worker thread)."""
    previous, _active[0] = _active[0], inputs_seed
    try:
        yield
    finally:
        _active[0] = previous


def active_inputs_seed() -> int | None:
    return _active[0]


def stream_seed(seed: int) -> int:
    """The generator seed of integer seed `seed` under the active inputs seed (itself when none)."""
    salt = _active[0]
    if salt is None:
        return seed
    digest = hashlib.sha256(f"{salt}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(stream_seed(seed))


def draw_offset(dtype: torch.dtype, gen: torch.Generator) -> int:
    """A storage offset in elements: 0 for half of the draws, else 1..OFFSET_STEPS times OFFSET_ALIGN bytes."""
    k = int(torch.randint(0, 2 * OFFSET_STEPS, (1,), generator=gen, device=gen.device))
    return 0 if k < OFFSET_STEPS else (k - OFFSET_STEPS + 1) * OFFSET_ALIGN // dtype.itemsize


def randn(
    shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: torch.device, scale: float = 1.0
) -> torch.Tensor:
    """Standard normal values (times `scale`) rounded to `dtype`: a contiguous tensor of
    `shape` at a drawn storage offset into a random buffer (see the module doc)."""
    offset = draw_offset(dtype, gen)
    buffer = (torch.randn(offset + numel(shape), generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)
    return buffer[offset:].view(shape)


def with_layout(
    shape: tuple[int, ...],
    layout: str,
    dtype: torch.dtype,
    gen: torch.Generator,
    device: torch.device,
    scale: float = 1.0,
) -> torch.Tensor:
    """A random tensor of `shape` in `contiguous` or `row_strided` layout (at a drawn offset)."""
    if layout == "contiguous":
        return randn(shape, dtype, gen, device, scale)
    if layout == "row_strided":
        wide = randn((*shape[:-1], shape[-1] + ROW_PAD), dtype, gen, device, scale)
        return wide[..., : shape[-1]]
    raise ValueError(f"unknown layout {layout!r}; expected 'contiguous' or 'row_strided'")


def uniform(gen: torch.Generator) -> float:
    """One value uniform in [0, 1) from `gen`."""
    return float(torch.rand((), generator=gen, device=gen.device, dtype=torch.float64))


def draw_eps(gen: torch.Generator, default: float) -> float:
    """`default` for a quarter of the draws, else log-uniform in EPS_RANGE."""
    if uniform(gen) < 0.25:
        return default
    low, high = (math.log(e) for e in EPS_RANGE)
    return math.exp(low + (high - low) * uniform(gen))


def kept(drawn: float, scalars: Mapping[str, Any] | None, name: str) -> float:
    """The scalar argument a draw uses: `drawn`, or another draw's (`scalars`, from
    Operator.values_with: a timed sample keeps its seed's eps or cap). Drawn either way, so the
    rest of the stream is the same; the tensors are then placed for the scalar kept."""
    return drawn if scalars is None else float(scalars[name])


def rows_of(t: torch.Tensor) -> int:
    """Rows of `t` [..., N]: the product of its leading dimensions."""
    return numel(tuple(t.shape[:-1]))


def row(t: torch.Tensor, r: int) -> torch.Tensor:
    """Row `r` of `t` [..., N] (rows in row-major order of the leading dimensions), as a
    view: writing it writes `t`, whatever its strides."""
    index = []
    for size in reversed(t.shape[:-1]):
        index.append(r % size)
        r //= size
    return t[tuple(reversed(index))]


def pick_rows(n_rows: int, kinds: tuple[str, ...], gen: torch.Generator, device: torch.device) -> dict[str, int]:
    """Distinct seeded rows for the first `kinds` that leave one ordinary row: kind -> row."""
    kinds = kinds[: max(0, n_rows - 1)]
    if not kinds:
        return {}
    rows = torch.randperm(n_rows, generator=gen, device=device)[: len(kinds)].tolist()
    return dict(zip(kinds, rows, strict=True))


def row_factor(kind: str, r: int, eps: float | None = None) -> float:
    """What a scaled special row is multiplied by: 0, or an exact power of two (TINY's and
    LARGE's exponents follow the row index, so tensors sharing a pick, e.g. x and residual,
    scale alike; EPS_SCALE's is the power of two nearest sqrt(eps))."""
    if kind == ZERO:
        return 0.0
    if kind == TINY:
        low, high = TINY_EXPONENTS
        return 2.0 ** -(low + r % (high - low + 1))
    if kind == LARGE:
        low, high = LARGE_EXPONENTS
        return 2.0 ** (low + r % (high - low + 1))
    if kind == EPS_SCALE:
        if eps is None:
            raise ValueError("an eps_scale row needs the eps it is scaled to")
        return 2.0 ** round(math.log2(math.sqrt(eps)))
    raise ValueError(f"unknown scaled row {kind!r}; expected one of {ZERO}, {TINY}, {EPS_SCALE}, {LARGE}")


def nonfinite_column(r: int, width: int) -> int:
    """The column of a NONFINITE row's non-finite element (spread over the row by its index)."""
    return (r * 7919 + width // 2) % width


def scale_rows(t: torch.Tensor, picked: dict[str, int], eps: float | None = None) -> None:
    """Make the picked rows of `t` special, in place (ZERO rows are +0.0 throughout; a
    NONFINITE row gets its value at `nonfinite_column`)."""
    for kind, r in picked.items():
        view = row(t, r)
        if kind == ZERO:
            view.zero_()
        elif kind == NONFINITE:
            view[nonfinite_column(r, view.shape[-1])] = NONFINITE_VALUES[r % len(NONFINITE_VALUES)]
        else:
            view.mul_(row_factor(kind, r, eps))


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---- extra shapes -----------------------------------------------------------------------

# Random extra shapes per check: 0..EXTRA_MAX_RANDOM, RANDOM_ROWS rows. The interpreter runs a
# one-row-per-program kernel row by row, so extra rows cost: with up to 2 shapes of 63 rows and
# real widths at 9 rows, `check rmsnorm` took 66.3 s of CPU against 40.1 before extra shapes
# (one thread, a loaded machine); 1 shape of at most 23 rows, real widths at 9 rows: 53.7 s.
EXTRA_MAX_RANDOM = 1
REAL_ROWS = (1, 3, 5)  # rows of a real-width extra shape (none of rmsnorm's panel counts but 1)
RANDOM_ROWS = (11, 23)  # odd rows of a random extra shape, in this range
RANDOM_WIDTHS = (3, 1023)  # odd widths of a random extra shape, in this range

# The rest of the domain (issue 35): each thorough check also draws
MISALIGNED, DRAWN_ROWS, RANK_4, RANK_1 = "misaligned", "drawn rows", "4-D", "1-D"
DOMAIN_DRAWS = (MISALIGNED, DRAWN_ROWS, RANK_4, RANK_1)  # in the order extra_cases lists them
MISALIGN_ELEMENTS = (1, 15)  # the check's own case, every tensor an odd count in this range further in
ROWS_RANGE = (24, 1 << 17)  # a row count drawn log-uniformly in this range, past every panel's rows,
ROWS_RANGE_INTERPRETED = (24, 1 << 10)  # ... in this one in the Triton interpreter (one program at a time)
# The widths of these shapes are multiples of WIDTH_STEP elements (16 bytes of bf16), so each varies
# one thing (the row count, the rank) and no arm that takes only rows of whole 16-byte vectors (a
# peer's contract) is excluded by its width: odd widths are the random shape's above.
WIDTH_STEP = 8
ROWS_WIDTHS = (8, 64)  # ... at a width in this range (narrow: 2**17 rows cost a torch arm ms)
RANK_4_WIDTHS = (8, 248)  # a 4-D shape's width is drawn in this range
RANK_1_WIDTHS = (8, 1016)  # a 1-D shape's width is drawn in this range
RANK_4_LEADS = ((2, 3), (2, 3), (2, 3, 5))  # a 4-D shape's leading sizes are drawn from these
RANK_PROBABILITY = 0.5  # each of the 4-D and 1-D shapes is drawn with this probability


def _pick(digest: bytes, at: int, choices: tuple[int, ...]) -> int:
    return choices[int.from_bytes(digest[at : at + 2], "little") % len(choices)]


def drawn_width(rng: random.Random, bounds: tuple[int, int]) -> int:
    """A multiple of WIDTH_STEP in `bounds` (inclusive), uniform."""
    return WIDTH_STEP * rng.randint(bounds[0] // WIDTH_STEP, bounds[1] // WIDTH_STEP)


def drawn_rows(rng: random.Random) -> int:
    """A row count log-uniform in ROWS_RANGE (ROWS_RANGE_INTERPRETED in the Triton interpreter)."""
    low, high = (math.log(r) for r in (ROWS_RANGE_INTERPRETED if launch.interpreted() else ROWS_RANGE))
    return round(math.exp(low + (high - low) * rng.random()))


def rank_4(op: Operator, rng: random.Random) -> tuple[int, ...]:
    """A 4-D shape: the operator's extra-shape form with leading sizes drawn (RANK_4_LEADS)
    prepended up to four dimensions ([a, b, c, N]; [a, c, heads, head_dim] for the Z-Image form)."""
    a, b, c = (rng.choice(sizes) for sizes in RANK_4_LEADS)
    base = op.extra_shape(c, drawn_width(rng, RANK_4_WIDTHS))
    return (*(a, b)[: max(0, 4 - len(base))], *base)


def domain_shapes(op: Operator, rng: random.Random) -> list[tuple[int, ...]]:
    """The drawn row count's shape, and the 4-D and 1-D shapes drawn (each with RANK_PROBABILITY;
    the 1-D one is [N] of the extra-shape form, which shape rules that need more dimensions refuse)."""
    shapes = []
    if DRAWN_ROWS in DOMAIN_DRAWS:
        shapes.append(op.extra_shape(drawn_rows(rng), drawn_width(rng, ROWS_WIDTHS)))
    if RANK_4 in DOMAIN_DRAWS and rng.random() < RANK_PROBABILITY:
        shapes.append(rank_4(op, rng))
    if RANK_1 in DOMAIN_DRAWS and rng.random() < RANK_PROBABILITY:
        shapes.append(op.extra_shape(1, drawn_width(rng, RANK_1_WIDTHS))[-1:])
    return shapes


def misaligned_case(case: Case, rng: random.Random) -> Case:
    """The check's own case with every tensor an odd number of elements further in (Case.misalign)."""
    return replace(case, misalign=rng.randrange(MISALIGN_ELEMENTS[0] | 1, MISALIGN_ELEMENTS[1] + 1, 2))


def extra_cases(op: Operator, case: Case, seed: int) -> list[Case]:
    """The extra shapes of the gate check of (`case`, `seed`) under the active inputs seed, in
    the case's dtype and layout (see the module doc): the case itself misaligned, the real widths
    and the random odd shape drawn, a drawn row count, the 4-D and 1-D shapes drawn; shapes the
    operator refuses, and the case's own (but misaligned), are left out."""
    digest = hashlib.sha256(f"{_active[0]}/{op.name}/{case.id}/{seed}/extra".encode()).digest()
    rng = random.Random(hashlib.sha256(f"{_active[0]}/{op.name}/{case.id}/{seed}/domain".encode()).digest())
    shapes = [
        op.extra_shape(_pick(digest, 2 * i + 1, REAL_ROWS), width)
        for i, width in enumerate(op.real_widths)
        if digest[2 * i] % 2 == 0
    ]
    odd_rows = tuple(range(RANDOM_ROWS[0] | 1, RANDOM_ROWS[1] + 1, 2))
    odd_widths = tuple(range(RANDOM_WIDTHS[0] | 1, RANDOM_WIDTHS[1] + 1, 2))
    for k in range(digest[20] % (EXTRA_MAX_RANDOM + 1)):
        shapes.append(op.extra_shape(_pick(digest, 21 + 4 * k, odd_rows), _pick(digest, 23 + 4 * k, odd_widths)))
    cases = [misaligned_case(case, rng)] if MISALIGNED in DOMAIN_DRAWS and not case.misalign else []
    for shape in dict.fromkeys([*shapes, *domain_shapes(op, rng)]):
        extra = Case(shape, case.dtype, case.layout)
        if shape != case.shape and not op.refusal(extra):
            cases.append(extra)
    return cases[:EXTRA_SHAPES_MAX]
