"""Kernel commands: `ops`, `check` (its logic: trial/check.py), `run`, `calibrate`; it mounts
`protocol new|freeze` (cli/protocol.py) and `demo` (cli/demo.py) beside them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kerneltrial.cli import records
from kerneltrial.cli.demo import demo
from kerneltrial.cli.protocol import protocol_app
from kerneltrial.cli.support import (
    AXIS_HELP,
    CliError,
    ExitCode,
    console,
    emit_json,
    progress_bar,
    swept_shapes,
    within,
)
from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.layout import SUMMARY
from kerneltrial.trial.targets import TARGETS

if TYPE_CHECKING:
    from collections.abc import Callable

    from kerneltrial.trial.check import CheckOutcome

TARGET_OPTION = typer.Option(
    "--target",
    help=f"Fail every Triton launch whose grid exceeds this target's limits ({', '.join(TARGETS)}).",
)
PANEL_HELP = (
    "Default cases: 'quick' (the CPU-sized cases, each in one layout, the layouts in turn: the "
    "default without a GPU), 'small' (every CPU-sized case in every layout) or 'gpu' (realistic: the "
    "default with one)."
)
JSON_HELP = "Print one JSON document on stdout (schema in its `schema` field); human output goes to stderr."


def ops() -> None:
    """List the operators, their implementations, and which peers are available here."""
    from rich.markup import escape

    from kerneltrial.ops.launch import interpreted
    from kerneltrial.ops.registry import all_ops

    out = console()
    if interpreted():
        out.print("[yellow]No GPU visible: kernels run through the Triton interpreter.[/yellow]")
    for op in all_ops():
        impls = list(op.impls.values())
        ours = [i.name for i in impls if i.available and i.kind in ("control", "candidate")]
        others = [f"{i.name} ({i.kind})" for i in impls if i.available and i.kind not in ("control", "candidate")]
        missing = [f"{i.name} ({i.reason})" for i in impls if not i.available]
        out.print(f"[bold]{escape(op.signature)}[/bold]  layouts: {', '.join(op.layouts)}")
        out.print(f"  ours: {', '.join(ours)}", highlight=False, markup=False, soft_wrap=True)
        if others:
            out.print(f"  peers and user arms: {', '.join(others)}", highlight=False, markup=False, soft_wrap=True)
        if missing:
            out.print(f"  unavailable here: {'; '.join(missing)}", highlight=False, markup=False, soft_wrap=True)


def check(
    op: Annotated[str | None, typer.Argument(help="Operator name (see `kerneltrial ops`).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Check every operator.")] = False,
    impl: Annotated[list[str] | None, typer.Option(help="Implementation(s) to check; default: all available.")] = None,
    shape: Annotated[list[str] | None, typer.Option(help="Shape(s) like 4096x2048; default: the panel.")] = None,
    layout: Annotated[list[str] | None, typer.Option(help="Layout(s); default: every layout of the operator.")] = None,
    axis: Annotated[list[str] | None, typer.Option(help=AXIS_HELP)] = None,
    dtype: Annotated[
        str | None, typer.Option(help="dtype of the --shape cases (default: the operator's first).")
    ] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Fresh random inputs per check: seeds 0..N-1.")] = 2,
    inputs_seed: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Seed every draw (values, offsets, eps/cap, extra shapes) from this; default: a fresh one, printed.",
        ),
    ] = None,
    panel: Annotated[str, typer.Option(help=PANEL_HELP)] = "auto",
    impl_module: Annotated[
        list[str] | None,
        typer.Option(
            "--impl-module",
            help="A user's kernel file or module; its operator functions become arms (with OP, it must define OP).",
        ),
    ] = None,
    peers: Annotated[bool, typer.Option(help="Include peers (torch eager, torch.compile, Liger, FlagGems).")] = True,
    jsonl: Annotated[Path | None, typer.Option(help="Also write every check as a JSON line here.")] = None,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Require output bit-identical to the official formula (the float64 oracle keeps its tolerance).",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            min=0.1, help="Seconds one check may take; a kernel that never returns ends the command with exit 1."
        ),
    ] = 600.0,
    target: Annotated[str | None, TARGET_OPTION] = None,
    isolate: Annotated[
        str,
        typer.Option(
            help="Arms that run in a worker process of their own, apart from kerneltrial's: user (the "
            "--impl-module arms; their modules are never imported here), all, or none.",
        ),
    ] = "user",
    json_: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Correctness gate: fresh inputs per seed, poisoned outputs, NaN fails, inputs unchanged,
    nothing written outside the outputs, compared with the official formula and a float64
    oracle. The last column counts output elements 0 / <=1 / <=2 / <=4 / <=16 / >16 ulps
    from the official formula. Exit 1 on any failure or a check that outlasts --timeout (an
    isolated arm's worker that outlasts it is killed: that arm fails, the others go on); 2 on
    bad input (an --impl-module that defines no function OP names the functions it does)."""
    run_checks(
        CheckOptions(
            op=op,
            all_=all_,
            impl=impl,
            shape=shape,
            layout=layout,
            axis=axis,
            dtype=dtype,
            seeds=seeds,
            inputs_seed=inputs_seed,
            panel=panel,
            impl_module=impl_module,
            peers=peers,
            jsonl=jsonl,
            exact=exact,
            timeout=timeout,
            target=target,
            isolate=isolate,
            json_=json_,
        )
    )


@dataclass(frozen=True)
class CheckOptions:
    """`check`'s options, read once from the command line (each one's help: `check`'s parameters)."""

    op: str | None
    all_: bool
    impl: list[str] | None
    shape: list[str] | None
    layout: list[str] | None
    axis: list[str] | None
    dtype: str | None
    seeds: int
    inputs_seed: int | None
    panel: str
    impl_module: list[str] | None
    peers: bool
    jsonl: Path | None
    exact: bool
    timeout: float
    target: str | None
    isolate: str
    json_: bool


def run_checks(o: CheckOptions) -> None:
    """`check` (its docstring): refuse a bad option, check each operator's arms on its cases
    (trial/check.py), then print the table and what was skipped; exit 1 on a failed check."""
    from kerneltrial.ops import inputs as inp
    from kerneltrial.trial.check import PANELS, CheckRequest, operators
    from kerneltrial.trial.check import run_checks as checked
    from kerneltrial.trial.targets import get_target

    if o.isolate not in ("user", "all", "none"):
        raise CliError(f"unknown --isolate {o.isolate!r}; use user, all or none")
    profile = get_target(o.target) if o.target else None
    if o.all_ == (o.op is not None):
        raise CliError("name one operator or pass --all (see `kerneltrial ops`)")
    if o.panel not in ("auto", *PANELS):
        raise CliError(f"unknown panel {o.panel!r}; use {', '.join(PANELS)} or auto")
    if o.axis and not o.shape:
        raise CliError("--axis sweeps a --shape template; pass --shape, e.g. --shape Rx2048 --axis R=1,64")
    shapes = swept_shapes(o.shape, o.axis or []) if o.shape else None
    drawn_from = inp.new_inputs_seed() if o.inputs_seed is None else o.inputs_seed
    request = CheckRequest(
        o.op, operators(o.op, o.all_), o.impl, shapes, o.layout, o.dtype, o.seeds, drawn_from, o.panel,
        o.impl_module or [], o.peers, o.exact, o.timeout, profile, o.isolate,
    )  # fmt: skip
    with progress_bar() as bar:

        def progress(name: str, total: int) -> Callable[[], None]:
            task = bar.add_task(name, total=total)
            return lambda: bar.advance(task)

        outcome = checked(request, within, progress)
    print_checks(o, drawn_from, profile.name if profile else None, outcome)


def print_checks(o: CheckOptions, inputs_seed: int, target: str | None, outcome: CheckOutcome) -> None:
    """`check`'s output: the table (title: the device type, the interpreter, the --target), the
    inputs seed, what was skipped (the requested arms unavailable here, then the pairs not
    checked), the isolation notes, the counts, and the --jsonl and --json documents; exit 1 on a
    failed check."""
    from rich.markup import escape
    from rich.table import Table

    from kerneltrial.ops import launch
    from kerneltrial.trial.check import check_row

    device = outcome.device.type
    checked = [c for part in outcome.parts for c in part.checked]
    calls = [records.checked_call(c.op, r.row()) for c in checked for r in c.results]
    requested = outcome.requested
    unavailable = {f"{op}/{i.name}: {i.reason}" for op, impls in requested.items() for i in impls if not i.available}
    skipped = sorted(unavailable) + [line for part in outcome.parts for line in part.not_checked]
    out = console(stderr=o.json_)
    table = Table(
        title=f"correctness on {device}"
        + (" (Triton interpreter)" if launch.interpreted() else "")
        + (f", launches checked against {target}" if target else ""),
        caption=CHECK_COLUMNS_NOTE,
    )
    for column in CHECK_COLUMNS:
        table.add_column(column)
    for row in map(check_row, checked):
        table.add_row(*map(escape, row), style=None if row[4] == "pass" else "red")
    out.print(table)
    out.print(f"inputs seed {inputs_seed} (--inputs-seed {inputs_seed} draws the same inputs again)", markup=False)
    if o.jsonl:
        o.jsonl.write_text("".join(json.dumps(asdict(c)) + "\n" for c in calls))
    for line in skipped:
        out.print(f"skipped {line}", markup=False, soft_wrap=True)
    for note in outcome.notes:
        out.print(f"warning: {note}", markup=False, soft_wrap=True)
    failed = [c for c in calls if not c.passed]
    out.print(f"{len(calls) - len(failed)} passed, {len(failed)} failed")
    if o.json_:
        emit_json(
            records.CheckResult(
                device=device,
                interpreted=launch.interpreted(),
                inputs_seed=inputs_seed,
                passed=len(calls) - len(failed),
                failed=len(failed),
                failing_arms=list(dict.fromkeys(f"{c.op}/{c.arm}" for c in failed)),
                checks=calls,
                skipped=skipped,
            )
        )
    if failed:
        raise typer.Exit(ExitCode.FAILED)


CHECK_COLUMNS = (
    "operator",
    "case",
    "arm",
    "seeds",
    "result",
    "max abs (worse of formula, oracle)",
    "max rel (worse of formula, oracle)",
    "ulp (worse of formula, oracle)",
    "ulps from formula: 0/≤1/≤2/≤4/≤16/>16",
)
CHECK_COLUMNS_NOTE = (
    "max abs, max rel, ulp: the largest difference over the seeds from either reference, the official torch "
    "formula or the float64 oracle; a kernel identical to the formula still differs from the oracle by the "
    "formula's own rounding. The histogram counts output elements by their distance from the formula only."
)


def run(
    protocol: Annotated[Path, typer.Argument(help="Protocol TOML file.")],
    out: Annotated[Path, typer.Option(help="Run directory to create (or to continue with --resume).")],
    resume: Annotated[
        bool, typer.Option(help="Continue a killed run in --out without losing or repeating rows.")
    ] = False,
    order_seed: Annotated[
        int | None,
        typer.Option(help="Seed of the round order instead of the protocol's (replicates); recorded in plan.json."),
    ] = None,
    target: Annotated[str | None, TARGET_OPTION] = None,
    json_: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Run on a Ray cluster, one GPU per work unit (--ray-address, else RAY_ADDRESS, else the local one, started if none runs); with --replicas or --shard.",
        ),
    ] = False,
    ray_address: Annotated[
        str | None, typer.Option(help="With --ray: the cluster's address (e.g. ray://head:10001).")
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(min=2, help="With --ray: N runs of the whole protocol, order seeds protocol + 1..N.")
    ] = None,
    shard: Annotated[
        str | None, typer.Option(help="With --ray: 'cases': the cases split over the GPUs, each case on one GPU.")
    ] = None,
) -> None:
    """Run a trial: correctness gate, ceilings, interleaved timing rounds (a random call of every
    sample checked), summary.json. Exit 0 when at least one candidate passed the protocol's gate,
    1 when none did, 2 on bad input, 130 when interrupted (rows kept; continue with --resume).
    With --ray: a fleet directory (one run per work unit and the combined figures); exit 0 when
    some candidate holds on every GPU (--replicas) or passes the protocol's gate over the whole
    panel (--shard cases)."""
    run_command(
        RunOptions(
            protocol=protocol,
            out=out,
            resume=resume,
            order_seed=order_seed,
            target=target,
            json_=json_,
            ray=ray,
            ray_address=ray_address,
            replicas=replicas,
            shard=shard,
        )
    )


@dataclass(frozen=True)
class RunOptions:
    """`run`'s options, read once from the command line (each one's help: `run`'s parameters)."""

    protocol: Path
    out: Path
    resume: bool
    order_seed: int | None
    target: str | None
    json_: bool
    ray: bool
    ray_address: str | None
    replicas: int | None
    shard: str | None


def run_command(o: RunOptions) -> None:
    """`run` (its docstring): the protocol refused at once when it cannot run, then the trial here
    or, with --ray, the fleet."""
    from kerneltrial.trial import protocol as proto
    from kerneltrial.trial.preflight import preflight

    # torch-free, before any heavy import: a missing file, a bad key, a case too large for this
    # machine (a fleet's workers judge their own memory) is refused at once
    if o.ray:
        proto.load(o.protocol)
    else:
        preflight(o.protocol)
    if o.ray:
        from kerneltrial.cli.fleet import run_on_ray

        if o.order_seed is not None or o.target or o.json_:
            raise CliError("--order-seed, --target and --json are not for --ray runs")
        run_on_ray(o.protocol, o.out, o.ray_address, o.replicas, o.shard, o.resume)
        return
    if o.replicas is not None or o.shard is not None or o.ray_address is not None:
        raise CliError("--replicas, --shard and --ray-address go with --ray")
    root, unavailable = run_here(o)
    print_run(o, root, unavailable)


def run_here(o: RunOptions) -> tuple[Path, list[records.UnavailableArm]]:
    """The trial in this process, with a progress bar; returns its run directory and the arms
    unavailable here (each named on stderr before any work)."""
    from kerneltrial.trial.runner import run_trial
    from kerneltrial.trial.targets import get_target

    profile = get_target(o.target) if o.target else None
    err = console(stderr=True)
    unavailable: list[records.UnavailableArm] = []

    def announce(arms: list[Any]) -> None:
        for arm in arms:
            if not arm.available:
                unavailable.append(records.UnavailableArm(arm.name, arm.reason))
                err.print(
                    f"arm {arm.name} is unavailable here and will not be timed: {arm.reason}",
                    soft_wrap=True,
                    markup=False,
                )

    with progress_bar() as bar:
        root = run_trial(
            o.protocol, o.out, resume=o.resume, progress=bar, announce=announce, order_seed=o.order_seed, target=profile
        )
    return root, unavailable


def print_run(o: RunOptions, root: Path, unavailable: list[records.UnavailableArm]) -> None:
    """What `run` prints after its trial: the gate's verdicts and the next commands (with --json,
    its document on stdout); exit 1 when no arm passed the gate."""
    summary = read_json(root / SUMMARY)
    gate = summary.get("gate", {})
    verdicts = [
        records.ArmVerdict(name, bool(verdict.get("passed")), list(verdict.get("reasons", [])))
        for name, verdict in gate.get("arms", {}).items()
    ]
    passed = list(gate.get("passed_arms", []))
    lines = [f"run directory: {root}", f"timing: {summary.get('label', '')}"]
    lines += [f"gate failed by {v.arm}: {'; '.join(v.reasons)}" for v in verdicts if not v.passed]
    lines += [
        f"gate {gate.get('rule')!r} passed by: {', '.join(passed) or 'no arm'}",
        f"next: kerneltrial verify {root} && kerneltrial report {root}",
    ]
    human = console(stderr=o.json_)
    for line in lines:
        human.print(line, soft_wrap=True, markup=False)
    if o.json_:
        emit_json(
            records.RunResult(
                run_dir=str(root),
                timing=str(summary.get("label", "")),
                gate_rule=str(gate.get("rule")),
                passed_arms=passed,
                arms=verdicts,
                unavailable_arms=unavailable,
            )
        )
    if not passed:
        raise typer.Exit(ExitCode.FAILED)


def calibrate(
    protocol: Annotated[Path, typer.Argument(help="The protocol whose settings to calibrate (its control is used).")],
    out: Annotated[Path, typer.Option(help="Run directory of the calibration (its protocol is written beside it).")],
    resume: Annotated[bool, typer.Option(help="Continue a killed calibration run.")] = False,
) -> None:
    """A/A calibration: the control against an A/A copy of itself and against itself plus an
    injected delay (protocol `injected_slowdown`, default 3%), with the protocol's settings.
    Reports the false-positive rate of win/loss verdicts, CI widths and the power to see the
    slowdown. Name the result in another protocol's `calibration_run` to require it."""
    from kerneltrial.trial.runner import calibrate as run_calibration

    with progress_bar() as bar:
        root = run_calibration(protocol, out, resume=resume, progress=bar)
    calibration = read_json(root / SUMMARY).get("calibration", {})
    human = console()
    human.print(f"run directory: {root}", markup=False, soft_wrap=True)
    human.print(calibration.get("sentence", json.dumps(calibration)), markup=False, soft_wrap=True)
    if not calibration.get("passed"):
        raise typer.Exit(ExitCode.FAILED)


def mount(app: typer.Typer) -> None:
    app.command("ops")(ops)
    app.command("check")(check)
    app.add_typer(protocol_app, name="protocol")
    app.command("run")(run)
    app.command("calibrate")(calibrate)
    app.command("demo")(demo)
