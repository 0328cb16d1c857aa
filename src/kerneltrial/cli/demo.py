"""`kerneltrial demo`: the built-in default, the whole pipeline on a small rmsnorm trial."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kerneltrial.cli.support import ExitCode, console, progress_bar
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.layout import CORRECTNESS, SUMMARY

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
