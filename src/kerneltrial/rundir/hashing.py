"""sha256 helpers: of bytes, of a file, and of a list of (relative path, bytes) pairs."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(Path(path).read_bytes())


def digest_of(files: list[tuple[str, bytes]]) -> str:
    """sha256 over (relative path, bytes) pairs in the given order: relpath (utf-8) + NUL +
    bytes + NUL per file (the package source digest, docs/RUNDIR.md, `source.tar.gz`)."""
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
