"""Analysis commands (verify, report, compare, performance), mounted on the main app.

Thin: parse arguments, call the library, print. Bad input (a missing directory, a
directory that is not a run directory) prints one `error:` line and exits 2; a run that
fails verification exits 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import kind_of

if TYPE_CHECKING:
    from kerneltrial.analysis.verify import VerifyResult

T = TypeVar("T")

RunDirs = Annotated[list[Path], typer.Argument(help="Run directories (each holds provenance.json, plan.json, ...).")]
RunDir = Annotated[Path, typer.Argument(help="A run directory with summary.json.")]


def _or_exit(action: Callable[[], T]) -> T:
    """Run `action`; bad input becomes one error line and exit code 2, not a traceback."""
    try:
        return action()
    except (RunDirError, OSError, json.JSONDecodeError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    except KeyError as error:
        typer.echo(f"error: malformed run directory: missing field {error}", err=True)
        raise typer.Exit(2) from None


def _verify_one(run_dir: Path) -> VerifyResult:
    """The kernel or the serving verifier, by the run directory's kind."""
    from kerneltrial.analysis.verify import VerifyResult, verify_run_dir  # imported here: `--help` stays fast

    if kind_of(run_dir) == "kernel":
        return verify_run_dir(run_dir)
    from kerneltrial.serving.verify import verify_serving_run

    result = VerifyResult(run_dir)
    result.add("serving run", verify_serving_run(run_dir), "every serving figure matches")
    return result


def verify(run_dirs: RunDirs) -> None:
    """Recompute every figure of each run directory from its raw rows and compare with summary.json.

    Prints one line per check (`ok`, `FAIL`, or `n/a` for a check the run is too old to have)
    and a final line; exits 1 if any check fails, 2 on bad input.
    """
    failed = False
    for run_dir in run_dirs:
        result = _or_exit(lambda: _verify_one(run_dir))  # noqa: B023 (called at once, inside the loop)
        for check in result.checks:
            mark = "FAIL" if not check.ok else "ok  " if check.applicable else "n/a "
            typer.echo(f"{mark} {check.name}: {check.detail}")
        bad = len(result.failures)
        skipped = sum(not check.applicable for check in result.checks)
        if bad:
            typer.echo(f"VERIFY FAILED: {bad} of {len(result.checks)} checks failed in {run_dir}")
        else:
            typer.echo(
                f"verified: all {len(result.checks) - skipped} checks passed in {run_dir}"
                + (f" ({skipped} not applicable to this run)" if skipped else "")
            )
        failed = failed or bad > 0
    if failed:
        raise typer.Exit(1)


def report(run_dir: RunDir) -> None:
    """Write report.md and PNG figures into RUN_DIR, drawn from its summary.json."""
    from kerneltrial.analysis.report import write_report

    typer.echo(f"wrote {_or_exit(lambda: write_report(run_dir))}")


def compare(run_a: RunDir, run_b: RunDir) -> None:
    """Show the same cases of two runs side by side: median in A, median in B, ratio B/A."""
    from kerneltrial.analysis.compare import compare_runs

    typer.echo(_or_exit(lambda: compare_runs(run_a, run_b)), nl=False)


def performance(
    run_dirs: RunDirs,
    out: Annotated[Path, typer.Option("--out", help="Markdown file to write.")] = Path("PERFORMANCE.md"),
) -> None:
    """Render one markdown file (e.g. PERFORMANCE.md) from several run directories' summaries."""
    from kerneltrial.analysis.report import write_performance_md

    typer.echo(f"wrote {_or_exit(lambda: write_performance_md(run_dirs, out))}")


def mount(app: typer.Typer) -> None:
    """Register the analysis commands on the main `kerneltrial` app."""
    app.command("verify")(verify)
    app.command("report")(report)
    app.command("compare")(compare)
    app.command("performance")(performance)
