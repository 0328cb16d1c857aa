"""A kernel run's figures (PNG, matplotlib), each drawn from summary.json: speedups per case,
verdicts per arm, the bandwidth ceiling. Titles say "NOT GPU performance" without a GPU and
UNVERIFIED when asked (kernel/report.py writes them beside report.md).

Each is drawn under matplotlib's default style, whatever matplotlibrc the environment has, so that
a run and a matplotlib version give the same PNG bytes anywhere: verify draws every figure of
FIGURES again and compares the bytes (kernel/derived.py)."""

from __future__ import annotations

import functools
import io
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, ParamSpec, TypeVar

import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from kerneltrial.kernel.cells import rate
from kerneltrial.publication import titled
from kerneltrial.rundir.layout import CEILING_PNG, SIZE_PNG, SPEEDUP_PNG, VERDICTS_PNG
from kerneltrial.rundir.summary_doc import Summary, read_summary

DISQUALIFIED_MARKERS = {"failed correctness": "x", "failed while timed": "X", "implausible": "^"}
TITLE_CHARS_PER_INCH = 9  # the default 12 pt title font sets ~11-11.6 characters per inch (measured); 9 leaves a margin
Target = Path | BinaryIO  # a file to write, or a buffer (verify's rendering, as PNG)
Draw = Callable[[Summary, Target, bool], Target]  # (summary, where, unverified) -> where
P = ParamSpec("P")
R = TypeVar("R")


def _default_style(draw: Callable[P, R]) -> Callable[P, R]:
    """`draw` under matplotlib's default style (the environment's matplotlibrc does not reach the PNG)."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.style.context("default"):
            return draw(*args, **kwargs)

    return drawn


def _title(summary: Summary, text: str, fig: Figure, unverified: bool = False) -> str:
    """The title (marked when the run was not verified), and the timing label of a run that is not
    GPU performance, each wrapped to the figure's width (about TITLE_CHARS_PER_INCH characters of
    the default title font)."""
    width = max(20, int(fig.get_figwidth() * TITLE_CHARS_PER_INCH))
    text = titled(text, unverified)
    lines = [text] if summary.is_gpu else [text, f"({summary.label})"]
    return "\n".join(textwrap.fill(line, width) for line in lines)


def _save(fig: Figure, ax: Any, path: Target) -> Target:
    """Legend (beside the axes, never over the data), layout and the PNG: the common end of every
    figure. A file's format is its suffix's (`plot --out`), a buffer's PNG."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight", format=None if isinstance(path, Path) else "png")
    return path


def _log_speedup_axis(ax: Any, values: list[float]) -> None:
    """A log y axis for ratios (2x and 0.5x equally far from 1), labelled with plain numbers:
    1-2-5 ticks over a decade or more, evenly spaced ticks over a narrower range (a log axis
    would show none there)."""
    ax.set_yscale("log")
    low, high = min(values, default=1.0), max(values, default=1.0)
    wide = high / low >= 10 if low > 0 else True
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)) if wide else MaxNLocator(nbins=6))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


@_default_style
def plot_speedups(summary: Summary, path: Target, unverified: bool = False) -> Target:
    """Speedup with CI per case and arm; every case shown, failed arms marked with an x at 1."""
    arms = summary.compared_arms()
    cases = [c.case for c in summary.cases]
    band = summary.tie_band
    fig = Figure(figsize=(max(6.0, 1.2 * len(cases) * max(1, len(arms)) ** 0.5 + 2), 4.5))
    ax = fig.subplots()
    shown = [1 - band, 1 + band]
    ax.axhspan(1 - band, 1 + band, color="0.85", label=f"tie band ±{band:g}")
    ax.axhline(1.0, color="black", linewidth=1)
    width = 0.8 / max(1, len(arms))
    for j, name in enumerate(arms):
        offset = (j - (len(arms) - 1) / 2) * width
        xs, ys, lows, highs = [], [], [], []
        disqualified: dict[str, list[float]] = {}
        for i, case in enumerate(summary.cases):
            entry = case.arms[name]
            if entry.speedup is not None and entry.ci_low is not None and entry.ci_high is not None:
                xs.append(i + offset)
                ys.append(entry.speedup)
                lows.append(entry.speedup - entry.ci_low)
                highs.append(entry.ci_high - entry.speedup)
                shown += [entry.ci_low, entry.ci_high]
            elif entry.status in DISQUALIFIED_MARKERS:
                disqualified.setdefault(entry.status, []).append(i + offset)
        line = ax.errorbar(xs, ys, yerr=[lows, highs], fmt="o", capsize=3, label=name)
        for status, where in disqualified.items():
            ax.scatter(
                where,
                [1.0] * len(where),
                marker=DISQUALIFIED_MARKERS[status],
                s=60,
                color=line[0].get_color(),
                label=f"{name}: {status}",
            )
    ax.set_xticks(range(len(cases)), cases, rotation=30, ha="right")
    _log_speedup_axis(ax, shown)
    ax.set_ylabel(f"speedup vs {summary.control} (×, log scale)")
    ax.set_title(_title(summary, "Speedup per case with bootstrap CI", fig, unverified))
    return _save(fig, ax, path)


@_default_style
def plot_verdicts(summary: Summary, path: Target, unverified: bool = False) -> Target:
    """Stacked wins / ties / losses / failed correctness per arm (runs with timed checks: also
    inconclusive, failed while timed and implausible)."""
    arms = summary.compared_arms()
    fig = Figure(figsize=(max(5.0, 1.2 * len(arms) + 2), 4))
    ax = fig.subplots()
    bottom = [0] * len(arms)
    bars = [
        ("wins", "win", "tab:green"),
        ("ties", "tie", "0.6"),
        ("inconclusive", "inconclusive", "tab:olive"),
        ("losses", "loss", "tab:red"),
        ("failed_correctness", "failed correctness", "black"),
        ("failed_while_timed", "failed while timed", "tab:purple"),
        ("implausible", "implausible", "tab:orange"),
    ]
    for key, label, color in bars:
        counts = [getattr(summary.aggregates[name], key) for name in arms]
        if None in counts:  # a count the summary's version did not keep
            continue
        ax.bar(arms, counts, bottom=bottom, label=label, color=color)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of cases: no 0.5 ticks
    ax.set_ylabel("cases")
    ax.set_title(_title(summary, "Verdicts per arm", fig, unverified))
    return _save(fig, ax, path)


@_default_style
def plot_ceiling(summary: Summary, path: Target, unverified: bool = False) -> Target:
    """% of the copy ceiling per case and arm (control included)."""
    arms = [a.name for a in summary.arms if a.available]
    cases = [c.case for c in summary.cases]
    fig = Figure(figsize=(max(6.0, 0.5 * len(cases) * len(arms) + 2), 4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(arms))
    for j, name in enumerate(arms):
        values = [c.arms[name].pct_of_copy_ceiling or 0.0 for c in summary.cases]
        ax.bar([i + (j - (len(arms) - 1) / 2) * width for i in range(len(cases))], values, width, label=name)
    ax.axhline(100.0, color="black", linewidth=1)
    ax.set_xticks(range(len(cases)), cases, rotation=30, ha="right")
    ax.set_ylabel("% of copy ceiling")
    copy = summary.ceilings.copy_gbps
    ax.set_title(_title(summary, f"Bandwidth vs copy ceiling ({rate(copy)} GB/s)", fig, unverified))
    return _save(fig, ax, path)


# ---------------------------------------------------------------- documents


@_default_style
def plot_against_size(summary: Summary, path: Target, unverified: bool = False) -> Target:
    """Time per call and GB/s of each timed arm against the bytes each case moves (log-log), one
    line per arm through its cases in order of size: where an arm falls off with size, or never
    leaves the launch floor. Cases of one size (layouts, dtypes) are drawn as separate points."""
    fig = Figure(figsize=(10, 4.4))
    time_ax, rate_ax = fig.subplots(1, 2)
    cases = sorted(summary.cases, key=lambda c: c.bytes)
    arms = list(dict.fromkeys(name for c in cases for name in c.arms))
    for name in arms:
        points = [
            (c.bytes, c.arms[name])
            for c in cases
            if name in c.arms and c.arms[name].status == "timed" and c.arms[name].median_ns_per_call is not None
        ]
        if not points:
            continue
        sizes = [size for size, _ in points]
        time_ax.plot(sizes, [f.median_ns_per_call / 1e3 for _, f in points], marker="o", label=name)
        rate_ax.plot(sizes, [f.gbps for _, f in points], marker="o", label=name)
    for ax, label in ((time_ax, "median µs per call"), (rate_ax, "GB/s (bytes moved / median time)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes moved per call")
        ax.set_ylabel(label)
    time_ax.set_title(_title(summary, "Time and bandwidth against size", fig, unverified), fontsize="medium")
    return _save(fig, rate_ax, path)


# every figure a command adds to a kernel run directory, by its file name (verify draws each again)
FIGURES: dict[str, Draw] = {
    SPEEDUP_PNG: plot_speedups,
    VERDICTS_PNG: plot_verdicts,
    CEILING_PNG: plot_ceiling,
    SIZE_PNG: plot_against_size,
}


def figure_png(run_dir: Path, name: str, unverified: bool) -> bytes:
    """The PNG bytes of figure `name` of FIGURES as its command draws it from the run's summary.json
    (verify compares them with the file: kernel/derived.py)."""
    buffer = io.BytesIO()
    FIGURES[name](read_summary(run_dir), buffer, unverified)
    return buffer.getvalue()


def draw_figure(run_dir: Path, name: str, unverified: bool) -> Path:
    """Figure `name` of FIGURES drawn from the run's summary.json into its file in the run directory
    (`report` and `plot` replace a figure verify fails this way: cli/analysis.py)."""
    return FIGURES[name](read_summary(run_dir), Path(run_dir) / name, unverified)
