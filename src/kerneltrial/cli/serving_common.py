"""What the serving commands share: their help texts, where runs go by default, the server argv's
port and model id, the live display of a trial and its summary, and running a protocol (`_run`).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kerneltrial.cli.support import CliError, ExitCode, console

if TYPE_CHECKING:
    from rich.progress import Progress

    from kerneltrial.rundir.serving_summary_doc import Acceptance, ArmAccuracy, ServingSummary
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


def client_name(client: str) -> str:
    from kerneltrial.serving.bench import CLIENTS

    if client not in CLIENTS:
        raise CliError(f"--client {client!r} is not one of {', '.join(CLIENTS)}; pick one of them")
    return client


def default_out(kind: str) -> Path:
    return Path("runs") / f"serve-{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def server_from_argv(argv: list[str], model_id: str | None, port: int | None) -> tuple[list[str], str, int]:
    """Fill {port}; find the model id (--served-model-name, --model, `serve MODEL`) and port."""
    from kerneltrial.serving.completeness import flag_value

    if not argv:
        raise CliError("no server command; put it after `--`, e.g. `-- vllm serve MODEL --port 8000`")
    p = port or int(flag_value(argv, "--port") or 8000)
    argv = [a.replace("{port}", str(p)) for a in argv]
    if model_id is None:
        model_id = flag_value(argv, "--served-model-name") or flag_value(argv, "--model")
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


def print_summary(summary: ServingSummary, run_dir: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    t = Table(title=f"serving summary ({summary.warmup.rule})")
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
    for arm, cases in summary.results.items():
        for cid, e in cases.items():
            cells = [
                "-" if (v := e.figure(k)) is None else f"{v:.2f}"
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
            t.add_row(escape(arm), escape(cid), e.status, *cells)
    out.print(t)
    for line in accuracy_summary_lines(summary):
        out.print(line, markup=False, soft_wrap=True)
    for arm, d in (summary.dispatch or {}).items():
        shown = {True: "valid", False: "INVALID", None: "not applicable"}[d.valid]
        out.print(f"dispatch proof {arm}: {shown} ({d.reason})", markup=False)
    if summary.acceptance:
        print_acceptance(summary.acceptance)
    if sc := summary.scope:
        why = f" ({'; '.join(sc.reasons)})" if sc.reasons else ""
        out.print(f"scope: {sc.kind} on {sc.hardware}{why}", markup=False)
    for f in summary.failures:
        out.print(f"failure: {f}", markup=False, style="red")
    out.print(
        f"run directory: {run_dir}  (pandas: read_json('runs.jsonl', lines=True), read_csv('requests.csv'))",
        markup=False,
        soft_wrap=True,
    )


def print_acceptance(acc: Acceptance) -> None:
    """Each case's gain and TTFT ratio with their intervals, the verdict and its reasons."""
    from rich.markup import escape

    out = console()
    for cid, c in acc.cases.items():
        if c.gain is None or c.ttft_ratio is None:
            continue
        gain, ttft = f"{c.gain:+.2%}", f"{c.ttft_ratio:.4f}"
        if c.gain_low is not None and c.gain_high is not None:
            gain += f" [{c.gain_low:+.2%}, {c.gain_high:+.2%}]"
            ttft += f" [{c.ttft_ratio_low:.4f}, {c.ttft_ratio_high:.4f}]"
        out.print(
            f"{cid}: total tok/s gain {gain} (lower bound must exceed {acc.noise_band:.2%}), "
            f"TTFT ratio {ttft} (upper bound at most {acc.ttft_ratio_max}), "
            f"{acc.confidence:.0%} intervals over {c.rounds} launch(es) per arm",
            markup=False,
        )
    shown = acc.verdict or ("ACCEPTED" if acc.accepted else "REJECTED")
    verdict = f"[green]{shown}[/]" if acc.accepted else f"[red]{shown}[/]"
    out.print(f"candidate {escape(acc.candidate)} vs baseline {escape(acc.baseline)}: {verdict}")
    for r in acc.reasons:
        out.print(f"  - {r}", markup=False)


@dataclass(frozen=True)
class RunOptions:
    """The command-line options a serving run takes beside its protocol (each recorded in the run)."""

    vllm: str | None  # --vllm
    quiet: bool = False
    model: str | None = None  # --model: replaces server.model (plan.json argv_expanded, tokenizer)
    client: str | None = None  # --client: replaces bench.client (plan.json client, every client_argv)
    override_pins: bool = False  # --override-pins (plan.json override_pins, launches.jsonl pins)
    calibration: dict[str, Any] | None = None  # the passed calibration a trial rests on (provenance.json)


def run_text(proto_text: str, base_dir: Path, run_dir: Path, opts: RunOptions, stop: Any = None) -> ServingSummary:
    """Run a serving protocol into `run_dir` and print its summary; exit 1 when a run failed (a run
    that `stop` ended, the calibration's pilot, returns its summary)."""
    from kerneltrial.rundir.serving_summary_doc import read_serving_summary
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
        proto = proto.with_client(client_name(opts.client))
    if proto.accuracy is not None:
        load_grader()  # before the first launch, not an hour later at the first graded answer
    vllm = resolve_vllm(opts.vllm)
    install_sigterm_as_interrupt()
    display = Display(enabled=not opts.quiet)
    try:
        args = (sys.argv, display, opts.override_pins, stop, opts.calibration)
        summary = run_protocol(proto, proto_text.encode(), run_dir, vllm, *args)
    except PilotStop:  # summarised and recorded as FAILED with its reason; the caller writes its verdict
        return read_serving_summary(run_dir)
    except (LaunchError, BenchError) as e:  # a gate of the run failed: a failed check, not bad input
        raise CliError(f"{e} (raw data kept in {run_dir})", ExitCode.FAILED) from None
    except KeyboardInterrupt:
        raise CliError(
            f"interrupted; the server was stopped and the raw data kept in {run_dir}", ExitCode.INTERRUPTED
        ) from None
    finally:
        display.stop()
    print_summary(summary, run_dir)
    if summary.status != "ok":
        raise CliError(
            f"a run or a dispatch proof failed (see the failures above and summary.json in {run_dir})", ExitCode.FAILED
        )
    return summary


def execute(proto_text: str, base_dir: Path, run_dir: Path, opts: RunOptions) -> None:
    """Run a serving protocol into `run_dir`; exit 1 when a run failed or the candidate was not ACCEPTED."""
    summary = run_text(proto_text, base_dir, run_dir, opts)
    if summary.acceptance and not summary.acceptance.accepted:
        raise typer.Exit(ExitCode.FAILED)  # the verdict (REJECTED, INCONCLUSIVE) and its reasons are printed above


def preset_server(
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


def accuracy_summary_lines(summary: ServingSummary) -> list[str]:
    """Each arm's accuracy line and its cross-grade's lines (serving/crossgrade.py: the counts and
    the disagreements, or why it did not run; runs from before the trial ran one have none)."""
    out = []
    for arm, a in summary.accuracy.items():
        out.append(f"accuracy {arm}: {accuracy_line(a).removeprefix('accuracy ')}")
        if a.cross_grade is not None:
            out += [f"{arm} {line}" for line in a.cross_grade.lines()]
    return out


def accuracy_line(res: ArmAccuracy) -> str:
    """One accuracy result in a line (the line of before samples, then the gate's rule and its pass
    probability at the gate)."""
    k = res.samples
    graded = f"{res.correct}/{res.n * k}" + (f" ({res.n} problems x {k} samples)" if k > 1 else "")
    effect = 1.0 if res.design_effect is None else res.design_effect
    interval = "Wilson" if k == 1 else f"Wilson, design effect {effect:.2f},"
    at_gate = res.pass_probability_at_gate
    rule = "interval's lower end" if res.rule == "lower_bound" else "accuracy"
    return (
        f"accuracy {graded} = {res.accuracy:.3f} ({interval} {res.confidence:.0%} CI "
        f"{res.ci_low:.3f}-{res.ci_high:.3f}); request errors {res.errors}, truncated "
        f"{res.truncated or 0}; gate {res.gate} on {res.n_rule or 'any n'}: "
        f"{'passed' if res.passed else 'FAILED'} (rule: {rule} >= {res.gate}); a model at exactly "
        f"{res.gate} passes this gate with probability "
        f"{'(not computed)' if at_gate is None else f'{at_gate:.3f}'} (independent samples)"
    )
