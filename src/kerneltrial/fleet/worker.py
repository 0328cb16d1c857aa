"""One work unit, as a Ray task on its worker: refuse another device model, else run the unit's
piece as `python -m kerneltrial.cli run PIECE --out RUN [--resume]` in a fresh process (as
`kerneltrial replicate` does: no compiled kernel or allocator state carries over) on the GPU
Ray gave the task, its output appended to the unit's log. A partial run started on another GPU
(its recorded uuid) or host is not resumed (the kernel runner would refuse it: one run's rows
come from one chip): it is moved aside to abandoned/<unit>-attemptN and the unit starts afresh.

The fault hook, for tests only: `KERNELTRIAL_FLEET_FAULT=UNIT:ROWS` (`FAULT_ENV`) makes that
unit's worker kill its run once timings.csv holds ROWS rows, then die itself, as a worker whose
GPU falls off the bus. The driver honours it only when `KERNELTRIAL_TESTING=1` (`TESTING_ENV`)
is set too; without it the variable is ignored, so a stray one never kills production work.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kerneltrial.rundir.layout import PROVENANCE, TIMINGS
from kerneltrial.rundir.provenance import nvidia_smi, visible_gpu
from kerneltrial.trial.replicate import same_code_env
from kerneltrial.trial.runner import moved_device

FAULT_ENV = "KERNELTRIAL_FLEET_FAULT"  # "UNIT:ROWS", e.g. "shard-2:3"
TESTING_ENV = "KERNELTRIAL_TESTING"  # "1": FAULT_ENV is honoured


@dataclass(frozen=True)
class Identity:
    host: str
    device: str  # the GPU's name (nvidia-smi), or the CPU's as the kernel runner records it
    uuid: str | None  # the GPU's (nvidia-smi: "GPU-...", as the kernel runner records it); None: no GPU


@dataclass(frozen=True)
class Outcome:
    identity: Identity
    exit_code: int | None  # of `kerneltrial run`; None when refused
    refused: str | None  # why the worker refused the unit
    abandoned: str | None = None  # why a partial run was moved aside before this attempt started afresh


def identity() -> Identity:
    """This worker's host and device (the GPU Ray gave the task, else the CPU)."""
    gpu = visible_gpu()
    smi = nvidia_smi(("name", "uuid"), gpu=gpu) if gpu is not None else None
    if smi:
        return Identity(socket.gethostname(), smi[0]["name"], smi[0]["uuid"])
    return Identity(socket.gethostname(), platform.processor() or platform.machine(), None)


def _die_with_parent() -> None:
    """Linux: the run gets SIGKILL when this worker dies, so a run never outlives its worker
    and goes on writing while `--resume` starts another on the same directory."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.is_file() else 0


def _set_aside(run_dir: Path, me: Identity, to: Path) -> str | None:
    """Move a partial run started on another GPU or host to `to`; why, or None when it stays."""
    provenance = run_dir / PROVENANCE
    moved = moved_device(json.loads(provenance.read_text()), me.uuid, me.host) if provenance.is_file() else None
    if moved is not None:
        to.parent.mkdir(parents=True, exist_ok=True)
        run_dir.rename(to)
    return moved


def run_unit(
    piece: str, run_dir: str, log: str, expected: str | None, set_aside: str, fault_rows: int | None
) -> Outcome:
    """Run one unit; `expected`: the fleet's device model (None: mixed devices allowed);
    `set_aside`: where a partial run started on another GPU or host goes."""
    me = identity()
    if expected is not None and me.device != expected:
        why = f"device {me.device!r} on {me.host} is not the fleet's {expected!r} and the protocol does not allow mixed devices"
        return Outcome(me, None, why)
    abandoned = _set_aside(Path(run_dir), me, Path(set_aside))
    command = [sys.executable, "-m", "kerneltrial.cli", "run", piece, "--out", run_dir]
    if Path(run_dir).is_dir() and any(Path(run_dir).iterdir()):
        command.append("--resume")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        if abandoned is not None:
            out.write(f"# not resumed, moved to {set_aside}: {abandoned}\n")
        out.write(f"$ kerneltrial {' '.join(command[3:])}  # on {me.host}, {me.device} {me.uuid or ''}\n")
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
        return Outcome(me, run.wait(), None, abandoned)
