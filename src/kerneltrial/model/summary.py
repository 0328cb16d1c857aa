"""summary.json of a model trial, computed from the raw files alone (plan, correctness,
timings, attribution).

Speedups are paired by round: every round times every arm once, so a round's ratio
reference / arm cancels what the round shares (a clock or host-load shock hits all arms of
a round). The estimate is the geometric mean of the per-round ratios, with a Student-t
interval on their logs (analysis/stats.py `paired_ratio`, the rule serving trials use for
their launches), called win / tie / loss / inconclusive against the tie band
(analysis/stats.py `verdict`: a tie only when the interval lies inside the band).

References: `eager` (the model's own code: what a user gains), `torch_eager` (the routed
structure with torch formulas: what the kernels alone change) and `kerneltrial` (every
other arm against ours), each when the run timed it.

Attribution: `share` is the time inside the routed operators over the arm's median wall
time per call, and `device_busy` the device's kernel time over that wall time. When
device_busy is well below 1 the call is host-bound: the GPU waits on Python, and a faster
kernel changes little. `drift` compares the second half of a case's rounds with the first
(the median over arms of each arm's ratio of medians); far from 1 it says the machine
changed during the case.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.analysis.stats import median, paired_ratio, verdict
from kerneltrial.rundir.files import read_csv, read_json, read_jsonl

SCHEMA = "kerneltrial.model-summary/2"
REFERENCES = ("eager", "torch_eager", "kerneltrial")
METHOD = "geometric mean of per-round ratios, Student-t interval on their logs"


def per_call_ns(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[int, float]]:
    """(case, arm) -> round -> nanoseconds per call."""
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in rows:
        out[(row["case"], row["arm"])][int(row["round"])] = int(row["ns"]) / int(row["calls"])
    return out


def comparison(ref: dict[int, float], arm: dict[int, float], confidence: float, tie_band: float) -> dict[str, Any]:
    rounds = sorted(set(ref) & set(arm))
    ratio = paired_ratio([ref[r] for r in rounds], [arm[r] for r in rounds], confidence)
    ci = ratio.interval
    return {
        "speedup": ratio.estimate,
        "ci": None if ci is None else [ci.low, ci.high],
        "verdict": "inconclusive" if ci is None else verdict(ci, tie_band),
        "rounds": ratio.n,
    }


def drift(samples: list[dict[int, float]]) -> float | None:
    """Median over arms of median(second half of rounds) / median(first half)."""
    ratios = []
    for rounds in samples:
        order = sorted(rounds)
        half = len(order) // 2
        if half:
            first = [rounds[r] for r in order[:half]]
            second = [rounds[r] for r in order[len(order) - half :]]
            ratios.append(median(second) / median(first))
    return float(np.median(ratios)) if ratios else None


def attribution(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[str, int]]:
    regions: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for row in rows:
        regions[(row["case"], row["arm"])][row["region"]] = int(row["ns"])
    return regions


def shares(found: dict[str, int] | None, wall_ns: float, gpu: bool) -> dict[str, Any] | None:
    """The routed operators' time and the device's over the median wall time (on a CPU the
    profiler sees no device: `device_ns` is the profiled call's host time, busy is None)."""
    if not found:
        return None
    regions = {k: v for k, v in found.items() if k not in ("total", "wall")}
    return {
        "regions_ns": regions,
        "device_ns": found["total"],
        "share": sum(regions.values()) / wall_ns,
        "device_busy": found["total"] / wall_ns if gpu else None,
    }


def build(run_dir: Path) -> dict[str, Any]:
    plan = read_json(run_dir / "plan.json")
    times = per_call_ns(read_csv(run_dir / "timings.csv"))
    found = attribution(read_csv(run_dir / "attribution.csv"))
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    cases: dict[str, Any] = {}
    for case in plan["cases"]:
        cid = case["case"]
        arms: dict[str, Any] = {}
        for arm in timed:
            samples = times[(cid, arm)]
            med = median(list(samples.values()))
            entry: dict[str, Any] = {
                "median_ns": med,
                "samples": len(samples),
                "tokens_per_s": case["tokens_per_call"] / (med / 1e9),
                "attribution": shares(found.get((cid, arm)), med, plan["is_gpu"]),
            }
            for ref in REFERENCES:
                if ref != arm and ref in timed:
                    entry[f"vs_{ref}"] = comparison(times[(cid, ref)], samples, plan["confidence"], plan["tie_band"])
            arms[arm] = entry
        cases[cid] = {
            "phase": case["phase"],
            "tokens_per_call": case["tokens_per_call"],
            "drift": drift([times[(cid, arm)] for arm in timed]),
            "arms": arms,
        }
    correctness = {
        row["arm"]: {"passed": row["passed"], "message": row["message"]}
        for row in read_jsonl(run_dir / "correctness.jsonl")
    }
    return {
        "schema": SCHEMA,
        "method": METHOD,
        "timing_label": plan["timing_label"],
        "cases": cases,
        "correctness": correctness,
        "unavailable": {a["name"]: a["reason"] for a in plan["arms"] if not a["available"]},
    }
