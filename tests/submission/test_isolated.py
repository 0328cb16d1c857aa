"""The isolated interface check (issue 24, item 3): the archive runs where no kerneltrial module is
importable, and the harness judges its outputs with the gate's rules."""

from __future__ import annotations

import importlib.util
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from kerneltrial.ops.registry import Case, Impl, RegistryError, get_op, load_user_module
from kerneltrial.submission.archive import build
from kerneltrial.submission.isolated import (
    Remote,
    Reply,
    WorkerEnded,
    interface_check,
    path_without_kerneltrial,
    started,
)
from kerneltrial.trial import gate, guard
from kerneltrial.trial.targets import get_target
from tests.conftest import REPO

PLANTED = REPO / "tests" / "fixtures" / "planted"
PACKAGE = PLANTED / "package"
CPU = torch.device("cpu")
CASE = Case((4, 64))


def unpacked(tmp_path: Path, module: Path) -> Path:
    """The scratch folder `started` expects: the module unpacked under archive/."""
    (tmp_path / "archive").mkdir()
    shutil.copy(module, tmp_path / "archive" / module.name)
    return tmp_path


def test_the_worker_sees_no_kerneltrial_with_both_shims_loaded(tmp_path, monkeypatch):
    """The planted module's import fails naming what it finds if any kerneltrial module is
    loaded or importable, a loaded module's file lies in kerneltrial's package, or a KERNELTRIAL*
    variable is set. In the worker (a target given, so the launch hook and the interpreter's
    rounding fix are both loaded before the import), with the repository on PYTHONPATH and a
    KERNELTRIAL variable set, it imports; in kerneltrial's process it does not."""
    module = PACKAGE / "looks_for_the_harness.py"
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # its src/ holds the package: `import src.kerneltrial`
    monkeypatch.setenv("KERNELTRIAL_VLLM", "/opt/vllm/bin/python")
    with started(unpacked(tmp_path, module), module.stem, "rmsnorm", get_target("ascend"), 300) as worker:
        hello = worker.hello()
    assert hello.error == "" and "rmsnorm" in hello.callables, hello
    with pytest.raises(RegistryError, match="the module sees kerneltrial: kerneltrial"):
        load_user_module(str(module))


def test_the_worker_path_holds_no_kerneltrial(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    path = path_without_kerneltrial(tmp_path, tmp_path)
    assert str(REPO / "src") not in path
    assert path and all(not (Path(entry) / "kerneltrial").exists() for entry in path)
    assert importlib.util.find_spec("kerneltrial") is not None  # while this process has it


def test_the_planted_kerneltrial_sniffer_passes_in_process_and_fails_isolated():
    """The hole: correct only while a kerneltrial module is in sys.modules, so the gate in
    kerneltrial's own process passes it; the isolated check, as the target imports it, does not."""
    operator = get_op("rmsnorm")
    (impl,) = [i for i in load_user_module(str(PACKAGE / "sniffs_kerneltrial.py")) if i.op == "rmsnorm"]
    assert gate.check(operator, impl, CASE, 0, CPU).passed
    source = (PACKAGE / "sniffs_kerneltrial.py").read_bytes()
    result = interface_check(build({"sniffs_kerneltrial.py": source}), "rmsnorm", None, 300)
    assert not result.passed and result.reason.startswith(
        "gate: 1x64/contiguous/bfloat16 seed 0: output differs from the reference: max abs"
    ), result


@pytest.mark.slow
def test_a_worker_that_exits_ends_the_check_naming_its_exit_status(tmp_path):
    module = tmp_path / "exits.py"
    module.write_text("import os\n\n\ndef rmsnorm(x, weight, eps=1e-6):\n    os._exit(3)\n")
    with pytest.raises(WorkerEnded, match=r"^crashed: the worker exited \(exit 3\)"):
        interface_check(build({"exits.py": module.read_bytes()}), "rmsnorm", None, 300)


@pytest.mark.slow
def test_a_worker_that_never_returns_ends_the_check_at_its_timeout():
    source = (PLANTED / "never_returns.py").read_bytes()
    with pytest.raises(WorkerEnded, match=r"^did not finish within 10 s \(a kernel that never returns\?\)"):
        interface_check(build({"never_returns.py": source}), "rmsnorm", None, 10)


class InProcess:
    """A stand-in for the worker: the same torch.save round trips, the call made here."""

    ended = ""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.previous: Any = None

    @staticmethod
    def _crossed(value: Any) -> Any:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)

    def call(self, args: list[Any]) -> Reply:
        args = self._crossed({"args": args})["args"]
        returned = self.fn(*args)
        tensors = [returned] if isinstance(returned, torch.Tensor) else list(returned or [])
        addresses = [t.untyped_storage().data_ptr() for t in tensors]
        self.previous = returned  # as the worker: alive while the caller holds its copy
        returned, args = self._crossed((returned, args))  # one save: shared storages stay shared
        return Reply(returned, type(returned).__name__, addresses, args, "", "")


def remote_check(op: str, fn: Any, case: Case = CASE) -> gate.CheckResult:
    impl = Impl(op=op, name="submission:m", kind="user", loader=lambda: Remote(InProcess(fn)))  # type: ignore[arg-type]
    return gate.check(get_op(op), impl, case, 0, CPU)


def test_remote_passes_a_correct_arm_and_carries_the_gate_rules_across():
    """Through the round trip a correct arm passes; a persistent output buffer, a write past an
    in-place output and a wrong result fail with the gate's own messages."""
    good = load_user_module(str(REPO / "tests" / "fixtures" / "good_rmsnorm.py"))[0].resolve()
    assert remote_check("rmsnorm", good).passed
    persistent = load_user_module(str(PLANTED / "persistent_buffer.py"))[0].resolve()
    assert "returns a persistent buffer" in remote_check("rmsnorm", persistent).message
    writes_past = load_user_module(str(PLANTED / "writes_past_residual.py"))[0].resolve()
    assert "wrote outside its output" in remote_check("fused_add_rmsnorm", writes_past, Case((4, 64))).message
    assert "differs from the reference" in remote_check("rmsnorm", lambda x, w, eps: x * w).message


def test_remote_maps_an_output_in_an_input_storage_onto_the_harness_buffer():
    """An output that is a view of an input comes back as a view of the harness's own buffer,
    so the gate's aliasing check sees it; the worker's writes into inputs land in the harness's."""
    values = get_op("rmsnorm").make_inputs(CASE, 0, CPU)
    guarded = guard.guard(values)
    x, weight, eps = guarded.inputs.values()

    def scribbles(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x[0, 0] = 7.0
        return x[1]

    out = Remote(InProcess(scribbles))(x, weight, eps)  # type: ignore[arg-type]
    assert gate.shares_storage(out, x) and float(x[0, 0]) == 7.0
    assert "modified its input(s) x" in guard.problems(get_op("rmsnorm"), guarded, values)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ({"raised": "ValueError: boom"}, "^boom$"),
        ({"raised": "CompilationError: at 1:2"}, "^CompilationError: at 1:2$"),
        ({"launch": "kernel k launched grid (70000,), over the ascend limit"}, "over the ascend limit"),
        ({"returned": None, "returned_type": "Widget"}, "returned Widget; expected a tensor"),
    ],
)
def test_remote_raises_what_the_worker_reports(reply, error):
    class Reporting:
        ended = ""

        def call(self, args: list[Any]) -> Reply:
            base = {"returned": None, "returned_type": "NoneType", "addresses": [], "args": args}
            return Reply(**(base | {"raised": "", "launch": ""} | reply))

    with pytest.raises(Exception, match=error):
        Remote(Reporting())(torch.zeros(2), torch.zeros(2), 1e-6)  # type: ignore[arg-type]
