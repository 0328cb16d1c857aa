"""The workflow commands: `dispatch derive`, `protocol confirm`, `replicate`, `suite`.

Track 1: exploration -> a rule derived from the runs -> one frozen confirmation of the
dispatcher on fresh seeds, linked to those runs by digest -> N independent replicates of it.
A suite runs every protocol of a directory under one tag (a model's micro-ops). Thin: each
command parses, calls the library (imported inside it: `kerneltrial --help` stays torch-free)
and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kerneltrial.cli import records
from kerneltrial.cli.support import ExitCode, console, emit_json, sub_app
from kerneltrial.rundir.layout import REPLICATES_MD

dispatch_app = sub_app("Shape dispatch rules derived from trials.")


@dispatch_app.command("derive")
def derive(
    runs: Annotated[list[Path], typer.Argument(help="Exploratory run directories of one operator on one device.")],
    out: Annotated[Path, typer.Option(help="The rule file to write (TOML), e.g. next to the dispatcher module.")],
) -> None:
    """Per case the fastest eligible geometry (control or concrete candidate, timed and checked),
    reduced to ordered row-count thresholds per width (and layout where the layouts disagree);
    every branch cites its cases, runs (summary sha256) and predicted speedups with CIs."""
    from kerneltrial.analysis.dispatch import derive_rule

    rule = derive_rule(runs, out)
    for branch in rule.branches:
        cases = ", ".join(c.case for c in branch.cases)
        console().print(
            f"width {branch.width} layout {branch.layout} rows >= {branch.min_rows}: {branch.arm}  ({cases})",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    console().print(f"other widths: {rule.default}; wrote {out}", highlight=False, markup=False, soft_wrap=True)


def confirm(
    rule: Annotated[Path, typer.Argument(help="The rule file the dispatcher module loads (from `dispatch derive`).")],
    module: Annotated[Path, typer.Option(help="The dispatcher module (a .py file whose rule is RULE).")],
    out: Annotated[Path, typer.Option(help="Where to write the confirmation protocol (TOML).")],
    seeds: Annotated[
        str | None,
        typer.Option(help="Comma-separated fresh seeds; default: as many as the first run's, above every seed used."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Protocol name (default: <op>-confirmation).")] = None,
) -> None:
    """Write a confirmation protocol: the dispatcher module as its one candidate, the control,
    the derived-from runs' cases and settings (gate included), fresh seeds, and the sha256 of
    the rule and of each run it was derived from. Review it, then freeze it."""
    from kerneltrial.trial.confirm import write_confirmation

    seed_list = None
    if seeds is not None:
        try:
            seed_list = [int(s) for s in seeds.split(",")]
        except ValueError:
            raise ValueError(f"malformed --seeds {seeds!r}; write integers separated by commas, e.g. 3,4,5") from None
    write_confirmation(rule, module, out, seeds=seed_list, name=name)
    console().print(f"wrote {out}; review it, then: kerneltrial protocol freeze {out}", soft_wrap=True)


def replicate(
    protocol: Annotated[Path, typer.Argument(help="A frozen protocol.")],
    runs: Annotated[int, typer.Option("--runs", min=2, help="Independent runs (fresh processes, order seeds 1..N).")],
    out: Annotated[Path, typer.Option(help="Directory for run-1..N, replicates.json and replicates.md.")],
) -> None:
    """Run one frozen protocol N times, each in a fresh process with its own order seed, then
    summarise across runs: per case each run's verdict, wins in k of N, the stricter gate
    'win on every case in every run', and between-run spread next to the within-run CIs.
    Exit 0 when some candidate passed that stricter gate, 1 when none did."""
    from kerneltrial.trial.replicate import run_replicates

    table = run_replicates(protocol, runs, out)
    console().print((out / REPLICATES_MD).read_text(), highlight=False, markup=False, soft_wrap=True)
    console().print(f"next: kerneltrial verify {out}", soft_wrap=True)
    if not any(arm.every_case_every_run for arm in table.arms):
        raise typer.Exit(ExitCode.FAILED)


def suite(
    name: Annotated[str, typer.Argument(help="A directory of protocols, or NAME for protocols/NAME.")],
    tag: Annotated[str, typer.Option(help="The suite's tag, one word (e.g. E0), recorded in suite.json.")],
    out: Annotated[Path, typer.Option(help="Suite directory: one run directory per protocol, suite.json.")],
    resume: Annotated[bool, typer.Option(help="Continue an interrupted suite: finished runs are kept.")] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="Print one JSON document on stdout; human output goes to stderr.")
    ] = False,
) -> None:
    """Run every protocol of a directory (*.toml, in name order), each as `kerneltrial run` in a
    fresh process into OUT/<protocol stem>, and record the suite in OUT/suite.json (tag, protocol
    sha256s, each run's status, times, the code's commit). Exit 0 when every protocol ran to a
    summary, whatever its gate; 1 when some run failed (the others still ran)."""
    from kerneltrial.trial.suite import run_suite

    record = run_suite(name, tag, out, resume=resume)
    human = console(stderr=json_)
    for entry in record.runs:
        human.print(
            f"{entry.protocol}: {entry.status} (exit {entry.exit_code}) -> {out / entry.run}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    human.print(f"next: kerneltrial verify {out} && kerneltrial report {out}", soft_wrap=True, markup=False)
    if json_:
        emit_json(
            records.SuiteResult(
                suite_dir=str(out),
                name=record.name,
                tag=record.tag,
                complete=record.complete,
                runs=[records.SuiteRunStatus(r.protocol, str(out / r.run), r.status, r.exit_code) for r in record.runs],
            )
        )
    if not record.complete:
        raise typer.Exit(ExitCode.FAILED)


def mount(app: typer.Typer) -> None:
    from kerneltrial.cli.protocol import protocol_app

    app.add_typer(dispatch_app, name="dispatch")
    protocol_app.command("confirm")(confirm)
    app.command("replicate")(replicate)
    app.command("suite")(suite)
