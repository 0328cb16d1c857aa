"""The PNG figures of a serving report (report.py writes them beside report.md): per case, each
arm's throughput and TTFT per launch with the log-scale interval of its geometric mean, its
latency percentiles, and its goodput when the plan sets SLOs. Drawn from summary.json and
runs.jsonl through report_data.py's records; nothing is measured here."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kerneltrial.publication import titled
from kerneltrial.serving.report_data import LATENCIES, PERCENTILES, ServingRun, arm_case


def _panels(run: ServingRun, panel_width: float) -> tuple[Figure, list[Axes]]:
    """A figure of one panel per case of the plan, side by side, each `panel_width` inches wide."""
    cases = run.plan.cases
    fig = Figure(figsize=(panel_width * len(cases), 4))
    return fig, [fig.add_subplot(1, len(cases), k + 1) for k in range(len(cases))]


def _saved(fig: Figure, title: str, path: Path) -> Path:
    """`fig` under `title`, written to `path` as a PNG; returns `path`."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_metric(run: ServingRun, metric: str, path: Path, unverified: bool = False) -> Path:
    """One panel per case: each launch's figure (dots) and the arm's mean with its interval (bar)."""
    fig, axes = _panels(run, 4.5)
    names = [a.name for a in run.plan.arms]
    label = "total tok/s" if metric == "throughput" else "mean TTFT (ms)"
    for k, (case, ax) in enumerate(zip(run.plan.cases, axes, strict=True)):
        for x, name in enumerate(names):
            cell = arm_case(run, name, case.case)
            pooled = cell.throughput if metric == "throughput" else cell.ttft_ms
            if pooled is None:
                ax.plot([x], [0], "x", color="red")
                continue
            per = [s.throughput.mean if metric == "throughput" else s.ttft_ms.mean for s in cell.launches]
            ax.plot([x] * len(per), per, "o", color="grey", alpha=0.6, label="launch" if x == 0 else None)
            err = (
                [[pooled.mean - pooled.low], [pooled.high - pooled.mean]]
                if pooled.low is not None and pooled.high is not None
                else None
            )
            ax.errorbar(
                [x + 0.15],
                [pooled.mean],
                yerr=err,
                fmt="s",
                color="C0",
                capsize=4,
                label=f"geometric mean, {run.plan.acceptance.confidence:.0%} CI" if x == 0 else None,
            )
        ax.set_xticks(range(len(names)), names)
        ax.set_title(case.case, fontsize="small")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        if k == 0:
            ax.legend(fontsize="small")
    gpu = "" if run.gpu else " (no GPU recorded)"
    return _saved(fig, titled(f"{run.name}: {label} per arm and launch{gpu}", unverified), path)


def plot_latency(run: ServingRun, path: Path, unverified: bool = False) -> Path:
    """One panel per case: p50 (dot) and p99 (triangle) of TTFT, TPOT, ITL and E2E per arm, log scale."""
    fig, axes = _panels(run, 5.5)
    names = [a.name for a in run.plan.arms]
    width = 0.8 / max(len(names), 1)
    for k, (case, ax) in enumerate(zip(run.plan.cases, axes, strict=True)):
        for j, name in enumerate(names):
            result = run.summary.results.get(name, {}).get(case.case)
            for m, (metric, _) in enumerate(LATENCIES):
                x = m + (j - (len(names) - 1) / 2) * width
                for (stat, label), marker in zip(PERCENTILES, ("o", "^"), strict=True):
                    v = None if result is None else result.latency_ms(stat, metric)
                    if v is not None and v > 0:
                        ax.plot([x], [v], marker, color=f"C{j}", label=f"{name} {label}" if m == 0 else None)
        ax.set_xticks(range(len(LATENCIES)), [label for _, label in LATENCIES])
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(case.case, fontsize="small")
        ax.grid(axis="y", alpha=0.3)
        if k == 0:
            ax.legend(fontsize="x-small", ncol=2)
    return _saved(fig, titled(f"{run.name}: latency p50 (dot) and p99 (triangle) per arm", unverified), path)


def plot_goodput(run: ServingRun, path: Path, unverified: bool = False) -> Path:
    """One panel per case: each arm's request goodput (req/s) against the plan's SLOs."""
    fig, axes = _panels(run, 4.5)
    names = [a.name for a in run.plan.arms]
    for case, ax in zip(run.plan.cases, axes, strict=True):
        values = [
            (r.figure("request_goodput") or 0.0) if (r := run.summary.results.get(n, {}).get(case.case)) else 0.0
            for n in names
        ]
        ax.bar(range(len(names)), values, color=[f"C{j}" for j in range(len(names))])
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("goodput (req/s)")
        ax.set_title(case.case, fontsize="small")
        ax.grid(axis="y", alpha=0.3)
    slos = ", ".join(f"{k} <= {v:g} ms" for k, v in (run.plan.goodput or {}).items())
    return _saved(fig, titled(f"{run.name}: request goodput ({slos})", unverified), path)
