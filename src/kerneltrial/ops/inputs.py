"""Random inputs for operators: seeded, on the target device.

Layouts shared by several operators:
- `contiguous`: a contiguous tensor;
- `row_strided`: the first N columns of a wider tensor (a row stride larger than N),
  the layout of a slice taken from a bigger activation.

Coverage. Every operator's `make_inputs` draws the following, because each one exposes a
wrong kernel that passed the check panel without it (tests/ops/test_coverage.py plants
one defect per item and shows the gate catching it):
- a storage offset: every tensor `randn` draws (and so every layout's tensors, weights
  included) is a view OFFSET_BYTES into a larger random buffer, so a kernel that addresses
  the storage from its start instead of the tensor's data pointer reads other values.
  256 bytes keep every alignment a kernel may rely on (16-byte vectors, 128-byte lines):
  timings on these inputs are those of a fresh allocation;
- special rows (`pick_rows`, `scale_rows`), placed at seeded positions:
  - ZERO, a row of zeros: its norm is 0 and only eps keeps rsqrt finite (a kernel without
    eps writes 0 * inf = NaN); for an argmax, a row of ties across every lane;
  - TINY, a row scaled by 2**-k, k in TINY_EXPONENTS (|x| ~ 1e-31..1e-23; a power of two
    keeps bf16 and fp32 values exact): its squares underflow to 0 in fp32, so a kernel
    that guards exact zero rows instead of adding eps divides by zero, and an argmax
    whose tanh cancels near 0 loses the order of the row;
  - EPS_SCALE, a row scaled by 2**-10 (rms ~ 1e-3, a mean square ~ 1e-6, as large as
    eps): its result depends on eps, so a kernel that ignores the eps argument is wrong
    there by a factor up to 2.4 (elsewhere eps moves the result by ~1e-6 relative,
    invisible under any tolerance);
  only as many kinds as leave one ordinary row (none in a single-row tensor);
- eps (`eps_for`): the operator's default eps for even seeds and the other of EPS_VALUES
  for odd ones; the gate's seeds 0 and 1 check both, so a kernel that hard-codes its
  default fails.
"""

from __future__ import annotations

import torch

ROW_PAD = 64  # extra columns of the wider tensor behind a `row_strided` view
OFFSET_BYTES = 256  # where every drawn tensor starts inside its buffer

ZERO, TINY, EPS_SCALE = "zero", "tiny", "eps_scale"
NORM_ROWS = (ZERO, TINY, EPS_SCALE)  # special rows of the normalisation operators
TINY_EXPONENTS = (80, 100)  # a TINY row is scaled by 2**-k, k in this range (inclusive)
EPS_SCALE_FACTOR = 2.0**-10
EPS_VALUES = (1e-6, 1e-5)  # the eps values `eps_for` alternates between


def generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(
    shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: torch.device, scale: float = 1.0
) -> torch.Tensor:
    """Standard normal values (times `scale`) rounded to `dtype`: a contiguous tensor of
    `shape` at a storage offset of OFFSET_BYTES into a random buffer (see the module doc)."""
    offset = OFFSET_BYTES // dtype.itemsize
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
    """A random tensor of `shape` in `contiguous` or `row_strided` layout (at an offset)."""
    if layout == "contiguous":
        return randn(shape, dtype, gen, device, scale)
    if layout == "row_strided":
        wide = randn((*shape[:-1], shape[-1] + ROW_PAD), dtype, gen, device, scale)
        return wide[..., : shape[-1]]
    raise ValueError(f"unknown layout {layout!r}; expected 'contiguous' or 'row_strided'")


def eps_for(seed: int, default: float) -> float:
    """`default` for even seeds, the other of EPS_VALUES for odd seeds."""
    other = EPS_VALUES[1] if default == EPS_VALUES[0] else EPS_VALUES[0]
    return default if seed % 2 == 0 else other


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


def row_factor(kind: str, r: int) -> float:
    """What a special row is multiplied by: 0, or an exact power of two (TINY's exponent
    follows the row index, so tensors sharing a pick, e.g. x and residual, scale alike)."""
    if kind == ZERO:
        return 0.0
    if kind == TINY:
        low, high = TINY_EXPONENTS
        return 2.0 ** -(low + r % (high - low + 1))
    if kind == EPS_SCALE:
        return EPS_SCALE_FACTOR
    raise ValueError(f"unknown special row {kind!r}; expected one of {ZERO}, {TINY}, {EPS_SCALE}")


def scale_rows(t: torch.Tensor, picked: dict[str, int]) -> None:
    """Make the picked rows of `t` special, in place (ZERO rows are +0.0 throughout)."""
    for kind, r in picked.items():
        view = row(t, r)
        if kind == ZERO:
            view.zero_()
        else:
            view.mul_(row_factor(kind, r))


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
