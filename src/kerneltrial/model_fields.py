"""Walking pydantic models by field: the nested model a field holds, the field a validation
error points at (and the one-line message for it, `describe`), every dotted key. Shared by the protocol parsers (error messages) and
protocol_keys (the reference); imports nothing else of kerneltrial."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself, in a list, or optional), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := nested_model(a)) is not None), None)


def field_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> FieldInfo | None:
    """The field a validation error's location points at (list indices skipped), or None."""
    info: FieldInfo | None = None
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None
        info = current.model_fields[part]
        current = nested_model(info.annotation)
    return info


def fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        yield prefix + name, info
        sub = nested_model(info.annotation)
        if sub is not None:
            yield from fields(sub, f"{prefix}{name}.")


def undocumented(model: type[BaseModel]) -> list[str]:
    """Keys (dotted, nested tables included) whose field has no description."""
    return [key for key, info in fields(model) if not (info.description or "").strip()]


def describe(error: ValidationError, model: type[BaseModel]) -> str:
    """One line for a protocol's validation error: the key, the bad value and the fix
    (pydantic's first error; `model` is the protocol's top-level model)."""
    # a misspelt key also reads as a missing one: name the misspelling, it carries the fix
    first = sorted(error.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = first["loc"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "protocol"
    if first["type"] == "missing":
        info = field_at(model, loc)
        what = info.description.rstrip(".") if info and info.description else "see docs/PROTOCOL_KEYS.md"
        return f"{where} is missing; add it ({what})"
    if first["type"] == "extra_forbidden":
        parent = field_at(model, loc[:-1])
        table = (nested_model(parent.annotation) if parent else None) or model
        keys = list(table.model_fields)
        near = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        return f"{where} is not a protocol key; " + (
            f"did you mean {near[0]}?" if near else f"use one of {', '.join(keys)}"
        )
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "value_error":  # our validators' messages name the value and the fix
        return f"{where}: {msg}"
    return f"{where}: {msg[0].lower()}{msg[1:]}, got {first['input']!r}"
