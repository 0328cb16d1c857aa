"""The kerneltrial package source at a commit of this checkout's git history.

A run records the commit that ran (provenance.json `git.commit`) and the digest of the package
source (`git.source_sha256`). A run directory's own files can all be edited, but the history
of the repository that publishes kerneltrial cannot be, cheaply: verify reads the package at
the recorded commit from it (kernel/provenance_checks.py compares its digest with the run's;
kernel/schema_requirements.py reads which run-directory contract that code writes). Where
this checkout has no git, or no such commit, nothing is read and the caller says why.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kerneltrial.rundir.provenance import REPO_ROOT

PACKAGE_PATH = "src/kerneltrial/"  # where the package lives in every commit of the repository
GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class CommitTree:
    """The package's .py files at `commit` ({path relative to src/kerneltrial: bytes}), or None and why not."""

    commit: str
    files: dict[str, bytes] | None
    reason: str


def _git(*args: str, stdin: bytes | None = None, repo: Path = REPO_ROOT) -> bytes | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, timeout=GIT_TIMEOUT_S)
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


def objects(names: list[str], repo: Path = REPO_ROOT) -> list[bytes | None] | None:
    """The bytes of each named object (a blob id, or `commit:path`), None for one git does not have,
    read through one `git cat-file --batch`; None when git cannot be run in `repo`."""
    out = _git("cat-file", "--batch", stdin="".join(f"{name}\n" for name in names).encode(), repo=repo)
    if out is None:
        return None
    found: list[bytes | None] = []
    at = 0
    for _ in names:  # --batch answers in the order asked: "<id> <type> <size>\n<bytes>\n" or "<name> missing\n"
        header_end = out.index(b"\n", at)
        header = out[at:header_end].split()
        if header[-1] == b"missing":
            found.append(None)
            at = header_end + 1
            continue
        size = int(header[2])
        found.append(out[header_end + 1 : header_end + 1 + size])
        at = header_end + 1 + size + 1
    return found


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
    contents = objects(list(blobs.values())) if blobs else None
    if not contents or any(data is None for data in contents):
        return CommitTree(commit, None, f"commit {commit} has no readable package source under {PACKAGE_PATH}")
    return CommitTree(commit, {path: data for path, data in zip(blobs, contents, strict=True) if data is not None}, "")


def knows(commit: str) -> bool:
    """Whether this package runs from a git checkout whose history holds `commit` (False without git,
    or in a shallow clone or a fork that lacks it)."""
    return _git("cat-file", "-e", f"{commit}^{{commit}}") is not None


def descends_from(commit: str, ancestor: str) -> bool:
    """Whether `commit` is `ancestor` or comes after it in this checkout's history (False where
    either is unknown here)."""
    return _git("merge-base", "--is-ancestor", ancestor, commit) is not None
