"""Human views of kernel runs: report.md + PNG figures, and a combined PERFORMANCE.md.

Every figure is drawn from summary.json (nothing is recomputed here); provenance.json and
protocol.toml only supply the device, versions and operator name. Runs without a GPU are
labelled "NOT GPU performance" in every heading and figure title.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from kerneltrial.analysis.errors import RunDirError

SPEEDUP_PNG = "speedup.png"
VERDICTS_PNG = "verdicts.png"
CEILING_PNG = "ceiling.png"


# ---------------------------------------------------------------- loading

def load_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not Path(run_dir).is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    if not path.is_file():
        raise RunDirError(
            f"{run_dir}: no summary.json; write it first (the runner does, or analysis.summary.write_summary)"
        )
    return json.loads(path.read_text())


def _provenance(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "provenance.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def operator_name(run_dir: Path, summary: dict[str, Any]) -> str:
    """summary's `op`, else the protocol's `op`/`operator` key, else the directory name."""
    if summary.get("op"):
        return str(summary["op"])
    path = Path(run_dir) / "protocol.toml"
    protocol = tomllib.loads(path.read_text()) if path.is_file() else {}
    return str(protocol.get("op") or protocol.get("operator") or Path(run_dir).name)


def compared_arms(summary: dict[str, Any]) -> list[str]:
    """Available arms other than the control, in plan order."""
    return [a["name"] for a in summary["arms"] if a["available"] and a["name"] != summary["control"]]


# ---------------------------------------------------------------- formatting

def _num(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _rate(value: float | None) -> str:
    """GB/s or a percentage: one decimal, or three significant digits when small (CPU runs)."""
    return "–" if value is None else format(value, ",.1f" if abs(value) >= 10 else ".3g")


def speedup_cell(entry: dict[str, Any]) -> str:
    if entry["speedup"] is None:
        return "–"
    return f"{entry['speedup']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def _status_cell(entry: dict[str, Any], is_control: bool) -> str:
    if entry["status"] == "failed correctness":
        return "**failed correctness**: " + "; ".join(entry["messages"])
    if entry["status"] in ("unavailable", "not timed"):
        return f"{entry['status']}: {entry['reason']}"
    return "control" if is_control else (entry["verdict"] or "no control timing")


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def case_table(summary: dict[str, Any]) -> list[str]:
    """One row per (case, arm), every arm including failed and unavailable ones."""
    rows = []
    for case in summary["cases"]:
        for name, entry in case["arms"].items():
            rows.append([
                f"`{case['case']}`", f"`{name}`", _num(_us(entry["median_ns_per_call"]), ",.2f"),
                speedup_cell(entry), _status_cell(entry, name == summary["control"]),
                _rate(entry["gbps"]), _rate(entry["pct_of_copy_ceiling"]),
            ])
    confidence = int(round(100 * summary["bootstrap"]["confidence"]))
    header = ["case", "arm", "median µs", f"speedup [{confidence}% CI]", "verdict", "GB/s", "% of copy ceiling"]
    return _table(header, rows)


def aggregate_table(summary: dict[str, Any]) -> list[str]:
    rows = []
    for name in compared_arms(summary):
        agg = summary["aggregates"][name]
        gate = summary["gate"]["arms"][name]
        ci = "–" if agg["geomean"] is None else \
            f"{agg['geomean']:.3f} [{agg['geomean_ci_low']:.3f}, {agg['geomean_ci_high']:.3f}]"
        worst = "–" if agg["worst"] is None else f"{agg['worst']:.3f} (`{agg['worst_case']}`)"
        verdict = "pass" if gate["passed"] else "FAIL: " + "; ".join(gate["reasons"])
        rows.append([f"`{name}`", ci, _num(agg["mean"], ".3f"), worst,
                     f"{agg['wins']}/{agg['ties']}/{agg['losses']}", str(agg["failed_correctness"]), verdict])
    return _table(["arm", "geomean [CI]", "mean", "worst case", "wins/ties/losses", "failed correctness",
                   f"gate `{summary['gate']['rule']}`"], rows)


def _us(ns: float | None) -> float | None:
    return None if ns is None else ns / 1000.0


def banner(summary: dict[str, Any]) -> str:
    """The timing label; loud when the run is not GPU performance."""
    return summary["label"] if summary["is_gpu"] else f"**{summary['label']}**"


def _provenance_lines(provenance: dict[str, Any]) -> list[str]:
    lines = []
    if provenance.get("device"):
        lines.append(f"- device: {_compact(provenance['device'])}")
    if provenance.get("versions"):
        lines.append(f"- versions: {_compact(provenance['versions'])}")
    if provenance.get("git"):
        lines.append(f"- git: {_compact(provenance['git'])}")
    return lines


def _names(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _compact(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_compact(v)}" for k, v in value.items())
    return str(value)


# ---------------------------------------------------------------- figures

def _title(summary: dict[str, Any], text: str) -> str:
    return text if summary["is_gpu"] else f"{text}\n({summary['label']})"


def plot_speedups(summary: dict[str, Any], path: Path) -> Path:
    """Speedup with CI per case and arm; every case shown, failed arms marked with an x at 1."""
    arms = compared_arms(summary)
    cases = [c["case"] for c in summary["cases"]]
    band = summary["tie_band"]
    fig = Figure(figsize=(max(6.0, 1.2 * len(cases) * max(1, len(arms)) ** 0.5 + 2), 4.5))
    ax = fig.subplots()
    ax.axhspan(1 - band, 1 + band, color="0.85", label=f"tie band ±{band:g}")
    ax.axhline(1.0, color="black", linewidth=1)
    width = 0.8 / max(1, len(arms))
    for j, name in enumerate(arms):
        offset = (j - (len(arms) - 1) / 2) * width
        xs, ys, lows, highs, failed = [], [], [], [], []
        for i, case in enumerate(summary["cases"]):
            entry = case["arms"][name]
            if entry["speedup"] is not None:
                xs.append(i + offset)
                ys.append(entry["speedup"])
                lows.append(entry["speedup"] - entry["ci_low"])
                highs.append(entry["ci_high"] - entry["speedup"])
            elif entry["status"] == "failed correctness":
                failed.append(i + offset)
        line = ax.errorbar(xs, ys, yerr=[lows, highs], fmt="o", capsize=3, label=name)
        if failed:
            ax.scatter(failed, [1.0] * len(failed), marker="x", s=60, color=line[0].get_color(),
                       label=f"{name}: failed correctness")
    ax.set_xticks(range(len(cases)), cases, rotation=30, ha="right")
    ax.set_ylabel(f"speedup vs {summary['control']} (×)")
    ax.set_title(_title(summary, "Speedup per case with bootstrap CI"))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_verdicts(summary: dict[str, Any], path: Path) -> Path:
    """Stacked wins / ties / losses / failed correctness per arm."""
    arms = compared_arms(summary)
    fig = Figure(figsize=(max(5.0, 1.2 * len(arms) + 2), 4))
    ax = fig.subplots()
    bottom = [0] * len(arms)
    for key, label, color in (("wins", "win", "tab:green"), ("ties", "tie", "0.6"),
                              ("losses", "loss", "tab:red"), ("failed_correctness", "failed correctness", "black")):
        counts = [summary["aggregates"][name][key] for name in arms]
        ax.bar(arms, counts, bottom=bottom, label=label, color=color)
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax.set_ylabel("cases")
    ax.set_title(_title(summary, "Verdicts per arm"))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_ceiling(summary: dict[str, Any], path: Path) -> Path:
    """% of the copy ceiling per case and arm (control included)."""
    arms = [a["name"] for a in summary["arms"] if a["available"]]
    cases = [c["case"] for c in summary["cases"]]
    fig = Figure(figsize=(max(6.0, 0.5 * len(cases) * len(arms) + 2), 4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(arms))
    for j, name in enumerate(arms):
        values = [c["arms"][name]["pct_of_copy_ceiling"] or 0.0 for c in summary["cases"]]
        ax.bar([i + (j - (len(arms) - 1) / 2) * width for i in range(len(cases))], values, width, label=name)
    ax.axhline(100.0, color="black", linewidth=1)
    ax.set_xticks(range(len(cases)), cases, rotation=30, ha="right")
    ax.set_ylabel("% of copy ceiling")
    copy = summary["ceilings"]["copy_gbps"]
    ax.set_title(_title(summary, f"Bandwidth vs copy ceiling ({_rate(copy)} GB/s)"))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


# ---------------------------------------------------------------- documents

def run_section(run_dir: Path, summary: dict[str, Any], level: int = 1) -> list[str]:
    """The markdown body shared by report.md and PERFORMANCE.md for one run."""
    h = "#" * level
    ceilings = summary["ceilings"]
    lines = [
        f"{h} {operator_name(run_dir, summary)}: `{Path(run_dir).name}`", "",
        f"Timing: {banner(summary)}", "",
        f"- protocol sha256: `{summary['protocol_sha256']}`",
        f"- backend `{summary['backend']}`, L2 `{summary['l2']}`, control `{summary['control']}`, "
        f"tie band ±{summary['tie_band']:g}",
        f"- ceilings: copy {_rate(ceilings['copy_gbps'])} GB/s, read {_rate(ceilings['read_gbps'])} GB/s "
        f"(medians of {ceilings['copy_samples']} and {ceilings['read_samples']} samples)",
        *_provenance_lines(_provenance(run_dir)),
        f"- gate `{summary['gate']['rule']}`: passed by {_names(summary['gate']['passed_arms']) or 'no arm'}",
        "", f"{h}# Per arm", "", *aggregate_table(summary),
        "", f"{h}# Per case (every case and arm; regressions included)", "", *case_table(summary),
    ]
    unavailable = [a for a in summary["arms"] if not a["available"]]
    if unavailable:
        lines += ["", "Unavailable arms: " + "; ".join(f"`{a['name']}` ({a['reason']})" for a in unavailable)]
    if summary["warnings"]:
        lines += ["", f"{h}# Warnings", "", *(f"- {w}" for w in summary["warnings"])]
    return lines


def write_report(run_dir: Path) -> Path:
    """Write report.md and its PNG figures into the run directory; returns report.md's path."""
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    plot_speedups(summary, run_dir / SPEEDUP_PNG)
    plot_verdicts(summary, run_dir / VERDICTS_PNG)
    plot_ceiling(summary, run_dir / CEILING_PNG)
    lines = run_section(run_dir, summary) + [
        "", "## Figures", "",
        f"![speedup per case]({SPEEDUP_PNG})", "", f"![verdicts per arm]({VERDICTS_PNG})", "",
        f"![% of copy ceiling]({CEILING_PNG})", "",
        "Figures are drawn from summary.json; `kerneltrial verify` rebuilds every figure from the raw rows.",
    ]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_performance_md(run_dirs: list[Path], out: Path) -> Path:
    """Render one markdown file covering several run directories (e.g. PERFORMANCE.md)."""
    if not run_dirs:
        raise RunDirError("no run directories given; pass at least one")
    sections = [run_section(Path(d), load_summary(Path(d)), level=2) for d in run_dirs]
    lines = ["# Performance", "",
             "Generated by `kerneltrial performance` from committed run directories; medians are per call, "
             "speedup = median(control) / median(arm) with a paired bootstrap CI. "
             "Runs labelled NOT GPU performance were timed on a CPU.", ""]
    for section in sections:
        lines += section + [""]
    out = Path(out)
    out.write_text("\n".join(lines))
    return out
