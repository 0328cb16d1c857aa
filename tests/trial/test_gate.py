"""The correctness gate catches wrong kernels and names the defect; bad input gets one-line errors."""

from __future__ import annotations

import pytest

from kerneltrial.ops.registry import Case, Impl, RegistryError, get_op, load_user_module
from kerneltrial.trial.gate import check
from tests.conftest import REPO
from tests.kt import run_cli

FIXTURES = REPO / "tests" / "fixtures"
CASE = Case((3, 200))


def wrong_impl(name: str) -> Impl:
    import importlib.util

    spec = importlib.util.spec_from_file_location("wrong_rmsnorm_fixture", FIXTURES / "wrong_rmsnorm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name)
    return Impl(op="rmsnorm", name=name, kind="user", loader=lambda: fn)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("rmsnorm", "NaN element"),  # skips the last element: the poisoned value shows through
        ("wrong_rounding", "differs from the reference"),
        ("mutates_input", "modified its input(s) x"),
        ("returns_nan", "NaN element"),
        ("wrong_shape", "has shape"),
    ],
)
def test_gate_catches_wrong_kernel(name, expected, device):
    result = check(get_op("rmsnorm"), wrong_impl(name), CASE, seed=0, device=device)
    assert not result.passed
    assert expected in result.message


def test_gate_passes_correct_user_module(device):
    impls = load_user_module(str(FIXTURES / "good_rmsnorm.py"))
    assert [i.name for i in impls] == ["user:good_rmsnorm"]
    result = check(get_op("rmsnorm"), impls[0], CASE, seed=1, device=device)
    assert result.passed, result.message
    assert result.max_rel < 0.016


def test_inplace_outputs_checked_as_outputs(device):
    """An in-place op that writes only x but not residual is caught."""
    op = get_op("fused_add_rmsnorm")

    def forgets_residual(x, residual, weight, eps=1e-6):
        new_x, _ = op.reference(x, residual, weight, eps)
        x.copy_(new_x)

    impl = Impl(op=op.name, name="forgets_residual", kind="user", loader=lambda: forgets_residual)
    result = check(op, impl, Case((4, 64)), seed=0, device=device)
    assert not result.passed
    assert "output 1" in result.message


def test_bad_user_module_errors():
    with pytest.raises(RegistryError, match="failed to import"):
        load_user_module(str(FIXTURES / "broken_import.py"))
    with pytest.raises(RegistryError, match="does not exist"):
        load_user_module("no/such/file.py")


@pytest.mark.parametrize(
    "args,message",
    [
        (["check", "nosuchop"], "unknown operator 'nosuchop'"),
        (["check", "rmsnorm", "--impl", "nosuch"], "unknown implementation 'nosuch'"),
        (["check", "rmsnorm", "--shape", "4096xabc"], "malformed shape '4096xabc'"),
        (["check", "rmsnorm", "--impl-module", str(FIXTURES / "broken_import.py")], "failed to import"),
        (["check"], "name one operator or pass --all"),
    ],
)
def test_cli_bad_input_one_line(args, message):
    result = run_cli(*args)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert message in text
    assert "Traceback" not in result.output


def test_cli_check_fails_on_wrong_user_kernel():
    result = run_cli(
        "check",
        "rmsnorm",
        "--impl-module",
        str(FIXTURES / "wrong_rmsnorm.py"),
        "--impl",
        "user:wrong_rmsnorm",
        "--impl",
        "control",
        "--shape",
        "2x100",
        "--seeds",
        "1",
    )
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "pass" in result.output
