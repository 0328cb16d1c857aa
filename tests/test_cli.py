"""The CLI surface: every command has --help; `ops` lists the eight operators and the peers here."""

from __future__ import annotations

from pathlib import Path

import pytest

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
