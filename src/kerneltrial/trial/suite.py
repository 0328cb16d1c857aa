"""Suites: every protocol of one directory, run one after another (`kerneltrial suite`).

The protocols are the directory's *.toml files in name order; all are checked (parsed, arms
resolved, cases validated against their operators) before the first runs, so a typo in the
last one does not surface after the others have used the GPU. Each runs as `python -m
kerneltrial.cli run PROTOCOL --out DIR/<stem>` in a fresh process, exactly as a lone `run`
would (no compiled kernel, allocator state or imported peer carries from one operator to the
next), its output on stderr. suite.json (suite/record.py) is written before the first run
and after each: a killed or interrupted suite continues with `--resume`, which skips finished
runs and resumes an unfinished one with `run --resume`. A run that fails (an exit other than
0, or 1 for a gate no arm passed) is recorded and the suite goes on to the next protocol.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from kerneltrial.ops.registry import get_op
from kerneltrial.rundir.documents import Git
from kerneltrial.rundir.files import now
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import MANIFEST, SUITE, SUMMARY
from kerneltrial.rundir.provenance import git_state, source_digest
from kerneltrial.suite.record import Suite, SuiteRun, read_suite, write_suite
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.replicate import GATE_FAILED, same_code_env
from kerneltrial.trial.runner import RunError, check_arms

TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
PROTOCOLS = Path("protocols")  # NAME that is no directory is looked up here (from the working directory)
DESCRIPTION = "README.md"  # a protocol directory's description, copied into suite.json
INTERRUPT_GRACE_S = 30.0  # an interrupted run gets this long to write its rows and exit (130)


def protocol_dir(name: str) -> Path:
    """NAME as a directory, else protocols/NAME."""
    for candidate in (Path(name), PROTOCOLS / name):
        if candidate.is_dir():
            return candidate
    raise proto.ProtocolError(
        f"no protocol directory {name!r}: neither {Path(name)} nor {PROTOCOLS / name} is a directory"
    )


def protocol_files(directory: Path) -> list[Path]:
    """The directory's protocols, *.toml in name order, each checked as `run` would before any work."""
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise proto.ProtocolError(f"{directory} holds no protocol (*.toml); a suite runs every protocol of a directory")
    for path in files:
        p = proto.load(path)
        check_arms(path, p)
        op = get_op(p.op)
        for spec in p.cases:
            op.validate(spec.case())
    return files


def check_tag(tag: str) -> None:
    if not TAG.fullmatch(tag):
        raise ValueError(f"tag {tag!r} is not one word; use letters, digits, - and _ (e.g. E0)")


def _start(directory: Path, files: list[Path], tag: str, out: Path, resume: bool) -> Suite:
    """A new suite record in an empty `out`, or, with `resume`, the record there, once it is
    shown to be the same suite (name, tag, protocol files and their bytes, kerneltrial code)."""
    runs = [SuiteRun(protocol=f.name, sha256=sha256_file(f), run=f.stem) for f in files]
    if (out / SUITE).is_file():
        if not resume:
            raise RunError(f"{out} holds a suite; continue it with --resume or choose another --out")
        suite = read_suite(out)
        if (suite.name, suite.tag) != (directory.name, tag):
            raise RunError(
                f"{out} holds suite {suite.name!r} tag {suite.tag!r}, not {directory.name!r} tag {tag!r}; choose another --out"
            )
        if [(r.protocol, r.sha256) for r in suite.runs] != [(r.protocol, r.sha256) for r in runs]:
            raise RunError(
                f"{out} was started with other protocols ({', '.join(r.protocol for r in suite.runs)}, or other "
                f"bytes); --resume needs the protocol files it started with"
            )
        if suite.git.source_sha256 != source_digest():
            raise RunError(
                f"{out} was started by other kerneltrial code (source sha256 {str(suite.git.source_sha256)[:12]}..., "
                f"commit {suite.git.commit}); resume it with that code or start a new suite"
            )
        return suite
    if out.exists() and any(out.iterdir()):
        raise RunError(f"{out} is not empty and holds no suite; choose another --out")
    description = directory / DESCRIPTION
    suite = Suite(
        name=directory.name,
        tag=tag,
        protocols_dir=str(directory),
        description=description.read_text() if description.is_file() else None,
        git=Git(**git_state()),
        started_at=now(),
        finished_at=None,
        runs=runs,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_suite(out, suite)
    return suite


def _run_protocol(protocol: Path, run_dir: Path) -> int:
    """`kerneltrial run` of one protocol in a fresh process, its output on our stderr; its exit code."""
    command = [sys.executable, "-m", "kerneltrial.cli", "run", str(protocol), "--out", str(run_dir)]
    if run_dir.is_dir() and any(run_dir.iterdir()):
        command.append("--resume")
    print(" ".join(["kerneltrial", *command[3:]]), file=sys.stderr, flush=True)
    child = subprocess.Popen(command, env=same_code_env(), stdout=2)  # fd 2: stdout stays free for --json
    try:
        return child.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the child too: let it keep its rows and exit
        try:
            child.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def run_suite(name: str, tag: str, out: Path, resume: bool = False) -> Suite:
    """Run every protocol of the directory `name` (or protocols/`name`) into `out`/<stem>, one
    after another, recording the suite in `out`/suite.json; returns the final record."""
    check_tag(tag)
    directory = protocol_dir(name)
    files = protocol_files(directory)
    suite = _start(directory, files, tag, out, resume)
    for index, entry in enumerate(suite.runs):
        if entry.status == "finished":
            continue
        run_dir = out / entry.run
        if (run_dir / MANIFEST).is_file():  # written last: the run ended, the suite was stopped before recording it
            suite = _replace(out, suite, index, entry.model_copy(update={"status": "finished", "finished_at": now()}))
            continue
        start = {"status": "running", "exit_code": None, "started_at": now(), "finished_at": None}
        entry = entry.model_copy(update=start)
        suite = _replace(out, suite, index, entry)
        code = _run_protocol(files[index], run_dir)
        if code in (130, -signal.SIGINT):  # the run was interrupted (not by us): so is the suite
            raise KeyboardInterrupt
        finished = code in (0, GATE_FAILED) and (run_dir / SUMMARY).is_file()
        update = {"status": "finished" if finished else "failed", "exit_code": code, "finished_at": now()}
        suite = _replace(out, suite, index, entry.model_copy(update=update))
    if suite.complete:
        suite = suite.model_copy(update={"finished_at": suite.finished_at or now()})
        write_suite(out, suite)
    return suite


def _replace(out: Path, suite: Suite, index: int, entry: SuiteRun) -> Suite:
    runs = [entry if i == index else r for i, r in enumerate(suite.runs)]
    suite = suite.model_copy(update={"runs": runs})
    write_suite(out, suite)
    return suite
