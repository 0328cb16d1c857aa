"""What an operator and its implementations are: the records the registry holds.

An *operator* (`Operator`) knows its semantics: how to make inputs, the official torch
formula (`reference`), a float64 `oracle`, tolerances, bytes moved and, where meaningful,
FLOPs (ops/flops.py). An *implementation* (`Impl`) is one way to compute it: the control, a candidate kernel, a peer adapter or a
user's function. An `OperatorSpec` declares an operator whole: the `Operator` and its `Arm`s
(implementations as declared), in listing order; ops/catalog.py holds the built-in ones and
registry.py registers them.

Calling convention: `make_inputs` returns an ordered dict of named arguments and every
implementation is called positionally with its values, as the FlagOS submission
convention writes them (e.g. `rmsnorm(x, weight, eps)`). `outputs()` turns a call's effect
into a tuple of tensors: the return value, or for in-place operators the arguments named
in `Operator.inplace`. `reference` and `oracle` are pure and return that same tuple.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch

from kerneltrial.ops import launch
from kerneltrial.ops.placement import placed
from kerneltrial.rundir.layout import DTYPE_BYTES, case_id

Inputs = dict[str, Any]
Outputs = tuple[torch.Tensor, ...]
ImplKind = Literal["control", "candidate", "peer", "user", "calibration"]

G = TypeVar("G")  # a kernel family's launch geometry record

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_BYTES}


class RegistryError(ValueError):
    """A bad operator, implementation or module name; the message names the fix."""


class Unavailable(RuntimeError):
    """Raised by a peer loader when the peer is not installed or cannot run here."""


@dataclass(frozen=True)
class Case:
    """One problem: a shape, a dtype and a memory layout of the inputs. `misalign` (0 for every
    panel and protocol case): every tensor sits that many elements (an odd number) further into
    its storage, so no data pointer is 16-byte aligned (ops/placement.py; the gate draws such a
    case as an extra shape, ops/inputs.py `extra_cases`)."""

    shape: tuple[int, ...]
    dtype: str = "bfloat16"
    layout: str = "contiguous"
    misalign: int = 0

    @property
    def id(self) -> str:
        base = case_id(self.shape, self.layout, self.dtype)
        return f"{base}/misaligned+{self.misalign}" if self.misalign else base

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        """Bytes per element of the case's dtype."""
        return self.torch_dtype.itemsize


@dataclass(frozen=True)
class Tolerance:
    """Elementwise bound |out - expected| <= atol + rtol * |expected|."""

    rtol: float
    atol: float


# Widths a kernel may special-case that no panel holds, checked as extra shapes (ops/inputs.py,
# `extra_cases`): the hidden sizes of Qwen2-0.5B (896), Llama-3.2-3B (3072) and Qwen2-7B (3584).
REAL_WIDTHS = (896, 3072, 3584)


def rows_by_width(rows: int, width: int) -> tuple[int, ...]:
    """The shape of an extra case: `rows` rows of `width` elements."""
    return (rows, width)


# The kernels kerneltrial ships (and calibration copies of them or of peers): in the Triton
# interpreter, one program at a time, they take no extra shape of more than INTERPRETED_EXTRA_ROWS
# rows (the gate's drawn row counts reach 1024 there: seconds per call for a one-row-per-program
# kernel, ~2.3 ms a row on this project's machines); a GPU checks them on every drawn row count.
SHIPPED_KINDS = ("control", "candidate", "calibration")
INTERPRETED_EXTRA_ROWS = 128


# Default tolerances against both the reference and the float64 oracle. bf16: rtol 0.016
# is two bf16 ulps (2 * 2**-7), enough for one extra rounding step between the formula and
# a kernel; fp16 and fp32 likewise a few ulps of their mantissa.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "bfloat16": Tolerance(rtol=0.016, atol=1e-5),
    "float16": Tolerance(rtol=2e-3, atol=1e-5),
    "float32": Tolerance(rtol=1e-4, atol=1e-5),
}


@dataclass
class Impl:
    """One implementation of an operator. `loader` resolves the callable lazily."""

    op: str
    name: str
    kind: ImplKind
    loader: Callable[[], Callable[..., Any]]
    doc: str = ""
    layouts: tuple[str, ...] | None = None  # None: every layout of the operator
    # None: every last dimension; else the only ones a peer takes (its contract): the gate draws no extra
    # shape of another width for it (a user's arm cannot declare one: trial/runner.py refuses it)
    widths: tuple[int, ...] | None = None
    # True: takes only 16-byte aligned data pointers (its contract, e.g. a CUDA kernel of 16-byte
    # vector loads): the gate draws no misaligned extra case for it (Case.misalign)
    aligned: bool = False
    _fn: Callable[..., Any] | None = field(default=None, repr=False)
    _reason: str | None = field(default=None, repr=False)

    def resolve(self) -> Callable[..., Any] | None:
        """The callable, or None when unavailable (see `reason`)."""
        if self._fn is None and self._reason is None:
            try:
                self._fn = self.loader()
            except Unavailable as exc:
                self._reason = str(exc)
        return self._fn

    @property
    def available(self) -> bool:
        return self.resolve() is not None

    @property
    def reason(self) -> str:
        self.resolve()
        return self._reason or ""

    def supports(self, case: Case) -> bool:
        """Whether the arm takes `case`'s layout: outside its layouts it is not applicable there."""
        return self.layouts is None or case.layout in self.layouts

    def draws_extra(self, case: Case) -> bool:
        """Whether the gate may check the arm on the extra shape `case` (ops/inputs.py): inside its
        layouts and widths, aligned where it takes only aligned pointers, and, for the kernels
        kerneltrial ships in the Triton interpreter, of at most INTERPRETED_EXTRA_ROWS rows. A panel
        case outside `widths` is still checked, and fails as declined."""
        if not self.supports(case) or (self.widths is not None and case.shape[-1] not in self.widths):
            return False
        if case.misalign and self.aligned:
            return False
        rows = math.prod(case.shape[:-1])
        return not (self.kind in SHIPPED_KINDS and launch.interpreted() and rows > INTERPRETED_EXTRA_ROWS)


@dataclass
class Operator:
    """The semantics of one operator and the implementations registered for it."""

    name: str
    signature: str
    doc: str
    layouts: tuple[str, ...]
    make_inputs: Callable[[Case, int, torch.device], Inputs]
    reference: Callable[..., Outputs]
    oracle: Callable[..., Outputs]
    bytes_moved: Callable[[Case], int]
    small_cases: tuple[Case, ...]
    gpu_cases: tuple[Case, ...]
    dtypes: tuple[str, ...] = ("bfloat16",)
    inplace: tuple[str, ...] = ()
    exact: bool = False  # integer outputs compared exactly (e.g. argmax indices)
    contiguous_outputs: bool = False  # the interface returns contiguous tensors (the gate checks it)
    shape_rule: Callable[[tuple[int, ...]], str] | None = None  # returns a complaint, or "" when the shape is fine
    real_widths: tuple[int, ...] = REAL_WIDTHS  # widths of the extra shapes the gate draws (ops/inputs.py)
    extra_shape: Callable[[int, int], tuple[int, ...]] = rows_by_width  # (rows, width) -> an extra case's shape
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # Draws seed's tensors for given scalar arguments, where the values depend on them (softcap's
    # logits are placed relative to its cap); None: make_inputs' tensors, the scalars replaced.
    values_for: Callable[[Case, int, torch.device, Mapping[str, Any]], Inputs] | None = None
    # FLOPs per call where a count is meaningful (ops/flops.py says what is counted): plan.json
    # records it per case and the summary derives achieved TFLOPS from it; None: not defined
    flops: Callable[[Case], int] | None = None
    impls: dict[str, Impl] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every draw honours a case's `misalign` (ops/placement.py), whoever wrote the operator."""
        self.make_inputs = placed(self.make_inputs)
        if self.values_for is not None:
            self.values_for = placed(self.values_for)

    def values_with(self, case: Case, seed: int, device: torch.device, scalars: Mapping[str, Any]) -> Inputs:
        """Fresh tensors drawn from `seed` with the scalar arguments `scalars` (eps, cap) of another
        draw: the timed value sets of a sample, whose scalars must stay those of its (case, seed)."""
        if self.values_for is not None:
            return self.values_for(case, seed, device, scalars)
        return self.make_inputs(case, seed, device) | dict(scalars)

    def outputs(self, inputs: Inputs, returned: Any) -> Outputs:
        """What a call produced: in-place arguments, or the returned tensor(s)."""
        if self.inplace:
            return tuple(inputs[name] for name in self.inplace)
        if isinstance(returned, torch.Tensor):
            return (returned,)
        if isinstance(returned, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in returned):
            return tuple(returned)
        raise TypeError(
            f"{self.name}: an implementation returned {type(returned).__name__}; expected a tensor ({self.signature})"
        )

    def refusal(self, case: Case) -> str:
        """Why the operator cannot take `case` (naming the fix), or '' when it can."""
        if case.dtype not in self.dtypes:
            return f"{self.name} takes dtype {', '.join(self.dtypes)}, not {case.dtype!r}"
        if case.layout not in self.layouts:
            return f"{self.name} has no layout {case.layout!r}; use one of {', '.join(self.layouts)}"
        complaint = self.shape_rule(case.shape) if self.shape_rule else ""
        return f"{self.name}: shape {'x'.join(map(str, case.shape))} {complaint}" if complaint else ""

    def validate(self, case: Case) -> None:
        """Refuse a case the operator cannot take, with a message that names the fix."""
        refusal = self.refusal(case)
        if refusal:
            raise RegistryError(refusal)

    def tolerance(self, dtype: str) -> Tolerance:
        return self.tolerances[dtype]

    def impl(self, name: str) -> Impl:
        if name not in self.impls:
            known = ", ".join(self.impls) or "none"
            raise RegistryError(f"unknown implementation {name!r} of {self.name}; known: {known}")
        return self.impls[name]


@dataclass(frozen=True)
class Arm:
    """An implementation as an operator's spec declares it; `register_spec` registers it as an
    `Impl` of the spec's operator (the fields mean what `Impl`'s do). Our kernels are declared
    with `own`; the peer modules build their peers' arms (a loader that raises Unavailable)."""

    name: str
    loader: Callable[[], Callable[..., Any]]
    doc: str
    kind: ImplKind = "peer"
    layouts: tuple[str, ...] | None = None
    widths: tuple[int, ...] | None = None
    aligned: bool = False


def own(name: str, fn: Callable[..., Any], doc: str, kind: ImplKind = "candidate") -> Arm:
    """The arm of one of our own kernels (a control or a candidate): `fn` itself, always available."""
    return Arm(name, lambda: fn, doc, kind)


def kernel_arms(
    geometries: Mapping[str, G], launcher: Callable[[G], Callable[..., Any]], describe: Callable[[G], str]
) -> tuple[Arm, ...]:
    """One arm per launch geometry of a kernel family, by arm name in order (`control` is the
    control, the rest candidates): `launcher(geometry)` runs it, `describe(geometry)` is its doc."""
    return tuple(
        own(name, launcher(g), describe(g), "control" if name == "control" else "candidate")
        for name, g in geometries.items()
    )


@dataclass(frozen=True)
class OperatorSpec:
    """One operator declared whole: its semantics, panels and description (`operator`, with no
    implementations) and its arms in the order `kerneltrial ops` lists them."""

    operator: Operator
    arms: tuple[Arm, ...]
