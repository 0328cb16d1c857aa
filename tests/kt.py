"""The one way tests write a protocol file and call the CLI (`from tests.kt import ...`).

`run_cli` runs `kerneltrial.cli.app` in-process (typer's CliRunner, wide enough that no message
wraps); `run_process` runs it as a user does, in a fresh interpreter, for the tests about processes
(what a pipe, not a terminal, receives; a kernel that never returns); `cli_argv` is its argv for
the tests that signal it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from kerneltrial.cli import app
from tests.conftest import REPO

WIDTH = 400  # columns: wider than any message, so none wraps mid-phrase


@dataclass(frozen=True)
class CliResult:
    """What one CLI call left: its exit status, stdout, stderr, and output (both streams: in the
    order written for `run_cli`, stdout then stderr for `run_process`)."""

    exit_code: int
    stdout: str
    stderr: str
    output: str


def run_cli(*args: str | Path) -> CliResult:
    """`kerneltrial ARGS` in-process; serving commands are `run_cli("serve", ...)`."""
    result = CliRunner().invoke(app, [str(a) for a in args], terminal_width=WIDTH)
    return CliResult(result.exit_code, result.stdout, result.stderr, result.output)


def cli_argv(*args: str | Path) -> list[str]:
    """The argv of `kerneltrial ARGS` in a fresh interpreter (for subprocess.Popen)."""
    return [sys.executable, "-m", "kerneltrial.cli", *map(str, args)]


def run_process(*args: str | Path, timeout: float = 900) -> CliResult:
    """`kerneltrial ARGS` as a user runs it: a fresh interpreter in the repository, stdout and
    stderr piped; `timeout` seconds at most."""
    done = subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return CliResult(done.returncode, done.stdout, done.stderr, done.stdout + done.stderr)


def write_protocol(path: Path, text: str, **fields: object) -> Path:
    """Write a protocol (kernel, serving or model: TOML text) to `path` and return the path. With
    fields, `text` is a template filled by str.format (its literal braces doubled)."""
    path.write_text(text.format(**fields) if fields else text)
    return path
