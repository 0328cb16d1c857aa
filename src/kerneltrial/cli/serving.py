"""`kerneltrial serve ...`: launch, bench, trial, calibrate, accuracy. Thin: parse, call, print.

Errors and exit codes follow `cli.support`. The serving modules (httpx, numpy) are imported
inside the commands: `--help` and usage errors stay fast. `serve bench` and `serve accuracy`
live in cli/serving_adhoc.py; what the commands share in cli/serving_common.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kerneltrial.cli import support as cli_support
from kerneltrial.cli.serving_common import (
    CLIENT_HELP,
    EXTRA,
    OVERRIDE_HELP,
    PINS_HELP,
    PRESET_HELP,
    VLLM_HELP,
    RunOptions,
    client_name,
    default_out,
    execute,
    preset_server,
    run_text,
    server_from_argv,
)
from kerneltrial.cli.support import CliError, ExitCode, console

if TYPE_CHECKING:
    pass

from kerneltrial.cli.serving_adhoc import accuracy, bench

app = cli_support.app(
    help=(
        "Serving trials on an OpenAI-compatible server (vLLM): launch with fail-fast gates, "
        "throughput cases through `vllm bench serve`, interleaved A/B trials with preregistered "
        "acceptance, and a MATH-500 accuracy gate. Server commands go after `--` as an argv list."
    ),
    epilog=cli_support.EXIT_CODES_HELP,
)


app.command(context_settings=EXTRA)(bench)


@app.command()
def trial(
    protocol: Path = typer.Argument(
        ..., help="TOML protocol: arms (argv + env), cases, acceptance, optional accuracy."
    ),
    out_dir: Path = typer.Option(None, "--out", help="New run directory (default runs/serve-trial-TIMESTAMP)."),
    vllm: str = typer.Option(None, "--vllm", help=VLLM_HELP),
    model: str = typer.Option(None, "--model", help="Model path filling {model} (overrides server.model)."),
    client: str = typer.Option(None, "--client", help=CLIENT_HELP + " Default: the protocol's bench.client."),
    override_pins: bool = typer.Option(False, "--override-pins", help=PINS_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """A/B trial: fresh launch per arm, in counterbalanced blocks (A B, B A), preregistered acceptance.

    Accepted when, in every case, the lower bound of the candidate's total tok/s gain (a 95%
    interval across launches) exceeds the noise band (default 1%), the upper bound of its mean
    TTFT ratio is <= 1.01, and (if [accuracy] is set) it passes the MATH-500 gate; with one
    launch per arm the verdict is INCONCLUSIVE. [acceptance] calibration = DIR requires a passed
    `serve calibrate` first. Exit 0 when every run completed and the candidate was ACCEPTED, 1
    when a run failed or it was REJECTED or INCONCLUSIVE (verdict and reasons in summary.json and
    on screen), 2 when the required calibration does not qualify.
    """
    from kerneltrial.serving.calibration_gate import require_calibration
    from kerneltrial.serving.protocol import load_protocol

    proto, raw = load_protocol(protocol)
    proto = proto.with_model(model) if model else proto
    out = out_dir or default_out("trial")
    used = require_calibration(proto.with_client(client_name(client)) if client else proto, protocol.parent, out)
    execute(raw.decode("utf-8"), protocol.parent, out, RunOptions(vllm, quiet, model, client, override_pins, used))


@app.command()
def calibrate(
    protocol: Path = typer.Argument(..., help="TOML protocol whose baseline arm is calibrated."),
    out_dir: Path = typer.Option(None, "--out", help="New run directory (default runs/serve-calibrate-TIMESTAMP)."),
    launches: int = typer.Option(
        None,
        "--launches",
        help="Launches per arm, at least the protocol's rounds (default: the fewest, even, whose subsets of "
        "rounds give enough A/A comparisons to estimate max_false_acceptance_rate).",
    ),
    vllm: str = typer.Option(None, "--vllm", help=VLLM_HELP),
    model: str = typer.Option(None, "--model", help="Model path filling {model} (overrides server.model)."),
    override_pins: bool = typer.Option(False, "--override-pins", help=PINS_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """A/A calibration: the baseline arm against itself with the protocol's settings.

    Writes a serving run directory (arms A and A-prime, both the baseline; no accuracy gate)
    and calibration.json. It judges trials of the protocol's rounds: per case the noise (sd of
    the per-round log ratios) and the interval half-widths such a trial would have, and the
    false-acceptance rate over every A/A trial of that size the launches contain (each subset
    of rounds, each case, both directions). Passes only when the half-widths are below the
    noise band (and ttft_ratio_max - 1), there are at least 1/max_false_acceptance_rate
    comparisons, and the rate is at most max_false_acceptance_rate; otherwise it says how many
    launches the observed noise would need. A trial protocol names the directory in
    [acceptance] calibration. Exit 0 when it passed, 1 when not or a run failed.
    """
    from kerneltrial.rundir.files import read_jsonl
    from kerneltrial.serving.calibration import calibration_protocol, calibration_record, write_calibration
    from kerneltrial.serving.calibration_host import this_host
    from kerneltrial.serving.pilot import pilot_reason
    from kerneltrial.serving.protocol import load_protocol, parse_protocol

    _, raw = load_protocol(protocol)
    text, trial_rounds = calibration_protocol(raw.decode("utf-8"), launches)
    run_dir = out_dir or default_out("calibrate")
    proto = parse_protocol(text, protocol.parent)
    proto = proto.with_model(model) if model else proto

    def pilot(rows: list[dict[str, Any]]) -> str | None:  # serving/pilot.py: stop when the pilot's noise asks for more
        return pilot_reason(proto, rows, trial_rounds)

    summary = run_text(
        text, protocol.parent, run_dir, RunOptions(vllm, quiet, model, override_pins=override_pins), pilot
    )
    stopped = pilot_reason(proto, read_jsonl(run_dir / "runs.jsonl"), trial_rounds)
    record = calibration_record(proto, summary, trial_rounds, stopped, host=this_host(proto.server.model))
    path = write_calibration(run_dir, record)
    console().print(f"{record.sentence}; {path}", markup=False, soft_wrap=True)
    if not record.passed:
        raise typer.Exit(ExitCode.FAILED)


app.command(context_settings=EXTRA)(accuracy)


@app.command("launch", context_settings=EXTRA)
def launch_cmd(
    ctx: typer.Context,
    model_id: str = typer.Option(None, "--model-id", help="Model id /v1/models must list (default: from the argv)."),
    port: int = typer.Option(None, "--port", help="Port (default: --port in the argv, else 8000)."),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout"),
    hold: float = typer.Option(0.0, "--hold", help="Keep the server up this many seconds after it is ready."),
    out_dir: Path = typer.Option(None, "--out", help="Directory for server.log and launch.json."),
    preset: str = typer.Option(None, "--preset", help=PRESET_HELP),
    override: list[str] = typer.Option([], "--override", help=OVERRIDE_HELP),
    model: str = typer.Option(None, "--model", help="Model path (with --preset)."),
    vllm: str = typer.Option(None, "--vllm", help="`vllm` executable that serves (with --preset; default: on PATH)."),
) -> None:
    """Start the server given after `--` (or a --preset), check the gates (port, alive, ready, model id), stop it."""
    import time

    from kerneltrial.serving.launcher import LaunchError, Server, ServerSpec, install_sigterm_as_interrupt

    env: dict[str, str] = {}
    if preset:
        if model_id:
            raise CliError(f"--model-id: preset {preset} serves its own model id; leave --model-id out")
        pr, argv, p = preset_server(preset, model, port, vllm, list(ctx.args), override)
        mid, env = pr.model_id, dict(pr.env)
    elif override:
        raise CliError("--override replaces a flag of a --preset; pass --preset NAME")
    else:
        argv, mid, p = server_from_argv(list(ctx.args), model_id, port)
    run_dir = out_dir or default_out("launch")
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = ServerSpec(argv, mid, port=p, env=env, ready_timeout_s=ready_timeout)
    install_sigterm_as_interrupt()
    srv = Server(spec, run_dir / "server.log")
    out = console()
    try:
        with srv:
            out.print(f"ready in {srv.timings['ready_s']:.1f} s at {spec.base_url} serving {mid!r}")
            end = time.monotonic() + hold
            while time.monotonic() < end:
                srv.check_alive("the hold")
                time.sleep(0.5)
    except LaunchError as e:
        raise CliError(str(e), ExitCode.FAILED) from None
    except KeyboardInterrupt:
        raise CliError("interrupted; the server was stopped", ExitCode.INTERRUPTED) from None
    finally:
        (run_dir / "launch.json").write_text(
            json.dumps({"record": srv.record, "timings": srv.timings}, indent=2, default=str)
        )
    out.print(
        f"stopped ({', '.join(srv.record.get('signals_sent', [])) or 'already exited'}); log {run_dir / 'server.log'}"
    )
