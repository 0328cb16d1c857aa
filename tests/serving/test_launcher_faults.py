"""Launcher gates and clean stops, against the fake server (fast, no vLLM needed)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kerneltrial.serving.launcher import LaunchError, Server, ServerSpec, group_alive, operator_env

from .conftest import REPO


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
        srv = Server(ServerSpec(fake_argv(port), "tiny", port=port), tmp_path / "server.log")
        with pytest.raises(LaunchError, match=f"port {port} .* already taken"):
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
        ServerSpec(fake_argv(port, "--model-id", "other"), "tiny", port=port, ready_timeout_s=20),
        tmp_path / "server.log",
    )
    with pytest.raises(LaunchError, match=r"lists models \['other'\], not 'tiny'"):
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
    with pytest.raises(LaunchError, match="cannot start server"):
        with srv:
            pass


def test_operator_env_filter():
    env = {"VLLM_PLUGINS": "fl", "USE_FLAGGEMS": "1", "VLLM_FL_X": "1", "HOME": "/root", "PATH": "/bin"}
    assert operator_env(env) == {"USE_FLAGGEMS": "1", "VLLM_FL_X": "1", "VLLM_PLUGINS": "fl"}


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
    cmd = [
        sys.executable,
        "-m",
        "kerneltrial.serving",
        "launch",
        "--hold",
        "120",
        "--out",
        str(tmp_path / "run"),
        "--model-id",
        "tiny",
        "--",
        *fake_argv(port, "--spawn-child", "--pidfile", str(pidfile)),
    ]
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
    assert not group_alive(server_pid)
    assert (tmp_path / "run" / "server.log").read_text().strip()
    assert (tmp_path / "run" / "launch.json").is_file()


def test_sigterm_to_kerneltrial_also_cleans_up(tmp_path, port, fake_argv):
    pidfile = tmp_path / "pid"
    cmd = [
        sys.executable,
        "-m",
        "kerneltrial.serving",
        "launch",
        "--hold",
        "120",
        "--out",
        str(tmp_path / "run"),
        "--model-id",
        "tiny",
        "--",
        *fake_argv(port, "--pidfile", str(pidfile)),
    ]
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
    assert not group_alive(int(pidfile.read_text()))
