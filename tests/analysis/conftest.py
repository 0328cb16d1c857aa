"""Fixtures for the analysis tests; the run-directory writer lives in rundir_factory.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from rundir_factory import write_run_dir

from kerneltrial.analysis.summary import write_summary


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A default synthetic run directory (see rundir_factory.py) with summary.json written."""
    path = write_run_dir(tmp_path / "run")
    write_summary(path)
    return path
