"""The operator registry: the registered operators and their implementations, by name.

The built-in operators are declared, not registered by their modules: ops/catalog.py holds one
`OperatorSpec` per operator (ops/spec.py: the `Operator` and its `Arm`s, in listing order), and
`load_builtin_ops` registers them through `register_spec`, once. Users' modules register their
arms through `load_user_module` or `register_impl`. Everything else looks operators and
implementations up here by name (`get_op`, `all_ops`); the records are importable from here too.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneltrial.ops.spec import (
    DTYPES,
    Case,
    Impl,
    ImplKind,
    Inputs,
    Operator,
    OperatorSpec,
    Outputs,
    RegistryError,
    Tolerance,
    Unavailable,
)

__all__ = [
    "DTYPES",
    "Case",
    "Impl",
    "Inputs",
    "Operator",
    "OperatorSpec",
    "Outputs",
    "RegistryError",
    "Tolerance",
    "Unavailable",
    "add_impl",
    "all_ops",
    "get_op",
    "load_builtin_ops",
    "load_user_module",
    "register_impl",
    "register_op",
    "register_spec",
]

_OPERATORS: dict[str, Operator] = {}
_builtins_registered = False  # set by load_builtin_ops once the catalog is registered


def register_spec(spec: OperatorSpec) -> Operator:
    """Register a declared operator and its arms (the one path for the built-in operators)."""
    op = register_op(spec.operator)
    for arm in spec.arms:
        _add(op, Impl(op.name, arm.name, arm.kind, arm.loader, arm.doc, arm.layouts, arm.widths, arm.aligned))
    return op


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
    return _add(get_op(impl.op), impl)


def _add(operator: Operator, impl: Impl) -> Impl:
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


def load_builtin_ops() -> None:
    """Register the operators ops/catalog.py declares (`SPECS`), the first time it is called."""
    global _builtins_registered
    if _builtins_registered:
        return
    from kerneltrial.ops.catalog import SPECS

    for spec in SPECS:
        register_spec(spec)
    _builtins_registered = True


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
