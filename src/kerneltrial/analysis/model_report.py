"""Reports of model trials (src/kerneltrial/model), drawn from summary.json and plan.json alone:
report.md of one run, and its section in PERFORMANCE.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kerneltrial.rundir.files import read_json, read_jsonl


def _ratio(entry: dict[str, Any] | None) -> str:
    if not entry:
        return ""
    low, high = entry["ci"]
    return f"{entry['speedup']:.3f} [{low:.3f}, {high:.3f}] {entry['verdict']}"


def _share(attr: dict[str, Any] | None) -> str:
    if not attr or attr.get("share") is None:
        return ""
    return f"{100 * attr['share']:.1f}%"


def case_lines(cid: str, case: dict[str, Any]) -> list[str]:
    lines = [
        f"### {cid} ({case['phase']}, {case['tokens_per_call']} tokens per call)",
        "",
        "| arm | median ms | tokens/s | vs eager [CI] | vs torch_eager [CI] | replaceable ops' share | ops' time (ms) |",
        "|---|---:|---:|---|---|---:|---|",
    ]
    for arm, e in case["arms"].items():
        attr = e.get("attribution") or {}
        regions = ", ".join(f"{op} {ns / 1e6:.3f}" for op, ns in attr.get("regions_ns", {}).items())
        lines.append(
            f"| {arm} | {e['median_ns'] / 1e6:.3f} | {e['tokens_per_s']:.1f} | {_ratio(e.get('vs_eager'))} | "
            f"{_ratio(e.get('vs_torch_eager'))} | {_share(attr)} | {regions} |"
        )
    return [*lines, ""]


def render(run_dir: Path) -> str:
    plan = read_json(run_dir / "plan.json")
    summary = read_json(run_dir / "summary.json")
    lines = [
        f"# Model trial: {plan['model']} ({plan['dtype']})",
        "",
        f"Timing: {summary['timing_label']}. {plan['rounds']} interleaved rounds per case, "
        f"{plan['calls_per_sample']} call(s) per sample; speedup = median(reference) / median(arm), "
        f"{plan['bootstrap']['confidence']:.0%} paired bootstrap interval over rounds, tie band ±{plan['tie_band']:.0%}.",
        "The eager arm is the untouched model; torch_eager is the patched structure with torch formulas, "
        "so `vs torch_eager` isolates the kernels. The share is the routed operators' part of one profiled "
        "call's device time: no kernel swap saves more than that share.",
        "",
        "## Correctness (before timing)",
        "",
        "Logits: distance of the prompts' last-position logits to the float32 model (relative to its max "
        "logit; an arm passes at most `oracle_factor` x eager's own distance) and to eager's.",
        "",
        "| arm | passed | calls per forward | to float32 (limit) | to eager | identical greedy steps | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for row in read_jsonl(run_dir / "correctness.jsonl"):
        calls = ", ".join(f"{k} {v}" for k, v in row["calls_per_forward"].items())
        rel = row.get("logits_rel_diff")
        oracle = row.get("oracle_rel_error")
        limit = row.get("oracle_rel_error_limit")
        to_oracle = "" if oracle is None else f"{oracle:.3g}" + ("" if limit is None else f" ({limit:.3g})")
        note = row["message"]
        div = row.get("first_divergence")
        if div and div["near_tie"]:
            note = note or f"near-tie divergence at step {div['step']} (margin {div['margin']:.2g})"
        lines.append(
            f"| {row['arm']} | {'yes' if row['passed'] else '**no**'} | {calls} | {to_oracle} | "
            f"{'' if rel is None else f'{rel:.3g}'} | {row.get('greedy_identical_steps', '')} | {note} |"
        )
    for arm, reason in summary["unavailable"].items():
        lines.append(f"| {arm} | not run | | | | | {reason} |")
    lines += ["", "## Timing", ""]
    for cid, case in summary["cases"].items():
        lines += case_lines(cid, case)
    return "\n".join(lines)


def performance_section(run_dir: Path) -> list[str]:
    """The run's section in PERFORMANCE.md: its timing tables under the run's name."""
    plan = read_json(run_dir / "plan.json")
    summary = read_json(run_dir / "summary.json")
    lines = [
        f"### {run_dir.name}: {plan['model']} ({plan['dtype']}), whole model",
        "",
        f"Timing: {summary['timing_label']}; {plan['rounds']} interleaved rounds. Arms not timed: "
        + (", ".join(f"{a} ({why})" for a, why in summary["unavailable"].items()) or "none")
        + ". Correctness: "
        + ", ".join(f"{a} {'passed' if c['passed'] else 'FAILED'}" for a, c in summary["correctness"].items())
        + ".",
        "",
    ]
    for cid, case in summary["cases"].items():
        lines += ["#" + line if line.startswith("### ") else line for line in case_lines(cid, case)]
    return lines


def write_model_report(run_dir: Path) -> Path:
    path = run_dir / "report.md"
    path.write_text(render(run_dir))
    return path
