"""Walking pydantic models by field: the nested model a field holds, the field a validation
error points at, every dotted key. Shared by the protocol parsers (error messages) and
protocol_keys (the reference); imports nothing else of kerneltrial."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel
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
