"""Reading and writing the files of a run directory.

JSON documents are replaced atomically (a temporary file, then os.replace: a killed process
leaves the old or the new document, never half of one). Rows are appended and flushed one
by one (a killed run keeps what it measured; docs/RUNDIR.md).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kerneltrial.rundir.errors import RunDirError


def now() -> str:
    """The current UTC time, ISO 8601 with milliseconds (every timestamp a run records)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def json_text(data: Any) -> str:
    """`data` as the text of a JSON document of a run directory: indented, one final newline."""
    return json.dumps(data, indent=2) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON (`json_text`), replacing `path` in one step."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json_text(data))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON document at `path`; RunDirError when it is missing or not JSON."""
    if not path.is_file():
        raise RunDirError(f"{path.parent}: missing {path.name}; not a complete run directory")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunDirError(f"{path}: not valid JSON ({error})") from error


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (none when it does not exist); RunDirError names a bad line."""
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise RunDirError(f"{path.name} line {number} is not JSON ({error})") from error
    return rows


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header (none when it does not exist)."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def trim_partial_line(path: Path) -> None:
    """Drop a last line a killed process left half-written."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """Append one row to a JSON-lines file, flushed (for files written a row at a time)."""
    with jsonl_appender(path) as append:
        append(row)


@contextmanager
def jsonl_appender(path: Path) -> Iterator[Callable[[dict[str, Any]], None]]:
    """An `append(row)` that writes one JSON line and flushes it."""
    with path.open("a", encoding="utf-8") as handle:

        def append(row: dict[str, Any]) -> None:
            handle.write(json.dumps(row) + "\n")
            handle.flush()

        yield append


@contextmanager
def csv_appender(path: Path, columns: list[str]) -> Iterator[Callable[[list[Any]], None]]:
    """An `append(row)` that writes one CSV row and flushes it; the header is written first
    when the file is new or empty."""
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(columns)
            handle.flush()

        def append(row: list[Any]) -> None:
            writer.writerow(row)
            handle.flush()

        yield append
