"""Analysis commands (verify, report, compare, performance), mounted on the main app.

Thin: parse arguments, call the library, print. Errors and exit codes follow
`cli_support`: bad input (a missing directory, a directory that is not a run directory)
is one `error:` line and exit 2; a run that fails verification exits 1.

Publication verifies: `report`, `compare` and `performance` run the independent verification
of every run they render first (`require_verified`, each directory once per command) and
refuse a run that fails it, exit 1, naming the failed checks; `--unverified` renders anyway
and every page then says UNVERIFIED in its title (publication.py). A page or figure that fails is
derived data, not a reason to refuse: `report` renders the page again, `report` and `plot` draw a
kernel run's figure again (`require_verified`), and `verify` keeps failing it until then.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from kerneltrial.cli import records
from kerneltrial.cli.support import CliError, ExitCode, emit_json
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.layout import ADDED_FIGURES, PROVENANCE, REPLICATES_MD, REPORT, SIZE_PNG, kind_of
from kerneltrial.rundir.summary_doc import read_summary

RunDirs = Annotated[list[Path], typer.Argument(help="Run directories (each holds provenance.json, plan.json, ...).")]
RunDir = Annotated[Path, typer.Argument(help="A run directory with summary.json.")]
Json = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON document on stdout (schema in its `schema` field); human output goes to stderr."
    ),
]


Unverified = Annotated[
    bool,
    typer.Option(
        "--unverified",
        help="Render without requiring `kerneltrial verify` to pass; every page then says UNVERIFIED in its title.",
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
    """The verifier of the directory's kind (`rundir.layout.kind_of`): kernel, replicate, suite,
    fleet, model or serving. `regrade`: serving runs re-grade every accuracy answer."""
    kind = kind_of(run_dir)
    if kind == "model":
        return _verify_model(run_dir)
    if kind == "serving":
        return _verify_serving(run_dir, regrade)
    if kind == "replicates":
        from kerneltrial.replicates.record import verify_replicates

        return verify_replicates(run_dir)
    if kind == "suite":
        from kerneltrial.suite.record import verify_suite

        return verify_suite(run_dir)
    if kind == "fleet":
        from kerneltrial.fleet.record import verify_fleet

        return verify_fleet(run_dir)
    from kerneltrial.kernel.verify import verify_run_dir  # `--help` stays fast

    return verify_run_dir(run_dir)


def _verify_model(run_dir: Path) -> VerifyResult:
    from kerneltrial.analysis.model_report import render
    from kerneltrial.kernel.provenance_checks import commit_problems
    from kerneltrial.kernel.verify import check_written_after
    from kerneltrial.model.verify import verify_model_run

    result = verify_model_run(run_dir)
    result.record("source commit", *commit_problems(read_json(run_dir / PROVENANCE)))
    check_written_after(result, run_dir, run_dir / REPORT, lambda unverified: render(run_dir, unverified))
    return result


def _verify_serving(run_dir: Path, regrade: bool) -> VerifyResult:
    from kerneltrial.kernel.verify import check_written_after
    from kerneltrial.serving.report import render
    from kerneltrial.serving.report_data import load_run
    from kerneltrial.serving.verify import verify_serving_run

    result = verify_serving_run(run_dir, regrade=regrade)
    check_written_after(result, run_dir, run_dir / REPORT, lambda unverified: render(load_run(run_dir), unverified))
    return result


def _checks_file(check_name: str, files: tuple[str, ...]) -> bool:
    """A check of one of `files`, named bare or prefixed with the run of a suite, fleet or replicate directory."""
    return any(check_name == name or check_name.endswith(f": {name}") for name in files)


def _derived_page(check_name: str) -> bool:
    """A check of a page `report` writes (a run's report.md, a replicate directory's replicates.md)."""
    return _checks_file(check_name, (REPORT, REPLICATES_MD))


def _replace_figures(run_dir: Path, names: list[str]) -> None:
    """Draw the figures `names` of kernel run `run_dir` again from its raw rows (they failed verify,
    which passed otherwise), each named on stderr."""
    from kerneltrial.kernel.plots import draw_figure

    for name in names:
        path = draw_figure(run_dir, name, unverified=False)
        typer.echo(f"replaced {path}: it did not match the raw rows", err=True)


def require_verified(run_dirs: list[Path], unverified: bool, regrade: bool = True, redraw: bool = False) -> None:
    """Before anything is rendered: every run directory passes the independent verification
    (each verified once), else CliError exit 1 naming the failed checks. A stale or edited
    report.md does not block: no command renders from it, and `report` writes it again (a line
    on stderr names it). `redraw` (`report`, `plot`): nor does a figure of a kernel run directory
    that fails (ADDED_FIGURES: derived data), which is drawn again from the raw rows once the rest
    verifies, a line on stderr saying so; a member run's figure inside a collection still blocks,
    its detail naming the command that replaces it (`report` or `plot` of the member run).
    `unverified`: nothing is verified, and a line on stderr says the pages will say so."""
    if unverified:
        typer.echo("not verified (--unverified): every page written says UNVERIFIED in its title", err=True)
        return
    for run_dir in dict.fromkeys(run_dirs):
        result = verify_one(run_dir, regrade=regrade)
        figures = [c.name for c in result.failures if redraw and c.name in ADDED_FIGURES]
        for check in result.failures:
            if _derived_page(check.name):
                typer.echo(
                    f"{run_dir}: {check.name} is not the rendering of its directory; `report` renders it again",
                    err=True,
                )
        failed = [f"{c.name} ({c.detail})" for c in result.failures if not (_derived_page(c.name) or c.name in figures)]
        if failed:
            raise CliError(
                f"{run_dir} fails verification, so it is not rendered: {len(failed)} check(s) failed: "
                + "; ".join(failed)
                + ". See `kerneltrial verify`; --unverified renders it with UNVERIFIED in every title",
                ExitCode.FAILED,
            )
        _replace_figures(run_dir, figures)


def _verify_mark(check: records.VerifyCheck) -> str:
    """A check's mark on verify's line: a figure present but not compared is a warning, never `ok`."""
    if not check.ok:
        return "FAIL"
    if check.applicable:
        return "ok  "
    return "warn" if _checks_file(check.name, ADDED_FIGURES) else "n/a "


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
        marks = [_verify_mark(check) for check in checks]
        for mark, check in zip(marks, checks, strict=True):
            typer.echo(f"{mark} {check.name}: {check.detail}", err=json_)
        bad, skipped, warned = (marks.count(mark) for mark in ("FAIL", "n/a ", "warn"))
        if bad:
            typer.echo(f"VERIFY FAILED: {bad} of {len(checks)} checks failed in {run_dir}", err=json_)
        else:
            notes = [f"{skipped} not applicable to this run"] if skipped else []
            notes += [f"{warned} warning{'s' if warned > 1 else ''}: a figure not compared"] if warned else []
            typer.echo(
                f"verified: all {len(checks) - skipped - warned} checks passed in {run_dir}"
                + (f" ({'; '.join(notes)})" if notes else ""),
                err=json_,
            )
    ok = all(run.ok for run in runs)
    if json_:
        emit_json(records.VerifyResult(ok=ok, runs=runs))
    if not ok:
        raise typer.Exit(ExitCode.FAILED)


def _write_report(run_dir: Path, unverified: bool) -> Path:
    """The report of `run_dir` by its kind (a replicate, suite or fleet directory: each run's, then the whole's)."""
    kind = kind_of(run_dir)
    if kind == "model":
        from kerneltrial.analysis.model_report import write_model_report

        return write_model_report(run_dir, unverified)
    if kind == "serving":
        from kerneltrial.serving.report import write_serving_report

        return write_serving_report(run_dir, unverified)
    if kind == "replicates":
        from kerneltrial.replicates.record import write_replicates_report

        return write_replicates_report(run_dir, unverified)
    if kind == "suite":
        from kerneltrial.suite.record import write_suite_report

        return write_suite_report(run_dir, unverified)
    if kind == "fleet":
        from kerneltrial.fleet.record import write_fleet_report

        return write_fleet_report(run_dir, unverified)
    from kerneltrial.kernel.report import write_report

    return write_report(run_dir, unverified)


def report(run_dir: RunDir, unverified: Unverified = False, no_regrade: NoRegrade = False) -> None:
    """Verify RUN_DIR, then write report.md and PNG figures into it, drawn from its summary.json (the
    kernel, model or serving report, by the directory's kind; a replicate, suite or fleet directory:
    each run's, and one for the whole). A run that fails verification is not rendered (exit 1), except
    for a kernel run's figures, which are derived: one that fails is replaced, and stderr says so."""
    kind = kind_of(run_dir)
    if kind == "serving":  # a directory the report cannot read is bad input (exit 2), not a failed verify
        from kerneltrial.serving.report_data import load_run

        load_run(run_dir)
    elif kind == "kernel":  # likewise; an interrupted run is told to resume
        read_summary(run_dir)
    require_verified([run_dir], unverified, regrade=not no_regrade, redraw=True)
    typer.echo(f"wrote {_write_report(run_dir, unverified)}")


def export(
    run_dir: RunDir,
    csv: Annotated[bool, typer.Option("--csv", help="A CSV table: a row per (case, arm) of summary.json.")] = False,
    out: Annotated[Path | None, typer.Option(help="File to write (default: standard output).")] = None,
    unverified: Unverified = False,
) -> None:
    """Verify a kernel run, then export its figures: --csv gives a row per (case, arm) with its status,
    verdict, median ns per call, speedup and interval, GB/s, host time per call and the timing label
    (nothing recomputed: summary.json's figures). A run that fails verification is not exported (exit 1)."""
    from kerneltrial.analysis.export import export_csv

    if not csv:
        raise CliError("name the format: --csv (the one export format)")
    if kind_of(run_dir) != "kernel":
        raise CliError(f"{run_dir} is a {kind_of(run_dir)} directory; export takes a kernel run")
    read_summary(run_dir)  # an unreadable or unfinished run is bad input, said before verify
    require_verified([run_dir], unverified)
    text = export_csv(run_dir)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}", err=True)


def plot(
    run_dir: RunDir,
    out: Annotated[
        Path | None,
        typer.Option(help=f"PNG to write (default: {SIZE_PNG} in the run directory, which verify allows there)."),
    ] = None,
    unverified: Unverified = False,
) -> None:
    """Verify a kernel run, then plot each timed arm's median time per call and GB/s against the
    bytes each case moves (log-log, a line per arm): for sweeps (`protocol new --axis`). A run that
    fails verification is not plotted (exit 1), except for its figures, which are derived: one that
    fails is replaced, and stderr says so."""
    from kerneltrial.kernel.plots import plot_against_size

    if kind_of(run_dir) != "kernel":
        raise CliError(f"{run_dir} is a {kind_of(run_dir)} directory; plot takes a kernel run")
    summary = read_summary(run_dir)
    require_verified([run_dir], unverified, redraw=True)
    typer.echo(f"wrote {plot_against_size(summary, out or run_dir / SIZE_PNG, unverified)}")


def _unverified_notes(notes: list[str], unverified: bool) -> list[str]:
    """A --json comparison has no title: its notes open with the unverified mark instead."""
    from kerneltrial.publication import UNVERIFIED, UNVERIFIED_NOTE

    return [f"{UNVERIFIED}: {UNVERIFIED_NOTE}", *notes] if unverified else notes


def require_common(run_a: Path, run_b: Path, rows: int, only_in_a: list[str], only_in_b: list[str]) -> None:
    """Two runs with nothing in common compare nothing: exit 1 and say what each run holds alone."""
    if rows == 0:
        raise CliError(
            f"{run_a} and {run_b} have no case and arm in common, so there is nothing to compare "
            f"(only in A: {', '.join(only_in_a) or 'nothing'}; only in B: {', '.join(only_in_b) or 'nothing'}); "
            "compare runs of the same cases",
            ExitCode.FAILED,
        )


def _compare_serving(run_a: Path, run_b: Path, json_: bool, unverified: bool) -> None:
    from kerneltrial.serving.compare import compare_runs, comparison
    from kerneltrial.serving.report_data import GeomeanInterval

    compared = comparison(run_a, run_b)
    require_common(run_a, run_b, len(compared.rows), compared.only_in_a, compared.only_in_b)
    if not json_:
        typer.echo(compare_runs(run_a, run_b, unverified), nl=False)
        return

    def interval(i: GeomeanInterval | None) -> records.LaunchInterval | None:
        return None if i is None else records.LaunchInterval(i.mean, i.low, i.high, i.n)

    emit_json(
        records.ServingCompareResult(
            run_a=str(run_a),
            run_b=str(run_b),
            notes=_unverified_notes(compared.notes, unverified),
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


def compare(
    run_a: RunDir,
    run_b: RunDir,
    json_: Json = False,
    unverified: Unverified = False,
    no_regrade: NoRegrade = False,
) -> None:
    """Verify both runs, then show them side by side. Kernel runs of one operator: median in A,
    median in B, ratio B/A, the change of each (case, arm) from both runs' raw samples (FAST,
    SLOW, SAME or UNSURE: the unpaired bootstrap interval of B's speedup over A against the tie
    band) with a summary line, each run's speedup over its control with the CI, and each run's verdict.
    Serving runs: per arm and case, total tok/s and mean TTFT over launches with their interval,
    ratio B/A. A run that fails verification is not shown (exit 1)."""
    kinds = (kind_of(run_a), kind_of(run_b))
    if "serving" in kinds and kinds != ("serving", "serving"):
        raise CliError(f"{run_a} is a {kinds[0]} run, {run_b} a {kinds[1]} run: compare two runs of one kind")
    require_verified([run_a, run_b], unverified, regrade=not no_regrade)
    if "serving" in kinds:
        _compare_serving(run_a, run_b, json_, unverified)
        return
    from kerneltrial.analysis.compare import Speedup, compare_runs, comparison

    compared = comparison(run_a, run_b)
    require_common(run_a, run_b, len(compared.rows), compared.only_in_a, compared.only_in_b)
    if not json_:
        typer.echo(compare_runs(run_a, run_b, unverified), nl=False)
        return

    def speedup(s: Speedup | None) -> records.Speedup | None:
        return None if s is None else records.Speedup(s.value, s.ci_low, s.ci_high)

    emit_json(
        records.CompareResult(
            run_a=str(run_a),
            run_b=str(run_b),
            timing_a=compared.label_a,
            timing_b=compared.label_b,
            notes=_unverified_notes(compared.notes, unverified),
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
                    None if r.change is None else records.Change(**asdict(r.change)),
                )
                for r in compared.rows
            ],
            only_in_a=compared.only_in_a,
            only_in_b=compared.only_in_b,
            changes=compared.changes(),
            noise_rule=compared.rule.words(),
        )
    )


def performance(
    run_dirs: RunDirs,
    out: Annotated[Path, typer.Option("--out", help="Markdown file to write (the first page).")] = Path(
        "PERFORMANCE.md"
    ),
    runs_out: Annotated[
        Path | None,
        typer.Option(
            "--runs-out", help="The per-run tables' file (default: results/PERFORMANCE-runs.md beside --out)."
        ),
    ] = None,
    unverified: Unverified = False,
) -> None:
    """Verify every run directory, then render their summaries as PERFORMANCE.md (per operator and
    regime) and its per-run tables (results/PERFORMANCE-runs.md). A run that fails verification
    stops it before anything is written (exit 1)."""
    from kerneltrial.analysis.performance import write_performance_md

    require_verified(run_dirs, unverified)
    typer.echo(f"wrote {write_performance_md(run_dirs, out, runs_out, unverified)}")


def mount(app: typer.Typer) -> None:
    """Register the analysis commands on the main `kerneltrial` app."""
    app.command("verify")(verify)
    app.command("report")(report)
    app.command("compare")(compare)
    app.command("export")(export)
    app.command("plot")(plot)
    app.command("performance")(performance)
