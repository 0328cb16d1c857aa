"""Provenance: what ran, where, with which versions, started and finished when."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "triton", "numpy", "kerneltrial", "liger-kernel", "flag-gems", "vllm")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_state(repo: Path, source: list[tuple[str, bytes]] | None = None) -> dict[str, Any]:
    """The commit that ran. A sender that ships a copy of the tree to another machine names
    its commit in KERNELTRIAL_SOURCE_COMMIT, and that declaration wins: the copy may carry a
    stale .git (one GPU service copies the working tree with the .git of an earlier commit,
    so git there reported that commit, "dirty"). What git reports is kept beside it
    (`git_head`, `git_dirty`), and `source_sha256` (see `source_digest`) lets anyone check
    the declaration against a checkout of the named commit."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if head else None
    dirty = bool(status) if status is not None else None
    state: dict[str, Any] = {
        "commit": head,
        "dirty": dirty,
        "source_sha256": digest_of(source) if source is not None else source_digest(),
    }
    declared = os.environ.get("KERNELTRIAL_SOURCE_COMMIT")
    if declared:
        state.update(commit=declared, dirty=None, source="KERNELTRIAL_SOURCE_COMMIT", git_head=head, git_dirty=dirty)
    return state


def source_files(root: Path | None = None) -> list[tuple[str, bytes]]:
    """The kerneltrial package's .py files on disk: (relative posix path, bytes), sorted."""
    root = root or Path(__file__).resolve().parents[1]
    return [(path.relative_to(root).as_posix(), path.read_bytes()) for path in sorted(root.rglob("*.py"))]


def digest_of(files: list[tuple[str, bytes]]) -> str:
    """sha256 over (relative path, bytes) pairs in the given order (see `source_digest`)."""
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def source_digest(root: Path | None = None) -> str:
    """sha256 over the kerneltrial package's .py files on disk (relative path and bytes, in
    sorted order): the code that ran. A checkout of the declared commit gives the same hash
    unless .py files git does not track were added to the package."""
    return digest_of(source_files(root))


def write_source_archive(path: Path, files: list[tuple[str, bytes]]) -> None:
    """The package source that runs, as `kerneltrial/<relative path>` members of a gzip tar
    (sorted, mtime 0): anyone can read the code behind a run, and verify recomputes
    `source_digest` from it."""
    import gzip
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files:
            info = tarfile.TarInfo(f"kerneltrial/{name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))


def nvidia_smi(*fields: str) -> dict[str, str] | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return dict(zip(fields, (v.strip() for v in done.stdout.splitlines()[0].split(",")), strict=False))


def clocks() -> dict[str, str] | None:
    """Clocks as nvidia-smi sees them now (SM and memory, current and default)."""
    return nvidia_smi(
        "clocks.sm",
        "clocks.mem",
        "clocks.default_applications.graphics",
        "clocks.max.sm",
        "temperature.gpu",
        "power.draw",
    )


def device_info() -> dict[str, Any]:
    import torch  # here, not at the top: the CLI and serving import this module without torch

    if not torch.cuda.is_available():
        return {"gpu": None, "cpu": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(0)
    smi = nvidia_smi("driver_version", "name")
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "memory_bytes": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
        "cuda": torch.version.cuda,
        "driver": smi.get("driver_version") if smi else None,
    }


def collect(
    repo: Path, protocol_sha256: str, kind: str = "kernel", source: list[tuple[str, bytes]] | None = None
) -> dict[str, Any]:
    """Provenance at the start of a run; `source` (see `source_files`) is the code whose
    digest is recorded, read once by a caller that also archives it."""
    from kerneltrial.ops.launch import interpreted

    return {
        "kind": kind,
        "protocol_sha256": protocol_sha256,
        "versions": versions(),
        "device": device_info(),
        "triton_interpreter": interpreted(),
        "clocks_at_start": clocks(),
        "hostname": socket.gethostname(),
        "git": git_state(repo, source),
        "argv": sys.argv,
        "started_at": now(),
        "finished_at": None,
    }
