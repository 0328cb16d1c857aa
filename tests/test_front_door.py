"""The front door as a new user meets it (issue 11): `protocol new` without a GPU writes the
small CPU panel and says so; `run` names the arms it cannot time before any timing; `demo`
can be run again and never overwrites an earlier run."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kerneltrial.ops.registry import get_op
from kerneltrial.trial.cli import fresh_run_dir
from tests.conftest import REPO

PROTOCOL = """
name = "front-door"
op = "rmsnorm"
control = "control"
candidates = ["packed_r4_w4", "torch_compile"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
[[cases]]
shape = [4, 64]
"""


def kerneltrial(*args: str, cwd: Path = REPO, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kerneltrial.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def test_fresh_run_dir_never_reuses_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    assert fresh_run_dir(out) == out / "run" and out.is_dir()
    (out / "run").mkdir()
    assert fresh_run_dir(out) == out / "run-2"
    (out / "run-2").mkdir()
    (out / "run-3").write_text("a file is taken too")
    assert fresh_run_dir(out) == out / "run-4"


def test_protocol_new_without_a_gpu_writes_the_cpu_panel_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "p.toml"
    result = kerneltrial("protocol", "new", "rmsnorm", "--out", str(out), "--candidate", "packed_r4_w4")
    assert result.returncode == 0, result.stderr
    assert "No GPU visible: writing the operator's small CPU panel" in result.stderr
    shapes = [tuple(c["shape"]) for c in tomllib.loads(out.read_text())["cases"]]
    small = {c.shape for c in get_op("rmsnorm").small_cases}
    assert shapes and set(shapes) <= small, shapes


@pytest.mark.slow
def test_run_names_unavailable_arms_before_timing(tmp_path: Path) -> None:
    protocol = tmp_path / "p.toml"
    protocol.write_text(PROTOCOL)
    result = kerneltrial("run", str(protocol), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    said = "arm torch_compile is unavailable here and will not be timed: torch.compile peers run on a GPU"
    progress = result.stderr.splitlines()  # piped: a line per step (correctness: i/n, timing: i/n)
    first = next(i for i, line in enumerate(progress) if said in line)
    assert first < min(i for i, line in enumerate(progress) if line.startswith(("correctness:", "timing:")))


@pytest.mark.slow
def test_demo_again_writes_a_fresh_run_directory(tmp_path: Path) -> None:
    """The README's first set-up command, run a second time: the earlier run stays as it was."""
    out = tmp_path / "demo"
    earlier = out / "run"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text('{"earlier": true}')
    result = kerneltrial("demo", "--out", str(out), timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (earlier / "summary.json").read_text() == '{"earlier": true}'
    assert (out / "run-2" / "summary.json").is_file() and (out / "run-2" / "report.md").is_file()
    assert "NOT GPU performance" in result.stdout
