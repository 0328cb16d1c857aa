"""The interface a submission's entry point must match: the parameters of the operator's
registry `signature` (e.g. `zimage_qk_rmsnorm(x, weight, eps=1e-5) -> Tensor`), by name, in
order, with the same defaults, and nothing else. The Track 1 workflow's package that every
chip rejected had an entry point that did not match the interface; this is that check.

Parameters are read from source with `ast`: the module's (`inspect` of an archive imports
nothing) or the live function's signature text (the interface check's worker imports it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["positional", "*args", "keyword-only", "**kwargs"]


class NotLiteral:
    """A default written as an expression `ast.literal_eval` cannot read (a name, a call)."""

    def __repr__(self) -> str:
        return "<not a literal>"


NOT_LITERAL = NotLiteral()


@dataclass(frozen=True)
class Param:
    """One parameter: its name, kind and default (`text` as written, `value` as read)."""

    name: str
    kind: Kind = "positional"
    has_default: bool = False
    value: Any = None
    text: str = ""

    def __str__(self) -> str:
        prefix = {"positional": "", "*args": "*", "keyword-only": "", "**kwargs": "**"}[self.kind]
        return f"{prefix}{self.name}" + (f"={self.text}" if self.has_default else "")


def _literal(node: ast.expr, constants: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return NOT_LITERAL


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Top-level names bound once to a literal (`EPS = 1e-5`): a default may name one, as the
    live function's default is then that literal."""
    values: dict[str, list[Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values.setdefault(node.targets[0].id, []).append(_literal(node.value, {}))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            values.setdefault(node.target.id, []).append(_literal(node.value, {}))
    return {name: v[0] for name, v in values.items() if len(v) == 1 and v[0] is not NOT_LITERAL}


def params_of_def(node: ast.FunctionDef | ast.AsyncFunctionDef, constants: dict[str, Any] | None = None) -> list[Param]:
    """The parameters of a `def`, read from its syntax tree; `constants` resolves defaults that
    name a module-level literal (see `module_constants`)."""
    constants = constants or {}
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [
        Param(p.arg, "positional")
        if d is None
        else Param(p.arg, "positional", True, _literal(d, constants), ast.unparse(d))
        for p, d in zip(positional, defaults, strict=True)
    ]
    if a.vararg:
        params.append(Param(a.vararg.arg, "*args"))
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(
            Param(p.arg, "keyword-only")
            if d is None
            else Param(p.arg, "keyword-only", True, _literal(d, constants), ast.unparse(d))
        )
    if a.kwarg:
        params.append(Param(a.kwarg.arg, "**kwargs"))
    return params


def _parse_def(head: str) -> ast.FunctionDef:
    node = ast.parse(f"def {head}: pass").body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def params_of_signature(text: str) -> list[Param] | None:
    """The parameters of a live function from its `inspect.signature` text (`(x, weight,
    eps=1e-06)`, as the interface check's worker reports it), read as source; None when the
    text is not Python (a default whose repr is no expression)."""
    try:
        return params_of_def(_parse_def(f"f{text}"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a default's repr the parser cannot hold
        return None


def declared(signature: str) -> tuple[str, list[Param]]:
    """The head (`op(x, weight, eps=1e-5)`) and parameters of a registry signature."""
    head = signature[: signature.index(")") + 1]
    return head, params_of_def(_parse_def(head))


def mismatch(signature: str, got: list[Param]) -> str:
    """Why an entry point with parameters `got` does not match `signature`, or ''."""
    head, expected = declared(signature)
    name = head[: head.index("(")]
    written = f"{name}({', '.join(map(str, got))})"
    extra = [p for p in got if p.kind != "positional"]
    if extra:
        return f"{written} takes {extra[0]} ({extra[0].kind}); the interface is {head}: take exactly its parameters"
    if [p.name for p in got] != [p.name for p in expected]:
        return (
            f"{written} does not match the interface {head}: take parameters "
            f"{', '.join(p.name for p in expected)} in that order"
        )
    for want, have in zip(expected, got, strict=True):
        if want.has_default and not have.has_default:
            return f"parameter {have.name} of {written} has no default; the interface is {head}"
        if want.has_default and (have.value is NOT_LITERAL or have.value != want.value):
            return f"parameter {have.name} of {written} has another default than the interface {head}"
    return ""
