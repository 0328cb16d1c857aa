"""A trial whose inputs are wrong stops before it writes or launches anything (issue 14): a
missing MATH-500 file used to surface after the first launch's whole throughput phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltrial.serving.accuracy import AccuracyError
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.trial import run_protocol
from tests.conftest import REPO


def protocol_text(marker: Path, data: str) -> str:
    """Two arms whose 'server' only leaves `marker` behind: it exists if anything was launched."""
    argv = json.dumps([sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    arms = "".join(
        f'[[arms]]\nname = "{n}"\nrole = "{r}"\nargv = {argv}\n' for n, r in (("a", "baseline"), ("b", "candidate"))
    )
    return (
        'name = "fail-early"\n[server]\nmodel_id = "tiny"\nport = 8765\n[bench]\ncases = [[8, 4, 1, 2]]\n'
        f'[accuracy]\ndata = "{data}"\n{arms}'
    )


def test_a_missing_accuracy_file_stops_the_trial_before_anything_runs(tmp_path: Path) -> None:
    marker, out = tmp_path / "launched", tmp_path / "run"
    text = protocol_text(marker, str(tmp_path / "no-such-math500.jsonl"))
    with pytest.raises(AccuracyError, match="no-such-math500.jsonl not found"):
        run_protocol(parse_protocol(text), text.encode(), out, sys.executable, argv=["test"])
    assert not out.exists() and not marker.exists()


def test_the_cli_refuses_it_with_exit_2_and_one_line(tmp_path: Path) -> None:
    marker, out = tmp_path / "launched", tmp_path / "run"
    protocol = tmp_path / "p.toml"
    protocol.write_text(protocol_text(marker, "no-such-math500.jsonl"))  # relative: the protocol's folder
    result = subprocess.run(
        [sys.executable, "-m", "kerneltrial.cli", "serve", "trial", str(protocol), "--out", str(out), "--quiet"]
        + ["--vllm", sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: MATH-500 file") and "no-such-math500.jsonl not found" in line
    assert not out.exists() and not marker.exists()
