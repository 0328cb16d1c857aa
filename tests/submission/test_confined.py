"""The package interface check's workers run in the trial's sandbox (issue 35, item 1;
trial/confine.py, from neutral copies: submission/confined.py): a module that reaches for the
harness at import is contained, a worker whose sandbox was not applied is stopped before it
imports anything, and a piece the host lacks is said in package's output and in the receipt."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kerneltrial.submission import confined
from kerneltrial.submission.isolated import Prepared, WorkerEnded, started
from kerneltrial.submission.receipt import Receipt
from kerneltrial.submission.target_env import FIRST
from kerneltrial.trial import confine
from tests.conftest import REPO
from tests.kt import run_cli

PACKAGE = REPO / "tests" / "fixtures" / "planted" / "package"
GOOD = REPO / "tests" / "fixtures" / "good_rmsnorm.py"
HOST = confine.host()
ATTACKS = (
    "create a file in the harness's folder",
    "create a file in the scratch folder",
    "signal the harness",
    "open the harness's memory",
)
needs = pytest.mark.skipif(
    set(HOST.allowed) != set(confine.PIECES), reason=f"this host lacks sandbox pieces: {HOST.missing}"
)
NONE = confine.HostSandbox((), dict.fromkeys(confine.PIECES, "left out by the test"), None)
PARTIAL = confine.HostSandbox(
    tuple(p for p in confine.PIECES if p != "seccomp"), {"seccomp": "left out by the test"}, HOST.cgroup_root
)


def hello_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sandbox: confine.HostSandbox) -> str:
    """What the planted reaches_the_harness's import says in a worker of `sandbox`."""
    harness = tmp_path / "out"
    harness.mkdir()
    harness.chmod(0o755)  # as package's --out folder is: the harness's, readable by all
    monkeypatch.setenv("KT_PLANTED_HARNESS_PID", str(os.getpid()))
    monkeypatch.setenv("KT_PLANTED_HARNESS_DIR", str(harness))
    monkeypatch.setattr(confine, "host", lambda cuda=False: sandbox)
    scratch = tmp_path / "scratch"
    (scratch / "archive").mkdir(parents=True)
    shutil.copy(PACKAGE / "reaches_the_harness.py", scratch / "archive")
    with started(Prepared.make(scratch), FIRST, "reaches_the_harness", "rmsnorm", None, 120) as worker:
        return worker.hello().error


@needs
def test_a_module_cannot_write_the_harness_s_folders_or_signal_it_from_the_check(monkeypatch, tmp_path):
    assert hello_error(monkeypatch, tmp_path, HOST) == ""


@needs
def test_unconfined_the_same_module_reaches_the_harness(monkeypatch, tmp_path):
    error = hello_error(monkeypatch, tmp_path, NONE)
    assert error.endswith(f"RuntimeError: reached the harness: {', '.join(ATTACKS)}"), error


@needs
def test_a_worker_whose_sandbox_was_not_applied_is_stopped_before_it_imports(monkeypatch, tmp_path):
    monkeypatch.setattr(confined.WorkerSandbox, "command", lambda self, program: program)  # the sandbox skipped
    (tmp_path / "archive").mkdir()
    shutil.copy(GOOD, tmp_path / "archive")
    with (
        pytest.raises(WorkerEnded, match=r"^stopped before the worker started: the worker's sandbox was not applied"),
        started(Prepared.make(tmp_path), FIRST, GOOD.stem, "rmsnorm", None, 120) as worker,
    ):
        worker.hello()


@needs
def test_the_sandbox_runs_from_copies_that_name_nothing_of_kerneltrial(tmp_path):
    """PID 1 of the worker's namespace is the sandbox's init: its command line (the sandbox's
    path, its spec with the cgroup's and pyseccomp's paths, the interpreter) and the cgroup's
    path are what a module reads (the planted probe looks_for_the_harness reads both)."""
    (tmp_path / "archive").mkdir()
    shutil.copy(GOOD, tmp_path / "archive")
    with started(Prepared.make(tmp_path), FIRST, GOOD.stem, "rmsnorm", None, 120) as worker:
        assert worker.hello().error == ""
        process = worker.remote.handle.process
        assert process is not None
        command = " ".join(map(str, process.proc.args))  # the sandbox's, the launcher's and the worker's
        cgroup = str(process.confinement.cgroup)
    assert "kerneltrial" not in command.casefold() and "kerneltrial" not in cgroup.casefold(), (command, cgroup)


@needs
def test_package_says_and_records_a_missing_sandbox_piece(monkeypatch, tmp_path):
    out = tmp_path / "ship" / "s.zip"
    whole = run_cli("package", "rmsnorm", GOOD, "--out", out, "--unconfirmed")
    assert whole.exit_code == 0 and "sandbox: every piece (uid, pidns, cgroup, no_new_privs, seccomp)" in whole.output
    assert Receipt.read(out.with_suffix(".receipt.json")).interface_check.sandbox.missing == {}
    monkeypatch.setattr(confine, "host", lambda cuda=False: PARTIAL)
    partial = tmp_path / "partial" / "s.zip"
    result = run_cli("package", "rmsnorm", GOOD, "--out", partial, "--unconfirmed")
    assert result.exit_code == 0, result.output
    assert (
        "warning: partial sandbox: isolated arms ran without these sandbox pieces: seccomp (left out by the test) "
        "(the interface check's workers; the receipt records it)" in result.output
    )
    receipt = Receipt.read(partial.with_suffix(".receipt.json"))
    assert receipt.schema_id == "kerneltrial.receipt/4"
    assert receipt.interface_check.sandbox.missing == {"seccomp": "left out by the test"}
    shown = run_cli("inspect", partial, "--receipt", partial.with_suffix(".receipt.json"))
    assert (
        shown.exit_code == 0
        and "interface check isolated, no kerneltrial importable, in a sandbox without seccomp" in shown.output
    )
