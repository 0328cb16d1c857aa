"""summary.json of a model trial, computed from the raw files alone (plan, correctness,
timings, attribution). Statistics are the operator trials' (analysis/stats.py): the median
time per call, and the speedup median(reference) / median(arm) with a paired percentile
bootstrap interval over rounds, called win / tie / loss against the tie band.

Two references per arm: `eager` (the untouched model: what a user gains) and, when the
protocol runs it, `torch_eager` (the same patched structure with torch formulas: what the
kernels alone change). `share` is the fraction of a profiled call's time spent inside the
routed operators: no kernel swap can save more than that share of the call.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.analysis.stats import BootstrapRule, bootstrap_speedup_ci, median, speedup, three_way_verdict
from kerneltrial.rundir.files import read_csv, read_json, read_jsonl

SCHEMA = "kerneltrial.model-summary/1"
REFERENCES = ("eager", "torch_eager")


def per_call_ns(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[int, float]]:
    """(case, arm) -> round -> nanoseconds per call."""
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in rows:
        out[(row["case"], row["arm"])][int(row["round"])] = int(row["ns"]) / int(row["calls"])
    return out


def comparison(ref: dict[int, float], arm: dict[int, float], rule: BootstrapRule, tie_band: float) -> dict[str, Any]:
    rounds = sorted(set(ref) & set(arm))
    a = np.array([ref[r] for r in rounds])
    b = np.array([arm[r] for r in rounds])
    ci = bootstrap_speedup_ci(a, b, rule)
    return {
        "speedup": speedup(median(a), median(b)),
        "ci": [ci.low, ci.high],
        "verdict": three_way_verdict(ci, tie_band),
        "rounds": len(rounds),
    }


def attribution(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    regions: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for row in rows:
        regions[(row["case"], row["arm"])][row["region"]] = int(row["ns"])
    out = {}
    for key, found in regions.items():
        total = found.pop("total", 0)
        wall = found.pop("wall", 0)
        inside = sum(found.values())
        out[key] = {"total_ns": total, "wall_ns": wall, "regions_ns": found, "share": inside / total if total else None}
    return out


def build(run_dir: Path) -> dict[str, Any]:
    plan = read_json(run_dir / "plan.json")
    times = per_call_ns(read_csv(run_dir / "timings.csv"))
    shares = attribution(read_csv(run_dir / "attribution.csv"))
    rule = BootstrapRule(**plan["bootstrap"])
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    cases: dict[str, Any] = {}
    for case in plan["cases"]:
        cid = case["case"]
        arms: dict[str, Any] = {}
        for arm in timed:
            samples = times.get((cid, arm), {})
            if not samples:
                continue
            med = median(list(samples.values()))
            entry: dict[str, Any] = {
                "median_ns": med,
                "samples": len(samples),
                "tokens_per_s": case["tokens_per_call"] / (med / 1e9),
                "attribution": shares.get((cid, arm)),
            }
            for ref in REFERENCES:
                if ref != arm and (cid, ref) in times:
                    entry[f"vs_{ref}"] = comparison(times[(cid, ref)], samples, rule, plan["tie_band"])
            arms[arm] = entry
        cases[cid] = {"phase": case["phase"], "tokens_per_call": case["tokens_per_call"], "arms": arms}
    correctness = {
        row["arm"]: {"passed": row["passed"], "message": row["message"]}
        for row in read_jsonl(run_dir / "correctness.jsonl")
    }
    return {
        "schema": SCHEMA,
        "timing_label": plan["timing_label"],
        "cases": cases,
        "correctness": correctness,
        "unavailable": {a["name"]: a["reason"] for a in plan["arms"] if not a["available"]},
    }
