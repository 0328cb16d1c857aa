"""File integrity of a kernel run of the timed-check contract: manifest, source archive, provenance.

Part of `kerneltrial verify` (kernel/verify/ calls these for runs whose plan.json has
`"checks": 1`). Like verify, it imports nothing from kerneltrial.stats or kernel.summary: it
follows docs/VERIFY.md on its own. Each function returns the
problems it found; an empty list means the check passed.

What these checks prove: no file of the run directory changed after the run wrote its
manifest, and the package source archived with the run is the source whose digest the run
recorded. They cannot prove that the rows were honestly measured: a run directory whose
rows, summary and manifest were rewritten together is self-consistent (docs/VERIFY.md,
"What verify can and cannot prove").
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import ADDED_FIGURES, ERRATA, MANIFEST, REPORT, SOURCE_ARCHIVE

MANIFEST_SCHEMA = "kerneltrial.manifest/1"
PACKAGE_PREFIX = "kerneltrial/"
# files a person, `kerneltrial report` or `kerneltrial plot` may add after the run; everything else must be
# in the manifest. report.md is checked as a derived file and ERRATA.md by its own rule (kernel/derived.py).
ADDED_AFTER_RUN = (REPORT, ERRATA, *ADDED_FIGURES)
REQUIRED_VERSIONS = ("python", "torch", "triton")
SHA256 = re.compile(r"[0-9a-f]{64}")


def _added_after_run(relative: str) -> bool:
    """report.md, ERRATA.md and the figures of `report` and `plot`, at the top of the run directory."""
    return relative in ADDED_AFTER_RUN


def manifest_problems(run_dir: Path) -> list[str]:
    """Every file the manifest lists exists with its sha256; every other file was added after the run."""
    path = run_dir / MANIFEST
    if not path.is_file():
        return [f"{MANIFEST} is missing: a run with timed checks writes it last, over every file of the run"]
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return [f"{MANIFEST} is not valid JSON ({error})"]
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA or not isinstance(listed, dict):
        return [f"{MANIFEST} is not a {MANIFEST_SCHEMA} document {{schema, files: {{path: sha256}}}}"]
    problems = []
    for relative, recorded in listed.items():
        parts = PurePosixPath(relative).parts
        if PurePosixPath(relative).is_absolute() or ".." in parts or relative == MANIFEST:
            problems.append(f"{MANIFEST} lists {relative!r}, which is not a file inside the run directory")
        elif not (run_dir / relative).is_file():
            problems.append(f"{relative} is listed in {MANIFEST} but does not exist")
        elif sha256_file(run_dir / relative) != recorded:
            problems.append(
                f"{relative} hashes to {sha256_file(run_dir / relative)[:12]}..., {MANIFEST} recorded "
                f"{str(recorded)[:12]}...: the file changed after the run"
            )
    present = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    unlisted = [r for r in present if r != MANIFEST and r not in listed and not _added_after_run(r)]
    if unlisted:
        problems.append(f"{unlisted} not in {MANIFEST}: added after the run (only {', '.join(ADDED_AFTER_RUN)} may be)")
    return problems


class ArchiveError(ValueError):
    """source.tar.gz is not an archive of the package's .py files."""


def archive_members(path: Path) -> dict[str, bytes]:
    """The .py files of source.tar.gz: {relative path without "kerneltrial/": bytes}; ArchiveError
    for anything else in it, or an unreadable archive."""
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive.getmembers():
                if member.isdir():
                    continue
                relative = member.name.removeprefix(PACKAGE_PREFIX)
                parts = PurePosixPath(relative).parts
                if (
                    not member.isfile()
                    or not member.name.startswith(PACKAGE_PREFIX)
                    or ".." in parts
                    or not relative.endswith(".py")
                ):
                    raise ArchiveError(f"member {member.name!r} is not a .py file under {PACKAGE_PREFIX}")
                if relative in members:
                    raise ArchiveError(f"member {member.name!r} appears twice")
                handle = archive.extractfile(member)
                members[relative] = handle.read() if handle else b""
    except (tarfile.TarError, OSError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise ArchiveError(f"not a readable .tar.gz ({error})") from error
    if not members:
        raise ArchiveError("it holds no .py file")
    return members


def package_digest(files: dict[str, bytes]) -> str:
    """The package digest, defined as `provenance.source_digest`: sha256 over relpath (posix,
    without "kerneltrial/") + NUL + bytes + NUL, in the order in which pathlib sorts the paths
    (component by component). Of the archive's members or of a commit's files (kernel/git_history.py)."""
    digest = hashlib.sha256()  # written out, not rundir.hashing.digest_of: verify recomputes the runner's digest
    for relative in sorted(files, key=lambda r: PurePosixPath(r).parts):
        digest.update(relative.encode() + b"\0" + files[relative] + b"\0")
    return digest.hexdigest()


def archive_source_digest(path: Path) -> str:
    """The package digest of the files in source.tar.gz."""
    return package_digest(archive_members(path))


def source_problems(run_dir: Path, provenance: dict[str, Any]) -> list[str]:
    """source.tar.gz holds the package source whose digest provenance.json `git.source_sha256` claims."""
    claimed = (provenance.get("git") or {}).get("source_sha256")
    path = run_dir / SOURCE_ARCHIVE
    if not path.is_file():
        return [f"{SOURCE_ARCHIVE} is missing: a run with timed checks archives the package source that ran"]
    try:
        digest = archive_source_digest(path)
    except ArchiveError as error:
        return [f"{SOURCE_ARCHIVE}: {error}"]
    if digest != claimed:
        return [
            (
                f"{SOURCE_ARCHIVE} digests to {digest[:12]}..., provenance.json git.source_sha256 says "
                f"{str(claimed)[:12]}...: the archived source is not the source the run recorded"
            )
        ]
    return []


def provenance_problems(provenance: dict[str, Any]) -> list[str]:
    """The fields a run with timed checks records: versions, device, source digest, start and end."""
    problems = []
    versions = provenance.get("versions") if isinstance(provenance.get("versions"), dict) else {}
    missing = [name for name in REQUIRED_VERSIONS if not versions.get(name)]
    if missing:
        problems.append(f"versions lack {missing}")
    if not isinstance(provenance.get("device"), dict) or not provenance["device"]:
        problems.append("device is missing")
    claimed = (provenance.get("git") or {}).get("source_sha256")
    if not isinstance(claimed, str) or not SHA256.fullmatch(claimed):
        problems.append(f"git.source_sha256 {claimed!r} is not a sha256 of the package source")
    problems += [
        f"{key} is missing: the run did not record it"
        for key in ("started_at", "finished_at")
        if not provenance.get(key)
    ]
    return problems


def freeze_problems(provenance: dict[str, Any], plan: dict[str, Any], protocol_sha256: str) -> list[str]:
    """The freeze record is the protocol's (or null), and plan.json `frozen_at` says the same."""
    if "freeze" not in provenance:
        return ["provenance.json has no freeze key (a record {sha256, frozen_at}, or null when not frozen)"]
    record = provenance["freeze"]
    problems = []
    if record is None:
        recorded_at = None
    elif not isinstance(record, dict) or not isinstance(record.get("frozen_at"), str):
        return [f"provenance.json freeze {record!r} is neither null nor a record {{sha256, frozen_at}}"]
    else:
        recorded_at = record["frozen_at"]
        if record.get("sha256") != protocol_sha256:
            problems.append(
                f"provenance.json freeze sha256 {str(record.get('sha256'))[:12]}... is not protocol.toml's "
                f"{protocol_sha256[:12]}...: the frozen protocol is not the one that ran"
            )
    if plan.get("frozen_at") != recorded_at:
        problems.append(
            f"plan.json frozen_at {plan.get('frozen_at')!r} != provenance.json freeze.frozen_at {recorded_at!r}"
        )
    return problems
