"""The files the server processes imported, against the RECORD checked before the launch (issue 36
item 6, second part).

Inside the server, kerneltrial's plugin writes imports-PID.json beside each process's call record
(plugins/imports.py): every module it has imported from vLLM, FlagGems or vllm-plugin-FL, with the
file's hash as read and RECORD's hash of it. After the server stops, `imported_check` reads the
launch's records: every process with a plugin load (dispatch-PID.json) must have an imports record;
each imported file must be one RECORD lists, with RECORD's hash; each process must have read the
RECORD the pre-launch check hashed (serving/dist_records.py, `record_sha256`); some process must
have imported a vLLM file. launches.jsonl `pins.imported` keeps the result (`ImportedCheck`),
pins.scope takes its reasons, and verify recomputes it from the records (`imported_problems`).

What it cannot see: a file swapped for the import and back before the plugin hashed it, code run
from a bytecode cache (.pyc, which RECORD lists without a hash) or made without a file, and a
plugin or a server that writes these records to order (a user with root: docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerneltrial.plugins.imports import ImportsRecord
from kerneltrial.plugins.records import ProcessRecord
from kerneltrial.serving.dist_records import NAMES, SHOWN, DistRecord, from_fields

PLAN_KEY = "imported_files"  # plan.json: this runner requires the record (verify: no downgrade)


@dataclass(frozen=True)
class ImportedCheck:
    """A launch's imported files against RECORD (launches.jsonl `pins.imported`); `reasons`: why they
    are no evidence (none: they are)."""

    spawned: bool  # a server ran (a launch refused before it spawned imported nothing)
    processes: int = 0  # dispatch records with a plugin load
    recorded: int = 0  # of those, with an imports record
    files: int = 0  # distinct imported files of the pinned distributions
    unlisted: int = 0  # of those, files RECORD does not list
    differ: int = 0  # of those, files whose hash is not RECORD's
    reasons: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, data: Any) -> ImportedCheck | None:
        """From launches.jsonl (None: not a check)."""
        return from_fields(cls, data)


@dataclass
class _Tally:
    """The imported files of every process of one launch, by verdict."""

    files: set[tuple[str, str]] = field(default_factory=set)
    unlisted: set[tuple[str, str]] = field(default_factory=set)
    differ: set[tuple[str, str]] = field(default_factory=set)
    fileless: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)


def _processes(directory: Path, tally: _Tally) -> list[int]:
    """The PIDs of the dispatch records with a plugin load (a bad record is a reason)."""
    pids = []
    for p in sorted(directory.glob("dispatch-*.json")) if directory.is_dir() else []:
        try:
            rec = ProcessRecord.from_json(p.read_text(), p.name)
        except (ValueError, OSError) as e:
            tally.reasons.append(str(e))
            continue
        if rec.loads:
            pids.append(rec.pid)
    return pids


def _tally_process(rec: ImportsRecord, records: Mapping[str, Any], tally: _Tally) -> None:
    for dist in rec.distributions:
        pre = DistRecord.of(records.get(dist.key))
        want = pre.record_sha256 if pre is not None else None
        if dist.record_sha256 != want or pre is None or pre.distribution != dist.distribution:
            tally.reasons.append(
                f"{NAMES.get(dist.key, dist.key)}: server process {rec.pid} read the RECORD of {dist.distribution} "
                f"(sha256 {str(dist.record_sha256)[:12]}), not the one checked before the launch "
                f"({pre.distribution if pre else 'none'}, sha256 {str(want)[:12]})"
            )
    found = {d.key for d in rec.distributions}
    for f in rec.files:
        if f.key not in found:
            tally.reasons.append(
                f"{NAMES.get(f.key, f.key)}: the server imported {f.path}, but no {NAMES.get(f.key, f.key)} "
                "distribution was found in it"
            )
        tally.files.add((f.key, f.path))
        if f.listed is None:
            tally.unlisted.add((f.key, f.path))
        elif f.sha256 != f.listed:
            tally.differ.add((f.key, f.path))
    tally.fileless |= set(rec.fileless)


def _named(kind: set[tuple[str, str]], says: str) -> list[str]:
    """One line per file (the first SHOWN of each distribution), then how many more."""
    out = []
    for key in sorted({k for k, _ in kind}):
        paths = sorted(p for k, p in kind if k == key)
        out += [f"{NAMES.get(key, key)}: the server imported {p}, {says}" for p in paths[:SHOWN]]
        if len(paths) > SHOWN:
            out.append(f"{NAMES.get(key, key)}: and {len(paths) - SHOWN} more imported files {says}")
    return out


def imported_check(directory: Path, records: Any) -> ImportedCheck:
    """A stopped launch's imported files (its dispatch directory) against `records`, its pre-launch
    RECORD check (launches.jsonl `pins.records`)."""
    tally = _Tally()
    pids = _processes(directory, tally)
    recorded = 0
    for pid in pids:
        path = directory / f"imports-{pid}.json"
        try:
            rec = ImportsRecord.from_json(path.read_text(), path.name)
        except (ValueError, OSError):
            continue
        recorded += 1
        _tally_process(rec, records if isinstance(records, dict) else {}, tally)
    reasons = list(dict.fromkeys(tally.reasons))
    if not pids:
        reasons.append("no server process recorded loading kerneltrial's plugin, so none recorded its imported files")
    elif recorded < len(pids):
        reasons.append(
            f"{len(pids) - recorded} of {len(pids)} server processes that loaded kerneltrial's plugin recorded no "
            "imported files (imports-PID.json)"
        )
    elif not any(k == "vllm" for k, _ in tally.files):
        reasons.append("no server process recorded an imported vLLM file")
    reasons += _named(tally.unlisted, "which its RECORD does not list")
    reasons += _named(tally.differ, "whose hash differs from its RECORD")
    reasons += [f"the server ran {m}, a module without a file: no RECORD can list it" for m in sorted(tally.fileless)]
    return ImportedCheck(True, len(pids), recorded, len(tally.files), len(tally.unlisted), len(tally.differ), reasons)


def not_spawned() -> dict[str, Any]:
    """pins.imported of a launch refused before its server spawned."""
    return asdict(ImportedCheck(False))


def imported_reasons(data: Any, required: bool) -> list[str]:
    """Why a launch's imported files are no evidence for scope official (none: they are). `required`:
    the run's runner records them (plan.json `imported_files`); without it a row from before the
    record adds nothing, so an older run's scope is what it was."""
    if data is None and not required:
        return []
    check = ImportedCheck.of(data)
    if check is None:
        return ["the files the server imported were not recorded (launches.jsonl pins.imported)"]
    return list(check.reasons) if check.spawned else []


def imported_problems(where: str, row: Mapping[str, Any], directory: Path) -> list[str]:
    """verify: a launch's recorded `pins.imported` is the check its records give again."""
    pins = row.get("pins")
    if not isinstance(pins, dict) or "imported" not in pins or row.get("spawned") is False:
        return []
    got, want = pins["imported"], asdict(imported_check(directory, pins.get("records")))
    if got == want:
        return []
    diff = {
        k: (got.get(k) if isinstance(got, dict) else got, v)
        for k, v in want.items()
        if not isinstance(got, dict) or got.get(k) != v
    }
    return [f"{where}: pins.imported differs from what its dispatch records give (recorded, recomputed): {diff}"]
