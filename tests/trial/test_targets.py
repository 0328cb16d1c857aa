"""Target profiles: with `--target`, a Triton launch over the target's grid limit fails the arm's
check naming the kernel and the grid (issue 12, portability)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton.language as tl
from triton.compiler.compiler import CompiledKernel
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.ops.registry import Case, get_op, load_user_module
from kerneltrial.trial import gate
from kerneltrial.trial.runner import RunError, run_trial
from kerneltrial.trial.targets import GridLimitError, get_target, targeting
from tests.conftest import REPO
from tests.kt import run_cli, write_protocol

PLANTED = REPO / "tests" / "fixtures" / "planted"
ASCEND_REFUSAL = "kernel _one_program_per_item launched grid (70000,), over the ascend limit"


def check(target: str, module: str, tmp_path: Path) -> tuple[int, list[str]]:
    """`kerneltrial check --target` of a planted module on one small case: exit code, messages."""
    rows = tmp_path / f"{target}.jsonl"
    args = ["check", "rmsnorm", "--impl-module", str(PLANTED / f"{module}.py"), "--impl", f"user:{module}"]
    args += ["--shape", "1x64", "--layout", "contiguous", "--seeds", "1", "--no-peers", "--target", target]
    result = run_cli(*args, "--jsonl", str(rows))
    return result.exit_code, [json.loads(line)["message"] for line in rows.read_text().splitlines()]


def test_profiles_are_data_with_each_chips_limits():
    assert get_target("ascend").max_grid == (65535, 65535, 65535)
    assert get_target("nvidia").max_grid == (2**31 - 1, 65535, 65535)
    with pytest.raises(ValueError, match="unknown target 'tpu'; known: ascend, nvidia"):
        get_target("tpu")


def test_a_violation_names_the_kernel_the_grid_and_the_limit():
    ascend, nvidia = get_target("ascend"), get_target("nvidia")
    assert ascend.violation("k", (70000,)).startswith(
        "kernel k launched grid (70000,), over the ascend limit (x <= 65535"
    )
    assert ascend.violation("k", (65535, 65535, 65535)) == ""
    assert nvidia.violation("k", (70000,)) == ""
    assert "grid (1, 70000)" in nvidia.violation("k", (1, 70000))  # y is limited on NVIDIA too


def test_a_70000_program_grid_fails_ascend_and_passes_nvidia(tmp_path):
    """The acceptance case: the planted user kernel's callable grid, evaluated with its meta-parameters."""
    code, [message] = check("ascend", "huge_grid", tmp_path)
    assert code == 1 and message.startswith(ASCEND_REFUSAL), message
    assert check("nvidia", "huge_grid", tmp_path) == (0, [""])  # the interpreter runs all 70000 (empty) programs


def test_an_arm_that_catches_the_error_still_fails_its_check(device):
    load_user_module(str(PLANTED / "swallows_grid_error.py"))
    op = get_op("rmsnorm")
    with targeting(get_target("ascend")):
        result = gate.check(op, op.impl("user:swallows_grid_error"), Case((1, 64)), 0, device)
    assert not result.passed and result.message.startswith(ASCEND_REFUSAL)
    result = gate.check(op, op.impl("user:swallows_grid_error"), Case((1, 64)), 0, device)
    assert result.passed  # no target: nothing is checked


def test_the_hooks_are_installed_only_while_a_target_is_active():
    before = (JITFunction.run, InterpretedFunction.run, CompiledKernel.__getitem__)
    with targeting(get_target("ascend")):
        assert JITFunction.run is not before[0] and InterpretedFunction.run is not before[1]
        with pytest.raises(RuntimeError, match="already active"), targeting(get_target("nvidia")):
            pass
    assert (JITFunction.run, InterpretedFunction.run, CompiledKernel.__getitem__) == before


def _empty(PROGRAMS: tl.constexpr):
    pass


def test_compiled_launches_are_refused_before_they_compile():
    """The GPU paths (not run by the interpreter): `JITFunction.run`, and a cached compiled kernel
    launched directly (FlagGems' LibEntry); both refused before any compiler or driver call."""
    with targeting(get_target("ascend")):
        with pytest.raises(GridLimitError, match=r"kernel _empty launched grid \(70000, 1, 1\)"):
            JITFunction(_empty)[(70000, 1, 1)](PROGRAMS=70000)
        with pytest.raises(GridLimitError, match=r"kernel _empty launched grid \(1, 1, 70000\)"):
            JITFunction(_empty)[lambda meta: (1, 1, meta["PROGRAMS"])](PROGRAMS=70000)
        with pytest.raises(GridLimitError, match=r"kernel cached launched grid \(70000, 1, 1\)"):
            CompiledKernel.__getitem__(SimpleNamespace(name="cached"), (70000, 1, 1))


PROTOCOL = """
name = "target-run"
op = "rmsnorm"
control = "control"
candidates = ["user:huge_grid"]
impl_modules = ["{module}"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
[[cases]]
shape = [4, 64]
"""


@pytest.mark.slow
def test_run_records_the_target_and_gates_the_over_limit_arm(tmp_path):
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=PLANTED / "huge_grid.py")
    run = run_trial(protocol, tmp_path / "run", target=get_target("ascend"))
    plan = json.loads((run / "plan.json").read_text())
    assert plan["target"] == {"name": "ascend", "max_grid": [65535, 65535, 65535]}
    rows = [json.loads(line) for line in (run / "correctness.jsonl").read_text().splitlines()]
    [refused] = [r for r in rows if r["arm"] == "user:huge_grid"]
    assert not refused["passed"] and refused["message"].startswith(ASCEND_REFUSAL)
    assert verify_run_dir(run).ok
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["finished_at"] = None  # as if killed before the end
    (run / "provenance.json").write_text(json.dumps(provenance))
    with pytest.raises(RunError, match="started with --target ascend; resume it with the same --target"):
        run_trial(protocol, run, resume=True)
