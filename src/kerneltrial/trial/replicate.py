"""Replicates: N independent runs of one frozen protocol (`kerneltrial replicate`).

Each run is a fresh process (`python -m kerneltrial.cli run PROTOCOL --order-seed S`), so no
compiled kernel, cache or allocator state carries from one run to the next, with its own
round order (order seed = the protocol's + i for run-i, recorded in plan.json). Runs go to
DIR/run-1..N; a killed replicate continues: finished runs are kept, an unfinished one resumes.
Then the cross-run table (replicates/record.py) is written to DIR.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kerneltrial
from kerneltrial.replicates.record import ReplicateTable, cross_run, run_names, write_table
from kerneltrial.rundir.layout import REPLICATES
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.runner import RunError

GATE_FAILED = 1  # `run` exits 1 when no candidate passed the gate: a result, not an error


def same_code_env() -> dict[str, str]:
    """The environment with this process's kerneltrial first on the path: every replicate runs
    the code this command runs (not another installed copy)."""
    source = str(Path(kerneltrial.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": source if not path else f"{source}{os.pathsep}{path}"}


def run_replicates(protocol: Path, n: int, out: Path) -> ReplicateTable:
    """Run `protocol` `n` times into `out`/run-1..n and write the cross-run table there."""
    p = proto.load(protocol)
    if not proto.is_frozen(protocol):
        raise proto.ProtocolError(
            f"{protocol}: replicates run a frozen protocol: kerneltrial protocol freeze {protocol}"
        )
    if (out / REPLICATES).exists():
        raise RunError(f"{out} holds finished replicates; choose another --out")
    names = run_names(n)
    extra = sorted({d.name for d in out.glob("run-*")} - set(names))
    if extra:
        raise RunError(
            f"{out} holds {', '.join(extra)}, beyond the {n} runs asked for; every run goes into the table: choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names, start=1):
        run_dir = out / name
        provenance = run_dir / "provenance.json"
        if provenance.is_file() and json.loads(provenance.read_text()).get("finished_at"):
            continue
        command = [sys.executable, "-m", "kerneltrial.cli", "run", str(protocol), "--out", str(run_dir)]
        command += ["--order-seed", str(p.order_seed + i)]
        if run_dir.exists() and any(run_dir.iterdir()):
            command.append("--resume")
        print(f"replicate {i} of {n}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=same_code_env())  # its output passes through
        if done.returncode not in (0, GATE_FAILED):
            raise RunError(f"replicate {name} failed (exit {done.returncode}); its error is printed above")
    table = cross_run(out, n)
    write_table(out, table)
    return table
