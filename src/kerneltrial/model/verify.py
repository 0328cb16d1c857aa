"""Independent verification of a model-trial run directory.

It re-derives what the runner claims from the raw files, with its own code where the figure
is arithmetic (medians, speedups, the paired bootstrap, the round order), and returns the
problems found (none: the directory stands). Checks, one function each:
- `manifest`: every file listed with its sha256, none added or missing;
- `finished`: provenance records the end (an interrupted run is not evidence);
- `protocol`: the copied protocol's sha256 is the one the plan was built from;
- `gate`: every timed arm passed correctness with the routed call counts the model needs,
  every arm that failed is untimed, and the eager reference passed;
- `rounds`: every timed arm has one sample per round in every case, in the seeded order;
- `figures`: summary.json's medians, speedups, intervals and shares equal the recomputed ones.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

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


def figures(
    plan: dict[str, Any], timings: list[dict[str, str]], attribution: list[dict[str, str]], summary: dict[str, Any]
) -> list[str]:
    per: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in timings:
        per[(row["case"], row["arm"])][int(row["round"])] = int(row["ns"]) / int(row["calls"])
    regions: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for row in attribution:
        regions[(row["case"], row["arm"])][row["region"]] = int(row["ns"])
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


def verify_model_run(run: Path) -> list[str]:
    """The problems found in a model run directory (empty: it verifies)."""
    for name in ("plan.json", "provenance.json", "summary.json", "manifest.json", "timings.csv", "correctness.jsonl"):
        if not (run / name).is_file():
            raise RunDirError(f"{run}: {name} is missing; not a finished model run directory")
    plan = read_json(run / "plan.json")
    timings = read_csv(run / "timings.csv")
    return [
        *manifest(run),
        *finished(run),
        *protocol(run, plan),
        *gate(plan, read_jsonl(run / "correctness.jsonl")),
        *rounds(plan, timings),
        *figures(plan, timings, read_csv(run / "attribution.csv"), read_json(run / "summary.json")),
    ]
