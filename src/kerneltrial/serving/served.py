"""The served ledger, kerneltrial's side (issue 36, item 1): what the server itself says it answered.

The server's middleware (plugins/ledger.py) writes one line per answered HTTP request into a socket
kerneltrial made for the launch (launcher.Server). `LedgerReader` drains it on a thread into the
launch's `served.jsonl` (raw evidence, verify recounts it) and into memory. After a run,
`served_in` counts the completions the server answered inside the run's window (the monotonic
clock before the client started and after it ended), and `served_problem` compares that with what
the client completed and sent: the server must have answered at least every request the client
completed and at most every one it sent. A request another process answered (a listener sharing the port, serving the same names)
is missing from it, however the answer looked; an intruder that sends the server requests of its
own to make the count up must not send more than it answered. The client's ready check and warm-up requests
(`--ready-check-timeout-sec`, `--num-warmups` of vllm/benchmarks/serve.py) are off by default and in
kerneltrial's argv. What the count cannot see: an intruder that answers k requests and sends exactly
k of its own inside the same window (answers are counted, not matched one by one: vLLM's raw file
keeps no response id).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVED = "served.jsonl"  # a launch's ledger, beside its server.log
COMPLETIONS = ("/v1/completions", "/v1/chat/completions")  # what the benchmark clients request
WAIT_S = 5.0  # the longest a run's last lines may take to cross the socket after the client ended


@dataclass(frozen=True)
class Entry:
    """One ledger line: a request the server answered, on its monotonic clock."""

    path: str
    status: int
    t0: float
    t1: float

    @classmethod
    def parse(cls, line: str) -> Entry | None:
        try:
            row = json.loads(line)
            return cls(str(row["path"]), int(row["status"]), float(row["t0"]), float(row["t1"]))
        except (ValueError, KeyError, TypeError):
            return None


def served_in(entries: list[Entry], start: float, end: float) -> int:
    """Completions answered with HTTP 200 that started and ended inside [start, end]."""
    return sum(1 for e in entries if e.path in COMPLETIONS and e.status == 200 and start <= e.t0 and e.t1 <= end)


def served_problem(served: int, completed: int, sent: int, port: int) -> str | None:
    """The reason a run's answers are not all this server's, or None: the server must have answered
    at least every request the client completed and at most every request it sent (kerneltrial's
    client argv sends no ready check or warm-up; a request the client counted failed may still have
    been answered); more is someone else's traffic, e.g. an intruder's own requests making up for
    answers it gave."""
    if served > sent:
        return (
            f"the server's own ledger holds {served} answered completion(s) in the run's window, more than the "
            f"{sent} the client sent: another process sent requests to port {port} during the run; stop it or "
            "pick another port"
        )
    if served < completed:
        return (
            f"the server's own ledger holds {served} answered completion(s) in the run's window, fewer than the "
            f"{completed} the client completed: {completed - served} answer(s) came from another process on port "
            f"{port} (a listener sharing it through SO_REUSEPORT); stop it or pick another port"
        )
    return None


class LedgerReader:
    """Drains kerneltrial's end of the ledger socket on a thread into `path` and `entries` until the server
    closes its end (it stopped)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path
        self.entries: list[Entry] = []
        self.lines = 0  # every line read, parsable or not
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._drain, name="served-ledger", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(self.fd, "rb") as ledger, self.path.open("ab", buffering=0) as out:
            for line in ledger:
                out.write(line)
                entry = Entry.parse(line.decode(errors="replace"))
                with self.lock:
                    self.lines += 1
                    if entry is not None:
                        self.entries.append(entry)

    def served(self, start: float, end: float, at_least: int) -> int:
        """served_in over what was read, waiting up to WAIT_S for `at_least` (lines in flight)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with self.lock:
                count = served_in(self.entries, start, end)
            if count >= at_least or time.monotonic() >= deadline or not self.thread.is_alive():
                return count
            time.sleep(0.02)

    def probes(self, at_least: int) -> bool:
        """Whether `at_least` /v1/models answers have reached the ledger (waiting up to WAIT_S)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with self.lock:
                count = sum(1 for e in self.entries if e.path == "/v1/models" and e.status == 200)
            if count >= at_least or time.monotonic() >= deadline or not self.thread.is_alive():
                return count >= at_least
            time.sleep(0.02)

    def close(self, timeout_s: float = 5.0) -> None:
        self.thread.join(timeout_s)


def read_ledger(path: Path) -> list[Entry]:
    """A launch's served.jsonl as verify reads it (unparsable lines left out: `served_in` then counts fewer)."""
    if not path.is_file():
        return []
    return [e for line in path.read_text(errors="replace").splitlines() if (e := Entry.parse(line)) is not None]


def window_of(row: dict[str, Any]) -> tuple[float, float] | None:
    """A runs.jsonl row's window (`window`: [start, end] on the monotonic clock), or None."""
    window = row.get("window")
    if isinstance(window, list) and len(window) == 2 and all(isinstance(v, int | float) for v in window):
        return float(window[0]), float(window[1])
    return None
