"""The free-port check before a launch: a listener makes the port taken; TIME_WAIT left by a
closed connection does not (issue 14: the second launch of a trial was refused for a port
nothing listened on). A taken port is waited for, then its holder is named: a recorded server
from a killed run by its run, pid and start time, anything else by what /proc shows."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.lifecycle import PortTaken, port_is_free, read_record, record_server, wait_for_port

HOST = "127.0.0.1"


def _time_wait_on(port: int) -> None:
    """Leave a TIME_WAIT connection on the server side of `port` (the server closes first, as
    vLLM does with an idle keep-alive connection), then stop listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen()
        client = socket.create_connection((HOST, port))
        conn, _ = listener.accept()
        conn.close()  # the active close: this side of the connection enters TIME_WAIT
        client.recv(1)  # sees the FIN
        client.close()


def test_a_port_left_in_time_wait_is_free() -> None:
    port = free_port(HOST)
    _time_wait_on(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:  # what the old check did
        try:
            plain.bind((HOST, port))
            blocked = False
        except OSError:
            blocked = True
    assert blocked, "no TIME_WAIT was left; the test would not test the fix"
    assert port_is_free(HOST, port)


def test_a_port_someone_listens_on_is_taken() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((HOST, 0))
        listener.listen()
        assert not port_is_free(HOST, listener.getsockname()[1])


def test_a_launch_waits_for_the_port_to_be_released() -> None:
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen()
    port = listener.getsockname()[1]
    threading.Timer(1.0, listener.close).start()  # a server that is still shutting down
    t0 = time.monotonic()
    wait_for_port(HOST, port, 20)
    assert 0.9 < time.monotonic() - t0 < 10


def test_a_port_still_taken_after_the_wait_names_its_holder() -> None:
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen()
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(PortTaken, match=rf"port {port} on {HOST} is already taken after waiting 1 s") as e:
            wait_for_port(HOST, port, 1.0)
        assert 1.0 <= time.monotonic() - t0 < 5
        assert f"pid {os.getpid()} (" in str(e.value) and "pick another port" in str(e.value)  # this process


def _listener_process(port: int) -> subprocess.Popen[str]:
    """A stand-in for a server left over by a killed run: its own session, listening on `port`."""
    code = (
        "import socket, sys, time\ns = socket.socket()\n"
        f"s.bind(('{HOST}', {port}))\ns.listen()\nprint('up', flush=True)\ntime.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def test_a_recorded_server_whose_kerneltrial_still_runs_is_named_at_once(tmp_path: Path) -> None:
    port = free_port(HOST)
    proc = _listener_process(port)
    try:
        record_server(port, HOST, proc.pid, tmp_path / "run-x", ["vllm", "serve", "m"])
        t0 = time.monotonic()
        with pytest.raises(PortTaken) as e:
            wait_for_port(HOST, port, 30)
        assert time.monotonic() - t0 < 5  # no wait: that kerneltrial (this test) will not release it
        started = read_record(port).started_at  # type: ignore[union-attr]
        assert str(e.value) == (
            f"a server from run {tmp_path / 'run-x'} (pid {proc.pid}, started at {started}) holds port {port}, "
            f"bound or not; stop it with `kill -- -{proc.pid}`"
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_record_of_a_dead_server_is_not_believed(tmp_path: Path) -> None:
    """The record names a pid that has exited (its number may be reused): the real holder is named."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    port = free_port(HOST)
    proc = _listener_process(port)
    try:
        record_server(port, HOST, dead.pid, tmp_path / "run-old", ["vllm"])
        with pytest.raises(PortTaken) as e:
            wait_for_port(HOST, port, 0.5)
        assert "run-old" not in str(e.value) and f"pid {proc.pid} (" in str(e.value)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
