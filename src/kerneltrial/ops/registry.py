"""Operator and implementation registry.

An *operator* (`Operator`) knows its semantics: how to make inputs, the official torch
formula (`reference`), a float64 `oracle`, tolerances and bytes moved. An *implementation*
(`Impl`) is one way to compute it: the control, a candidate kernel, a peer adapter or a
user's function. Both are registered here; everything else looks them up by name.

Calling convention: `make_inputs` returns an ordered dict of named arguments and every
implementation is called positionally with its values, as the FlagOS submission
convention writes them (e.g. `rmsnorm(x, weight, eps)`). `outputs()` turns a call's effect
into a tuple of tensors: the return value, or for in-place operators the arguments named
in `Operator.inplace`. `reference` and `oracle` are pure and return that same tuple.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from kerneltrial.rundir.layout import DTYPE_BYTES, case_id

Inputs = dict[str, Any]
Outputs = tuple[torch.Tensor, ...]
ImplKind = Literal["control", "candidate", "peer", "user", "calibration"]

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_BYTES}


class RegistryError(ValueError):
    """A bad operator, implementation or module name; the message names the fix."""


class Unavailable(RuntimeError):
    """Raised by a peer loader when the peer is not installed or cannot run here."""


@dataclass(frozen=True)
class Case:
    """One problem: a shape, a dtype and a memory layout of the inputs."""

    shape: tuple[int, ...]
    dtype: str = "bfloat16"
    layout: str = "contiguous"

    @property
    def id(self) -> str:
        return case_id(self.shape, self.layout, self.dtype)

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
    widths: tuple[int, ...] | None = None  # None: every last dimension; else the only ones it takes (a peer's contract)
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
        """Whether `case` is inside the declared contract (layouts, widths): outside it the arm is
        not applicable, and the gate draws no extra shape outside it for this arm."""
        layout_ok = self.layouts is None or case.layout in self.layouts
        return layout_ok and (self.widths is None or case.shape[-1] in self.widths)


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
    impls: dict[str, Impl] = field(default_factory=dict)

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


_OPERATORS: dict[str, Operator] = {}


def register_op(op: Operator) -> Operator:
    if op.name in _OPERATORS:
        raise RegistryError(f"operator {op.name!r} is registered twice")
    _OPERATORS[op.name] = op
    return op


def register_impl(
    op: str,
    name: str,
    kind: ImplKind = "candidate",
    doc: str = "",
    layouts: tuple[str, ...] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register `fn` as implementation `name` of operator `op`."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        add_impl(
            Impl(
                op=op,
                name=name,
                kind=kind,
                loader=lambda: fn,
                doc=doc or (fn.__doc__ or "").strip().split("\n")[0],
                layouts=layouts,
            )
        )
        return fn

    return decorate


def add_impl(impl: Impl) -> Impl:
    operator = get_op(impl.op)
    if impl.name in operator.impls:
        raise RegistryError(f"implementation {impl.name!r} of {impl.op} is registered twice")
    operator.impls[impl.name] = impl
    return impl


def get_op(name: str) -> Operator:
    load_builtin_ops()
    if name not in _OPERATORS:
        raise RegistryError(f"unknown operator {name!r}; known: {', '.join(_OPERATORS)}")
    return _OPERATORS[name]


def all_ops() -> list[Operator]:
    load_builtin_ops()
    return list(_OPERATORS.values())


_INFRASTRUCTURE = frozenset({"registry", "peers", "peers_sglang", "launch", "inputs", "interpreter_fix"})


def load_builtin_ops() -> None:
    """Import every operator module of kerneltrial.ops (each registers itself once)."""
    import kerneltrial.ops as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _INFRASTRUCTURE:
            importlib.import_module(f"kerneltrial.ops.{info.name}")


def load_user_module(spec: str, op: str | None = None) -> list[Impl]:
    """Register a user's kernels from a file path or a dotted module name.

    Every top-level function named after an operator becomes an arm called
    `user:<module>` (kind `user`); the module may also use `register_impl` itself.
    With `op`, a module that adds no arm of that operator is refused, naming the functions it
    does define (a misspelt entry point must not read as a check of the built-in arms).
    """
    load_builtin_ops()
    if op is not None:
        get_op(op)
    before = {(o.name, n): i for o in _OPERATORS.values() for n, i in o.impls.items()}
    module, stem = _import_user_module(spec)
    for operator in _OPERATORS.values():
        fn = getattr(module, operator.name, None)
        if callable(fn):  # loading the same module again replaces its arms
            operator.impls[f"user:{stem}"] = Impl(
                op=operator.name,
                name=f"user:{stem}",
                kind="user",
                loader=lambda fn=fn: fn,
                doc=f"{operator.name} from {spec}",
            )
    added = [i for o in _OPERATORS.values() for n, i in o.impls.items() if before.get((o.name, n)) is not i]
    if op is not None and not any(impl.op == op for impl in added):
        functions = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__
        )
        raise no_function_named(spec, op, functions)
    if not added:
        raise no_operator_function(spec)
    return added


def no_function_named(spec: str, op: str, functions: list[str]) -> RegistryError:
    """The error for a user module given for operator `op` that defines no function `op`."""
    return RegistryError(
        f"{spec} defines no function {op} (its functions: {', '.join(functions) or 'none'}); "
        f"name the entry point {op}, or register it with kerneltrial.ops.registry.register_impl"
    )


def no_operator_function(spec: str) -> RegistryError:
    """The error for a user module that defines no function named after an operator."""
    return RegistryError(
        f"{spec} defines no operator function; name a top-level function after an operator "
        f"({', '.join(_OPERATORS)}) or use kerneltrial.ops.registry.register_impl"
    )


def user_stem(spec: str) -> str:
    """The short name the arms of user module `spec` (a .py path or a dotted name) carry: `user:<stem>`."""
    path = Path(spec)
    return path.stem if spec.endswith(".py") or path.exists() else spec.rsplit(".", 1)[-1]


def _import_user_module(spec: str) -> tuple[Any, str]:
    """The imported module and the short name its arms carry."""
    path = Path(spec)
    if spec.endswith(".py") or path.exists():
        if not path.is_file():
            raise RegistryError(f"user module {spec!r} does not exist; pass a .py file or a dotted module name")
        name = f"kerneltrial_user_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # a user's file may raise anything at import
            del sys.modules[name]
            raise RegistryError(f"user module {spec} failed to import: {type(exc).__name__}: {exc}") from exc
        return module, user_stem(spec)
    try:
        return importlib.import_module(spec), user_stem(spec)
    except Exception as exc:
        raise RegistryError(f"user module {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
