"""`kerneltrial serve ...`: launch, bench, trial, calibrate, accuracy. Thin: parse, call, print.

Errors and exit codes follow `cli_support`. The serving modules (httpx, numpy) are imported
inside the commands: `--help` and usage errors stay fast.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kerneltrial.cli import support as cli_support
from kerneltrial.cli.support import CliError, ExitCode, console

if TYPE_CHECKING:
    from rich.progress import Progress

    from kerneltrial.serving.accuracy import AccuracySpec
    from kerneltrial.serving.bench import Case
    from kerneltrial.serving.presets import Preset

EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
VLLM_HELP = "`vllm` executable for the benchmark client (env KERNELTRIAL_VLLM; default: vllm on PATH)."
PRESET_HELP = (
    "Built-in official command (minicpm5-2b = NVIDIA, minicpm5-2b-iluvatar, minicpm5-2b-metax; needs --model); "
    "extra server arguments go after `--`. Sources: docs/serving.md."
)
CLIENT_HELP = (
    "Benchmark client: completions (kerneltrial's: --backend vllm --endpoint /v1/completions --seed S); official "
    "(the organisers' benchmark_throughput_serve.py: its argv --backend vllm --endpoint /v1/completions "
    "--dataset-name random --ignore-eos, no --seed, RUNS = 4 so --repeats 4); or flagos-chat (a fork's chat script, "
    "benchmark_throughput_flagos.py, not the organisers': --backend openai-chat --endpoint /v1/chat/completions "
    "--trust-remote-code, no --seed). The accuracy gate always uses the chat endpoint."
)
CASES_HELP = (
    "JSON list [[input_len, output_len, concurrency, num_requests], ...], or a built-in set: official (the organisers' "
    "script's DEFAULT_TEST_CASES), official-all (its ALL_TEST_CASES), seed (the Track 2 seed's cases) or flagos-chat "
    "(the fork's chat script's scenarios)."
)
PINS_HELP = (
    "Launch even when the server environment does not match the protocol's [pins] (vllm-plugin-FL commit, FlagGems, "
    "vLLM): recorded in launches.jsonl and plan.json, and the run's scope is proxy."
)
OVERRIDE_HELP = (
    "Let an extra server argument after `--` replace this flag of the preset (e.g. --override max-model-len); "
    "without it a flag the preset sets is refused."
)
app = cli_support.app(
    help=(
        "Serving trials on an OpenAI-compatible server (vLLM): launch with fail-fast gates, "
        "throughput cases through `vllm bench serve`, interleaved A/B trials with preregistered "
        "acceptance, and a MATH-500 accuracy gate. Server commands go after `--` as an argv list."
    ),
    epilog=cli_support.EXIT_CODES_HELP,
)


def _client(client: str) -> str:
    from kerneltrial.serving.bench import CLIENTS

    if client not in CLIENTS:
        raise CliError(f"--client {client!r} is not one of {', '.join(CLIENTS)}; pick one of them")
    return client


def default_out(kind: str) -> Path:
    return Path("runs") / f"serve-{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _argv_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def server_from_argv(argv: list[str], model_id: str | None, port: int | None) -> tuple[list[str], str, int]:
    """Fill {port}; find the model id (--served-model-name, --model, `serve MODEL`) and port."""
    if not argv:
        raise CliError("no server command; put it after `--`, e.g. `-- vllm serve MODEL --port 8000`")
    p = port or int(_argv_value(argv, "--port") or 8000)
    argv = [a.replace("{port}", str(p)) for a in argv]
    if model_id is None:
        model_id = _argv_value(argv, "--served-model-name") or _argv_value(argv, "--model")
        if model_id is None and "serve" in argv and argv.index("serve") + 1 < len(argv):
            model_id = argv[argv.index("serve") + 1]
    if not model_id:
        raise CliError("cannot tell the model id the server will list; pass --model-id")
    return argv, model_id, p


class Display:
    """Rich progress bar fed by the runner's events."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.progress: Progress | None = None
        self.task: Any = None

    def __call__(self, kind: str, **kw: Any) -> None:
        if not self.enabled:
            return
        if kind == "start":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console(stderr=True),
                transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("starting", total=kw["total"])
        elif self.progress is None:
            return
        elif kind == "launch":
            self.progress.update(self.task, description=f"launch {kw['launch']} {kw['arm']}: waiting for ready")
        elif kind == "run":
            self.progress.update(
                self.task, description=f"launch {kw['launch']} {kw['arm']} {kw['case']} run {kw['run']}"
            )
        elif kind == "ran":
            r = kw["row"]
            self.progress.advance(self.task)
            if r["status"] != "ok":
                self.progress.console.print(
                    f"FAILED {r['arm']} {r['case']} run {r['run']}: {r.get('reason')}", markup=False, style="red"
                )
        elif kind == "accuracy":
            self.progress.update(self.task, description=f"accuracy {kw['arm']}")
        elif kind == "done":
            self.stop()

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    t = Table(title=f"serving summary ({summary['warmup']['rule']})")
    for col in (
        "arm",
        "case",
        "status",
        "total tok/s",
        "output tok/s",
        "peak output tok/s",
        "mean TTFT ms",
        "p99 TTFT ms",
        "mean TPOT ms",
        "mean ITL ms",
        "mean E2E ms",
    ):
        t.add_column(col)
    for arm, cases in summary["results"].items():
        for cid, e in cases.items():
            cells = [
                f"{e[k]:.2f}" if k in e else "-"
                for k in (
                    "total_token_throughput",
                    "output_throughput",
                    "max_output_tokens_per_s",
                    "mean_ttft_ms",
                    "p99_ttft_ms",
                    "mean_tpot_ms",
                    "mean_itl_ms",
                    "mean_e2el_ms",
                )
            ]
            t.add_row(escape(arm), escape(cid), e["status"], *cells)
    out.print(t)
    for arm, a in (summary.get("accuracy") or {}).items():
        out.print(
            f"accuracy {arm}: {a['correct']}/{a['n']} = {a['accuracy']:.3f} "
            f"(Wilson {a['confidence']:.0%} CI {a['ci_low']:.3f}-{a['ci_high']:.3f}), gate {a['gate']} on "
            f"{a.get('n_rule', 'any n')}: {'passed' if a['passed'] else 'FAILED'}",
            markup=False,
        )
    for arm, d in (summary.get("dispatch") or {}).items():
        shown = {True: "valid", False: "INVALID", None: "not applicable"}[d["valid"]]
        out.print(f"dispatch proof {arm}: {shown} ({d['reason']})", markup=False)
    acc = summary.get("acceptance")
    if acc:
        for cid, c in acc["cases"].items():
            if c.get("gain") is None:
                continue
            gain, ttft = f"{c['gain']:+.2%}", f"{c['ttft_ratio']:.4f}"
            if c.get("gain_low") is not None:
                gain += f" [{c['gain_low']:+.2%}, {c['gain_high']:+.2%}]"
                ttft += f" [{c['ttft_ratio_low']:.4f}, {c['ttft_ratio_high']:.4f}]"
            out.print(
                f"{cid}: total tok/s gain {gain} (lower bound must exceed {acc['noise_band']:.2%}), "
                f"TTFT ratio {ttft} (upper bound at most {acc['ttft_ratio_max']}), "
                f"{acc.get('confidence', 0.95):.0%} intervals over {c.get('rounds', '?')} launch(es) per arm",
                markup=False,
            )
        shown = acc.get("verdict") or ("ACCEPTED" if acc["accepted"] else "REJECTED")
        verdict = f"[green]{shown}[/]" if acc["accepted"] else f"[red]{shown}[/]"
        out.print(f"candidate {escape(acc['candidate'])} vs baseline {escape(acc['baseline'])}: {verdict}")
        for r in acc["reasons"]:
            out.print(f"  - {r}", markup=False)
    if sc := summary.get("scope"):
        why = f" ({'; '.join(sc['reasons'])})" if sc["reasons"] else ""
        out.print(f"scope: {sc['kind']} on {sc['hardware']}{why}", markup=False)
    for f in summary.get("failures", []):
        out.print(f"failure: {f}", markup=False, style="red")
    out.print(
        f"run directory: {run_dir}  (pandas: read_json('runs.jsonl', lines=True), read_csv('requests.csv'))",
        markup=False,
        soft_wrap=True,
    )


@dataclass(frozen=True)
class RunOptions:
    """The command-line options a serving run takes beside its protocol (each recorded in the run)."""

    vllm: str | None  # --vllm
    quiet: bool = False
    model: str | None = None  # --model: replaces server.model (plan.json argv_expanded, tokenizer)
    client: str | None = None  # --client: replaces bench.client (plan.json client, every client_argv)
    override_pins: bool = False  # --override-pins (plan.json override_pins, launches.jsonl pins)
    calibration: dict[str, Any] | None = None  # the passed calibration a trial rests on (provenance.json)


def _run(proto_text: str, base_dir: Path, run_dir: Path, opts: RunOptions, stop: Any = None) -> dict[str, Any]:
    """Run a serving protocol into `run_dir` and print its summary; exit 1 when a run failed (a run
    that `stop` ended, the calibration's pilot, returns its summary)."""
    from kerneltrial.rundir.files import read_json
    from kerneltrial.serving.accuracy import load_grader
    from kerneltrial.serving.bench import BenchError, resolve_vllm
    from kerneltrial.serving.launcher import LaunchError, install_sigterm_as_interrupt
    from kerneltrial.serving.pilot import PilotStop
    from kerneltrial.serving.protocol import parse_protocol
    from kerneltrial.serving.trial import run_protocol

    proto = parse_protocol(proto_text, base_dir)
    if opts.model:  # recorded in provenance (argv) and plan.json (argv_expanded, tokenizer)
        proto = proto.with_model(opts.model)
    if opts.client:  # recorded in provenance (argv) and plan.json (client), and in every run's client_argv
        proto = proto.with_client(_client(opts.client))
    if proto.accuracy is not None:
        load_grader()  # before the first launch, not an hour later at the first graded answer
    vllm = resolve_vllm(opts.vllm)
    install_sigterm_as_interrupt()
    display = Display(enabled=not opts.quiet)
    try:
        args = (sys.argv, display, opts.override_pins, stop, opts.calibration)
        summary = run_protocol(proto, proto_text.encode(), run_dir, vllm, *args)
    except PilotStop:  # summarised and recorded as FAILED with its reason; the caller writes its verdict
        return read_json(run_dir / "summary.json")
    except (LaunchError, BenchError) as e:  # a gate of the run failed: a failed check, not bad input
        raise CliError(f"{e} (raw data kept in {run_dir})", ExitCode.FAILED) from None
    except KeyboardInterrupt:
        raise CliError(
            f"interrupted; the server was stopped and the raw data kept in {run_dir}", ExitCode.INTERRUPTED
        ) from None
    finally:
        display.stop()
    print_summary(summary, run_dir)
    if summary["status"] != "ok":
        raise CliError(
            f"a run or a dispatch proof failed (see the failures above and summary.json in {run_dir})", ExitCode.FAILED
        )
    return summary


def _execute(proto_text: str, base_dir: Path, run_dir: Path, opts: RunOptions) -> None:
    """Run a serving protocol into `run_dir`; exit 1 when a run failed or the candidate was not ACCEPTED."""
    summary = _run(proto_text, base_dir, run_dir, opts)
    if summary.get("acceptance") and not summary["acceptance"]["accepted"]:
        raise typer.Exit(ExitCode.FAILED)  # the verdict (REJECTED, INCONCLUSIVE) and its reasons are printed above


@app.command(context_settings=EXTRA)
def bench(
    ctx: typer.Context,
    cases: str = typer.Option(None, "--cases", help=CASES_HELP),
    client: str = typer.Option("completions", "--client", help=CLIENT_HELP),
    repeats: int = typer.Option(
        4, "--repeats", "-r", help="Runs per case; the first is the warm-up and is dropped (>= 2)."
    ),
    base_url: str = typer.Option(
        None, "--base-url", help="Benchmark an already running server, e.g. http://127.0.0.1:8000."
    ),
    launch: bool = typer.Option(False, "--launch", help="Start the server given after `--`, benchmark, stop it."),
    preset: str = typer.Option(None, "--preset", help=PRESET_HELP),
    override: list[str] = typer.Option([], "--override", help=OVERRIDE_HELP),
    model: str = typer.Option(None, "--model", help="Model path (preset launches) and default tokenizer."),
    model_id: str = typer.Option(
        None, "--model-id", help="Model id the server lists in /v1/models (default: guessed)."
    ),
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="Tokenizer path for `vllm bench serve` (default: --model)."
    ),
    port: int = typer.Option(
        None, "--port", help="Port of the launched server (default: --port in its argv, else 8000)."
    ),
    vllm: str = typer.Option(None, "--vllm", help=VLLM_HELP),
    ready_timeout: float = typer.Option(
        900.0, "--ready-timeout", help="Seconds to wait for /v1/models to list the model."
    ),
    bench_timeout: float = typer.Option(3600.0, "--bench-timeout", help="Seconds one `vllm bench serve` run may take."),
    seeding: str = typer.Option(
        "official",
        "--seeding",
        help="official: every run of a case uses the prompt seed, as the official script does; per_run: run k uses seed + k.",
    ),
    seed: int = typer.Option(None, "--seed", help="Prompt seed for `vllm bench serve --seed` (default 0, its own)."),
    out_dir: Path = typer.Option(None, "--out", help="New run directory (default runs/serve-bench-TIMESTAMP)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Throughput cases through `vllm bench serve`, R runs each, warm-up run dropped.

    Examples:\n
      kerneltrial serve bench --base-url http://127.0.0.1:8000 --model-id m --tokenizer /models/m --cases '[[4096,1024,64,256]]'\n
      kerneltrial serve bench --preset minicpm5-2b --model /models/MiniCPM5-2B\n
      kerneltrial serve bench --preset minicpm5-2b --model /models/MiniCPM5-2B -- --max-num-seqs 64\n
      kerneltrial serve bench --launch --cases '[[512,128,8,32]]' -- vllm serve /models/m --port 8000
    """
    opts = BenchOptions(
        cases=cases,
        client=client,
        repeats=repeats,
        base_url=base_url,
        launch=launch,
        preset=preset,
        override=tuple(override),
        model=model,
        model_id=model_id,
        tokenizer=tokenizer,
        port=port,
        vllm=vllm,
        ready_timeout=ready_timeout,
        bench_timeout=bench_timeout,
        seeding=seeding,
        seed=seed,
        out_dir=out_dir,
        quiet=quiet,
        server_argv=tuple(ctx.args),
    )
    _check_bench_usage(opts)
    text = _bench_protocol(opts)
    _execute(text, Path("."), opts.out_dir or default_out("bench"), RunOptions(opts.vllm, opts.quiet))


@dataclass(frozen=True)
class BenchOptions:
    """`serve bench`'s options (each named after its flag), read once from the command line."""

    cases: str | None
    client: str
    repeats: int
    base_url: str | None
    launch: bool
    preset: str | None
    override: tuple[str, ...]
    model: str | None
    model_id: str | None
    tokenizer: str | None
    port: int | None
    vllm: str | None
    ready_timeout: float
    bench_timeout: float
    seeding: str
    seed: int | None
    out_dir: Path | None
    quiet: bool
    server_argv: tuple[str, ...]  # the arguments after `--`


@dataclass(frozen=True)
class BenchTarget:
    """The server `serve bench` measures: its fields of [server] and of the one arm, and (a preset's) cases
    and the protocol's header comments."""

    server: dict[str, Any]
    arm: dict[str, Any] = field(default_factory=dict)
    cases: list[Case] = field(default_factory=list)
    header: str = ""


def _check_bench_usage(o: BenchOptions) -> None:
    """The usage errors of `serve bench` that need no server and no file."""
    if sum([bool(o.base_url), o.launch, bool(o.preset)]) != 1:
        raise CliError("choose exactly one of --base-url URL, --launch -- <server argv>, --preset NAME")
    if o.server_argv and not (o.launch or o.preset):
        raise CliError(
            f"unexpected arguments {list(o.server_argv[:3])}; arguments after `--` are a server argv (--launch) "
            "or extra server arguments (--preset)"
        )
    if o.override and not o.preset:
        raise CliError("--override replaces a flag of a --preset; pass --preset NAME")
    if o.seeding not in ("official", "per_run"):
        raise CliError(f"--seeding {o.seeding!r} is not official or per_run")
    _client(o.client)


def _bench_protocol(o: BenchOptions) -> str:
    """The protocol `serve bench` runs: one arm, one round, its cases `repeats` times each."""
    import tomli_w

    from kerneltrial.serving.bench import CASE_SETS, parse_cases

    case_list: list[Any] | str | None = o.cases if o.cases in CASE_SETS else parse_cases(o.cases) if o.cases else None
    target = _bench_target(o)
    case_list = case_list or target.cases
    if not case_list:
        raise CliError("no cases; pass --cases '[[input_len, output_len, concurrency, num_requests]]' or a --preset")
    server = {"ready_timeout_s": o.ready_timeout, **target.server} | ({"tokenizer": o.tokenizer} if o.tokenizer else {})
    listed = case_list if isinstance(case_list, str) else [c.as_toml() for c in case_list]
    bench = {"cases": listed, "timeout_s": o.bench_timeout, "seeding": o.seeding, "client": o.client}
    table = {
        "name": "bench",
        "rounds": 1,
        "repeats": o.repeats,
        "server": server,
        "bench": bench | ({"seed": o.seed} if o.seed is not None else {}),
        "arms": [{"name": "server", "role": "arm", **target.arm}],
    }
    return target.header + tomli_w.dumps(table)


def _bench_target(o: BenchOptions) -> BenchTarget:
    """The one target the options name (_check_bench_usage made sure there is one)."""
    if o.preset:
        return _preset_target(o, o.preset)
    if o.base_url:
        return _running_target(o, o.base_url)
    return _launch_target(o)


def _preset_target(o: BenchOptions, name: str) -> BenchTarget:
    """`--preset NAME`: the preset's command with the extra arguments, its model id, env and cases."""
    if o.model_id:
        raise CliError(f"--model-id: preset {name} serves its own model id; leave --model-id out")
    extra, overrides = list(o.server_argv), list(o.override)
    pr, argv, p = _preset_server(name, o.model, o.port, o.vllm, extra, overrides)
    server = {"model_id": pr.model_id, "port": p, "model": o.model}
    return BenchTarget(
        server, {"argv": argv, "env": dict(pr.env)}, list(pr.cases), _preset_header(pr, extra, overrides)
    )


def _launch_target(o: BenchOptions) -> BenchTarget:
    """`--launch -- ARGV`: the server argv, its model id and port."""
    argv, mid, p = server_from_argv(list(o.server_argv), o.model_id, o.port)
    return BenchTarget({"model_id": mid, "port": p} | ({"model": o.model} if o.model else {}), {"argv": argv})


def _running_target(o: BenchOptions, base_url: str) -> BenchTarget:
    """`--base-url URL`: a running server, which must answer /v1/models (and list --model-id)."""
    status, ids = _listed_models(base_url)
    if not 200 <= status < 300:
        raise CliError(f"{base_url}/v1/models answered HTTP {status}; is the server ready?")
    if o.model_id and o.model_id not in ids:
        raise CliError(f"server lists {ids}, not {o.model_id!r}; fix --model-id")
    server = {"model_id": o.model_id or (ids[0] if ids else ""), "base_url": base_url.rstrip("/")}
    return BenchTarget(server | ({"model": o.model} if o.model else {}))


def _listed_models(base_url: str) -> tuple[int, list[str]]:
    """(HTTP status, model ids) of a running server's /v1/models; a usage error when it does not answer."""
    from kerneltrial.serving.launcher import list_models

    try:
        return list_models(base_url)
    except Exception as e:  # noqa: BLE001 - any transport error is the same advice
        raise CliError(f"no answer from {base_url}/v1/models ({type(e).__name__}); is the server running?") from None


def _preset_server(
    name: str, model: str | None, port: int | None, vllm: str | None, extra: list[str], overrides: list[str]
) -> tuple[Preset, list[str], int]:
    """(preset, full server argv, port) of `--preset NAME` with the extra arguments after `--`."""
    from kerneltrial.serving.bench import VLLM_ENV, resolve_vllm
    from kerneltrial.serving.presets import get_preset

    pr = get_preset(name)
    if not model:
        raise CliError(f"preset {name} needs --model PATH (the model is not bundled)")
    exe = resolve_vllm(vllm) if (vllm or os.environ.get(VLLM_ENV)) else "vllm"
    p = port or 8000
    return pr, pr.argv(exe, model, p, extra=extra, overrides=overrides), p


def _preset_header(pr: Preset, extra: list[str], overrides: list[str]) -> str:
    """TOML comments naming the preset, its source and any departure: kept in the run's protocol.toml."""
    lines = [f"# preset {pr.name} ({pr.vendor}): {pr.description}", f"# source: {pr.source}"]
    lines += [f"# left out of the source: {o.flag} {o.value} ({o.reason})" for o in pr.omitted]
    if extra:
        lines.append(f"# extra server arguments: {' '.join(extra)}")
    if overrides:
        lines.append(f"# overridden preset flags (a departure from the official command): {', '.join(overrides)}")
    return "\n".join(lines) + "\n"


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
    used = require_calibration(proto.with_client(_client(client)) if client else proto, protocol.parent)  # first
    out = out_dir or default_out("trial")
    _execute(raw.decode("utf-8"), protocol.parent, out, RunOptions(vllm, quiet, model, client, override_pins, used))


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
    from kerneltrial.serving.pilot import pilot_reason
    from kerneltrial.serving.protocol import load_protocol, parse_protocol

    _, raw = load_protocol(protocol)
    text, trial_rounds = calibration_protocol(raw.decode("utf-8"), launches)
    run_dir = out_dir or default_out("calibrate")
    proto = parse_protocol(text, protocol.parent)
    proto = proto.with_model(model) if model else proto

    def pilot(rows: list[dict[str, Any]]) -> str | None:  # serving/pilot.py: stop when the pilot's noise asks for more
        return pilot_reason(proto, rows, trial_rounds)

    summary = _run(text, protocol.parent, run_dir, RunOptions(vllm, quiet, model, override_pins=override_pins), pilot)
    stopped = pilot_reason(proto, read_jsonl(run_dir / "runs.jsonl"), trial_rounds)
    record = calibration_record(proto, summary, trial_rounds, stopped)
    path = write_calibration(run_dir, record)
    console().print(f"{record.sentence}; {path}", markup=False, soft_wrap=True)
    if not record.passed:
        raise typer.Exit(ExitCode.FAILED)


@app.command(context_settings=EXTRA)
def accuracy(
    ctx: typer.Context,
    base_url: str = typer.Option(None, "--base-url", help="Running server, e.g. http://127.0.0.1:8000."),
    launch: bool = typer.Option(False, "--launch", help="Start the server given after `--`, measure, stop it."),
    model_id: str = typer.Option(None, "--model-id", help="Model id to request (default: first id in /v1/models)."),
    data: str = typer.Option(
        None,
        "--data",
        help="MATH-500 test.jsonl path, or hf:HuggingFaceH4/MATH-500 to load from the hub (online only).",
    ),
    level: str = typer.Option("Level 3", "--level", help="Level filter ('Level 3' or 3); 'all' for every level."),
    limit: int = typer.Option(None, "--limit", help="Only the first N problems after the filter."),
    api: str = typer.Option(
        "chat", "--api", help="chat (/v1/chat/completions, for instruct models) or completions (/v1/completions)."
    ),
    temperature: float = typer.Option(1.0, "--temperature"),
    top_p: float = typer.Option(0.95, "--top-p"),
    max_tokens: int = typer.Option(4096, "--max-tokens", help="Generation budget per problem."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight at once."),
    gate: float = typer.Option(0.95, "--gate", help="Pass when accuracy >= this and no request failed."),
    seed: int = typer.Option(0, "--seed", help="Per-request sampling seed = seed + problem index."),
    port: int = typer.Option(None, "--port", help="Port of the launched server."),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout"),
    out_dir: Path = typer.Option(None, "--out", help="New directory for records.jsonl and accuracy.json."),
) -> None:
    """MATH-500 accuracy gate: per-problem records, accuracy with a Wilson 95% CI, gate >= 0.95."""
    opts = AccuracyOptions(
        base_url=base_url,
        launch=launch,
        model_id=model_id,
        data=data,
        level=level,
        limit=limit,
        api=api,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        concurrency=concurrency,
        gate=gate,
        seed=seed,
        port=port,
        ready_timeout=ready_timeout,
        out_dir=out_dir,
        server_argv=tuple(ctx.args),
    )
    spec = _accuracy_spec(opts)
    from kerneltrial.serving import accuracy as acc_mod

    acc_mod.load_problems(spec.data, spec.level, spec.limit)
    acc_mod.load_grader()
    run_dir = opts.out_dir or default_out("accuracy")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise CliError(f"{run_dir} already holds files; pick a new --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    res = _measure_accuracy(opts, spec, run_dir)
    console().print(
        f"accuracy {res['correct']}/{res['n']} = {res['accuracy']:.3f} "
        f"(Wilson {res['confidence']:.0%} CI {res['ci_low']:.3f}-{res['ci_high']:.3f}); "
        f"request errors {res['errors']}, truncated {res['truncated']}; gate {gate} on {res['n_rule']}: "
        f"{'passed' if res['passed'] else 'FAILED'}",
        soft_wrap=True,
    )
    records = run_dir / "records.jsonl"
    console().print(f"records: {records}  (pandas: read_json(path, lines=True))", soft_wrap=True)
    if not res["passed"]:
        raise typer.Exit(ExitCode.FAILED)


@dataclass(frozen=True)
class AccuracyOptions:
    """`serve accuracy`'s options (each named after its flag), read once from the command line."""

    base_url: str | None
    launch: bool
    model_id: str | None
    data: str | None
    level: str
    limit: int | None
    api: str
    temperature: float
    top_p: float
    max_tokens: int
    concurrency: int
    gate: float
    seed: int
    port: int | None
    ready_timeout: float
    out_dir: Path | None
    server_argv: tuple[str, ...]  # the server argv after `--` (--launch)


def _accuracy_spec(o: AccuracyOptions) -> AccuracySpec:
    """The measurement `serve accuracy` makes; a usage error for a missing server, data or a bad --api."""
    if bool(o.base_url) == o.launch:
        raise CliError("choose one of --base-url URL or --launch -- <server argv>")
    if not o.data:
        raise CliError("pass --data PATH to MATH-500 test.jsonl (or --data hf:HuggingFaceH4/MATH-500 when online)")
    if o.api not in ("chat", "completions"):
        raise CliError(f"--api {o.api!r} is not chat or completions")
    from kerneltrial.serving.accuracy import AccuracySpec

    return AccuracySpec(
        data=o.data,
        level=None if o.level.lower() == "all" else o.level,
        limit=o.limit,
        api=o.api,
        temperature=o.temperature,
        top_p=o.top_p,
        max_tokens=o.max_tokens,
        concurrency=o.concurrency,
        gate=o.gate,
        seed=o.seed,
    )


def _measure_accuracy(o: AccuracyOptions, spec: AccuracySpec, run_dir: Path) -> dict[str, Any]:
    """The accuracy run's result, on the server it launches (--launch) or a running one; the records
    stay in `run_dir` when a launch gate fails or the run is interrupted."""
    from kerneltrial.serving import accuracy as acc_mod
    from kerneltrial.serving.launcher import LaunchError, Server, ServerSpec, install_sigterm_as_interrupt

    install_sigterm_as_interrupt()
    try:
        if o.base_url:  # else --launch (_accuracy_spec refused both and neither)
            model_id = o.model_id or _first_model(o.base_url)
            return acc_mod.run_accuracy(o.base_url.rstrip("/"), model_id, spec, run_dir)
        argv, mid, p = server_from_argv(list(o.server_argv), o.model_id, o.port)
        spec_s = ServerSpec(argv, mid, port=p, ready_timeout_s=o.ready_timeout)
        with Server(spec_s, run_dir / "server.log") as srv:
            res = acc_mod.run_accuracy(spec_s.base_url, srv.served_name, spec, run_dir)
            srv.check_alive("the accuracy run")
        return res
    except LaunchError as e:
        raise CliError(f"{e} (records kept in {run_dir})", ExitCode.FAILED) from None
    except KeyboardInterrupt:
        raise CliError(
            f"interrupted; the server was stopped and the records kept in {run_dir}", ExitCode.INTERRUPTED
        ) from None


def _first_model(base_url: str) -> str:
    """The first model id a running server lists."""
    _, ids = _listed_models(base_url)
    if not ids:
        raise CliError(f"{base_url}/v1/models lists no model; pass --model-id")
    return ids[0]


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
        pr, argv, p = _preset_server(preset, model, port, vllm, list(ctx.args), override)
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
