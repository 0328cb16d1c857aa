"""Independent verification of a model-trial run directory.

It re-derives what the runner claims from the raw files, with its own code where the figure
is arithmetic (medians, paired ratios and their intervals, verdicts, the round order), and
returns the problems found (none: the directory stands). Checks, one function each:
- `manifest`: every file listed with its sha256, none added or missing;
- `finished`: provenance records the end (an interrupted run is not evidence);
- `protocol`: the copied protocol's sha256 is the one the plan was built from;
- `rounds`: every timed arm has one sample per round in every case, in the seeded order;
schema 2 (model-summary/2):
- `plan_matches_protocol`: arms, cases, rounds, seed and every rule are the protocol's;
- `gate_v2`: every arm's pass or fail re-derived from its row's numbers (call counts the
  model's config needs, logits against eager's own distance to float32, near-ties), every
  available arm that passed timed and no other;
- `order_v2`: the samples' start times follow the case / round / position order;
- `figures_v2`: every figure, verdict and key of summary.json recomputed;
schema 1 (the first runs, now archived): `gate` and `figures_v1` (the bootstrap rule).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as t_dist

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_csv, read_json, read_jsonl
from kerneltrial.rundir.hashing import sha256_file

REL = 1e-9


def _close(a: float | None, b: float | None) -> bool:
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


def _order(seed: int, case_index: int, round_index: int, arms: list[str]) -> list[str]:
    order = list(arms)
    random.Random(f"{seed}/{case_index}/{round_index}").shuffle(order)
    return order


def rounds(plan: dict[str, Any], timings: list[dict[str, str]]) -> list[str]:
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
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
            want = _order(plan["seed"], index, r, timed)
            if got != want:
                problems.append(f"rounds: {case['case']} round {r} ran {got}, the seed gives {want}")
    return problems


def _speedup_ci(ref: np.ndarray, arm: np.ndarray, resamples: int, seed: int, confidence: float) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ref.size, size=(resamples, ref.size))
    ratios = np.median(ref[idx], axis=1) / np.median(arm[idx], axis=1)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def _indexed(
    timings: list[dict[str, str]], attribution: list[dict[str, str]]
) -> tuple[dict[tuple[str, str], dict[int, float]], dict[tuple[str, str], dict[str, int]]]:
    """ns per call by (case, arm) and round, and attributed ns by (case, arm) and region."""
    per: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in timings:
        per[(row["case"], row["arm"])][int(row["round"])] = int(row["ns"]) / int(row["calls"])
    regions: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for row in attribution:
        regions[(row["case"], row["arm"])][row["region"]] = int(row["ns"])
    return per, regions


def figures_v1(
    plan: dict[str, Any], timings: list[dict[str, str]], attribution: list[dict[str, str]], summary: dict[str, Any]
) -> list[str]:
    per, regions = _indexed(timings, attribution)
    boot = plan["bootstrap"]
    problems = []
    for case in plan["cases"]:
        cid = case["case"]
        claimed = summary["cases"].get(cid, {}).get("arms", {})
        for arm in [a["name"] for a in plan["arms"] if a["timed"]]:
            entry = claimed.get(arm)
            samples = per.get((cid, arm))
            if entry is None or not samples:
                problems.append(
                    f"figures: {cid} {arm} is timed but has {'no summary entry' if samples else 'no samples'}"
                )
                continue
            med = float(np.median(list(samples.values())))
            if not _close(entry["median_ns"], med) or not _close(
                entry["tokens_per_s"], case["tokens_per_call"] * 1e9 / med
            ):
                problems.append(f"figures: {cid} {arm} median {entry['median_ns']} != recomputed {med}")
            for ref in ("eager", "torch_eager"):
                key = f"vs_{ref}"
                if ref == arm or (cid, ref) not in per:
                    continue
                if key not in entry:
                    problems.append(f"figures: {cid} {arm} has no {key}")
                    continue
                common = sorted(set(per[(cid, ref)]) & set(samples))
                a = np.array([per[(cid, ref)][r] for r in common])
                b = np.array([samples[r] for r in common])
                want = float(np.median(a) / np.median(b))
                low, high = _speedup_ci(a, b, boot["resamples"], boot["seed"], boot["confidence"])
                got = entry[key]
                if not (_close(got["speedup"], want) and _close(got["ci"][0], low) and _close(got["ci"][1], high)):
                    problems.append(
                        f"figures: {cid} {arm} {key} {got['speedup']} [{got['ci']}] != recomputed {want} [{low}, {high}]"
                    )
            found = dict(regions.get((cid, arm), {}))
            total = found.pop("total", 0)
            found.pop("wall", None)
            share = sum(found.values()) / total if total else None
            got_share = (entry.get("attribution") or {}).get("share")
            if found and not _close(got_share, share):
                problems.append(f"figures: {cid} {arm} share {got_share} != recomputed {share}")
    return problems


# --- schema 2 (model-summary/2): the run re-derived from its protocol and raw rows ----------

SUMMARY_V2 = "kerneltrial.model-summary/2"
GPU_LABEL = "host clock between device synchronisations: what a caller waits for (host and GPU)"
CPU_LABEL = "host clock, Triton interpreter on a CPU: NOT GPU performance"


def plan_matches_protocol(run: Path, plan: dict[str, Any]) -> list[str]:
    """The plan says what the protocol says: arms, cases, rounds, seed and every rule."""
    from kerneltrial.model.spec import parse_protocol

    p = parse_protocol((run / "protocol.toml").read_text())
    want = {
        "arms": list(p.arms),
        "cases": [c.id for c in p.cases],
        "rounds": p.rounds,
        "warmup": p.warmup,
        "seed": p.seed,
        "calls_per_sample": p.calls_per_sample,
        "tie_band": p.tie_band,
        "confidence": p.confidence,
        "attribution": p.attribution,
        "correctness": p.correctness.model_dump(),
    }
    got = dict(want) | {key: plan.get(key) for key in want}
    got["arms"] = [a["name"] for a in plan["arms"]]
    got["cases"] = [c["case"] for c in plan["cases"]]
    return [f"plan: {key} is {got[key]!r}, the protocol says {want[key]!r}" for key in want if got[key] != want[key]]


def expected_calls(layers: int, eager: bool) -> dict[str, int]:
    """model/build.py's rule, written again: verify re-derives the gate without importing the
    runner's torch-heavy modules (and a change to the rule must be made in both)."""
    if eager:
        return {"rmsnorm": 2 * layers + 1, "fused_add_rmsnorm": 0, "silu_and_mul": layers}
    return {"rmsnorm": layers + 1, "fused_add_rmsnorm": layers, "silu_and_mul": layers}


def gate_v2(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Every verdict of the gate re-derived from the row's own numbers and the protocol's rule."""
    rule = plan["correctness"]
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
            limit = rule["oracle_factor"] * eager["oracle_rel_error"]
            if not math.isclose(row["oracle_rel_error_limit"], limit, rel_tol=REL):
                problems.append(f"gate: {name}'s logits limit {row['oracle_rel_error_limit']} is not {limit}")
            passed = passed and row["oracle_rel_error"] <= limit
            div = row["first_divergence"]
            problems += divergence_problems(name, row, eager)
            if div is not None:
                near = div["margin"] <= rule["near_tie"]
                if div["near_tie"] != near:
                    problems.append(
                        f"gate: {name}'s divergence margin {div['margin']} is called near_tie={div['near_tie']}"
                    )
                passed = passed and (near or div.get("agrees_with_float32", False))
        if row["passed"] != passed:
            problems.append(f"gate: {name} is recorded passed={row['passed']}, its numbers give {passed}")
        if arm["timed"] != passed:
            problems.append(f"gate: {name} timed={arm['timed']} but its correctness gives passed={passed}")
    return problems


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


def order_v2(plan: dict[str, Any], timings: list[dict[str, str]]) -> list[str]:
    """The samples' start times follow the plan's order: case, round, seeded position."""
    index = {c["case"]: i for i, c in enumerate(plan["cases"])}
    ordered = sorted(timings, key=lambda r: (index.get(r["case"], -1), int(r["round"]), int(r["position"])))
    starts = [int(r["start_ns"]) for r in ordered]
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        return ["rounds: sample start times do not follow the case / round / position order"]
    return []


def _paired(
    ref: dict[int, float], arm: dict[int, float], confidence: float
) -> tuple[float, tuple[float, float] | None]:
    rounds_ = sorted(set(ref) & set(arm))
    logs = np.log(np.array([ref[r] for r in rounds_]) / np.array([arm[r] for r in rounds_]))
    mean = float(logs.mean())
    if logs.size < 2:
        return math.exp(mean), None
    half = float(t_dist.ppf((1 + confidence) / 2, logs.size - 1)) * float(logs.std(ddof=1)) / math.sqrt(logs.size)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def _verdict(ci: tuple[float, float] | None, band: float) -> str:
    if ci is None:
        return "inconclusive"
    low, high = ci
    if low > 1 + band:
        return "win"
    if high < 1 - band:
        return "loss"
    return "tie" if 1 - band <= low and high <= 1 + band else "inconclusive"


def figures_v2(
    plan: dict[str, Any],
    timings: list[dict[str, str]],
    attribution: list[dict[str, str]],
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
) -> list[str]:
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    per, regions = _indexed(timings, attribution)
    problems = []
    want_label = GPU_LABEL if plan["is_gpu"] else CPU_LABEL
    if summary.get("timing_label") != want_label or plan.get("timing_label") != want_label:
        problems.append(f"figures: the timing label does not match the device (is_gpu {plan['is_gpu']})")
    if summary.get("correctness") != {r["arm"]: {"passed": r["passed"], "message": r["message"]} for r in rows}:
        problems.append("figures: summary.json's correctness differs from correctness.jsonl")
    if summary.get("unavailable") != {a["name"]: a["reason"] for a in plan["arms"] if not a["available"]}:
        problems.append("figures: summary.json's unavailable arms differ from the plan's")
    if set(summary["cases"]) != {c["case"] for c in plan["cases"]}:
        problems.append(f"figures: summary.json's cases {sorted(summary['cases'])} are not the plan's")
    for case in plan["cases"]:
        cid = case["case"]
        claimed = summary["cases"].get(cid, {}).get("arms", {})
        if set(claimed) != set(timed):
            problems.append(f"figures: {cid} reports arms {sorted(claimed)}, the timed arms are {sorted(timed)}")
        for arm in timed:
            samples, entry = per.get((cid, arm), {}), claimed.get(arm)
            if sorted(samples) != list(range(plan["rounds"])) or entry is None:
                problems.append(f"figures: {cid} {arm} lacks its {plan['rounds']} rounds or its summary entry")
                continue
            med = float(np.median(list(samples.values())))
            if not (_close(entry["median_ns"], med) and entry["samples"] == len(samples)):
                problems.append(f"figures: {cid} {arm} median {entry['median_ns']} != recomputed {med}")
            refs = [r for r in ("eager", "torch_eager", "kerneltrial") if r != arm and r in timed]
            if {k for k in entry if k.startswith("vs_")} != {f"vs_{r}" for r in refs}:
                problems.append(f"figures: {cid} {arm} compares with other references than {refs}")
            for ref in refs:
                got = entry.get(f"vs_{ref}", {})
                est, ci = _paired(per[(cid, ref)], samples, plan["confidence"])
                same_ci = (got.get("ci") is None) == (ci is None) and (ci is None or all(map(_close, got["ci"], ci)))
                if not (
                    _close(got.get("speedup"), est) and same_ci and got.get("verdict") == _verdict(ci, plan["tie_band"])
                ):
                    problems.append(
                        f"figures: {cid} {arm} vs_{ref} {got} != recomputed {est} {ci} {_verdict(ci, plan['tie_band'])}"
                    )
            found = dict(regions.get((cid, arm), {}))
            if plan["attribution"] and "total" not in found:
                problems.append(f"figures: {cid} {arm} has no attribution rows")
                continue
            attr = entry.get("attribution")
            if found:
                device = found.pop("total")
                found.pop("wall", None)
                ok = attr is not None and attr["regions_ns"] == found and attr["device_ns"] == device
                ok = (
                    ok
                    and _close(attr["share"], sum(found.values()) / med)
                    and _close(attr["device_busy"], device / med if plan["is_gpu"] else None)
                )
                if not ok:
                    problems.append(f"figures: {cid} {arm} attribution {attr} != recomputed from attribution.csv")
    return problems


def verify_model_run(run: Path) -> list[str]:
    """The problems found in a model run directory (empty: it verifies)."""
    for name in ("plan.json", "provenance.json", "summary.json", "manifest.json", "timings.csv", "correctness.jsonl"):
        if not (run / name).is_file():
            raise RunDirError(f"{run}: {name} is missing; not a finished model run directory")
    plan = read_json(run / "plan.json")
    timings = read_csv(run / "timings.csv")
    rows = read_jsonl(run / "correctness.jsonl")
    summary = read_json(run / "summary.json")
    attribution = read_csv(run / "attribution.csv")
    common = [*manifest(run), *finished(run), *protocol(run, plan), *rounds(plan, timings)]
    if summary.get("schema") != SUMMARY_V2:  # the first runs (results/archive/h200/minicpm5-2b-model-r*)
        return [*common, *gate(plan, rows), *figures_v1(plan, timings, attribution, summary)]
    return [
        *common,
        *plan_matches_protocol(run, plan),
        *gate_v2(plan, rows),
        *order_v2(plan, timings),
        *figures_v2(plan, timings, attribution, rows, summary),
    ]
