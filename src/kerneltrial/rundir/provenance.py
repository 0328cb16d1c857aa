"""Torch-free provenance: package versions, the git state and source digest of the code that
ran, its archive, and nvidia-smi's view of the GPUs. The kernel runner adds the torch device
(trial/provenance.py); the serving runner adds the servers' versions (serving/launcher.py)."""

from __future__ import annotations

import gzip
import io
import os
import platform
import shutil
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Any

from kerneltrial.rundir.hashing import digest_of

PACKAGES = ("torch", "triton", "numpy", "kerneltrial", "liger-kernel", "flag-gems", "vllm")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # src/kerneltrial
REPO_ROOT = PACKAGE_ROOT.parents[1]  # the checkout (or the site-packages parent of an install)
SMI_TIMEOUT_S = 20
CLOCK_FIELDS = (
    "clocks.sm",
    "clocks.mem",
    "clocks.default_applications.graphics",
    "clocks.max.sm",
    "temperature.gpu",
    "power.draw",
)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_state(repo: Path = REPO_ROOT, source: list[tuple[str, bytes]] | None = None) -> dict[str, Any]:
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


def source_files(root: Path = PACKAGE_ROOT) -> list[tuple[str, bytes]]:
    """The kerneltrial package's .py files on disk: (relative posix path, bytes), sorted."""
    return [(path.relative_to(root).as_posix(), path.read_bytes()) for path in sorted(root.rglob("*.py"))]


def source_digest(root: Path = PACKAGE_ROOT) -> str:
    """sha256 over the kerneltrial package's .py files on disk (relative path and bytes, in
    sorted order): the code that ran. A checkout of the declared commit gives the same hash
    unless .py files git does not track were added to the package."""
    return digest_of(source_files(root))


def write_source_archive(path: Path, files: list[tuple[str, bytes]]) -> None:
    """The package source that runs, as `kerneltrial/<relative path>` members of a gzip tar
    (sorted, mtime 0): anyone can read the code behind a run, and verify recomputes
    `source_digest` from it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files:
            info = tarfile.TarInfo(f"kerneltrial/{name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))


def visible_gpu() -> str | None:
    """The first entry of CUDA_VISIBLE_DEVICES (an index or a UUID: the GPU torch calls cuda:0),
    or None when it is not set. nvidia-smi and NVML ignore that variable and number every GPU
    of the machine, so a process given GPU 1 (a Ray task) would read GPU 0's clocks without it."""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    return entries[0] if entries else None


def nvidia_smi(fields: tuple[str, ...], units: bool = False, gpu: str | None = None) -> list[dict[str, str]] | None:
    """One {field: value} per GPU as nvidia-smi reports them (`units`: values keep their unit,
    "81559 MiB"), or None where there is no nvidia-smi or it fails. `gpu` (an index or UUID):
    that GPU only."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    fmt = "csv,noheader" if units else "csv,noheader,nounits"
    only = ["-i", gpu] if gpu else []
    try:
        done = subprocess.run(
            [exe, *only, f"--query-gpu={','.join(fields)}", f"--format={fmt}"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not rows:
        return None
    return [dict(zip(fields, (value.strip() for value in line.split(",")), strict=False)) for line in rows]


def clocks() -> dict[str, str] | None:
    """The clocks of the GPU this process uses (`visible_gpu`, else the first) as nvidia-smi sees
    them now (SM and memory, current and default), its temperature and power draw."""
    gpus = nvidia_smi(CLOCK_FIELDS, gpu=visible_gpu())
    return gpus[0] if gpus else None
