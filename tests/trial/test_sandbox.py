"""The sandbox around isolated workers (issue 35, items 1 and 3): the worker cannot trace, signal,
read or write the harness, everything it starts dies with it, and while another arm is timed it
runs nothing; what it reads of the harness's memory it cannot change behind the harness. Planted
modules (tests/fixtures/planted/): reaches_the_harness, leaves_a_daemon, burns_between_calls,
false_snapshot, restores_its_input, shrinks_its_buffers, private_stream; each test also runs the planted module unconfined (or unfrozen) where that is
safe, so that it shows the attack works there and the test can fail."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch

from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.ops.registry import Case, RegistryError, get_op
from kerneltrial.rundir.integrity_notes import in_process_warning, sandbox_warning
from kerneltrial.rundir.layout import RunDir
from kerneltrial.trial import confine, gate
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.arms import Isolation
from kerneltrial.trial.isolation import Settings
from kerneltrial.trial.runner import RunError, run_trial, write_manifest
from kerneltrial.trial.sandbox import FILE_LIMIT
from kerneltrial.trial.shared import sealed_memory
from tests.conftest import REPO
from tests.kt import run_cli, run_process, write_protocol

PLANTED = REPO / "tests" / "fixtures" / "planted"
CPU = torch.device("cpu")
ATTACKS = ("ptrace", "/proc/PID/mem", "signal", "process_vm_readv", "write the harness's folder")
ATTACKS += ("connect to the harness's loopback port", "a user namespace", "io_uring")
HOST = confine.host()
needs = pytest.mark.skipif(
    set(HOST.allowed) != set(confine.PIECES), reason=f"this host lacks sandbox pieces: {HOST.missing}"
)


def arm(iso: Isolation, name: str):
    (impl,) = iso.module_arms(str(PLANTED / f"{name}.py"))
    return impl.resolve()


def call(fn) -> torch.Tensor:
    (out,) = fn(torch.ones(2, 8), torch.ones(8), 1e-6)
    return out


def attacks(monkeypatch: pytest.MonkeyPatch, folder: Path, sandbox: confine.HostSandbox) -> dict[str, bool]:
    folder.chmod(0o755)  # as a run directory is: the harness's, readable by all
    monkeypatch.setenv("KT_PLANTED_HARNESS_PID", str(os.getpid()))
    monkeypatch.setenv("KT_PLANTED_HARNESS_DIR", str(folder))
    monkeypatch.setattr(confine, "host", lambda cuda=False: sandbox)
    with socket.create_server(("127.0.0.1", 0)) as server, Isolation(Settings(60, CPU)) as iso:
        monkeypatch.setenv("KT_PLANTED_HARNESS_PORT", str(server.getsockname()[1]))
        flags = call(arm(iso, "reaches_the_harness")).tolist()
    return dict(zip(ATTACKS, [f == 1.0 for f in flags], strict=True))


@needs
def test_the_worker_cannot_trace_signal_read_or_write_the_harness(monkeypatch, tmp_path: Path):
    assert attacks(monkeypatch, tmp_path, HOST) == dict.fromkeys(ATTACKS, False)


@needs
def test_unconfined_the_same_worker_reaches_the_harness(monkeypatch, tmp_path: Path):
    none = confine.HostSandbox((), dict.fromkeys(confine.PIECES, "left out by the test"), None)
    assert attacks(monkeypatch, tmp_path, none) == dict.fromkeys(ATTACKS, True)


@needs
def test_each_piece_alone_stops_what_it_claims(monkeypatch, tmp_path: Path):
    def only(*pieces: str) -> confine.HostSandbox:
        return confine.HostSandbox(pieces, {}, HOST.cgroup_root if "cgroup" in pieces else None)

    uid = attacks(monkeypatch, tmp_path, only("uid", "no_new_privs"))
    assert not any(uid[a] for a in ATTACKS[:5]), uid  # no capability, another uid: nothing reaches a root harness
    seccomp = attacks(monkeypatch, tmp_path, only("seccomp", "no_new_privs"))
    assert not seccomp["ptrace"] and not seccomp["process_vm_readv"] and seccomp["/proc/PID/mem"], seccomp
    assert not seccomp["a user namespace"] and not seccomp["io_uring"], seccomp
    pidns = attacks(monkeypatch, tmp_path, only("pidns", "no_new_privs"))
    assert not pidns["signal"] and not pidns["/proc/PID/mem"], pidns  # the harness's pid names nothing there
    assert not pidns["connect to the harness's loopback port"] and pidns["io_uring"], pidns  # its own network


def processes_of(uid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        line = next((x for x in text.splitlines() if x.startswith("Uid:")), "")
        if str(uid) in line.split()[1:]:
            found.append(int(status.parent.name))
    return found


@needs
def test_what_the_worker_starts_dies_with_it():
    with Isolation(Settings(60, CPU)) as iso:
        fn = arm(iso, "leaves_a_daemon")
        call(fn)
        confinement = fn.remote.handle.process.confinement
        uid, cgroup = confinement.uid, confinement.cgroup
        assert len(processes_of(uid)) >= 2  # the worker and its detached daemon
    deadline = time.monotonic() + 10
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uid) == [] and not cgroup.exists()


def burned_us(confinement: confine.Confinement, seconds: float) -> int:
    start = confinement.cpu_us()
    time.sleep(seconds)
    return confinement.cpu_us() - start


@needs
def test_a_frozen_worker_burns_nothing_while_another_arm_is_timed():
    with Isolation(Settings(60, CPU)) as iso:
        fn = arm(iso, "burns_between_calls")
        call(fn)
        confinement = fn.remote.handle.process.confinement
        assert confinement.frozen  # held while the harness read the call's memory
        confinement.thaw()
        assert burned_us(confinement, 0.3) > 50_000  # between calls it burns (the attack)
        iso.quiet(None)  # an in-process arm is timed now
        assert burned_us(confinement, 0.3) < 2_000
        assert call(fn).shape == (2, 8)  # its next request thaws it (and it is held again after)


@needs
def test_a_worker_without_the_sandbox_the_host_allows_is_refused(monkeypatch):
    monkeypatch.setattr(confine.Confinement, "command", lambda self, program: program)  # the sandbox skipped
    with (
        Isolation(Settings(60, CPU)) as iso,
        pytest.raises(RegistryError, match="SandboxMissing: .*its sandbox was not applied"),
    ):
        arm(iso, "burns_between_calls")


# ---------------------------------------------------------------- no silent downgrade (item 4)

GOOD = REPO / "tests" / "fixtures" / "good_rmsnorm.py"
WRONG = REPO / "tests" / "fixtures" / "wrong_rmsnorm.py"
PARTIAL = confine.HostSandbox(
    tuple(p for p in confine.PIECES if p != "seccomp"), {"seccomp": "left out by the test"}, HOST.cgroup_root
)


def downgraded(tmp_path: Path, **keys: object) -> Path:
    """A protocol that isolates user:good_rmsnorm and leaves user:wrong_rmsnorm in kerneltrial's process."""
    text = proto.new(
        "rmsnorm",
        "downgraded",
        ["user:good_rmsnorm", "user:wrong_rmsnorm"],
        [Case((4, 64))],
        impl_modules=[str(GOOD), str(WRONG)],
        **{"isolate": ["user:good_rmsnorm"], "seeds": [0], "rounds": 3, "warmup": 1, "calls_per_sample": 2, "l2": "hot"}
        | keys,
    )
    return write_protocol(tmp_path / "p.toml", text)


def test_freeze_refuses_a_user_arm_left_in_process_unless_the_protocol_accepts_it(tmp_path: Path):
    refused = run_cli("protocol", "freeze", downgraded(tmp_path))
    assert refused.exit_code == 2 and "leaves user:wrong_rmsnorm in kerneltrial's process" in refused.output
    assert "allow_in_process = true" in refused.output and not proto.is_frozen(tmp_path / "p.toml")
    accepted = downgraded(tmp_path, allow_in_process=True)
    assert run_cli("protocol", "freeze", accepted).exit_code == 0


def test_freeze_refuses_isolated_arms_with_fewer_samples_than_the_floor_needs(tmp_path: Path):
    thin = downgraded(tmp_path, allow_in_process=True, rounds=2)  # 1 seed x 2 rounds
    refused = run_cli("protocol", "freeze", thin)
    assert refused.exit_code == 2 and "user:good_rmsnorm run isolated with 2 samples per (case, arm)" in refused.output
    assert "needs at least 3" in refused.output and not proto.is_frozen(thin)
    assert run_cli("protocol", "freeze", downgraded(tmp_path, allow_in_process=True)).exit_code == 0  # 3 rounds


def test_a_frozen_protocol_refuses_a_partial_sandbox_unless_it_accepts_one(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(confine, "host", lambda cuda=False: PARTIAL)
    protocol = downgraded(tmp_path, allow_in_process=True)
    proto.freeze(protocol)
    with pytest.raises(
        RunError, match=r"without these sandbox pieces: seccomp \(left out by the test\).*accept_partial"
    ):
        run_trial(protocol, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_every_page_says_what_the_run_lacked(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(confine, "host", lambda cuda=False: PARTIAL)
    run = run_trial(downgraded(tmp_path), tmp_path / "run")
    notes = [in_process_warning("user:wrong_rmsnorm"), sandbox_warning({"seccomp": "left out by the test"})]
    summary = json.loads((run / "summary.json").read_text())
    assert all(n in summary["warnings"] for n in notes)
    assert run_cli("report", run).exit_code == 0
    assert all(n in (run / "report.md").read_text() for n in notes)
    assert all(n in run_cli("compare", run, run).output for n in notes)
    page = tmp_path / "PERFORMANCE.md"
    assert run_cli("performance", run, "--out", page).exit_code == 0
    assert all(n in page.read_text() for n in notes)
    assert verify_run_dir(run).ok
    # a reviewer who deletes the notes (and rehashes the manifest) is caught: from the summary, ...
    edited = reviewed(run, tmp_path / "a", lambda plan, summary: summary["warnings"].remove(notes[1]))
    assert any("summary warnings lack" in problem for problem in edited)
    # ... with plan.json's record of the sandbox (the runner's code shows it writes one), ...
    edited = reviewed(
        run, tmp_path / "b", lambda plan, summary: (plan.pop("sandbox"), summary["warnings"].remove(notes[1]))
    )
    assert any("with a sandbox record" in problem and "source.tar.gz" in problem for problem in edited), edited
    # ... or with the record emptied
    edited = reviewed(
        run, tmp_path / "c", lambda plan, summary: (plan.update(sandbox=None), summary["warnings"].remove(notes[1]))
    )
    assert any("plan.json sandbox is None but arms ['user:good_rmsnorm'] ran isolated" in p for p in edited), edited


def reviewed(run: Path, copy: Path, edit) -> list[str]:
    """verify's problems with a copy of `run` whose plan.json and summary.json `edit` changed,
    its manifest rehashed as a reviewer would."""
    shutil.copytree(run, copy)
    plan, summary = (json.loads((copy / name).read_text()) for name in ("plan.json", "summary.json"))
    edit(plan, summary)
    for name, document in (("plan.json", plan), ("summary.json", summary)):
        (copy / name).write_text(json.dumps(document, indent=2) + "\n")
    write_manifest(RunDir(copy))
    return verify_run_dir(copy).problems


# ---------------------------------------------------------------- the harness's own reads (items 2 and 5)


def gate_messages(name: str, device: torch.device, case: Case) -> list[str]:
    with Isolation(Settings(120, device)) as iso:
        (impl,) = iso.module_arms(str(PLANTED / f"{name}.py"))
        result = gate.check(get_op("rmsnorm"), impl, case, 0, device)
    return [] if result.passed else [result.message]


def test_a_worker_that_reports_a_false_snapshot_of_its_inputs_is_caught():
    (message,) = gate_messages("false_snapshot", CPU, Case((4, 64)))
    assert "wrote an argument's memory after the call returned" in message


def test_a_worker_whose_answer_the_parser_cannot_hold_fails_its_arm_not_the_harness():
    (message,) = gate_messages("answers_too_deep", CPU, Case((4, 64)))
    assert (
        "worker broke the protocol: an answer to 'call' that is not JSON kerneltrial reads (RecursionError)" in message
    )


def test_a_worker_writes_no_file_past_the_sandbox_ceiling_and_its_buffers_are_unnamed():
    with Isolation(Settings(120, CPU)) as iso:
        (impl,) = iso.module_arms(str(GOOD))
        process = iso.remotes[0].handle.process
        assert process is not None
        limits = {confine.file_size_limit(pid) for pid in process.confinement.pids(process.leader)}
    assert limits == {FILE_LIMIT}  # every process of the worker, the sandbox's own too
    fd, _ = sealed_memory(64, readonly=True)
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == "/memfd: (deleted)"  # nothing names the check
    finally:
        os.close(fd)


def test_a_kernel_that_writes_its_input_faults_however_its_worker_would_hide_it():
    (message,) = gate_messages("restores_its_input", CPU, Case((4, 64)))
    assert "killed by signal SIGSEGV during 'call'" in message
    assert "its inputs are read-only to it: a kernel that writes one faults" in message


@pytest.mark.slow
def test_a_worker_cannot_shrink_a_buffer_under_the_harness():
    """In a process of its own: were the cut allowed, the harness would die of SIGBUS."""
    done = run_process(
        *["check", "rmsnorm", "--impl-module", PLANTED / "shrinks_its_buffers.py", "--no-peers"],
        *["--impl", "user:shrinks_its_buffers", "--shape", "4x64", "--seeds", "1"],
        timeout=300,
    )
    assert done.exit_code == 0 and " 0 failed" in done.stdout, done.output[-2000:]
    assert "pass" in next(line for line in done.stdout.splitlines() if "user:shrinks_its_buffers" in line)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="stream order needs a CUDA device; none is visible here")
def test_an_arm_whose_output_is_not_ordered_with_the_callers_stream_is_refused_on_cuda():
    (message,) = gate_messages("private_stream", torch.device("cuda"), Case((4096, 4096)))
    assert "not finished when the current stream was synchronised" in message


@pytest.mark.parametrize(
    ("device", "case"),
    [
        (CPU, Case((64, 256))),
        pytest.param(  # outputs of 16 MiB: blocks of their own from the driver, not carved from a poisoned segment
            torch.device("cuda"),
            Case((2048, 4096)),
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="the driver's pages need a CUDA device"),
        ),
    ],
    ids=["cpu", "cuda"],
)
def test_an_arm_that_returns_unwritten_memory_on_repeated_values_is_caught(device: torch.device, case: Case):
    """CPU: torch.empty poisons (NaN). CUDA: the worker spoils its copies of the last output (and the
    output) before its cache goes back to the driver; on an H100 (session 22, docs/NOTES.md) the arm was
    caught with or without the spoil, by what else the unwritten block held (an Inf at the storage-offset
    check): the spoil is a second line there, not shown to be the one that catches it."""
    (message,) = gate_messages("remembers_values", device, case)
    named = ("NaN element(s)",) if device.type == "cpu" else ("NaN element(s)", "Inf element(s)")
    assert any(name in message for name in named), message


def test_an_arm_whose_output_is_a_view_into_a_larger_block_passes_isolated(tmp_path: Path):
    """The worker copies an output's extent into its slot, not its whole storage (a RuntimeError before)."""
    module = tmp_path / "padded.py"
    module.write_text(
        "import torch\n\n\ndef rmsnorm(x, weight, eps=1e-6):\n"
        "    out = torch.empty(x.numel() + 64, dtype=x.dtype, device=x.device)[: x.numel()].view(x.shape)\n"
        "    xf = x.float()\n"
        "    return out.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight)\n"
    )
    with Isolation(Settings(120, CPU)) as iso:
        (impl,) = iso.module_arms(str(module))
        result = gate.check(get_op("rmsnorm"), impl, Case((4, 64)), 0, CPU)
    assert result.passed, result.message


def test_check_says_what_its_verdicts_rest_on(monkeypatch):
    args = ("check", "rmsnorm", "--impl-module", GOOD, "--impl", "user:good_rmsnorm", "--no-peers")
    args += ("--shape", "4x64", "--seeds", "1")
    in_process = run_cli(*args, "--isolate", "none")
    assert in_process.exit_code == 0 and f"warning: {in_process_warning('user:good_rmsnorm')}" in in_process.output
    monkeypatch.setattr(confine, "host", lambda cuda=False: PARTIAL)
    partial = run_cli(*args)
    assert partial.exit_code == 0 and "warning: partial sandbox: isolated arms ran without these" in partial.output
