"""Kernel commands: `ops`, `check`, `protocol new|freeze`, `run`, `demo`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kerneltrial.cli import records
from kerneltrial.cli.support import CliError, ExitCode, LineProgress, console, emit_json, progress_bar, sub_app, within
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.layout import CORRECTNESS, SUMMARY
from kerneltrial.trial.targets import TARGETS

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress

    from kerneltrial.ops.registry import Case, Impl, Operator
    from kerneltrial.trial.gate import CheckResult

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


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise CliError(f"malformed shape {text!r}; write dimensions joined by 'x', e.g. 4096x2048") from None
    if not shape or any(s <= 0 for s in shape):
        raise CliError(f"malformed shape {text!r}; every dimension must be a positive integer")
    return shape


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
    shape: Annotated[
        list[str] | None, typer.Option(help="Shape(s) like 4096x2048; default: the operator's panel.")
    ] = None,
    layout: Annotated[list[str] | None, typer.Option(help="Layout(s); default: every layout of the operator.")] = None,
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
    """`check` (its docstring): refuse a bad option, check each operator's arms on its cases, then
    print the table and what was skipped; exit 1 on a failed check."""
    from kerneltrial.ops import inputs as inp
    from kerneltrial.ops import launch
    from kerneltrial.ops.registry import all_ops, get_op, load_user_module
    from kerneltrial.trial import confine
    from kerneltrial.trial.isolation import Settings
    from kerneltrial.trial.remote import Isolation
    from kerneltrial.trial.targets import get_target, targeting

    if o.isolate not in ("user", "all", "none"):
        raise CliError(f"unknown --isolate {o.isolate!r}; use user, all or none")
    profile = get_target(o.target) if o.target else None
    isolation = Isolation(Settings(o.timeout, launch.device(), profile))
    if o.all_ == (o.op is not None):
        raise CliError("name one operator or pass --all (see `kerneltrial ops`)")
    if o.panel not in ("auto", *PANELS):
        raise CliError(f"unknown panel {o.panel!r}; use {', '.join(PANELS)} or auto")
    user_modules = o.impl_module or []
    for spec in user_modules if o.isolate == "none" else []:  # else imported in a worker only (below)
        load_user_module(spec, o.op)
    operators = all_ops() if o.all_ else [get_op(o.op)]
    device = launch.device()
    panel = o.panel if o.panel != "auto" else ("gpu" if device.type == "cuda" else "quick")
    parts: list[OperatorChecks] = []
    drawn_from = inp.new_inputs_seed() if o.inputs_seed is None else o.inputs_seed
    with progress_bar() as bar, targeting(profile), isolation, inp.drawing(drawn_from):
        for spec in user_modules if o.isolate != "none" else []:
            isolation.module_arms(spec, o.op)
        requested = {
            operator.name: [
                isolation.isolate(i) if o.isolate == "all" and i.kind != "calibration" else i
                for i in requested_arms(operator, o.impl, o.peers)
            ]
            for operator in operators
        }
        for operator in operators:
            cases = check_cases(operator, o.shape, o.dtype, o.layout, panel)
            parts.append(check_operator(o, operator, requested[operator.name], cases, device, bar))
            isolation.close_builtin()  # one operator's built-in arms at a time in their workers
    notes = confine.isolation_notes(o.impl_module or [], o.isolate, device.type == "cuda")
    print_checks(o, drawn_from, device.type, profile.name if profile else None, requested, parts, notes)


@dataclass(frozen=True)
class OperatorChecks:
    """One operator's part of `check`: its checks and table rows in the order they ran, and the
    (case, arm) pairs of its panel it skipped, with why."""

    calls: list[records.CheckedCall]
    rows: list[list[str]]
    not_checked: list[str]


def check_operator(
    o: CheckOptions,
    operator: Operator,
    impls: list[Impl],
    cases: list[Case],
    device: torch.device,
    bar: Progress | LineProgress,
) -> OperatorChecks:
    """Each of the arms `impls` of `operator` on each of `cases` that it takes."""
    from kerneltrial.trial.panel import skip_reason

    part = OperatorChecks([], [], [])
    task = bar.add_task(operator.name, total=len(cases) * len(impls))
    for case in cases:
        operator.validate(case)
        part.not_checked.extend(
            f"{operator.name}/{i.name} on {skip_reason(i, case)}" for i in impls if skip_reason(i, case)
        )
        for i in impls:
            bar.advance(task)
            if not i.available or not i.supports(case) or skip_reason(i, case):
                continue
            results = check_arm(o, operator, i, case, device)
            part.calls.extend(records.checked_call(operator.name, r.row()) for r in results)
            part.rows.append(check_row(operator.name, case.id, i.name, results))
    return part


def check_arm(o: CheckOptions, operator: Operator, impl: Impl, case: Case, device: torch.device) -> list[CheckResult]:
    """One arm on one case: a gate check per seed 0..--seeds-1, each within --timeout (an isolated
    arm's worker has the same deadline per request, and is killed past it)."""
    from kerneltrial.trial.gate import check as run_check
    from kerneltrial.trial.remote import is_isolated

    wait = (lambda _s, _w, work: work()) if is_isolated(impl) else within
    return [
        wait(
            o.timeout,
            f"{operator.name} {case.id} arm {impl.name} seed {s}",
            lambda s=s: run_check(operator, impl, case, s, device, exact=o.exact),
        )
        for s in range(o.seeds)
    ]


def print_checks(
    o: CheckOptions,
    inputs_seed: int,
    device: str,
    target: str | None,
    requested: dict[str, list[Impl]],
    parts: list[OperatorChecks],
    notes: list[str],
) -> None:
    """`check`'s output: the table (title: the `device` type, the interpreter, the --target), the
    inputs seed, what was skipped (the `requested` arms unavailable here, then the pairs not
    checked), the isolation `notes`, the counts, and the --jsonl and --json documents; exit 1 on a
    failed check."""
    from rich.markup import escape
    from rich.table import Table

    from kerneltrial.ops import launch

    calls = [c for part in parts for c in part.calls]
    unavailable = {f"{op}/{i.name}: {i.reason}" for op, impls in requested.items() for i in impls if not i.available}
    skipped = sorted(unavailable) + [line for part in parts for line in part.not_checked]
    out = console(stderr=o.json_)
    table = Table(
        title=f"correctness on {device}"
        + (" (Triton interpreter)" if launch.interpreted() else "")
        + (f", launches checked against {target}" if target else ""),
        caption=CHECK_COLUMNS_NOTE,
    )
    for column in CHECK_COLUMNS:
        table.add_column(column)
    for part in parts:
        for row in part.rows:
            table.add_row(*map(escape, row), style=None if row[4] == "pass" else "red")
    out.print(table)
    out.print(f"inputs seed {inputs_seed} (--inputs-seed {inputs_seed} draws the same inputs again)", markup=False)
    if o.jsonl:
        o.jsonl.write_text("".join(json.dumps(asdict(c)) + "\n" for c in calls))
    for line in skipped:
        out.print(f"skipped {line}", markup=False, soft_wrap=True)
    for note in notes:
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


def requested_arms(operator: Operator, impl: list[str] | None, peers: bool) -> list[Impl]:
    """The arms `check` runs for `operator`: those named with --impl, else every implementation
    (peers unless --no-peers). Only these are reported, as checked or as skipped."""
    if impl:
        return [operator.impl(n) for n in impl]
    return [i for i in operator.impls.values() if peers or i.kind != "peer"]


PANELS = ("quick", "small", "gpu")


def check_cases(
    operator: Operator, shape: list[str] | None, dtype: str | None, layout: list[str] | None, panel: str
) -> list[Case]:
    """The cases `check` runs, in the --layout(s) (default: every layout of the operator): the
    --shape cases in each; else the `gpu` or `small` panel in each; else (`quick`, the default
    without a GPU) each small case in one layout, the layouts in turn, so every shape and every
    layout is checked but not every pair: half the interpreter's time of `small` for two layouts
    (`check --all` within 10 minutes on 2 CPU cores, issue 25). Without a GPU, the panels add the
    case of more than 65535 rows (trial/panel.py; `quick`: in the first layout)."""
    from kerneltrial.ops.registry import Case
    from kerneltrial.trial.panel import beyond_grid_case, check_panel

    layouts = layout or operator.layouts
    if shape:
        return [Case(parse_shape(s), dtype or operator.dtypes[0], lay) for s in shape for lay in layouts]
    if panel == "quick":
        quick = [Case(c.shape, c.dtype, layouts[i % len(layouts)]) for i, c in enumerate(operator.small_cases)]
        beyond = beyond_grid_case(operator)
        return [*quick, Case(beyond.shape, beyond.dtype, layouts[0])]
    return check_panel(operator, gpu=panel == "gpu", layouts=layouts)


def check_row(op: str, case: str, arm: str, results: list[CheckResult]) -> list[str]:
    """One row of `check`'s table: the arm's seeds in one case (the first failure's message)."""
    bad = [r for r in results if not r.passed]
    worst = max(results, key=lambda r: (not r.passed, r.max_rel))
    hist = [sum(column) for column in zip(*(r.ulp_hist for r in results), strict=True)]
    status = "pass" if not bad else f"FAIL seed {bad[0].seed}: {bad[0].message}"
    return [op, case, arm, str(len(results)), status, f"{worst.max_abs:.3g}", f"{worst.max_rel:.3g}"] + [
        f"{worst.ulp:.3g}",
        "/".join(map(str, hist)),
    ]


protocol_app = sub_app("Write and freeze preregistered protocols.")


@protocol_app.command("new")
def protocol_new(
    op: Annotated[str, typer.Argument(help="Operator name.")],
    out: Annotated[Path, typer.Option(help="Where to write the TOML protocol.")],
    candidate: Annotated[list[str] | None, typer.Option(help="Candidate arm(s) (implementations or peers).")] = None,
    name: Annotated[str | None, typer.Option(help="Protocol name (default: OP-trial).")] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(help="Case shape(s); default: the operator's GPU panel (CPU panel without a GPU)."),
    ] = None,
    layout: Annotated[list[str] | None, typer.Option(help="Layout(s) of the cases; default: contiguous.")] = None,
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    rounds: Annotated[int, typer.Option(min=2)] = 7,
    gate: Annotated[str, typer.Option(help="'no_loss', 'geomean>=1.02' or both joined by ' and '.")] = "no_loss",
    impl_module: Annotated[
        list[str] | None,
        typer.Option(
            "--impl-module",
            help="A user's kernel file or module; its function named after OP becomes the candidate user:<module> (add it with --candidate too to name other arms).",
        ),
    ] = None,
) -> None:
    """Write a protocol for OP with the operator's panel (the GPU panel on a GPU, the small CPU
    panel without one) or --shape cases; review it, then freeze it."""
    from kerneltrial.ops import launch
    from kerneltrial.ops.registry import Case, get_op, load_user_module
    from kerneltrial.trial import protocol as proto

    human, err = console(), console(stderr=True)
    operator = get_op(op)
    user_arms = [impl.name for spec in impl_module or [] for impl in load_user_module(spec, op) if impl.op == op]
    # kernel files relative to the protocol's folder (the runner resolves them there): a portable protocol
    modules = [
        os.path.relpath(Path(spec).resolve(), out.resolve().parent) if spec.endswith(".py") else spec
        for spec in impl_module or []
    ]
    candidate = list(dict.fromkeys([*(candidate or []), *user_arms]))
    if not candidate:
        raise CliError("name at least one --candidate or an --impl-module that defines the operator")
    for c in candidate:
        operator.impl(c)
    layouts = layout or ["contiguous"]
    gpu = launch.device().type == "cuda"
    if not shape and not gpu:
        err.print(
            "No GPU visible: writing the operator's small CPU panel (the GPU panel would take hours in the "
            "Triton interpreter); pass --shape for other cases.",
            soft_wrap=True,
            markup=False,
        )
    panel = operator.gpu_cases if gpu else operator.small_cases
    cases = (
        [Case(parse_shape(s), operator.dtypes[0], lay) for s in shape for lay in layouts]
        if shape
        else [Case(c.shape, c.dtype, lay) for c in panel for lay in layouts]
    )
    try:
        seed_list = [int(s) for s in seeds.split(",")]
    except ValueError:
        raise CliError(f"malformed --seeds {seeds!r}; write integers separated by commas, e.g. 0,1,2") from None
    if out.exists():
        raise CliError(f"{out} exists; protocols are never overwritten: choose another --out")
    extra: dict[str, object] = {"impl_modules": modules} if modules else {}
    out.write_text(
        proto.new(op, name or f"{op}-trial", candidate, cases, seeds=seed_list, rounds=rounds, gate=gate, **extra)
    )
    human.print(f"wrote {out}; review it, then: kerneltrial protocol freeze {out}", markup=False, soft_wrap=True)


@protocol_app.command("freeze")
def protocol_freeze(file: Annotated[Path, typer.Argument(help="Protocol TOML file.")]) -> None:
    """Record the protocol's sha256 and the time; `run` (and `model`, for a whole-model protocol)
    refuses it once changed. A kernel protocol whose arms do not exist here or whose control is
    not a control is refused."""
    import tomllib

    from kerneltrial.trial import protocol as proto

    if not file.is_file():
        raise CliError(f"protocol file {file} does not exist")
    text = file.read_text()
    try:
        is_model = "model" in tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"{file}: not valid TOML: {exc}") from None
    if is_model:
        from kerneltrial.model.spec import load_protocol

        load_protocol(file)
    else:
        from kerneltrial.trial.runner import check_arms

        parsed = proto.parse(text, str(file))
        check_arms(file, parsed)
        proto.refuse_at_freeze(parsed, file)
    record = proto.freeze(file, validated=True)
    console().print(f"frozen {file}: sha256 {record['sha256']} at {record['frozen_at']}", markup=False, soft_wrap=True)


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


DEMO_PROTOCOL = """\
name = "demo-rmsnorm"
op = "rmsnorm"
phase = "exploratory"
control = "control"
candidates = ["packed_r4_w4", "kerneltrial", "torch_eager"]
seeds = [0, 1]
rounds = 5
warmup = 1
calls_per_sample = {calls}
l2 = "{l2}"
tie_band = 0.02
gate = "no_loss"

[[cases]]
shape = {shape_a}

[[cases]]
shape = {shape_b}
"""


def fresh_run_dir(out: Path) -> Path:
    """The first of out/run, out/run-2, out/run-3, ... that does not exist (`out` is created):
    a repeated demo takes a fresh directory and never overwrites an earlier one."""
    out.mkdir(parents=True, exist_ok=True)
    return next(out / name for name in ("run", *(f"run-{k}" for k in range(2, 10_000))) if not (out / name).exists())


INTERPRETER_NOTE = (
    "No GPU visible: the demo runs through the Triton interpreter on this CPU. Its times describe the "
    "interpreter, not GPU performance, and torch_eager (native torch) against the interpreted Triton control "
    "compares an interpreter with compiled code, not two kernels: its large speedup says nothing about either."
)
NEXT_STEPS = (
    "next, your own kernel (a module with `def rmsnorm(x, weight, eps=1e-6)`): "
    "kerneltrial check rmsnorm --impl-module my_kernels.py --impl user:my_kernels",
    "next, a frozen trial of it: kerneltrial protocol new rmsnorm --impl-module my_kernels.py --out my-trial.toml "
    "&& kerneltrial protocol freeze my-trial.toml && kerneltrial run my-trial.toml --out runs/my-trial",
)


def verdict_counts(wins: int, ties: int, losses: int, inconclusive: int) -> str:
    """An arm's verdicts over the cases, in words: `1 win, 1 tie, 0 losses, 0 inconclusive`."""
    words = [
        (wins, "win", "wins"),
        (ties, "tie", "ties"),
        (losses, "loss", "losses"),
        (inconclusive, "inconclusive", "inconclusive"),
    ]
    return ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in words)


def demo_lines(summary: dict[str, Any], checks: list[dict[str, Any]]) -> list[str]:
    """What the demo prints after its run: correctness, each arm's geomean and verdicts, the timing (GPU)."""
    lines = [f"correctness: {sum(c['passed'] for c in checks)} of {len(checks)} checks passed"]
    for arm, agg in summary.get("aggregates", {}).items():
        geomean = "n/a" if agg["geomean"] is None else f"{agg['geomean']:.3f}"
        counts = verdict_counts(agg["wins"], agg["ties"], agg["losses"], agg.get("inconclusive", 0))
        lines.append(f"  {arm}: geomean speedup {geomean} over the control; verdicts over the cases: {counts}")
    # without a GPU the label repeats INTERPRETER_NOTE, said once already
    return [*lines, f"timing: {summary.get('label', '')}"] if summary.get("is_gpu") else lines


def demo(
    out: Annotated[Path, typer.Option(help="Directory for the demo's protocol and run.")] = Path("runs/demo"),
) -> None:
    """The built-in default: check rmsnorm, freeze a small trial's protocol, run it, verify it,
    write its report, and name the next two commands to try. Run it again and it writes a fresh
    run directory beside the last (run-2, run-3, ...).

    With a GPU it times real kernels (CUDA events); without one it runs the same pipeline
    through the Triton interpreter on the CPU and says so: those times are not GPU performance."""
    from kerneltrial.kernel.report import write_report
    from kerneltrial.kernel.verify import verify_run_dir
    from kerneltrial.ops import launch
    from kerneltrial.trial import protocol as proto
    from kerneltrial.trial.runner import run_trial

    human = console()
    gpu = launch.device().type == "cuda"
    if not gpu:
        human.print(INTERPRETER_NOTE, style="yellow", soft_wrap=True, markup=False)
    run_dir = fresh_run_dir(out)
    protocol_file = out / f"{run_dir.name}.protocol.toml"
    protocol_file.write_text(
        DEMO_PROTOCOL.format(
            calls='"auto"' if gpu else 1,
            l2="cold" if gpu else "hot",
            shape_a=[4096, 4096] if gpu else [64, 1536],
            shape_b=[65536, 2048] if gpu else [8, 5120],
        )
    )
    frozen = proto.freeze(protocol_file)  # preregistered before anything runs, like any trial
    human.print(f"protocol {protocol_file} frozen at {frozen['frozen_at']}", soft_wrap=True, markup=False)
    with progress_bar() as bar:
        root = run_trial(protocol_file, run_dir, progress=bar)
    result = verify_run_dir(root)
    report = write_report(root, unverified=not result.ok)  # a failed verify: its titles say so
    for line in demo_lines(read_json(root / SUMMARY), read_jsonl(root / CORRECTNESS)):
        human.print(line, soft_wrap=True, markup=False)
    human.print(f"verify: {'ok' if result.ok else 'MISMATCH'}; report: {report}", soft_wrap=True, markup=False)
    for line in NEXT_STEPS:
        human.print(line, soft_wrap=True, markup=False)
    if not result.ok:
        raise typer.Exit(ExitCode.FAILED)


def mount(app: typer.Typer) -> None:
    app.command("ops")(ops)
    app.command("check")(check)
    app.add_typer(protocol_app, name="protocol")
    app.command("run")(run)
    app.command("calibrate")(calibrate)
    app.command("demo")(demo)
