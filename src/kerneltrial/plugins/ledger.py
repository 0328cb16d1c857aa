"""The served ledger (issue 36, item 1): inside the server, one record per answered HTTP request,
written to a socket only kerneltrial holds the other end of.

kerneltrial starts vLLM with `--middleware kerneltrial.plugins.ledger.Ledger` (vLLM's option for
an ASGI middleware, loaded in its API server) and one end of a socket pair as an inherited file
descriptor named by KERNELTRIAL_LEDGER_FD (serving/launcher.py). For every HTTP request the
middleware writes one line when the response's last byte was sent: the path, the status and the
server's monotonic clock at the request's start and just before its last byte was handed to the
socket (CLOCK_MONOTONIC: the host's clock, the one kerneltrial's process reads; the end is read
before the send, else a server descheduled after it stamped an answer the client had already
counted after the run's window: a loaded machine's flake). A request answered by any other process, e.g. a server that
shares the port through SO_REUSEPORT and serves the same model names, leaves no line: the trial
counts the lines of each run's window against the requests the client completed
(serving/served.py).

A socket cannot be opened by path, not even through /proc/PID/fd/N (a pipe can: a hostile review
reopened one for writing): another process can write to it only by holding the descriptor, which
it gets by inheriting it or, with ptrace rights over the server, by pidfd_getfd or ptrace (what a
user with root can still do: docs/serving.md, "Launch lifecycle", under Who answers). The variable
is removed from os.environ so that the server's own children do not name it; /proc/PID/environ
still shows it, and the number is no secret. Standard library only: it runs in
vLLM's interpreter and imports nothing of kerneltrial but this file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

FD_ENV = "KERNELTRIAL_LEDGER_FD"
MIDDLEWARE = "kerneltrial.plugins.ledger.Ledger"  # vLLM's --middleware value

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def record(path: str, status: int, t0: float, t1: float) -> bytes:
    """One line of the ledger (one small write, which a stream socket delivers whole and in order)."""
    return (json.dumps({"path": path[:200], "status": status, "t0": t0, "t1": t1}) + "\n").encode()


def ledger_fd() -> int | None:
    """The ledger's descriptor from the environment (removed from os.environ, so the server's own
    children do not name it), or None when this server keeps no ledger."""
    value = os.environ.pop(FD_ENV, None)
    return int(value) if value and value.isdigit() else None


class Ledger:
    """An ASGI middleware: the app unchanged, one ledger line per HTTP response sent."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self.fd = ledger_fd()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or self.fd is None:
            await self.app(scope, receive, send)
            return
        t0, status = time.monotonic(), 0

        async def sent(message: Message) -> None:
            nonlocal status
            t1 = time.monotonic()  # before the last byte leaves: the client cannot end its run before it
            await send(message)
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 0))
            elif message.get("type") == "http.response.body" and not message.get("more_body", False):
                self.write(record(str(scope.get("path", "")), status, t0, t1))

        await self.app(scope, receive, sent)

    def write(self, line: bytes) -> None:
        try:
            os.write(self.fd, line)  # type: ignore[arg-type]
        except OSError:
            self.fd = None  # kerneltrial closed its end: nothing reads the ledger any more
