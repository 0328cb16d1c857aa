"""A port claimer for tests/serving/test_port_claims.py, in a module of its own so that a spawned
process imports only this and serving/lifecycle.py (not pytest, not the test module)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltrial.serving.lifecycle import PortTaken, claim_port, forget_server

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Attempt:
    """One claimer's try in one round: whether it holds the port, else the refusal's message."""

    round: int
    pid: int
    held: bool
    refusal: str = ""


def claim_rounds(port: int, rounds: int, barrier: Any, results: Any) -> None:
    """Every round: all claimers claim `port` at once (a barrier), wait until all have tried, then
    the holder releases it, and all wait for that before the next round. Puts the list of this
    process's Attempts on `results`."""
    me = os.getpid()
    out: list[Attempt] = []
    for r in range(rounds):
        barrier.wait()
        try:
            claim_port(HOST, port, Path(f"run-{me}"), ["claimer"], 0.5)
            out.append(Attempt(r, me, True))
        except PortTaken as e:
            out.append(Attempt(r, me, False, str(e)))
        barrier.wait()
        if out[-1].held:
            forget_server(port, None)
        barrier.wait()
    results.put(out)
