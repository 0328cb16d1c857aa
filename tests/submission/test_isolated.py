"""The isolated interface check (issue 24, item 3): the archive runs where no kerneltrial module is
importable, and the harness judges its outputs with the gate's rules; since issue 35 (item 6) it
runs as a target imports it (python with site, a scrubbed environment, a neutral parent) under
two environments."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kerneltrial.ops.registry import Case, RegistryError, get_op, load_user_module
from kerneltrial.submission.archive import build
from kerneltrial.submission.interface import params_of_signature
from kerneltrial.submission.isolated import Hello, Prepared, WorkerEnded, hello_of, interface_check, started
from kerneltrial.submission.target_env import FIRST, scrubbed_environ, second_environment, site_directories
from kerneltrial.trial import gate
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


def test_the_worker_sees_no_kerneltrial_under_either_environment(tmp_path, monkeypatch):
    """The planted probe's import fails naming what it finds if any kerneltrial module is
    loaded or importable, a loaded module's file lies in kerneltrial's package, a variable names
    kerneltrial, a kerneltrial program is on PATH, an ancestor's or its own command line names
    it, a shim is in sys.modules, or site is off. In the worker (a target given, so the launch
    hook and the poisoning are both loaded before the import), with the repository on
    PYTHONPATH, a KERNELTRIAL variable and a variable naming kerneltrial set, it imports under
    both environments; in kerneltrial's process it does not."""
    module = PACKAGE / "looks_for_the_harness.py"
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # its src/ holds the package: `import src.kerneltrial`
    monkeypatch.setenv("KERNELTRIAL_VLLM", "/opt/vllm/bin/python")
    monkeypatch.setenv("HARNESS_HOME", "/opt/kerneltrial")
    prepared = Prepared.make(unpacked(tmp_path, module))
    for environment in (FIRST, second_environment(2)):
        with started(prepared, environment, module.stem, "rmsnorm", get_target("ascend"), 300) as worker:
            hello = worker.hello()
        assert hello.error == "" and "rmsnorm" in hello.callables, hello
    with pytest.raises(RegistryError, match="the module sees kerneltrial: kerneltrial"):
        load_user_module(str(module))


def test_the_target_interpreter_holds_no_kerneltrial_and_every_other_package(tmp_path, monkeypatch):
    """Its site-packages links every entry of this interpreter's site directories but
    kerneltrial's; its sys.path holds no folder from which kerneltrial imports."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    (tmp_path / "archive").mkdir()
    prepared = Prepared.make(tmp_path)
    linked = {entry.name for entry in (tmp_path / "py").glob("lib/python*/site-packages/*")}
    everything = {entry.name for folder in site_directories() for entry in folder.iterdir()}
    assert linked == {name for name in everything if "kerneltrial" not in name.casefold()}
    assert "torch" in linked and len(linked) < len(everything)
    assert str(REPO / "src") not in prepared.path
    assert prepared.path and all(not (Path(entry) / "kerneltrial").exists() for entry in prepared.path)
    assert importlib.util.find_spec("kerneltrial") is not None  # while this process has it


def test_the_environment_is_scrubbed_of_kerneltrial_and_the_harness(tmp_path):
    programs = tmp_path / "bin"
    programs.mkdir()
    (programs / "kerneltrial").touch()
    environ = {
        "KERNELTRIAL_RUNS": "/runs",
        "PATH": f"{programs}{os.pathsep}/usr/bin{os.pathsep}/opt/kerneltrial/bin",
        "LD_LIBRARY_PATH": "/opt/cuda/lib64",
        "NOTE": "run by kerneltrial",
        "PYTEST_XDIST_WORKER": "gw0",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "/src",
        "EMPTY": "",
    }
    assert scrubbed_environ(environ, tmp_path) == {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/opt/cuda/lib64",
        "EMPTY": "",
        "PWD": str(tmp_path),
    }


def test_the_planted_sniffer_passes_in_process_and_fails_isolated():
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
    assert "(imported as the target imports it: python main.py with site, torch's default" in result.reason


# The planted modules that can tell the old check (`python -I -S`, one torch thread, started by
# kerneltrial) from a plain python: each imported under those conditions, then as a target would.
# What the probe needs comes in a variable, so no command line but the parent's names kerneltrial.
SNIFFERS = {"right_with_one_thread": 9, "right_under_kerneltrial_parent": 13, "right_without_site": 8}
PROBE = """
import importlib, json, os, sys
probe = json.loads(os.environ["PROBE"])
sys.path[:0] = probe["path"]
import torch
if probe["one_thread"]:
    torch.set_num_threads(1)
x, w = torch.randn(4, 64), torch.randn(64)
ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
ratios = {n: round(float((importlib.import_module(n).rmsnorm(x, w, 1e-6) / ref).mean())) for n in probe["names"]}
print(json.dumps(ratios | {"threads": torch.get_num_threads()}))
"""
PARENT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[2:]))"  # argv[1]: what it is named


def sniffed(python: Path, parent: str, flags: list[str], one_thread: bool) -> dict[str, int]:
    """What each sniffer returns, as a ratio to the reference, imported by `python` with `flags`
    under a parent process named `parent`; and torch's thread count there."""
    probe = {"path": [str(PACKAGE), *sys.path], "one_thread": one_thread, "names": list(SNIFFERS)}
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PROBE": json.dumps(probe)}
    command = [str(python), "-c", PARENT, parent, str(python), *flags, "-c", PROBE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_planted_environment_sniffers_are_right_only_as_the_old_check_ran_them(tmp_path):
    (tmp_path / "archive").mkdir()
    python = Prepared.make(tmp_path).python  # a plain python with site, in a folder naming nothing
    old = sniffed(python, "kerneltrial-package", ["-I", "-S"], one_thread=True)
    assert old == dict.fromkeys(SNIFFERS, 1) | {"threads": 1}
    plain = sniffed(python, "serve", [], one_thread=False)
    default = plain.pop("threads")
    assert plain == SNIFFERS | ({"right_with_one_thread": 1} if default == 1 else {})


@pytest.mark.slow
def test_a_worker_that_exits_ends_the_check_naming_its_exit_status(tmp_path):
    module = tmp_path / "exits.py"
    module.write_text("import os\n\n\ndef rmsnorm(x, weight, eps=1e-6):\n    os._exit(3)\n")
    with pytest.raises(WorkerEnded, match=r"^crashed: worker exited with code 3 during 'call'"):
        interface_check(build({"exits.py": module.read_bytes()}), "rmsnorm", None, 300)


@pytest.mark.slow
def test_a_worker_that_never_returns_ends_the_check_at_its_timeout():
    source = (PLANTED / "never_returns.py").read_bytes()
    with pytest.raises(WorkerEnded, match=r"^did not finish within 10 s \(a kernel that never returns\?\)"):
        interface_check(build({"never_returns.py": source}), "rmsnorm", None, 10)


def test_a_package_that_hides_a_write_into_its_input_faults_in_the_one_worker():
    """The trials' isolated worker runs the package: its inputs are read-only to it, so a kernel
    that zeroes its weight dies at the write, whatever its module patches to hide it."""
    source = (PACKAGE / "hides_its_input_write.py").read_bytes()
    with pytest.raises(WorkerEnded, match=r"^crashed: .*killed by signal SIGSEGV during 'call'.*read-only to it"):
        interface_check(build({"hides_its_input_write.py": source}), "rmsnorm", None, 300)


def test_the_package_check_runs_the_trials_worker_file(tmp_path):
    """One worker implementation: the script a target's interpreter runs is a copy of trial/worker.py."""
    prepared = Prepared.make(unpacked(tmp_path, REPO / "tests" / "fixtures" / "good_rmsnorm.py"))
    with started(prepared, FIRST, "good_rmsnorm", "rmsnorm", None, 120) as worker:
        assert worker.hello().error == ""
        script = tmp_path / "app" / FIRST.script
        assert script.read_bytes() == (REPO / "src" / "kerneltrial" / "trial" / "worker.py").read_bytes()


def test_a_malformed_loaded_answer_is_no_hello_and_a_default_the_parser_cannot_hold_no_signature():
    good = {"error": "", "threads": 2, "callables": ["rmsnorm"], "signature": "(x, weight, eps=1e-06)"}
    assert hello_of(good) == Hello("", 2, ["rmsnorm"], "(x, weight, eps=1e-06)")
    for field, value in (("threads", "many"), ("threads", True), ("callables", "rmsnorm"), ("callables", [1])):
        assert hello_of(good | {field: value}) is None, (field, value)
    assert params_of_signature("(x, weight, eps=" + "-" * 100_000 + "1)") is None  # MemoryError in ast.parse


@pytest.mark.slow
def test_a_module_that_hangs_at_import_ends_the_check_at_its_timeout(tmp_path):
    """The whole check's timeout bounds the import too (the worker's load waits at least 120 s
    on its own): the hostile review's hanging import took 125 s against a 10 s timeout."""
    source = b"import time\ntime.sleep(3600)\n\n\ndef rmsnorm(x, weight, eps=1e-6):\n    return x\n"
    start = time.monotonic()
    with pytest.raises(WorkerEnded, match=r"^did not start within 10 s"):
        interface_check(build({"hangs.py": source}), "rmsnorm", None, 10)
    assert time.monotonic() - start < 40


def test_the_package_command_gives_cuda_expandable_segments_to_itself_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interface check's harness fits a GPU panel's last case on an 80 GB card only so (issue 35);
    the worker under check gets the environment a target gives it, with the user's own setting."""
    from kerneltrial.submission.target_env import ALLOCATOR, ALLOCATOR_NAMES, ALLOCATOR_SET
    from tests.kt import run_cli

    name, value = ALLOCATOR
    for each in (*ALLOCATOR_NAMES, ALLOCATOR_SET):
        monkeypatch.setenv(each, "x")  # recorded, so that the test's end restores the state before it
        monkeypatch.delenv(each)
    assert (
        run_cli("package", "rmsnorm", tmp_path / "none.py", "--out", tmp_path / "a.zip", "--unconfirmed").exit_code == 2
    )
    assert os.environ[name] == value == "expandable_segments:True"
    assert name not in scrubbed_environ(os.environ, tmp_path) and ALLOCATOR_SET not in scrubbed_environ(
        os.environ, tmp_path
    )
    for each in (name, ALLOCATOR_SET):
        monkeypatch.delenv(each)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")  # the user's, under torch's newer name
    run_cli("package", "rmsnorm", tmp_path / "none.py", "--out", tmp_path / "a.zip", "--unconfirmed")
    assert (
        name not in os.environ
        and scrubbed_environ(os.environ, tmp_path)["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:128"
    )
