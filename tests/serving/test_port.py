"""The free-port check before a launch: a listener makes the port taken; TIME_WAIT left by a
closed connection does not (issue 14: the second launch of a trial was refused for a port
nothing listened on)."""

from __future__ import annotations

import socket

from kerneltrial.serving.launcher import free_port, port_is_free

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
