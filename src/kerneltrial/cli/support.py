"""The one error path and output rules of every `kerneltrial` command (torch-free, cheap to import).

Exit codes (shown in `kerneltrial --help`, the README and docs/WORKFLOW.md, "Command line"):

  0    ok
  1    a verdict or check failed: the gate passed no arm, verify found problems, a serving
       trial was REJECTED, a correctness check failed or outlasted its timeout
  2    bad input: usage errors, missing or malformed files, protocols, run directories,
       unknown operators or arms
  130  interrupted (Ctrl-C; SIGTERM too in `serve`): data written so far stays as the runner left it

Every error prints one line to stderr, `error: <what is wrong and how to fix it>`, never a
traceback (a traceback means a bug in kerneltrial). Commands raise `CliError` for their own
errors; the library's errors (ValueError, OSError, and the classes kerneltrial defines) are
bad input unless the command translates them. `app()` puts the path on the root group, so a
command mounted anywhere under it cannot miss it.

Output: when stdout or stderr is not a terminal (a pipe, a log), Rich consoles are wide
enough that no table or line is cut or wrapped at 80 columns; help text is plain (no Rich
markup), so `[...]` in an option's help survives. Progress (`progress_bar`): a live bar on a
terminal, a plain line per tenth in logs and pipes. `within` bounds a call that may never return.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

try:  # recent typer vendors click; earlier versions depend on it
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from rich.console import Console
    from rich.progress import Progress


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    INTERRUPTED = 130


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a verdict or check failed (gate passed no arm, verify found problems, "
    "serving trial REJECTED, check failed); 2 bad input (usage, files, protocol, run directory); "
    "130 interrupted (data written so far is kept)."
)

# Wide enough for any table row or message we print; Rich cuts or wraps at its width (80 off a terminal).
PIPE_WIDTH = 10_000


class CliError(Exception):
    """An expected failure: printed as one `error:` line, the process exits with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def _say(code: ExitCode, message: str) -> None:
    """One line on stderr (newlines folded: one line is what a log grep finds); `error: ...`
    except for an interruption, which is what the user asked for."""
    prefix = "" if code == ExitCode.INTERRUPTED else "error: "
    print(prefix + " ".join(message.split()), file=sys.stderr, flush=True)


def exit_now(code: ExitCode, message: str) -> NoReturn:
    """The error path's line, then the end of the process without clean-up: for a thread that
    cannot be stopped (a kernel that never returns), whose interpreter shutdown would hang or
    abort."""
    _say(code, message)
    os._exit(code)


def _is_kerneltrials(exc: BaseException) -> bool:
    return any(cls.__module__.startswith("kerneltrial.") for cls in type(exc).__mro__)


def exit_code_of(exc: BaseException) -> tuple[ExitCode, str] | None:
    """The exit code and message for an expected exception; None for a bug (a traceback)."""
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED, "interrupted"
    if type(exc).__name__ == "NoArgsIsHelpError":  # (click >= 8.2) it prints the help; typer tests the name too
        return None
    if isinstance(exc, UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else "kerneltrial"
        return ExitCode.BAD_INPUT, f"{exc.format_message()} (see `{where} --help`)"
    if isinstance(exc, (ValueError, OSError)) or _is_kerneltrials(exc):
        return ExitCode.BAD_INPUT, str(exc) or type(exc).__name__
    return None


@contextmanager
def _one_path() -> Iterator[None]:
    try:
        yield
    except typer.Exit:
        raise
    except (Exception, KeyboardInterrupt) as exc:
        found = exit_code_of(exc)
        if found is None:
            raise
        code, message = found
        _say(code, message)
        raise typer.Exit(code) from None


class Group(TyperGroup):
    """The root group: every error raised while a command parses or runs takes the one path."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        with _one_path():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: typer.Context) -> Any:
        with _one_path():
            return super().invoke(ctx)


def app(help: str, epilog: str | None = None) -> typer.Typer:
    """A Typer app with the one error path and plain help (Rich markup would eat `[...]`)."""
    return typer.Typer(
        cls=Group,
        help=help,
        epilog=epilog,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )


def sub_app(help: str) -> typer.Typer:
    """A command group mounted under an `app`: plain help; errors reach the root's path."""
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None)


def console(stderr: bool = False) -> Console:
    """A Rich console for stdout (or stderr) that never cuts output off a terminal."""
    from rich.console import Console

    probe = Console(stderr=stderr)
    width = None if probe.is_terminal else PIPE_WIDTH
    return Console(stderr=stderr, emoji=False, highlight=False, width=width)  # ":boom:" in an arm name stays text


def emit_json(record: DataclassInstance) -> None:
    """The command's one JSON document on stdout (human output went to stderr)."""
    sys.stdout.write(json.dumps(asdict(record), indent=2) + "\n")
    sys.stdout.flush()


T = TypeVar("T")


def within(seconds: float, what: str, work: Callable[[], T]) -> T:
    """`work()`, or, when it has not returned after `seconds` (a kernel that never returns),
    one error line and the end of the process with exit code 1 (a check failed): a hung call
    cannot be interrupted from Python, and waiting for it forever helps no one. Ctrl-C while
    it runs ends the process the same way, with exit code 130."""
    done: list[T] = []
    failure: list[BaseException] = []
    finished = threading.Event()  # not Thread.is_alive: a join interrupted by Ctrl-C marks a live thread stopped (3.11)

    def run() -> None:
        try:
            done.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
        finally:
            finished.set()

    deadline = time.monotonic() + seconds
    try:
        threading.Thread(target=run, daemon=True).start()
        # short waits: a Ctrl-C the kernel delivers to another thread wakes no long wait in this one
        while not finished.wait(0.1) and time.monotonic() < deadline:
            pass
    except KeyboardInterrupt:
        if not finished.is_set():  # a live worker aborts the interpreter's shutdown: end here
            exit_now(ExitCode.INTERRUPTED, "interrupted")
        raise
    if not finished.is_set():
        exit_now(
            ExitCode.FAILED, f"{what} did not return within {seconds:g} s (a kernel that never returns?); stopping"
        )
    if failure:
        raise failure[0]
    return done[0]


class LineProgress:
    """Progress for logs and pipes (stderr not a terminal): one plain line per task each time it
    passes another tenth of its total, or LINE_EVERY_S seconds after the last line."""

    LINE_EVERY_S = 30.0

    def __init__(self) -> None:
        self.tasks: list[dict[str, Any]] = []

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, completed: int = 0, **_: Any) -> int:
        self.tasks.append(
            {
                "description": description,
                "total": total or 0,
                "completed": completed,
                "started": time.monotonic(),
                "printed": time.monotonic(),
                "tenth": -1,
            }
        )
        return len(self.tasks) - 1

    def update(self, task: int, total: float | None = None, **_: Any) -> None:
        if total is not None:
            self.tasks[task]["total"] = total

    def advance(self, task: int, advance: int = 1) -> None:
        t = self.tasks[task]
        t["completed"] += advance
        tenth = int(10 * t["completed"] / t["total"]) if t["total"] else 10
        now = time.monotonic()
        if tenth > t["tenth"] or now - t["printed"] >= self.LINE_EVERY_S:
            t["tenth"], t["printed"] = tenth, now
            print(
                f"{t['description']}: {t['completed']}/{t['total']} after {now - t['started']:.0f} s",
                file=sys.stderr,
                flush=True,
            )


def progress_bar() -> Progress | LineProgress:
    """A live bar on a terminal; plain lines in logs and pipes (a bar prints nothing there)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = console(stderr=True)
    if not err.is_terminal:
        return LineProgress()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise CliError(f"malformed shape {text!r}; write dimensions joined by 'x', e.g. 4096x2048") from None
    if not shape or any(s <= 0 for s in shape):
        raise CliError(f"malformed shape {text!r}; every dimension must be a positive integer")
    return shape


AXIS_HELP = (
    "A named axis swept over the --shape templates, NAME=v1,v2,... (nvbench's --axis): "
    "--shape Rx2048 --axis R=1,64,4096 gives 1x2048, 64x2048 and 4096x2048; several axes give every "
    "combination."
)


def swept_shapes(templates: list[str], axes: list[str]) -> list[tuple[int, ...]]:
    """The --shape templates with every combination of the --axis values put in for their names
    (a dimension of a template is a number or an axis name); each axis must appear in some
    template and each name in a template must be an axis."""
    if not axes:
        return list(dict.fromkeys(parse_shape(t) for t in templates))
    values: dict[str, list[int]] = {}
    for axis in axes:
        name, sep, listed = axis.partition("=")
        if not sep or not name.isidentifier() or not listed:
            raise CliError(f"malformed --axis {axis!r}; write NAME=v1,v2,..., e.g. R=1,64,4096")
        if name in values:
            raise CliError(f"--axis {name} is given twice; list every value in one --axis {name}=...")
        values[name] = [d for v in listed.split(",") for d in parse_shape(v)]
    used = {part for t in templates for part in t.lower().split("x") if not part.isdigit()}
    unknown = sorted(used - {n.lower() for n in values})
    if unknown:
        raise CliError(f"--shape names {', '.join(unknown)}, which no --axis gives; add --axis {unknown[0]}=...")
    idle = sorted(n for n in values if n.lower() not in used)
    if idle:
        raise CliError(f"--axis {idle[0]} appears in no --shape; write it into a template, e.g. --shape {idle[0]}x2048")
    shapes: list[tuple[int, ...]] = []
    for template in templates:
        combos: list[dict[str, int]] = [{}]
        for name, listed in values.items():
            if name.lower() in template.lower().split("x"):
                combos = [c | {name.lower(): v} for c in combos for v in listed]
        for combo in combos:
            text = "x".join(str(combo.get(p, p)) for p in template.lower().split("x"))
            shapes.append(parse_shape(text))
    return list(dict.fromkeys(shapes))
