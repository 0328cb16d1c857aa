"""One work unit, as a Ray task on its worker: refuse another device model, else run the unit's
piece as `python -m kerneltrial.cli run PIECE --out RUN [--resume]` in a fresh process (as
`kerneltrial replicate` does: no compiled kernel or allocator state carries over) on the GPU
Ray gave the task, its output appended to the unit's log.

The fault hook (`FAULT_ENV`, read by the driver, for tests): the worker kills its run once
timings.csv holds that many rows, then dies itself, as a worker whose GPU falls off the bus.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kerneltrial.rundir.layout import TIMINGS
from kerneltrial.rundir.provenance import nvidia_smi, visible_gpu
from kerneltrial.trial.replicate import same_code_env

FAULT_ENV = "KERNELTRIAL_FLEET_FAULT"  # "UNIT:ROWS", e.g. "shard-2:3"


@dataclass(frozen=True)
class Identity:
    host: str
    device: str  # the GPU's name (nvidia-smi), or the CPU's as the kernel runner records it


@dataclass(frozen=True)
class Outcome:
    identity: Identity
    exit_code: int | None  # of `kerneltrial run`; None when refused
    refused: str | None  # why the worker refused the unit


def identity() -> Identity:
    """This worker's host and device model (the GPU Ray gave the task, else the CPU)."""
    gpu = visible_gpu()
    smi = nvidia_smi(("name",), gpu=gpu) if gpu is not None else None
    device = smi[0]["name"] if smi else platform.processor() or platform.machine()
    return Identity(socket.gethostname(), device)


def _die_with_parent() -> None:
    """Linux: the run gets SIGKILL when this worker dies, so a run never outlives its worker
    and goes on writing while `--resume` starts another on the same directory."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.is_file() else 0


def run_unit(piece: str, run_dir: str, log: str, expected: str | None, fault_rows: int | None) -> Outcome:
    """Run one unit; `expected`: the fleet's device model (None: mixed devices allowed)."""
    me = identity()
    if expected is not None and me.device != expected:
        why = f"device {me.device!r} on {me.host} is not the fleet's {expected!r} and the protocol does not allow mixed devices"
        return Outcome(me, None, why)
    command = [sys.executable, "-m", "kerneltrial.cli", "run", piece, "--out", run_dir]
    if Path(run_dir).is_dir() and any(Path(run_dir).iterdir()):
        command.append("--resume")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"$ kerneltrial {' '.join(command[3:])}  # on {me.host}, {me.device}\n")
        out.flush()
        run = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=same_code_env(), preexec_fn=_die_with_parent
        )
        while fault_rows is not None and run.poll() is None:
            if _rows(Path(run_dir) / TIMINGS) >= fault_rows:
                run.kill()
                run.wait()
                os._exit(1)  # the worker dies mid-unit
            time.sleep(0.05)
        return Outcome(me, run.wait(), None)
