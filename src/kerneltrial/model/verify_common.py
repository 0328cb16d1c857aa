"""What model/verify.py's checks share across summary schemas, written independently of the
runner and the summary's builder (no import of either, nor of kerneltrial/stats.py; summary.json
is read as rundir/model_summary_doc.py's record): the manifest, the end record, the protocol's
digest, the seeded round order, the paired ratio and its verdict, and one arm's figures of one case."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as t_dist

from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.model_summary_doc import ModelArm, ModelSummary

REL = 1e-9
GPU_LABEL = "host clock between device synchronisations: what a caller waits for (host and GPU)"
CPU_LABEL = "host clock, Triton interpreter on a CPU: NOT GPU performance"
PerCall = dict[tuple[str, str], dict[int, float]]  # (case, arm) -> round -> ns per call
Regions = dict[tuple[str, str], dict[str, int]]  # (case, arm) -> region -> ns
# what each check of every schema says when it passes
PLAN_DETAIL = "arms, cases, rounds, seed and every rule as protocol.toml says"
GATE_DETAIL = "every arm's correctness verdict re-derived from its row; exactly the arms that passed are timed"
ROUNDS_DETAIL = "every case's arms have one sample per round, in the seeded order"
ORDER_DETAIL = "samples started in case / round / position order"
FIGURES_DETAIL = "every figure, verdict and key of summary.json recomputed"


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def manifest(run: Path) -> list[str]:
    listed: dict[str, str] = read_json(run / "manifest.json")
    present = {str(f.relative_to(run)) for f in run.rglob("*") if f.is_file()} - {
        "manifest.json",
        "report.md",
        "ERRATA.md",
    }
    problems = [f"manifest: {name} is not listed" for name in sorted(present - set(listed))]
    for name, digest in sorted(listed.items()):
        path = run / name
        if not path.is_file():
            problems.append(f"manifest: {name} is listed but missing")
        elif sha256_file(path) != digest:
            problems.append(f"manifest: {name} changed after the run (sha256 differs)")
    return problems


def finished(run: Path) -> list[str]:
    if not read_json(run / "provenance.json").get("finished_at"):
        return ["finished: provenance.json has no finished_at: the run was interrupted, it is not evidence"]
    return []


def protocol(run: Path, plan: dict[str, Any]) -> list[str]:
    if sha256_file(run / "protocol.toml") != plan["protocol_sha256"]:
        return ["protocol: protocol.toml is not the protocol the plan was built from"]
    return []


def seeded_order(seed: int, case_index: int, round_index: int, arms: list[str]) -> list[str]:
    order = list(arms)
    random.Random(f"{seed}/{case_index}/{round_index}").shuffle(order)
    return order


def rounds(plan: dict[str, Any], timings: list[dict[str, str]], arms_of: dict[str, list[str]]) -> list[str]:
    """Every case's arms (`arms_of`) have one sample per round, in the seeded order."""
    seen: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    problems = []
    for row in timings:
        seen[(row["case"], int(row["round"]))].append((int(row["position"]), row["arm"]))
        if int(row["calls"]) != plan["calls_per_sample"]:
            problems.append(
                f"rounds: {row['case']} round {row['round']} {row['arm']} has {row['calls']} calls per sample"
            )
    for index, case in enumerate(plan["cases"]):
        for r in range(plan["rounds"]):
            got = [arm for _, arm in sorted(seen.get((case["case"], r), []))]
            want = seeded_order(plan["seed"], index, r, arms_of[case["case"]])
            if got != want:
                problems.append(f"rounds: {case['case']} round {r} ran {got}, the seed gives {want}")
    return problems


def order_of_starts(plan: dict[str, Any], timings: list[dict[str, str]]) -> list[str]:
    """The samples' start times follow the plan's order: case, round, seeded position."""
    index = {c["case"]: i for i, c in enumerate(plan["cases"])}
    ordered = sorted(timings, key=lambda r: (index.get(r["case"], -1), int(r["round"]), int(r["position"])))
    starts = [int(r["start_ns"]) for r in ordered]
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        return ["rounds: sample start times do not follow the case / round / position order"]
    return []


def indexed(timings: list[dict[str, str]], attribution: list[dict[str, str]]) -> tuple[PerCall, Regions]:
    """ns per call by (case, arm) and round, and attributed ns by (case, arm) and region."""
    per: PerCall = defaultdict(dict)
    for row in timings:
        per[(row["case"], row["arm"])][int(row["round"])] = int(row["ns"]) / int(row["calls"])
    regions: Regions = defaultdict(dict)
    for row in attribution:
        regions[(row["case"], row["arm"])][row["region"]] = int(row["ns"])
    return per, regions


def expected_calls(layers: int, eager: bool) -> dict[str, int]:
    """model/build.py's rule, written again: verify re-derives the gate without importing the
    runner's torch-heavy modules (and a change to the rule must be made in both)."""
    if eager:
        return {"rmsnorm": 2 * layers + 1, "fused_add_rmsnorm": 0, "silu_and_mul": layers}
    return {"rmsnorm": layers + 1, "fused_add_rmsnorm": layers, "silu_and_mul": layers}


def paired(ref: dict[int, float], arm: dict[int, float], confidence: float) -> tuple[float, tuple[float, float] | None]:
    rounds_ = sorted(set(ref) & set(arm))
    logs = np.log(np.array([ref[r] for r in rounds_]) / np.array([arm[r] for r in rounds_]))
    mean = float(logs.mean())
    if logs.size < 2:
        return math.exp(mean), None
    half = float(t_dist.ppf((1 + confidence) / 2, logs.size - 1)) * float(logs.std(ddof=1)) / math.sqrt(logs.size)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def verdict_of(ci: tuple[float, float] | None, band: float) -> str:
    if ci is None:
        return "inconclusive"
    low, high = ci
    if low > 1 + band:
        return "win"
    if high < 1 - band:
        return "loss"
    return "tie" if 1 - band <= low and high <= 1 + band else "inconclusive"


def arm_figures(
    plan: dict[str, Any], cid: str, arm: str, entry: ModelArm, arms: list[str], per: PerCall, regions: Regions
) -> list[str]:
    """One arm's figures of one case (schemas 2 and 3): its median, its ratios against the
    references the case has, its attribution. Returns the problems; the median is the entry's."""
    samples = per.get((cid, arm), {})
    med = float(np.median(list(samples.values())))
    problems = []
    if not (close(entry.median_ns, med) and entry.samples == len(samples)):
        problems.append(f"figures: {cid} {arm} median {entry.median_ns} != recomputed {med}")
    refs = [r for r in ("eager", "torch_eager", "kerneltrial") if r != arm and r in arms]
    against = entry.against()
    if set(against) != set(refs):
        problems.append(f"figures: {cid} {arm} compares with other references than {refs}")
    for ref in refs:
        got = against.get(ref)
        est, ci = paired(per[(cid, ref)], samples, plan["confidence"])
        want = verdict_of(ci, plan["tie_band"])
        if got is None or not (close(got.speedup, est) and same_interval(got.ci, ci) and got.verdict == want):
            problems.append(f"figures: {cid} {arm} vs_{ref} {got} != recomputed {est} {ci} {want}")
    return problems + attribution_figures(plan, cid, arm, entry, med, regions)


def same_interval(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a == b if a is None or b is None else all(map(close, a, b))


def attribution_figures(
    plan: dict[str, Any], cid: str, arm: str, entry: ModelArm, med: float, regions: Regions
) -> list[str]:
    found = dict(regions.get((cid, arm), {}))
    if plan["attribution"] and "total" not in found:
        return [f"figures: {cid} {arm} has no attribution rows"]
    attr = entry.attribution
    if not found:
        return [] if attr is None else [f"figures: {cid} {arm} has attribution {attr} but no attribution rows"]
    device = found.pop("total")
    found.pop("wall", None)
    share = sum(found.values()) / med if found else None
    ok = attr is not None and attr.regions_ns == found and attr.device_ns == device
    ok = ok and close(attr.share, share) and close(attr.device_busy, device / med if plan["is_gpu"] else None)
    return [] if ok else [f"figures: {cid} {arm} attribution {attr} != recomputed from attribution.csv"]


def timing_rules(p: Any) -> dict[str, Any]:
    """The protocol's keys every schema's plan copies as they are (p: a parsed model protocol)."""
    keys = ("rounds", "warmup", "seed", "calls_per_sample", "tie_band", "confidence", "attribution")
    return {key: getattr(p, key) for key in keys}


def plan_problems(want: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The plan's keys against what its protocol gives (`want`; arms and cases by name)."""
    got = dict(want) | {key: plan.get(key) for key in want}
    got["arms"] = [a["name"] for a in plan["arms"]]
    got["cases"] = [c["case"] for c in plan["cases"]]
    return [f"plan: {key} is {got[key]!r}, the protocol says {want[key]!r}" for key in want if got[key] != want[key]]


def run_records(plan: dict[str, Any], rows: list[dict[str, Any]], summary: ModelSummary) -> list[str]:
    """summary.json's run-level records: the timing label, correctness, unavailable arms, cases."""
    problems = []
    want_label = GPU_LABEL if plan["is_gpu"] else CPU_LABEL
    if summary.timing_label != want_label or plan.get("timing_label") != want_label:
        problems.append(f"figures: the timing label does not match the device (is_gpu {plan['is_gpu']})")
    gate = {arm: (verdict.passed, verdict.message) for arm, verdict in summary.correctness.items()}
    if gate != {r["arm"]: (r["passed"], r["message"]) for r in rows}:
        problems.append("figures: summary.json's correctness differs from correctness.jsonl")
    if summary.unavailable != {a["name"]: a["reason"] for a in plan["arms"] if not a["available"]}:
        problems.append("figures: summary.json's unavailable arms differ from the plan's")
    if set(summary.cases) != {c["case"] for c in plan["cases"]}:
        problems.append(f"figures: summary.json's cases {sorted(summary.cases)} are not the plan's")
    return problems


Verdict = Callable[[str, dict[str, Any], dict[str, Any]], tuple[bool, list[str]]]  # (arm, row, eager's row)


def gate_rows(plan: dict[str, Any], rows: list[dict[str, Any]], rule_of: Verdict) -> list[str]:
    """The gate's bookkeeping, every schema: one row per available arm and none for an
    unavailable one, eager passing with the model's call counts, each arm's recorded verdict
    and whether it was timed against what `rule_of` derives from its numbers (call counts
    included here; `rule_of` adds the schema's rule and its own problems, for arms but eager)."""
    layers = int(plan["config"]["num_hidden_layers"])
    by_arm = {row["arm"]: row for row in rows}
    problems = [] if len(by_arm) == len(rows) else ["gate: an arm has more than one correctness row"]
    eager = by_arm.get("eager")
    if eager is None or not eager["passed"] or eager["calls_per_forward"] != expected_calls(layers, True):
        return [*problems, "gate: the eager reference has no passing row with the model's call counts"]
    for arm in plan["arms"]:
        name, row = arm["name"], by_arm.get(arm["name"])
        if not arm["available"]:
            if row is not None or arm["timed"]:
                problems.append(f"gate: {name} is unavailable but has a correctness row or was timed")
            continue
        if row is None:
            problems.append(f"gate: {name} is available but has no correctness row")
            continue
        passed = row["calls_per_forward"] == expected_calls(layers, name == "eager")
        if name != "eager":
            by_rule, found = rule_of(name, row, eager)
            passed, problems = passed and by_rule, problems + found
        if row["passed"] != passed:
            problems.append(f"gate: {name} is recorded passed={row['passed']}, its numbers give {passed}")
        if arm["timed"] != passed:
            problems.append(f"gate: {name} timed={arm['timed']} but its correctness gives passed={passed}")
    return problems
