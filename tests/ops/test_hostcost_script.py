"""scripts/device/hostcost.py runs end to end on the CPU interpreter (--smoke)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltrial.ops.registry import all_ops

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device" / "hostcost.py"


@pytest.mark.slow
def test_smoke_run_measures_every_operator_and_writes_out(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OUT": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("\n\n")[-1]
    assert table.startswith("floor: triton launch ")
    assert "compiled launcher n/a" in table  # the interpreter compiles nothing
    records = json.loads((tmp_path / "hostcost.json").read_text())
    ops = {op.name for op in all_ops()}
    for arm in ("kerneltrial", "kerneltrial_jit", "torch_eager"):
        measured = {r["op"] for r in records if r["arm"] == arm and r["us_per_call"] is not None}
        assert measured == ops, arm
    assert all(len(r["samples_us"]) == 2 for r in records if r["us_per_call"] is not None)
    assert (tmp_path / "hostcost.txt").read_text().rstrip().endswith(table.rstrip().split("\n")[-1])
