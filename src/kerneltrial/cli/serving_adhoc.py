"""The ad-hoc serving commands, `serve bench` and `serve accuracy`: a benchmark or a MATH-500
accuracy run outside a trial (cli/serving.py mounts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kerneltrial.cli.serving_common import (
    CASES_HELP,
    CLIENT_HELP,
    OVERRIDE_HELP,
    PRESET_HELP,
    VLLM_HELP,
    RunOptions,
    accuracy_line,
    client_name,
    default_out,
    execute,
    preset_server,
    server_from_argv,
)
from kerneltrial.cli.support import CliError, ExitCode, console

if TYPE_CHECKING:
    from kerneltrial.serving.accuracy import AccuracySpec
    from kerneltrial.serving.bench import Case
    from kerneltrial.serving.presets import Preset


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
    execute(text, Path("."), opts.out_dir or default_out("bench"), RunOptions(opts.vllm, opts.quiet))


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
    client_name(o.client)


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
    pr, argv, p = preset_server(name, o.model, o.port, o.vllm, extra, overrides)
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


def _preset_header(pr: Preset, extra: list[str], overrides: list[str]) -> str:
    """TOML comments naming the preset, its source and any departure: kept in the run's protocol.toml."""
    lines = [f"# preset {pr.name} ({pr.vendor}): {pr.description}", f"# source: {pr.source}"]
    lines += [f"# left out of the source: {o.flag} {o.value} ({o.reason})" for o in pr.omitted]
    if extra:
        lines.append(f"# extra server arguments: {' '.join(extra)}")
    if overrides:
        lines.append(f"# overridden preset flags (a departure from the official command): {', '.join(overrides)}")
    return "\n".join(lines) + "\n"


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
    gate: float = typer.Option(0.95, "--gate", help="Pass when the --rule holds against this and no request failed."),
    rule: str = typer.Option(
        "point",
        "--rule",
        help="point: accuracy >= --gate; lower_bound: the interval's lower end >= --gate. Printed with the result: "
        "the pass probability at the gate, P(this rule passes) for a model whose every sample is correct with "
        "probability exactly --gate, independently, with this n and --samples (about 0.5 for point).",
    ),
    samples: int = typer.Option(
        1, "--samples", help="Samples per problem (k); k > 1: interval with the design effect of k per problem."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed of problem i's sample j: seed + i + j * 1000000."),
    port: int = typer.Option(None, "--port", help="Port of the launched server."),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout"),
    out_dir: Path = typer.Option(None, "--out", help="New directory for records.jsonl and accuracy.json."),
) -> None:
    """MATH-500 accuracy gate: per-sample records, accuracy with its 95% interval, the gate on the
    stated --rule with its pass probability at the gate, and (with kerneltrial[evalscope]) a cross-grade
    by evalscope's math_500 with the disagreements listed."""
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
        rule=rule,
        samples=samples,
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
    from kerneltrial.rundir.serving_summary_doc import ArmAccuracy

    measured = ArmAccuracy.model_validate({k: res[k] for k in ArmAccuracy.model_fields})
    crossed = measured.cross_grade.lines() if measured.cross_grade is not None else []
    for line in [accuracy_line(measured), *crossed]:
        console().print(line, soft_wrap=True, markup=False)
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
    rule: str
    samples: int
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
    if o.rule not in ("point", "lower_bound"):
        raise CliError(f"--rule {o.rule!r} is not point or lower_bound")
    if o.samples < 1:
        raise CliError(f"--samples {o.samples} is below 1; pass 1 (one sample per problem) or more")
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
        rule=o.rule,
        samples=o.samples,
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
