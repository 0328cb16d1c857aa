"""Analysis commands (verify, report, compare, performance), mounted on the main app.

Thin: parse arguments, call the library, print. Errors and exit codes follow
`cli_support`: bad input (a missing directory, a directory that is not a run directory)
is one `error:` line and exit 2; a run that fails verification exits 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kerneltrial import cli_records as records
from kerneltrial.cli_support import CliError, ExitCode, emit_json
from kerneltrial.rundir.layout import kind_of

if TYPE_CHECKING:
    from kerneltrial.analysis.verify import VerifyResult

RunDirs = Annotated[list[Path], typer.Argument(help="Run directories (each holds provenance.json, plan.json, ...).")]
RunDir = Annotated[Path, typer.Argument(help="A run directory with summary.json.")]
Json = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON document on stdout (schema in its `schema` field); human output goes to stderr."
    ),
]


NoRegrade = Annotated[
    bool,
    typer.Option(
        "--no-regrade",
        help="Serving runs: trust the stored accuracy grades instead of re-grading every answer (needed when "
        "math-verify is not installed or is another version than the run's); verify says it did not re-grade.",
    ),
]


def verify_one(run_dir: Path, regrade: bool = True) -> VerifyResult:
    """The kernel verifier (kernel, replicate, suite and fleet directories), the serving one or the model
    one, by the directory's kind (`rundir.layout.kind_of`). `regrade`: serving runs re-grade
    every accuracy answer."""
    from kerneltrial.analysis.verify import VerifyResult, verify_run_dir  # imported here: `--help` stays fast

    kind = kind_of(run_dir)
    if kind == "model":
        from kerneltrial.model.verify import verify_model_run

        result = VerifyResult(run_dir)
        result.add("model run", verify_model_run(run_dir), "every model-trial figure matches")
        return result
    if kind != "serving":
        return verify_run_dir(run_dir)
    from kerneltrial.serving.verify import verified_detail, verify_serving_run

    result = VerifyResult(run_dir)
    result.add("serving run", verify_serving_run(run_dir, regrade=regrade), verified_detail(run_dir))
    if not regrade:
        result.not_applicable("accuracy grades", "not re-graded (--no-regrade): the stored correct flags are trusted")
    return result


def verify(run_dirs: RunDirs, json_: Json = False, no_regrade: NoRegrade = False) -> None:
    """Recompute every figure of each run directory from its raw rows and compare with summary.json.

    Prints one line per check (`ok`, `FAIL`, or `n/a` for a check the run is too old to have)
    and a final line; exits 1 if any check fails, 2 on bad input.
    """
    runs: list[records.VerifiedRun] = []
    for run_dir in run_dirs:
        result = verify_one(run_dir, regrade=not no_regrade)
        checks = [records.VerifyCheck(c.name, c.ok, c.applicable, c.detail) for c in result.checks]
        runs.append(records.VerifiedRun(str(run_dir), result.ok, checks))
        for check in checks:
            mark = "FAIL" if not check.ok else "ok  " if check.applicable else "n/a "
            typer.echo(f"{mark} {check.name}: {check.detail}", err=json_)
        bad = sum(not check.ok for check in checks)
        skipped = sum(not check.applicable for check in checks)
        if bad:
            typer.echo(f"VERIFY FAILED: {bad} of {len(checks)} checks failed in {run_dir}", err=json_)
        else:
            typer.echo(
                f"verified: all {len(checks) - skipped} checks passed in {run_dir}"
                + (f" ({skipped} not applicable to this run)" if skipped else ""),
                err=json_,
            )
    ok = all(run.ok for run in runs)
    if json_:
        emit_json(records.VerifyResult(ok=ok, runs=runs))
    if not ok:
        raise typer.Exit(ExitCode.FAILED)


def report(run_dir: RunDir) -> None:
    """Write report.md and PNG figures into RUN_DIR, drawn from its summary.json (the kernel or
    the serving report, by the directory's kind; a suite or fleet: each run's, and one for the whole)."""
    kind = kind_of(run_dir)
    if kind == "model":
        from kerneltrial.analysis.model_report import write_model_report

        typer.echo(f"wrote {write_model_report(run_dir)}")
        return
    if kind == "serving":
        from kerneltrial.serving.report import write_serving_report

        typer.echo(f"wrote {write_serving_report(run_dir)}")
        return
    if kind == "suite":
        from kerneltrial.analysis.suite import write_suite_report

        typer.echo(f"wrote {write_suite_report(run_dir)}")
        return
    if kind == "fleet":
        from kerneltrial.analysis.fleet import write_fleet_report

        typer.echo(f"wrote {write_fleet_report(run_dir)}")
        return
    from kerneltrial.analysis.report import write_report

    typer.echo(f"wrote {write_report(run_dir)}")


def _compare_serving(run_a: Path, run_b: Path, json_: bool) -> None:
    from kerneltrial.serving.compare import compare_runs, comparison
    from kerneltrial.serving.report_data import Interval

    if not json_:
        typer.echo(compare_runs(run_a, run_b), nl=False)
        return
    compared = comparison(run_a, run_b)

    def interval(i: Interval | None) -> records.LaunchInterval | None:
        return None if i is None else records.LaunchInterval(i.mean, i.low, i.high, i.n)

    emit_json(
        records.ServingCompareResult(
            run_a=str(run_a),
            run_b=str(run_b),
            notes=compared.notes,
            rows=[
                records.ComparedServingCase(
                    r.arm,
                    r.case,
                    r.status_a,
                    r.status_b,
                    interval(r.throughput_a),
                    interval(r.throughput_b),
                    r.throughput_ratio,
                    interval(r.ttft_ms_a),
                    interval(r.ttft_ms_b),
                    r.ttft_ratio,
                )
                for r in compared.rows
            ],
            only_in_a=compared.only_in_a,
            only_in_b=compared.only_in_b,
        )
    )


def compare(run_a: RunDir, run_b: RunDir, json_: Json = False) -> None:
    """Show two runs side by side. Kernel runs of one operator: median in A, median in B, ratio
    B/A, each run's speedup over its control with the CI, and each run's verdict. Serving runs:
    per arm and case, total tok/s and mean TTFT over launches with their interval, ratio B/A."""
    kinds = (kind_of(run_a), kind_of(run_b))
    if "serving" in kinds:
        if kinds != ("serving", "serving"):
            raise CliError(f"{run_a} is a {kinds[0]} run, {run_b} a {kinds[1]} run: compare two runs of one kind")
        _compare_serving(run_a, run_b, json_)
        return
    from kerneltrial.analysis.compare import Speedup, compare_runs, comparison

    if not json_:
        typer.echo(compare_runs(run_a, run_b), nl=False)
        return
    compared = comparison(run_a, run_b)

    def speedup(s: Speedup | None) -> records.Speedup | None:
        return None if s is None else records.Speedup(s.value, s.ci_low, s.ci_high)

    emit_json(
        records.CompareResult(
            run_a=str(run_a),
            run_b=str(run_b),
            timing_a=compared.label_a,
            timing_b=compared.label_b,
            notes=compared.notes,
            rows=[
                records.ComparedArm(
                    r.case,
                    r.arm,
                    r.median_a_ns,
                    r.median_b_ns,
                    r.ratio,
                    speedup(r.speedup_a),
                    speedup(r.speedup_b),
                    r.verdict_a,
                    r.verdict_b,
                )
                for r in compared.rows
            ],
            only_in_a=compared.only_in_a,
            only_in_b=compared.only_in_b,
        )
    )


def performance(
    run_dirs: RunDirs,
    out: Annotated[Path, typer.Option("--out", help="Markdown file to write.")] = Path("PERFORMANCE.md"),
) -> None:
    """Render several run directories' summaries as one markdown file, such as PERFORMANCE.md."""
    from kerneltrial.analysis.performance import write_performance_md

    typer.echo(f"wrote {write_performance_md(run_dirs, out)}")


def mount(app: typer.Typer) -> None:
    """Register the analysis commands on the main `kerneltrial` app."""
    app.command("verify")(verify)
    app.command("report")(report)
    app.command("compare")(compare)
    app.command("performance")(performance)
