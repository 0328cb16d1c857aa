"""scripts/device/setup.sh refuses a copy of the package that is not the sender's code (the digest
scripts/device/sendable.sh prints), before it installs or runs anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kerneltrial.rundir.provenance import source_digest
from tests.conftest import REPO


def setup_in(copy: Path, digest: str, commit: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELTRIAL_SOURCE_DIGEST": digest, "KERNELTRIAL_SOURCE_COMMIT": commit}
    script = ". scripts/device/setup.sh > /dev/null; echo rc=$?"
    return subprocess.run(["bash", "-c", script], cwd=copy, env=env, capture_output=True, text=True, timeout=120)


def test_a_copy_edited_after_the_senders_digest_is_refused(tmp_path: Path):
    shutil.copytree(
        REPO / "src" / "kerneltrial", tmp_path / "src" / "kerneltrial", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(REPO / "scripts" / "device", tmp_path / "scripts" / "device")
    sender = source_digest(tmp_path / "src" / "kerneltrial")
    done = setup_in(tmp_path, sender)
    assert "refusing: src/kerneltrial here digests" not in done.stderr
    edited = tmp_path / "src" / "kerneltrial" / "stats.py"
    edited.write_text(edited.read_text() + "\n# an edit made after sendable.sh ran\n")
    done = setup_in(tmp_path, sender)
    assert f"refusing: src/kerneltrial here digests to {source_digest(tmp_path / 'src' / 'kerneltrial')}" in done.stderr
    assert "rc=1" in done.stdout


def test_a_commit_without_its_digest_is_refused(tmp_path: Path):
    shutil.copytree(REPO / "scripts" / "device", tmp_path / "scripts" / "device")
    done = setup_in(tmp_path, "", commit="0" * 40)
    assert "refusing: KERNELTRIAL_SOURCE_COMMIT without KERNELTRIAL_SOURCE_DIGEST" in done.stderr
    assert "rc=1" in done.stdout
