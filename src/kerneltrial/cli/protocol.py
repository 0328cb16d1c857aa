"""Protocol commands: `protocol new` writes a preregistered kernel protocol, `protocol freeze` records it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kerneltrial.cli.support import AXIS_HELP, CliError, console, sub_app, swept_shapes

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
    axis: Annotated[list[str] | None, typer.Option(help=AXIS_HELP)] = None,
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
    if axis and not shape:
        raise CliError("--axis sweeps a --shape template; pass --shape, e.g. --shape Rx2048 --axis R=1,64")
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
        [Case(s, operator.dtypes[0], lay) for s in swept_shapes(shape, axis or []) for lay in layouts]
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
