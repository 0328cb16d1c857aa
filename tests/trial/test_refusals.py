"""Fast, clear refusals and messages (issue 25, item 5): bad input is refused before any heavy
import and before a run directory exists; the gate's messages give the first bad index and name a
dropped eps; `check` labels its error columns and lists only the arms it was asked for."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltrial.ops.registry import Case, get_op, load_user_module
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.gate import check
from kerneltrial.trial.preflight import GATE_COPIES, Memory, preflight
from kerneltrial.trial.runner import run_trial
from tests.conftest import REPO
from tests.kt import run_cli, write_protocol

PLANTED = REPO / "tests" / "fixtures" / "planted"
PROTOCOL = """
name = "refusals"
op = "rmsnorm"
candidates = ["kerneltrial"]
{extra}
[[cases]]
shape = {shape}
"""
HUGE = [1000000000, 100000]  # the shape: 2e14 bytes of bf16
HUGE_BYTES = "200,000,000,000,000 bytes"


def test_run_refuses_bad_input_before_importing_torch(tmp_path: Path) -> None:
    """A missing file, an unknown key and a shape that cannot fit: each one `error:` line, exit 2,
    without torch, numpy or Triton imported (a fresh process: 22 s on a loaded machine before)."""
    bad_key = write_protocol(tmp_path / "p.toml", PROTOCOL, shape=[4, 64], extra="roundz = 3")
    huge = write_protocol(tmp_path / "huge.toml", PROTOCOL, shape=HUGE, extra="")
    runs = [["nope.toml"], [str(bad_key)], [str(huge)]]
    code = (
        "import sys\nfrom kerneltrial.cli import app\n"
        f"for args in {runs!r}:\n"
        "    try:\n"
        f"        app(['run', *args, '--out', {str(tmp_path / 'run')!r}])\n"
        "    except SystemExit as exc:\n"
        "        print('exit', exc.code)\n"
        "print(sorted(m for m in ('torch', 'numpy', 'scipy', 'pandas', 'triton') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.split("\n")[:4] == ["exit 2", "exit 2", "exit 2", "[]"], done.stdout + done.stderr
    errors = done.stderr.splitlines()
    assert errors[0] == "error: protocol file nope.toml does not exist"
    assert errors[1].endswith("roundz is not a protocol key; did you mean rounds?")
    assert "case 1000000000x100000/contiguous/bfloat16 cannot fit: one input of that shape is" in errors[2]
    assert HUGE_BYTES in errors[2] and errors[2].endswith("Choose a smaller shape")
    assert not (tmp_path / "run").exists()


def test_a_case_is_refused_when_the_gate_cannot_hold_its_tensors(tmp_path: Path) -> None:
    """4x64 bf16 is 512 bytes: it fits in GATE_COPIES x 512 bytes, not in one byte less."""
    path = write_protocol(tmp_path / "p.toml", PROTOCOL, shape=[4, 64], extra="")
    assert preflight(path, Memory(GATE_COPIES * 512, "test")).cases[0].shape == [4, 64]
    with pytest.raises(proto.ProtocolError, match=r"one input of that shape is 512 bytes.*10,239 bytes are test"):
        preflight(path, Memory(GATE_COPIES * 512 - 1, "test"))


def test_the_runner_refuses_a_shape_that_cannot_fit_before_the_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(proto.ProtocolError, match=HUGE_BYTES):
        run_trial(write_protocol(tmp_path / "p.toml", PROTOCOL, shape=HUGE, extra=""), out)
    assert not out.exists()


def planted(name: str):
    (impl,) = [i for i in load_user_module(str(PLANTED / f"{name}.py")) if i.op == "rmsnorm"]
    return impl


def test_a_kernel_that_drops_eps_is_named_as_the_likely_cause(device) -> None:
    result = check(get_op("rmsnorm"), planted("drops_eps"), Case((4, 64)), 0, device)
    assert not result.passed
    assert re.fullmatch(
        r"output has 64 NaN element\(s\) \(the first at index \(\d, 0\)\) in whole rows where the reference is zero"
        r" or below 8.67362e-19 \(a zero or tiny input row, where only eps keeps rsqrt finite\): likely a kernel "
        r"that drops eps from the mean square",
        result.message,
    ), result.message


def test_an_unwritten_element_is_not_blamed_on_eps_and_gives_its_index(device) -> None:
    """wrong_rmsnorm's `rmsnorm` leaves the last element of every row unwritten (NaN-poisoned)."""
    (impl,) = [i for i in load_user_module(str(REPO / "tests" / "fixtures" / "wrong_rmsnorm.py")) if i.op == "rmsnorm"]
    result = check(get_op("rmsnorm"), impl, Case((4, 64)), 0, device)
    assert result.message == (
        "output has 4 NaN element(s) (the first at index (0, 63)): "
        "unwritten, invalid, or not finished when the current stream was synchronised"
    )


def test_a_wrong_value_gives_the_first_bad_index(device) -> None:
    result = check(get_op("rmsnorm"), planted("off_at_the_end"), Case((4, 64)), 0, device)
    assert re.fullmatch(
        r"output differs from the reference: max abs [\d.]+, max rel [\d.e+]+ \(rtol 0.016, atol 1e-05\); "
        r"first at index \(3, 63\): [-\d.e]+, expected [-\d.e]+",
        result.message,
    ), result.message


def test_check_labels_its_references_and_lists_only_the_requested_arms() -> None:
    done = run_cli("check", "rmsnorm", "--impl", "torch_eager", "--shape", "4x64", "--seeds", "1")
    assert done.exit_code == 0, done.output
    for label in ("max abs (worse of formula, oracle)", "ulp (worse of formula, oracle)", "ulps from formula"):
        assert label in done.output
    assert "float64 oracle" in done.output and "skipped" not in done.output  # liger etc. were not asked for
    asked = run_cli("check", "rmsnorm", "--impl", "liger", "--shape", "4x64", "--seeds", "1")
    assert "skipped rmsnorm/liger: Liger-Kernel needs a CUDA device" in asked.output
    assert "rmsnorm/flaggems" not in asked.output
