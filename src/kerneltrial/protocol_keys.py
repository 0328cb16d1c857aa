"""Every protocol key, generated from the pydantic models: `python -m kerneltrial.protocol_keys`.

The output is docs/PROTOCOL_KEYS.md (a test keeps the committed file equal to it). The
rendering needs only pydantic; `reference()` imports the three protocol modules when called
(the kernel one imports torch through the operator registry, runs nothing).
"""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kerneltrial.model_fields import nested_model

HEADER = (
    "# Protocol keys\n\n"
    "Generated from the protocol models by `python -m kerneltrial.protocol_keys > docs/PROTOCOL_KEYS.md`;\n"
    "do not edit by hand (tests/test_protocol_keys.py checks it). A key left out takes its default;\n"
    "a key not listed here is refused.\n"
)


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_type(a) for a in args if a is not type(None))
    if origin in (list, tuple):
        return "array of tables" if nested_model(args[0]) else f"list of {_type(args[0])}"
    if origin is dict:
        return f"table of {_type(args[1])}"
    if nested_model(annotation):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    """The field's constraints (Field(ge=..., min_length=...)) as text: ">= 2", "> 0, < 1", "non-empty"."""
    parts = []
    for m in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if (bound := getattr(m, attr, None)) is not None:
                parts.append(f"{sign} {bound}")
        if (n := getattr(m, "min_length", None)) is not None:
            parts.append("non-empty" if n == 1 else f"at least {n} items")
    return ", ".join(parts)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "the table's defaults"
    return f"`{_toml(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(model: type[BaseModel], title: str, intro: str, table: str = "", depth: int = 2) -> str:
    """Markdown: the model's keys (key, type, default, description), then a section per nested table."""
    lines = [f"{'#' * depth} {title}", "", intro, "", "| key | type | default | description |", "|---|---|---|---|"]
    sections: list[str] = []
    for name, info in model.model_fields.items():
        # a field whose Python type is not what the TOML holds names the latter (bench.cases: lists -> Case)
        hint = info.json_schema_extra.get("toml_type") if isinstance(info.json_schema_extra, dict) else None
        kind = str(hint) if hint else _type(info.annotation)
        bounds = _bounds(info)
        lines.append(
            f"| `{name}` | {_cell(f'{kind}, {bounds}' if bounds else kind)} | {_cell(_default(info))} | {_cell(info.description or '')} |"
        )
        sub = nested_model(info.annotation)
        if sub is not None:
            path = f"{table}.{name}" if table else name
            head = f"`[[{path}]]`" if kind == "array of tables" else f"`[{path}]`"
            sections.append(render(sub, head, info.description or "", path, depth + 1))
    return "\n".join([*lines, "", *sections]).rstrip("\n") + "\n"


def reference() -> str:
    """The whole reference: the kernel protocol, the serving protocol, the model protocol."""
    from kerneltrial.model.spec import Protocol as ModelProtocol
    from kerneltrial.serving.protocol import Protocol as ServingProtocol
    from kerneltrial.trial.protocol import Protocol as KernelProtocol

    kernel = render(
        KernelProtocol,
        "Kernel protocol (`kerneltrial run`, `kerneltrial calibrate`)",
        "Top-level keys and a `[[cases]]` array; written by `kerneltrial protocol new`, "
        "frozen by `kerneltrial protocol freeze`.",
    )
    serving = render(
        ServingProtocol,
        "Serving protocol (`kerneltrial serve trial`)",
        "Top-level keys, the tables `[server]`, `[bench]`, `[acceptance]`, the optional `[accuracy]` "
        "and an `[[arms]]` array; example: protocols/serving/minicpm5-2b-flaggems.toml.",
    )
    model = render(
        ModelProtocol,
        "Model protocol (`kerneltrial model`)",
        "Top-level keys, the `[correctness]` table and `[[prefill]]` / `[[decode]]` arrays; example: "
        "protocols/model/minicpm5-2b.toml (eager and CUDA-graph modes).",
    )
    return f"{HEADER}\n{kernel}\n{serving}\n{model}"


if __name__ == "__main__":
    print(reference(), end="")
