"""The kerneltrial package source at a commit of this checkout's git history.

A run records the commit that ran (provenance.json `git.commit`) and the digest of the package
source (`git.source_sha256`). A run directory's own files can all be edited, but the history
of the repository that publishes kerneltrial cannot be, cheaply: verify reads the package at
the recorded commit from it (analysis/provenance_checks.py compares its digest with the run's;
analysis/schema_requirements.py reads which run-directory contract that code writes). Where
this checkout has no git, or no such commit, nothing is read and the caller says why.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass

from kerneltrial.rundir.provenance import REPO_ROOT

PACKAGE_PATH = "src/kerneltrial/"  # where the package lives in every commit of the repository
GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class CommitTree:
    """The package's .py files at `commit` ({path relative to src/kerneltrial: bytes}), or None and why not."""

    commit: str
    files: dict[str, bytes] | None
    reason: str


def _git(*args: str, stdin: bytes | None = None) -> bytes | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], input=stdin, capture_output=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _blobs(listing: bytes) -> dict[str, str]:
    """`git ls-tree -r -z` output -> {path relative to the package: blob id} of its regular .py files."""
    found = {}
    for entry in filter(None, listing.split(b"\0")):
        meta, _, path = entry.decode().partition("\t")
        mode, kind, blob = meta.split()
        if kind == "blob" and mode.startswith("100") and path.startswith(PACKAGE_PATH) and path.endswith(".py"):
            found[path.removeprefix(PACKAGE_PATH)] = blob
    return found


def _contents(blobs: dict[str, str]) -> dict[str, bytes] | None:
    """Every blob's bytes, read through one `git cat-file --batch`."""
    out = _git("cat-file", "--batch", stdin="".join(f"{b}\n" for b in blobs.values()).encode())
    if out is None:
        return None
    files, at = {}, 0
    for path in blobs:  # --batch answers in the order asked: "<id> blob <size>\n<bytes>\n"
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        files[path] = out[header_end + 1 : header_end + 1 + size]
        at = header_end + 1 + size + 1
    return files


@functools.lru_cache(maxsize=64)
def package_at(commit: str) -> CommitTree:
    """The package at `commit` (any name git resolves); read once per commit and process."""
    if _git("rev-parse", "--git-dir") is None:
        return CommitTree(commit, None, f"{REPO_ROOT} is not a git checkout (or git is not installed)")
    full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if full is None:
        return CommitTree(commit, None, f"commit {commit} is not in the history of this checkout ({REPO_ROOT})")
    sha = full.decode().strip()
    listing = _git("ls-tree", "-r", "-z", sha, "--", PACKAGE_PATH)
    blobs = _blobs(listing) if listing is not None else {}
    files = _contents(blobs) if blobs else None
    if not files:
        return CommitTree(commit, None, f"commit {commit} has no package source under {PACKAGE_PATH}")
    return CommitTree(commit, files, "")
