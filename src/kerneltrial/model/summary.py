"""summary.json of a model trial, computed from the raw files alone (plan, correctness,
captures, timed checks, copies, timings, attribution), as rundir/model_summary_doc.py's record.

Speedups are paired by round: every round times every arm once, so a round's ratio
reference / arm cancels what the round shares (a clock or host-load shock hits all arms of
a round). The estimate is the geometric mean of the per-round ratios, with a Student-t
interval on their logs (stats.py `paired_ratio`, the rule serving trials use for
their launches), called win / tie / loss / inconclusive against the tie band
(stats.py `verdict`: a tie only when the interval lies inside the band).

Cases are (case, mode) pairs: graph-mode ids end in `-graph`. A case's arms are those that
passed the gate, less (graph mode) those whose call could not be captured and those that
failed a timed check; each left out is in the case's `excluded` with its reason. References:
`eager` (the model's own code: what a user gains), `torch_eager` (the routed structure with
torch formulas: what the kernels alone change) and `kerneltrial` (every other arm against
ours), each when the case has it.

Attribution: `share` is the time inside the routed operators over the arm's median wall
time per call (None where a graph replay's kernels could not be matched to the annotated
call's), and `device_busy` the device's kernel time over that wall time. When device_busy is
well below 1 the call is host-bound: the GPU waits on Python, and a faster kernel changes
little. The weight-read floor (model/floor.py): the bytes a call must read over the copy
rate measured in the run; `vs_floor` is the median wall time over it, `device_vs_floor` the
profiled call's device time over it. `drift` compares the second half of a case's rounds
with the first (the median over arms of each arm's ratio of medians); far from 1 it says the
machine changed during the case.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.model.layout import CAPTURES, COPIES, TIMED_CHECKS
from kerneltrial.rundir.files import read_csv, read_json, read_jsonl
from kerneltrial.rundir.layout import ATTRIBUTION, CORRECTNESS, PLAN, TIMINGS
from kerneltrial.rundir.model_summary_doc import (
    MODEL_SUMMARY_V3,
    REFERENCES,
    ArmGate,
    CopyRate,
    ModelArm,
    ModelAttribution,
    ModelCase,
    ModelSummary,
    PairedRatio,
    WeightFloor,
)
from kerneltrial.rundir.summary_doc import TimedCheckCounts
from kerneltrial.stats import median, paired_ratio, verdict

METHOD = "geometric mean of per-round ratios, Student-t interval on their logs"


def per_call_ns(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[int, float]]:
    """(case, arm) -> round -> nanoseconds per call."""
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in rows:
        out[(row["case"], row["arm"])][int(row["round"])] = int(row["ns"]) / int(row["calls"])
    return out


def comparison(ref: dict[int, float], arm: dict[int, float], confidence: float, tie_band: float) -> PairedRatio:
    rounds = sorted(set(ref) & set(arm))
    ratio = paired_ratio([ref[r] for r in rounds], [arm[r] for r in rounds], confidence)
    ci = ratio.interval
    return PairedRatio(
        speedup=ratio.estimate,
        ci=None if ci is None else (ci.low, ci.high),
        verdict="inconclusive" if ci is None else verdict(ci, tie_band),
        rounds=ratio.n,
    )


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


def shares(found: dict[str, int] | None, wall_ns: float, gpu: bool) -> ModelAttribution | None:
    """The routed operators' time and the device's over the median wall time (on a CPU the
    profiler sees no device: `device_ns` is the profiled call's host time, busy is None; no
    regions: a graph replay whose kernels could not be matched, share None)."""
    if not found:
        return None
    regions = {k: v for k, v in found.items() if k not in ("total", "wall")}
    return ModelAttribution(
        regions_ns=regions,
        device_ns=found["total"],
        share=sum(regions.values()) / wall_ns if regions else None,
        device_busy=found["total"] / wall_ns if gpu else None,
    )


def copy_rate(rows: list[dict[str, str]]) -> CopyRate:
    """The copy's samples, bytes per sample (read + written) and median rate in GB/s (bytes per ns)."""
    rates = [int(r["bytes"]) / int(r["ns"]) for r in rows]
    return CopyRate(bytes=int(rows[0]["bytes"]), samples=len(rows), gbps=median(rates))


def excluded_arms(
    plan: dict[str, Any], captures: list[dict[str, Any]], checks: list[dict[str, Any]]
) -> dict[str, dict[str, str]]:
    """case -> arm -> why a gate-passing arm has no figures there: not captured (every arm,
    where eager is not: the case ran no rounds), or its first failed timed check."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    for row in captures:
        if not row["captured"]:
            out[row["case"]][row["arm"]] = row["reason"]
            if row["arm"] == "eager":
                for arm in timed:
                    out[row["case"]].setdefault(arm, "eager, every ratio's reference, cannot be captured")
    for row in checks:
        if not row["passed"] and row["arm"] not in out[row["case"]]:
            out[row["case"]][row["arm"]] = row["message"]
    return out


def case_entry(case: dict[str, Any], arms: list[str], run: RunRows, excluded: dict[str, str]) -> ModelCase:
    cid = case["case"]
    floor_bytes = sum(case["floor_bytes"].values())
    floor = WeightFloor(bytes=floor_bytes, ns=floor_bytes / run.copy.gbps)
    entries: dict[str, ModelArm] = {}
    for arm in arms:
        samples = run.times[(cid, arm)]
        med = median(list(samples.values()))
        attr = shares(run.regions.get((cid, arm)), med, run.is_gpu)
        against = {
            f"vs_{ref}": comparison(run.times[(cid, ref)], samples, run.confidence, run.tie_band)
            for ref in REFERENCES
            if ref != arm and ref in arms
        }
        entries[arm] = ModelArm(
            median_ns=med,
            samples=len(samples),
            tokens_per_s=case["tokens_per_call"] / (med / 1e9),
            attribution=attr,
            vs_floor=med / floor.ns,
            device_vs_floor=attr.device_ns / floor.ns if attr and attr.device_ns is not None and run.is_gpu else None,
            **against,
        )
    return ModelCase(
        phase=case["phase"],
        mode=case["mode"],
        tokens_per_call=case["tokens_per_call"],
        floor=floor,
        drift=drift([run.times[(cid, arm)] for arm in arms]),
        excluded=excluded,
        arms=entries,
    )


@dataclass(frozen=True)
class RunRows:
    """The raw rows the figures come from, indexed."""

    times: dict[tuple[str, str], dict[int, float]]
    regions: dict[tuple[str, str], dict[str, int]]
    copy: CopyRate
    is_gpu: bool
    confidence: float
    tie_band: float


def build(run_dir: Path) -> ModelSummary:
    plan = read_json(run_dir / PLAN)
    captures = read_jsonl(run_dir / CAPTURES)
    checks = read_jsonl(run_dir / TIMED_CHECKS)
    run = RunRows(
        times=per_call_ns(read_csv(run_dir / TIMINGS)),
        regions=attribution(read_csv(run_dir / ATTRIBUTION)),
        copy=copy_rate(read_csv(run_dir / COPIES)),
        is_gpu=plan["is_gpu"],
        confidence=plan["confidence"],
        tie_band=plan["tie_band"],
    )
    excluded = excluded_arms(plan, captures, checks)
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    cases = {
        c["case"]: case_entry(c, [a for a in timed if a not in excluded[c["case"]]], run, excluded[c["case"]])
        for c in plan["cases"]
    }
    correctness = {
        row["arm"]: ArmGate(passed=row["passed"], message=row["message"]) for row in read_jsonl(run_dir / CORRECTNESS)
    }
    return ModelSummary(
        schema=MODEL_SUMMARY_V3,
        method=METHOD,
        timing_label=plan["timing_label"],
        graph_label=plan["graph_label"],
        copy=run.copy,
        cases=cases,
        correctness=correctness,
        unavailable={a["name"]: a["reason"] for a in plan["arms"] if not a["available"]},
        timed_checks=TimedCheckCounts(rows=len(checks), failed=sum(not r["passed"] for r in checks)),
    )
