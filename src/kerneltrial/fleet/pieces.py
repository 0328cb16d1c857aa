"""The protocol of one work unit: the fleet's protocol with the unit's cases and order seed.

Written to DIR/pieces/<unit>.toml before the unit runs, so a unit is an ordinary `kerneltrial
run` of an ordinary protocol (its run directory holds the piece as protocol.toml). Paths in the
protocol are relative to its folder; the piece rebases them onto pieces/. A piece of a frozen
protocol is frozen when written: it is the preregistered protocol, mechanically cut.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tomli_w

from kerneltrial.analysis.fleet import Unit
from kerneltrial.trial import protocol as proto


def _rebase(path: str, source: Path, dest: Path) -> str:
    return os.path.relpath((source / path).resolve(), dest.resolve())


def piece_text(parent: dict[str, Any], unit: Unit, source: Path, dest: Path) -> str:
    """TOML of `unit`'s protocol; `source`: the fleet protocol's folder, `dest`: the piece's."""
    data = {**parent, "cases": [parent["cases"][i] for i in unit.case_indices], "order_seed": unit.order_seed}
    if "impl_modules" in data:
        data["impl_modules"] = [_rebase(m, source, dest) if m.endswith(".py") else m for m in data["impl_modules"]]
    if "calibration_run" in data:
        data["calibration_run"] = _rebase(data["calibration_run"], source, dest)
    if "rule" in data:
        data["rule"] = {**data["rule"], "path": _rebase(data["rule"]["path"], source, dest)}
    if "derived_from" in data:
        data["derived_from"] = [{**d, "path": _rebase(d["path"], source, dest)} for d in data["derived_from"]]
    return tomli_w.dumps(data)


def write_piece(protocol: Path, parent: dict[str, Any], unit: Unit, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(piece_text(parent, unit, protocol.parent, path.parent))
    proto.parse(path.read_text(), str(path))
    if proto.is_frozen(protocol):
        proto.freeze(path)
