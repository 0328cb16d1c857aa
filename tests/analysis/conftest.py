"""Fixtures for the analysis tests; the run-directory writer lives in rundir_factory.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from rundir_factory import write_run_dir

from kerneltrial.kernel.summary import write_summary
from tests.kt import write_protocol


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A default synthetic run directory (see rundir_factory.py) with summary.json written."""
    path = write_run_dir(tmp_path / "run")
    write_summary(path)
    return path


CPU_PROTOCOL = """
name = "publication-cpu"
op = "rmsnorm"
control = "control"
candidates = ["packed_r4_w4"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
[[cases]]
shape = [4, 64]
"""


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, finished and verified run of the current contract (checks 3, host stage), on the CPU:
    one rmsnorm case, the control and one candidate, one seed, two rounds. Built once per session
    (about 20 s under the Triton interpreter); tests tamper with copies of it (`copy_of`)."""
    from kerneltrial.trial.runner import run_trial

    root = tmp_path_factory.mktemp("cpu_run")
    protocol = write_protocol(root / "p.toml", CPU_PROTOCOL)
    return run_trial(protocol, root / "run")


@pytest.fixture
def copy_of(cpu_run: Path, tmp_path: Path) -> Callable[[str], Path]:
    """A fresh copy of the session's CPU run under this test's tmp_path, named `name`."""
    import shutil

    return lambda name: Path(shutil.copytree(cpu_run, tmp_path / name))
