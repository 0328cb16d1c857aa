"""Launcher gates and clean stops, against the fake server (fast, no vLLM needed)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kerneltrial.serving.launcher import LaunchError, Server, ServerSpec, group_alive, operator_env
from kerneltrial.serving.lifecycle import port_is_free, process_alive, read_record
from tests.kt import cli_argv

from .conftest import REPO

# on the real-vLLM tests' worker ("vllm", tests/conftest.py): their stop timings (a 30 s bound on a 3 s
# readiness timeout) failed beside a vLLM server spinning on both cores (fresh-clone CI, session 22)
pytestmark = pytest.mark.xdist_group("vllm")


def _assert_gone(srv: Server) -> None:
    assert srv.proc is not None
    assert srv.proc.poll() is not None
    assert not group_alive(srv.proc.pid), "server process group still alive"


def test_ready_then_graceful_stop(tmp_path, port, fake_argv):
    spec = ServerSpec(
        fake_argv(port, "--spawn-child"),
        "tiny",
        port=port,
        ready_timeout_s=20,
        env={"VLLM_PLUGINS": "fl", "USE_FLAGGEMS": "1", "VLLM_FL_OPS": "rms_norm"},
    )
    srv = Server(spec, tmp_path / "server.log")
    with srv:
        assert srv.alive and srv.timings["ready_s"] < 20
        assert srv.record["operator_env"]["VLLM_FL_OPS"] == "rms_norm"
        assert srv.record["operator_env"]["USE_FLAGGEMS"] == "1"
    _assert_gone(srv)
    assert srv.record["signals_sent"][0] == "SIGINT"
    assert "SIGINT, shutting down" in (tmp_path / "server.log").read_text()


def test_stop_escalates_when_sigint_ignored(tmp_path, port, fake_argv):
    spec = ServerSpec(
        fake_argv(port, "--ignore-sigint", "--spawn-child"), "tiny", port=port, ready_timeout_s=20, stop_grace_s=1.0
    )
    srv = Server(spec, tmp_path / "server.log")
    with srv:
        pass
    _assert_gone(srv)
    assert srv.record["signals_sent"][:2] == ["SIGINT", "SIGTERM"]


def test_port_already_taken(tmp_path, port, fake_argv):
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        srv = Server(ServerSpec(fake_argv(port), "tiny", port=port, port_wait_s=1.0), tmp_path / "server.log")
        with pytest.raises(LaunchError, match=f"port {port} .* already taken after waiting 1 s: pid {os.getpid()}"):
            with srv:
                pass
    assert srv.proc is None  # nothing was started


def test_server_exits_at_start(tmp_path, port, fake_argv):
    srv = Server(
        ServerSpec(fake_argv(port, "--mode", "exit"), "tiny", port=port, ready_timeout_s=20), tmp_path / "server.log"
    )
    with pytest.raises(LaunchError, match="exited with code 3 before it was ready"):
        with srv:
            pass
    _assert_gone(srv)
    assert "bad argument" in (tmp_path / "server.log").read_text()


def test_wrong_model_id(tmp_path, port, fake_argv):
    srv = Server(
        ServerSpec(fake_argv(port, "--served-model-name", "other"), "tiny", port=port, ready_timeout_s=20),
        tmp_path / "server.log",
    )
    with pytest.raises(LaunchError, match=r"lists models \['other', 'kt-[0-9a-f]{16}'\], not 'tiny'"):
        with srv:
            pass
    _assert_gone(srv)


def test_readiness_timeout_on_503(tmp_path, port, fake_argv):
    srv = Server(
        ServerSpec(fake_argv(port, "--mode", "503", "--spawn-child"), "tiny", port=port, ready_timeout_s=3),
        tmp_path / "server.log",
    )
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"not ready after 3 s \(last /v1/models: HTTP 503\)"):
        with srv:
            pass
    assert time.monotonic() - t0 < 30
    _assert_gone(srv)


def test_missing_executable(tmp_path, port):
    srv = Server(ServerSpec(["/nonexistent/vllm", "serve"], "tiny", port=port), tmp_path / "server.log")
    with pytest.raises(LaunchError, match="cannot start server '/nonexistent/vllm': not found"):
        with srv:
            pass
    assert srv.proc is None


def test_operator_env_filter():
    env = {"VLLM_PLUGINS": "fl", "USE_FLAGGEMS": "1", "VLLM_FL_X": "1", "HOME": "/root", "PATH": "/bin"}
    assert operator_env(env) == {"USE_FLAGGEMS": "1", "VLLM_FL_X": "1", "VLLM_PLUGINS": "fl"}


def launch_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "launch.json").read_text())["record"]


def _wait_for(path: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.is_file() and path.read_text().strip():
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def test_sigint_to_kerneltrial_stops_the_server_group(tmp_path, port, fake_argv):
    """`kerneltrial serve launch --hold` as a subprocess; SIGINT it; server group is gone."""
    pidfile = tmp_path / "pid"
    cmd = cli_argv(
        "serve",
        "launch",
        "--hold",
        "120",
        "--out",
        str(tmp_path / "run"),
        "--model-id",
        "tiny",
        "--",
        *fake_argv(port, "--spawn-child", "--pidfile", str(pidfile)),
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(pidfile, 30)
        server_pid = int(pidfile.read_text())
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted; the server was stopped" in err
    assert not process_alive(server_pid) and not group_alive(launch_record(tmp_path / "run")["pgid"])
    assert (tmp_path / "run" / "server.log").read_text().strip()
    assert (tmp_path / "run" / "launch.json").is_file()


def test_sigterm_to_kerneltrial_also_cleans_up(tmp_path, port, fake_argv):
    pidfile = tmp_path / "pid"
    cmd = cli_argv(
        "serve",
        "launch",
        "--hold",
        "120",
        "--out",
        str(tmp_path / "run"),
        "--model-id",
        "tiny",
        "--",
        *fake_argv(port, "--pidfile", str(pidfile)),
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(pidfile, 30)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert not process_alive(int(pidfile.read_text())) and not group_alive(launch_record(tmp_path / "run")["pgid"])


def _wait_gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_the_server_runs_under_a_supervisor_that_passes_its_exit_status_on(tmp_path, port, fake_argv):
    pidfile = tmp_path / "pid"
    srv = Server(
        ServerSpec(fake_argv(port, "--pidfile", str(pidfile)), "tiny", port=port, ready_timeout_s=20),
        tmp_path / "server.log",
    )
    with srv:
        server_pid = int(pidfile.read_text())
        assert server_pid != srv.proc.pid and os.getpgid(server_pid) == srv.proc.pid  # in the supervisor's group
        os.kill(server_pid, signal.SIGKILL)  # the server dies of a signal: so does the supervisor
        assert _wait_gone(srv.proc.pid, 10) or srv.proc.poll() is not None
        with pytest.raises(LaunchError, match="server exited with code -9 during the benchmark"):
            srv.check_alive()
    _assert_gone(srv)


def test_the_port_record_lives_as_long_as_the_server(tmp_path, port, fake_argv, server_records):
    srv = Server(
        ServerSpec(fake_argv(port), "tiny", port=port, ready_timeout_s=20), tmp_path / "server.log", run_dir=tmp_path
    )
    with srv:
        rec = read_record(port)
        assert rec is not None and rec.pid == srv.proc.pid and rec.alive
        assert rec.run_dir == str(tmp_path) and rec.kerneltrial_pid == os.getpid()
        ledger = ["--middleware", "kerneltrial.plugins.ledger.Ledger"]  # the served ledger (issue 36)
        assert rec.argv == [*fake_argv(port), "--served-model-name", "tiny", srv.nonce, *ledger]  # the argv that ran
        assert (server_records / f"port-{port}.json").is_file()
    assert read_record(port) is None


def test_a_server_whose_supervisor_is_killed_gets_sigterm(tmp_path, port, fake_argv):
    """PR_SET_PDEATHSIG in the server: it does not outlive its supervisor."""
    pidfile = tmp_path / "pid"
    srv = Server(
        ServerSpec(fake_argv(port, "--pidfile", str(pidfile)), "tiny", port=port, ready_timeout_s=20),
        tmp_path / "server.log",
    )
    with srv:
        server_pid = int(pidfile.read_text())
        os.kill(srv.proc.pid, signal.SIGKILL)
        assert _wait_gone(server_pid, 10), "the server outlived its supervisor"
    _assert_gone(srv)


def test_kill_9_of_kerneltrial_stops_the_server_group_and_frees_the_port(tmp_path, port, fake_argv):
    """The supervisor sees kerneltrial die (it is reparented) and stops the group: SIGINT first."""
    pidfile = tmp_path / "pid"
    cmd = cli_argv(
        "serve",
        "launch",
        "--hold",
        "300",
        "--out",
        str(tmp_path / "run"),
        "--model-id",
        "tiny",
        "--",
        *fake_argv(port, "--spawn-child", "--pidfile", str(pidfile)),
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(pidfile, 30)
        server_pid = int(pidfile.read_text())
        end = time.monotonic() + 30
        while time.monotonic() < end and port_is_free("127.0.0.1", port):
            time.sleep(0.2)
        pgid = os.getpgid(server_pid)
        assert pgid != proc.pid and group_alive(pgid)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    end = time.monotonic() + 20
    while time.monotonic() < end and group_alive(pgid):
        time.sleep(0.1)
    survived = group_alive(pgid)
    if survived:
        os.killpg(pgid, signal.SIGKILL)  # leave nothing behind when the check fails
    assert not survived, "the server group outlived kerneltrial"
    assert port_is_free("127.0.0.1", port)
    log = (tmp_path / "run" / "server.log").read_text()
    assert "kerneltrial (pid" in log and "died; stopping the server group" in log
    assert "SIGINT, shutting down" in log  # stopped as the launcher would, gracefully first
