"""Verification of model-trial runs written before summary schema 3 (the archived runs and
results/h200/minicpm5-2b-model): their files and rules as they were then, checked with the
shared pieces of model/verify_common.py.

schema 2 (model-summary/2):
- `plan_matches_protocol_v2`: arms, cases, rounds, seed and every rule are the protocol's
  (whose `[correctness]` then held `greedy_steps` and `near_tie`: read here, not by today's
  protocol model);
- `gate_v2`: every arm's pass or fail re-derived from its row's numbers (call counts the
  model's config needs, logits against eager's own distance to float32, the free-running
  greedy rule's near-ties), every available arm that passed timed and no other;
- `figures_v2`: every figure, verdict and key of summary.json recomputed;
schema 1 (the first runs, now archived): `gate` and `figures_v1` (the bootstrap rule).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.model.verify_common import (
    FIGURES_DETAIL,
    GATE_DETAIL,
    ORDER_DETAIL,
    PLAN_DETAIL,
    REL,
    ROUNDS_DETAIL,
    arm_figures,
    close,
    gate_rows,
    indexed,
    order_of_starts,
    plan_problems,
    rounds,
    run_records,
    same_interval,
    timing_rules,
)
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.model_summary_doc import MODEL_SUMMARY_V2, ModelArm, ModelSummary


def gate(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    by_arm = {row["arm"]: row for row in rows}
    problems = []
    if not by_arm.get("eager", {}).get("passed"):
        problems.append("gate: the eager reference has no passing correctness row")
    for arm in plan["arms"]:
        row = by_arm.get(arm["name"])
        if arm["timed"] and (row is None or not row["passed"]):
            problems.append(f"gate: {arm['name']} was timed without a passing correctness row")
        if row is not None and row["passed"] and row["calls_per_forward"] != row["expected_calls_per_forward"]:
            problems.append(
                f"gate: {arm['name']} passed with call counts {row['calls_per_forward']} != {row['expected_calls_per_forward']}"
            )
        if row is not None and not row["passed"] and arm["timed"]:
            problems.append(f"gate: {arm['name']} failed correctness but was timed")
    return problems


def _speedup_ci(ref: np.ndarray, arm: np.ndarray, resamples: int, seed: int, confidence: float) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ref.size, size=(resamples, ref.size))
    ratios = np.median(ref[idx], axis=1) / np.median(arm[idx], axis=1)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def figures_v1(
    plan: dict[str, Any], timings: list[dict[str, str]], attribution: list[dict[str, str]], summary: ModelSummary
) -> list[str]:
    per, regions = indexed(timings, attribution)
    boot = plan["bootstrap"]
    problems = []
    for case in plan["cases"]:
        cid = case["case"]
        claimed = claimed_arms(summary, cid)
        for arm in [a["name"] for a in plan["arms"] if a["timed"]]:
            entry = claimed.get(arm)
            samples = per.get((cid, arm))
            if entry is None or not samples:
                problems.append(
                    f"figures: {cid} {arm} is timed but has {'no summary entry' if samples else 'no samples'}"
                )
                continue
            med = float(np.median(list(samples.values())))
            if not close(entry.median_ns, med) or not close(entry.tokens_per_s, case["tokens_per_call"] * 1e9 / med):
                problems.append(f"figures: {cid} {arm} median {entry.median_ns} != recomputed {med}")
            for ref in ("eager", "torch_eager"):
                key, got = f"vs_{ref}", entry.against().get(ref)
                if ref == arm or (cid, ref) not in per:
                    continue
                if got is None:
                    problems.append(f"figures: {cid} {arm} has no {key}")
                    continue
                common = sorted(set(per[(cid, ref)]) & set(samples))
                a = np.array([per[(cid, ref)][r] for r in common])
                b = np.array([samples[r] for r in common])
                want = float(np.median(a) / np.median(b))
                low, high = _speedup_ci(a, b, boot["resamples"], boot["seed"], boot["confidence"])
                if not (close(got.speedup, want) and same_interval(got.ci, (low, high))):
                    problems.append(
                        f"figures: {cid} {arm} {key} {got.speedup} [{got.ci}] != recomputed {want} [{low}, {high}]"
                    )
            problems += share_v1(cid, arm, entry, regions.get((cid, arm), {}))
    return problems


def share_v1(cid: str, arm: str, entry: ModelArm, found: dict[str, int]) -> list[str]:
    """Schema 1's share: the routed operators' time over the profiled call's device time."""
    found = dict(found)
    total = found.pop("total", 0)
    found.pop("wall", None)
    share = sum(found.values()) / total if total else None
    got = entry.attribution.share if entry.attribution else None
    return [f"figures: {cid} {arm} share {got} != recomputed {share}"] if found and not close(got, share) else []


def claimed_arms(summary: ModelSummary, cid: str) -> dict[str, ModelArm]:
    """The arms summary.json gives case `cid` ({} when it has no such case: run_records names it)."""
    case = summary.cases.get(cid)
    return case.arms if case else {}


# --- schema 2 (model-summary/2): the run re-derived from its protocol and raw rows ----------


LEGACY_DEFAULTS = {"prompts": 2, "prompt_tokens": 32, "greedy_steps": 16, "oracle_factor": 2.0, "near_tie": 0.01}


def plan_matches_protocol_v2(run: Path, plan: dict[str, Any]) -> list[str]:
    """The plan says what the protocol says: arms, cases, rounds, seed and every rule. The
    `[correctness]` table is read with schema 2's keys and defaults; the rest through today's
    protocol model (its other keys kept their meaning and defaults)."""
    from kerneltrial.model.spec import Protocol

    raw = tomllib.loads((run / "protocol.toml").read_text())
    correctness = LEGACY_DEFAULTS | raw.pop("correctness", {})
    p = Protocol.model_validate(raw)
    want = {"arms": list(p.arms), "cases": [c.id for c in p.cases], **timing_rules(p), "correctness": correctness}
    return plan_problems(want, plan)


def gate_v2(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Every verdict of the gate re-derived from the row's own numbers and schema 2's rule:
    the last-position logits against eager's distance, the free-running greedy tokens."""
    rule = plan["correctness"]

    def rule_of(name: str, row: dict[str, Any], eager: dict[str, Any]) -> tuple[bool, list[str]]:
        problems = divergence_problems(name, row, eager)
        limit = rule["oracle_factor"] * eager["oracle_rel_error"]
        if not math.isclose(row["oracle_rel_error_limit"], limit, rel_tol=REL):
            problems.append(f"gate: {name}'s logits limit {row['oracle_rel_error_limit']} is not {limit}")
        passed = row["oracle_rel_error"] <= limit
        div = row["first_divergence"]
        if div is not None:
            near = div["margin"] <= rule["near_tie"]
            if div["near_tie"] != near:
                problems.append(
                    f"gate: {name}'s divergence margin {div['margin']} is called near_tie={div['near_tie']}"
                )
            passed = passed and (near or div.get("agrees_with_float32", False))
        return passed, problems

    return gate_rows(plan, rows, rule_of)


def divergence_problems(name: str, row: dict[str, Any], eager: dict[str, Any]) -> list[str]:
    """The first divergence recomputed from the recorded greedy tokens (eager's, the arm's and
    the float32 model's; runs before they were recorded carry none, and are read as written)."""
    if "greedy_tokens" not in row or "greedy_tokens" not in eager:
        return []
    mine, ref, exact = row["greedy_tokens"], eager["greedy_tokens"], eager["float32_tokens"]
    want = None
    for k in range(len(ref[0]) if ref else 0):
        prompts = [i for i in range(len(ref)) if mine[i][k] != ref[i][k]]
        if prompts:
            i = prompts[0]
            agrees = ref[i][:k] == exact[i][:k] and mine[i][k] == exact[i][k]
            want = {"step": k, "prompt": i, "token": mine[i][k], "reference": ref[i][k], "agrees_with_float32": agrees}
            break
    got = row["first_divergence"]
    got = (
        None
        if got is None
        else {key: got.get(key) for key in ("step", "prompt", "token", "reference", "agrees_with_float32")}
    )
    return [] if got == want else [f"gate: {name}'s first divergence {got} is not what its tokens give: {want}"]


def figures_v2(
    plan: dict[str, Any],
    timings: list[dict[str, str]],
    attribution: list[dict[str, str]],
    rows: list[dict[str, Any]],
    summary: ModelSummary,
) -> list[str]:
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    per, regions = indexed(timings, attribution)
    problems = run_records(plan, rows, summary)
    for case in plan["cases"]:
        cid = case["case"]
        claimed = claimed_arms(summary, cid)
        if set(claimed) != set(timed):
            problems.append(f"figures: {cid} reports arms {sorted(claimed)}, the timed arms are {sorted(timed)}")
        for arm in timed:
            samples, entry = per.get((cid, arm), {}), claimed.get(arm)
            if sorted(samples) != list(range(plan["rounds"])) or entry is None:
                problems.append(f"figures: {cid} {arm} lacks its {plan['rounds']} rounds or its summary entry")
                continue
            problems += arm_figures(plan, cid, arm, entry, timed, per, regions)
    return problems


def verify_legacy(
    run: Path,
    plan: dict[str, Any],
    timings: list[dict[str, str]],
    rows: list[dict[str, Any]],
    summary: ModelSummary,
    attribution: list[dict[str, str]],
    result: VerifyResult,
) -> None:
    """The checks of a schema 1 or 2 run beyond the manifest, end record and protocol digest."""
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    result.add("rounds", rounds(plan, timings, {c["case"]: timed for c in plan["cases"]}), ROUNDS_DETAIL)
    if summary.schema_ != MODEL_SUMMARY_V2:  # the first runs (results/archive/h200/minicpm5-2b-model-r*)
        result.add("gate", gate(plan, rows), GATE_DETAIL)
        result.add("figures", figures_v1(plan, timings, attribution, summary), FIGURES_DETAIL)
        return
    result.add("plan matches protocol", plan_matches_protocol_v2(run, plan), PLAN_DETAIL)
    result.add("gate", gate_v2(plan, rows), GATE_DETAIL)
    result.add("order of starts", order_of_starts(plan, timings), ORDER_DETAIL)
    result.add("figures", figures_v2(plan, timings, attribution, rows, summary), FIGURES_DETAIL)
