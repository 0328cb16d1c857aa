"""The protocol of one work unit: the fleet's protocol with the unit's cases and order seed.

Written to DIR/pieces/<unit>.toml before the unit runs, so a unit is an ordinary `kerneltrial
run` of an ordinary protocol (its run directory holds the piece as protocol.toml). Paths in the
protocol are relative to its folder; the piece rebases them onto pieces/, and fleet.json records
what each named at plan time (`path_digests`). A piece of a frozen protocol is frozen when
written: it is the preregistered protocol, mechanically cut.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tomli_w

from kerneltrial.fleet.record import PathDigest, Unit, protocol_paths
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import MANIFEST
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.runner import module_hashes


def _rebase(path: str, source: Path, dest: Path) -> str:
    return os.path.relpath((source / path).resolve(), dest.resolve())


def rebased(parent: dict[str, Any], source: Path, dest: Path) -> dict[str, Any]:
    """The protocol's path keys, rebased from `source` (its folder) onto `dest` (dotted module names stay)."""
    data: dict[str, Any] = {}
    if "impl_modules" in parent:
        data["impl_modules"] = [_rebase(m, source, dest) if m.endswith(".py") else m for m in parent["impl_modules"]]
    if "calibration_run" in parent:
        data["calibration_run"] = _rebase(parent["calibration_run"], source, dest)
    if "rule" in parent:
        data["rule"] = {**parent["rule"], "path": _rebase(parent["rule"]["path"], source, dest)}
    if "derived_from" in parent:
        data["derived_from"] = [{**d, "path": _rebase(d["path"], source, dest)} for d in parent["derived_from"]]
    return data


def piece_text(parent: dict[str, Any], unit: Unit, source: Path, dest: Path) -> str:
    """TOML of `unit`'s protocol; `source`: the fleet protocol's folder, `dest`: the piece's."""
    cases = [parent["cases"][i] for i in unit.case_indices]
    return tomli_w.dumps({**parent, **rebased(parent, source, dest), "cases": cases, "order_seed": unit.order_seed})


def path_digests(protocol: Path, parent: dict[str, Any], pieces: Path) -> list[PathDigest]:
    """Each path of the protocol as every piece (in `pieces`) names it, with the sha256 of what it
    names now: a user module's as the kernel runner records it, a run directory's manifest.json's,
    another file's; None where there is none."""
    modules = module_hashes(proto.load(protocol), protocol)
    in_pieces = protocol_paths({**parent, **rebased(parent, protocol.parent, pieces)})
    digests = []
    for (key, path), (_, piece_path) in zip(protocol_paths(parent), in_pieces, strict=True):
        target = protocol.parent / path
        if key.startswith("impl_modules["):
            digest: str | None = None if modules[path] == "unknown" else modules[path]
        elif (target / MANIFEST).is_file():
            digest = sha256_file(target / MANIFEST)
        else:
            digest = sha256_file(target) if target.is_file() else None
        digests.append(PathDigest(key=key, path=path, piece_path=piece_path, sha256=digest))
    return digests


def write_piece(protocol: Path, parent: dict[str, Any], unit: Unit, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(piece_text(parent, unit, protocol.parent, path.parent))
    proto.parse(path.read_text(), str(path))
    if proto.is_frozen(protocol):
        proto.freeze(path)
