"""The CLI surface: every command has --help; `ops` lists the eight operators and the peers here."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from kerneltrial.cli.support import CliError, swept_shapes
from tests.kt import run_cli

EIGHT = [
    "rmsnorm",
    "rmsnorm_fp32",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "zimage_qk_rmsnorm",
    "silu_and_mul",
    "sigmoid_gate_mul",
    "softcap_row_argmax",
]


def test_ops_lists_the_eight_operators_and_peer_availability():
    result = run_cli("ops")
    assert result.exit_code == 0, result.output
    for name in EIGHT:
        assert f"{name}(" in result.output
    assert "torch_eager (peer)" in result.output
    assert "-> int64 Tensor [rows]" in result.output  # a signature's brackets are text, not Rich markup
    assert "liger (Liger-Kernel needs a CUDA device" in result.output  # skipped with its reason


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["ops"],
        ["check"],
        ["run"],
        ["demo"],
        ["calibrate"],
        ["verify"],
        ["report"],
        ["compare"],
        ["performance"],
        ["protocol", "new"],
        ["protocol", "freeze"],
        ["protocol", "confirm"],
        ["dispatch", "derive"],
        ["replicate"],
        ["package"],
        ["inspect"],
        ["serve", "bench"],
        ["serve", "trial"],
        ["serve", "accuracy"],
        ["serve", "launch"],
    ],
)
def test_every_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_the_cli_imports_neither_torch_nor_plotting_nor_pandas():
    """`kerneltrial --help` and usage errors print before any heavy import (issue 11: ~2.5 s before)."""
    import subprocess
    import sys

    heavy = ("torch", "matplotlib", "pandas", "triton", "numpy", "httpx")  # numpy, httpx: the serving stack
    code = f"import sys, kerneltrial.cli; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_version():
    result = run_cli("--version")
    assert result.exit_code == 0 and result.output.startswith("kerneltrial ")


MISSPELT = Path(__file__).parent / "fixtures" / "planted" / "package" / "misspelt_entry.py"


@pytest.mark.parametrize(
    "args",
    [
        ["check", "rmsnorm", "--impl-module", str(MISSPELT), "--no-peers"],
        ["protocol", "new", "rmsnorm", "--impl-module", str(MISSPELT), "--candidate", "control", "--out", "p.toml"],
    ],
    ids=["check", "protocol-new"],
)
def test_an_impl_module_without_the_operator_s_function_is_bad_input(args, tmp_path, monkeypatch):
    """The planted misspelt entry point (rms_norm) once read as success: `check` ran only the
    built-in arms and exited 0. Now exit 2, naming the functions the module does define."""
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert (
        f"error: {MISSPELT} defines no function rmsnorm (its functions: rms_norm, silu_and_mul); "
        "name the entry point rmsnorm" in " ".join(result.output.split())
    )
    assert not (tmp_path / "p.toml").exists()


def test_axes_sweep_the_shape_templates() -> None:
    assert swept_shapes(["Rx2048"], ["R=1,64"]) == [(1, 2048), (64, 2048)]
    assert swept_shapes(["RxW", "8x8"], ["R=1,2", "W=64,128"]) == [(1, 64), (1, 128), (2, 64), (2, 128), (8, 8)]
    assert swept_shapes(["4x64"], []) == [(4, 64)]
    for templates, axes, said in (
        (["RxW"], ["R=1"], "--shape names w, which no --axis gives"),
        (["Rx64"], [], "malformed shape 'Rx64'"),
        (["4x64"], ["R=1"], "--axis R appears in no --shape"),
        (["Rx64"], ["R=1", "R=2"], "--axis R is given twice"),
        (["Rx64"], ["R"], "malformed --axis 'R'"),
        (["Rx64"], ["R=0"], "every dimension must be a positive integer"),
    ):
        with pytest.raises(CliError, match=re.escape(said)):
            swept_shapes(templates, axes)


def test_check_and_protocol_new_take_an_axis(tmp_path: Path) -> None:
    argv = ["check", "rmsnorm", "--shape", "Rx64", "--axis", "R=1,3", "--impl", "control", "--seeds", "1"]
    done = run_cli(*argv, "--layout", "contiguous", "--json")
    assert done.exit_code == 0, done.output
    assert sorted(c["case"] for c in json.loads(done.stdout)["checks"]) == [
        "1x64/contiguous/bfloat16",
        "3x64/contiguous/bfloat16",
    ]
    out = tmp_path / "p.toml"
    done = run_cli(
        "protocol",
        "new",
        "rmsnorm",
        "--out",
        str(out),
        "--candidate",
        "packed_r4_w4",
        "--shape",
        "Rx64",
        "--axis",
        "R=1,3",
    )
    assert done.exit_code == 0, done.output
    assert [c["shape"] for c in tomllib.loads(out.read_text())["cases"]] == [[1, 64], [3, 64]]
    refused = run_cli("check", "rmsnorm", "--axis", "R=1,3")
    assert refused.exit_code == 2 and "--axis sweeps a --shape template" in refused.output
