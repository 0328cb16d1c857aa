"""Independent verification of a model-trial run directory.

It re-derives what the runner claims from the raw files, with its own code where the figure
is arithmetic (medians, paired ratios and their intervals, verdicts, the round order, the
input draws, the floor), and returns its named checks (rundir/checks.py).
Checks, one function each, for every schema:
- `manifest`: every file listed with its sha256, none added or missing;
- `finished`: provenance records the end (an interrupted run is not evidence);
- `protocol`: the copied protocol's sha256 is the one the plan was built from;
- `summary`: summary.json reads as its schema's record (rundir/model_summary_doc.py; a schema 3
  document holds every key schema 3 writes);
schema 3 (model-summary/3; older runs: model/verify_legacy.py):
- `plan_matches_protocol`: arms, (case, mode)s, rounds, seed, modes and every rule are the protocol's;
- `gate_v3`: every arm's teacher-forced verdict re-derived from its row (call counts, distance
  against eager's times the factor, top-1 agreement recomputed from the recorded tokens against
  eager's minus the margin), every available arm that passed timed and no other;
- `inputs_v3`: every call of every round (warm-up ones too) has its row, whose seed is the
  rule's and whose position and ids digest are what that seed draws (numpy's PCG64, redrawn here);
- `captures_v3`: graph cases have one capture row per timed arm, a captured one with the
  model's call counts; an arm not captured is not timed there, nor any arm where eager is not;
- `rounds`, `order_of_starts`: every case's arms have one sample per round in the seeded order,
  started in case / round / position order;
- `checks_v3`: one checked call per round, the same for every arm; every verdict re-derived
  from the distances (the limit: the factor x the largest of the rounds' scales, eager's
  Python-forward distance, which in eager mode is its timed call's);
- `figures_v3`: every figure, verdict, exclusion and key of summary.json recomputed, the copy
  rate from copies.csv, each case's floor bytes from the config and its floor from the rate.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.model.layout import CAPTURES, COPIES, GRAPH_CUDA, GRAPH_IDENTITY, INPUTS, TIMED_CHECKS
from kerneltrial.model.verify_common import (
    FIGURES_DETAIL,
    GATE_DETAIL,
    ORDER_DETAIL,
    PLAN_DETAIL,
    REL,
    ROUNDS_DETAIL,
    arm_figures,
    close,
    expected_calls,
    finished,
    gate_rows,
    indexed,
    manifest,
    order_of_starts,
    plan_problems,
    protocol,
    rounds,
    run_records,
    timing_rules,
)
from kerneltrial.model.verify_legacy import verify_legacy
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_csv, read_json, read_jsonl
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.model_summary_doc import MODEL_SUMMARY_V3, ModelCase, ModelSummary, read_model_summary

ArmsOf = dict[str, list[str]]  # case -> the arms it times


def plan_matches_protocol(run: Path, plan: dict[str, Any]) -> list[str]:
    """The plan says what the protocol says: arms, cases, rounds, seed, modes and every rule."""
    from kerneltrial.model.spec import case_id, parse_protocol

    p = parse_protocol((run / "protocol.toml").read_text())
    want = {
        "arms": list(p.arms),
        "cases": [case_id(c, m) for c, m in p.runs()],
        **timing_rules(p),
        "correctness": p.correctness.model_dump(),
        "modes": list(p.modes),
        "graph_prefill": p.graph_prefill,
    }
    return plan_problems(want, plan)


def gate_v3(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Every verdict of the teacher-forced gate re-derived from the row's numbers and the rule:
    the top-1 agreement recomputed from the arm's tokens, the limits from eager's row."""
    rule = plan["correctness"]
    problems = []
    eager = next((r for r in rows if r["arm"] == "eager"), None)
    for row in rows if eager is not None and "float32_tokens" in eager else []:
        top1 = agreement(row["top1_tokens"], eager["float32_tokens"])
        if not math.isclose(row["top1_agreement"], top1, rel_tol=REL):
            problems.append(f"gate: {row['arm']}'s top-1 agreement {row['top1_agreement']} is not its tokens' {top1}")

    def rule_of(name: str, row: dict[str, Any], eager: dict[str, Any]) -> tuple[bool, list[str]]:
        top1 = agreement(row["top1_tokens"], eager["float32_tokens"])
        passed = row["oracle_rel_error"] <= row["oracle_rel_error_limit"] and top1 >= row["top1_limit"]
        return passed, limit_problems(name, row, eager, rule)

    return problems + gate_rows(plan, rows, rule_of)


def agreement(tokens: list[list[int]], exact: list[list[int]]) -> float:
    """The share of (prompt, step) positions where the arm's top-1 is the float32 model's token."""
    pairs = [(a, b) for mine, theirs in zip(tokens, exact, strict=True) for a, b in zip(mine, theirs, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


def limit_problems(name: str, row: dict[str, Any], eager: dict[str, Any], rule: dict[str, Any]) -> list[str]:
    problems = []
    limit = rule["oracle_factor"] * eager["oracle_rel_error"]
    if not math.isclose(row["oracle_rel_error_limit"], limit, rel_tol=REL):
        problems.append(f"gate: {name}'s logits limit {row['oracle_rel_error_limit']} is not {limit}")
    top1_limit = agreement(eager["top1_tokens"], eager["float32_tokens"]) - rule["top1_margin"]
    if not math.isclose(row["top1_limit"], top1_limit, rel_tol=REL, abs_tol=1e-12):
        problems.append(f"gate: {name}'s top-1 limit {row['top1_limit']} is not eager's agreement minus the margin")
    return problems


# --- fresh inputs ----------------------------------------------------------------------------


def input_seed(seed: int, case: str, round_index: int) -> int:
    """model/inputs.py's rule, written again."""
    text = f"kerneltrial.model-inputs/{seed}/{case}/{round_index}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def redraw(seed: int, vocab: int, case: dict[str, Any], calls: int) -> list[tuple[int, str]]:
    """(position, ids digest) of every call the seed draws for the case (position -1: prefill)."""
    rng = np.random.default_rng(seed)
    tokens = case.get("tokens", 1)
    digests = []
    for _ in range(calls):
        ids = rng.integers(0, vocab, size=(case["batch"], tokens), dtype=np.int64)
        digests.append(hashlib.sha256(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest())
    if case["phase"] == "prefill":
        return [(-1, d) for d in digests]
    context = case["context"]
    span = min(context, max(calls, (context + 1) // 2))
    chosen = rng.choice(span, size=calls, replace=False) + (context - span + 1)
    return list(zip(sorted((int(q) for q in chosen), reverse=True), digests, strict=True))


def inputs_v3(plan: dict[str, Any], rows: list[dict[str, str]], arms_of: ArmsOf) -> list[str]:
    """Every round's inputs are what the rule's seed draws, one row per call, for every case timed."""
    vocab, calls = int(plan["config"]["vocab_size"]), plan["calls_per_sample"]
    seen: dict[tuple[str, int], list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        seen[(row["case"], int(row["round"]))].append(row)
    problems = []
    for case in plan["cases"]:
        cid = case["case"]
        for r in [*range(-plan["warmup"], 0), *range(plan["rounds"])] if arms_of[cid] else []:
            got = sorted(seen.pop((cid, r), []), key=lambda x: int(x["call"]))
            seed = input_seed(plan["seed"], cid, r)
            want = [(str(k), str(seed), str(q), d) for k, (q, d) in enumerate(redraw(seed, vocab, case, calls))]
            if [(x["call"], x["seed"], x["position"], x["ids_sha256"]) for x in got] != want:
                problems.append(f"inputs: {cid} round {r}'s inputs are not what seed {seed} draws")
    problems += [f"inputs: {cid} round {r} has inputs but the plan times no such round" for cid, r in sorted(seen)]
    return problems


# --- graph mode and timed checks -------------------------------------------------------------


def captures_v3(plan: dict[str, Any], captures: list[dict[str, Any]]) -> tuple[list[str], ArmsOf]:
    """The problems of captures.jsonl, and each case's arms: the timed ones, less in graph
    mode those not captured (all of them where eager is not)."""
    layers = int(plan["config"]["num_hidden_layers"])
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    by_case: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in captures:
        by_case[row["case"]][row["arm"]] = row
    problems: list[str] = []
    arms_of: ArmsOf = {}
    for case in plan["cases"]:
        cid, rows = case["case"], by_case.pop(case["case"], {})
        if case["mode"] == "eager":
            arms_of[cid] = timed
            problems += [f"captures: {cid} is an eager case but has capture rows"] if rows else []
            continue
        if sorted(rows) != sorted(timed):
            problems.append(f"captures: {cid} has capture rows for {sorted(rows)}, the timed arms are {sorted(timed)}")
        for arm, row in rows.items():
            counts_ok = row["calls_per_forward"] == expected_calls(layers, arm == "eager")
            if row["captured"] and not counts_ok:
                problems.append(f"captures: {cid} {arm} is captured with call counts {row['calls_per_forward']}")
            if not row["captured"] and not row["reason"]:
                problems.append(f"captures: {cid} {arm} is not captured and gives no reason")
        captured = [arm for arm in timed if rows.get(arm, {}).get("captured")]
        arms_of[cid] = captured if "eager" in captured else []
    problems += [f"captures: {cid} is not a case of the plan" for cid in sorted(by_case)]
    return problems, arms_of


def checks_v3(plan: dict[str, Any], checks: list[dict[str, Any]], arms_of: ArmsOf) -> tuple[list[str], ArmsOf]:
    """The timed checks' problems, and each case's arms that failed one."""
    keys = {"case", "round", "call", "arm", "distance", "scale", "limit", "passed", "message"}
    malformed = [row for row in checks if set(row) != keys]
    if malformed:
        return [f"checks: a timed check has the keys {sorted(malformed[0])}, not {sorted(keys)}"], {}
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in checks:
        by_case[row["case"]].append(row)
    problems: list[str] = []
    failed: ArmsOf = {}
    for case in plan["cases"]:
        rows = by_case.pop(case["case"], [])
        problems += case_checks(plan, case, rows, arms_of[case["case"]])
        failed[case["case"]] = sorted({row["arm"] for row in rows if not row["passed"]})
    return problems + [f"checks: {cid} is not a case of the plan" for cid in sorted(by_case)], failed


def case_checks(plan: dict[str, Any], case: dict[str, Any], rows: list[dict[str, Any]], arms: list[str]) -> list[str]:
    cid = case["case"]
    want = {(r, arm) for r in [*range(-plan["warmup"], 0), *range(plan["rounds"])] for arm in arms}
    if {(row["round"], row["arm"]) for row in rows} != want or len(rows) != len(want):
        return [f"checks: {cid} lacks a timed check of some round and arm, or has one too many"]
    if not rows:  # a graph case where eager could not be captured: no rounds
        return []
    problems = []
    calls: dict[int, set[int]] = defaultdict(set)
    scales: dict[int, set[float]] = defaultdict(set)
    for row in rows:
        calls[row["round"]].add(row["call"])
        scales[row["round"]].add(row["scale"])
    if any(len(k) != 1 or not 0 <= min(k) < plan["calls_per_sample"] for k in calls.values()):
        problems.append(f"checks: {cid} checks more than one call of a round, or a call the round did not make")
    own = case["mode"] != "eager" or all(r["distance"] == r["scale"] for r in rows if r["arm"] == "eager")
    if any(len(v) != 1 for v in scales.values()) or not own:
        problems.append(f"checks: {cid}'s scale differs between a round's rows, or is not eager's own distance")
    limit = plan["correctness"]["oracle_factor"] * max(max(v) for v in scales.values())
    for row in rows:
        passed = row["distance"] <= limit
        if row["passed"] != passed or not close(row["limit"], limit):
            problems.append(
                f"checks: {cid} round {row['round']} {row['arm']}: passed={row['passed']} limit "
                f"{row['limit']}, its distance gives passed={passed} limit {limit}"
            )
        if not passed and not row["message"].startswith("wrong result while timed: "):
            problems.append(f"checks: {cid} round {row['round']} {row['arm']} failed without its named message")
    return problems


# --- figures ---------------------------------------------------------------------------------


def llama_weight_bytes(config: dict[str, Any], size: int) -> int:
    """Every weight a Llama forward reads in full: the layers, the final norm and the head
    (the input embedding table only as the head, when tied)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or h // heads
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
    if config.get("attention_bias"):
        attention += heads * head_dim + 2 * kv * head_dim + h
    mlp = 3 * h * i + ((2 * i + h) if config.get("mlp_bias") else 0)
    return size * (layers * (attention + mlp + 2 * h) + h + config["vocab_size"] * h)


def floor_bytes_problems(plan: dict[str, Any], case: dict[str, Any]) -> list[str]:
    config = plan["config"]
    size = {"bfloat16": 2, "float16": 2, "float32": 4}[plan["dtype"]]
    got = case["floor_bytes"]
    want = {"embedding_rows": case["tokens_per_call"] * config["hidden_size"] * size, "kv_cache": 0}
    if case["phase"] == "decode":
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        want["kv_cache"] = (
            (2 * config["num_hidden_layers"] * case["batch"] * config["num_key_value_heads"] * head_dim)
            * (case["context"] + 1)
            * size
        )
    if config.get("model_type") == "llama":  # other models' weights are read as the runner counted them
        want["weights"] = llama_weight_bytes(config, size)
    if any(got.get(key) != value for key, value in want.items()):
        return [f"figures: {case['case']}'s floor bytes {got} are not the config's {want}"]
    return []


def copy_gbps(rows: list[dict[str, str]]) -> float | None:
    """The copies' median rate (bytes per ns), None when the rows are not samples 0..n-1 of
    positive bytes and times."""
    if [int(r["sample"]) for r in rows] != list(range(len(rows))) or not rows:
        return None
    if any(int(r["bytes"]) <= 0 or int(r["ns"]) <= 0 for r in rows):
        return None
    return float(np.median([int(r["bytes"]) / int(r["ns"]) for r in rows]))


def figures_v3(
    run: Path,
    plan: dict[str, Any],
    rows: list[dict[str, Any]],
    summary: ModelSummary,
    arms_of: ArmsOf,
    failed: ArmsOf,
) -> list[str]:
    per, regions = indexed(read_csv(run / "timings.csv"), read_csv(run / "attribution.csv"))
    checks = read_jsonl(run / TIMED_CHECKS)
    problems = run_records(plan, rows, summary)
    graph_label = GRAPH_CUDA if plan["is_gpu"] else GRAPH_IDENTITY
    if summary.graph_label != graph_label or plan.get("graph_label") != graph_label:
        problems.append("figures: the graph label does not match the device")
    counts = summary.timed_checks
    if counts is None or (counts.rows, counts.failed) != (len(checks), sum(not r["passed"] for r in checks)):
        problems.append("figures: summary.json's timed-check counts are not timed_checks.jsonl's")
    gbps = copy_gbps(read_csv(run / COPIES))
    claimed = summary.copy_rate.gbps if summary.copy_rate else None
    if gbps is None or not close(claimed, gbps):
        return [*problems, f"figures: the copy rate {claimed} GB/s is not copies.csv's median ({gbps})"]
    for case in plan["cases"]:
        figures = summary.cases.get(case["case"])
        if figures is not None:  # a case missing from summary.json: run_records names it
            problems += case_figures(plan, case, figures, arms_of, failed, per, regions, gbps)
    return problems


def case_figures(
    plan: dict[str, Any],
    case: dict[str, Any],
    claimed: ModelCase,
    arms_of: ArmsOf,
    failed: ArmsOf,
    per: Any,
    regions: Any,
    gbps: float,
) -> list[str]:
    cid = case["case"]
    problems = floor_bytes_problems(plan, case)
    floor_ns = sum(case["floor_bytes"].values()) / gbps
    arms = [a for a in arms_of[cid] if a not in failed.get(cid, [])]
    timed = [a["name"] for a in plan["arms"] if a["timed"]]
    if (claimed.mode, claimed.phase) != (case["mode"], case["phase"]):
        problems.append(f"figures: {cid}'s mode or phase is not the plan's")
    if not close(claimed.floor.ns if claimed.floor else None, floor_ns):
        problems.append(f"figures: {cid}'s floor {claimed.floor} is not {floor_ns} ns")
    excluded = claimed.excluded or {}
    if set(excluded) != set(timed) - set(arms):
        problems.append(
            f"figures: {cid} excludes {sorted(excluded)}, its rows exclude {sorted(set(timed) - set(arms))}"
        )
    entries = claimed.arms
    if set(entries) != set(arms):
        return [*problems, f"figures: {cid} reports arms {sorted(entries)}, its rows give {sorted(arms)}"]
    for arm in arms:
        entry = entries[arm]
        if sorted(per.get((cid, arm), {})) != list(range(plan["rounds"])):
            problems.append(f"figures: {cid} {arm} lacks its {plan['rounds']} rounds")
            continue
        problems += arm_figures(plan, cid, arm, entry, arms, per, regions)
        attr = entry.attribution
        device = attr.device_ns / floor_ns if attr and attr.device_ns is not None and plan["is_gpu"] else None
        if not (close(entry.vs_floor, entry.median_ns / floor_ns) and close(entry.device_vs_floor, device)):
            problems.append(f"figures: {cid} {arm}'s figures against the floor are not its median's and device time's")
    return problems


def freeze_problems(run: Path, plan: dict[str, Any]) -> list[str]:
    """The freeze record is null or the protocol's ({sha256 of protocol.toml, frozen_at}), and
    plan.json's frozen_at says the same."""
    record = read_json(run / "provenance.json").get("freeze", "absent")
    if record == "absent" or "frozen_at" not in plan:
        return ["freeze: a schema 3 run records its freeze (provenance.json freeze, plan.json frozen_at)"]
    if record is None:
        return [] if plan["frozen_at"] is None else [f"freeze: plan.json frozen_at {plan['frozen_at']!r}, not frozen"]
    if not isinstance(record, dict) or record.get("sha256") != sha256_file(run / "protocol.toml"):
        return ["freeze: the freeze record is not of this protocol.toml (its sha256 differs)"]
    if plan["frozen_at"] != record.get("frozen_at"):
        return [f"freeze: plan.json frozen_at {plan['frozen_at']!r} != the freeze record's {record.get('frozen_at')!r}"]
    return []


def verify_v3(
    run: Path, plan: dict[str, Any], rows: list[dict[str, Any]], summary: ModelSummary, result: VerifyResult
) -> None:
    """The checks of a schema 3 run beyond the manifest, end record and protocol digest."""
    missing = [name for name in (INPUTS, CAPTURES, COPIES, TIMED_CHECKS) if not (run / name).is_file()]
    if missing:
        result.add("files", [f"files: a schema 3 run has {missing[0]}; it is missing"], "")
        return
    result.add("files", [], f"{', '.join((INPUTS, CAPTURES, COPIES, TIMED_CHECKS))} present")
    timings = read_csv(run / "timings.csv")
    capture_problems, arms_of = captures_v3(plan, read_jsonl(run / CAPTURES))
    check_problems, failed = checks_v3(plan, read_jsonl(run / TIMED_CHECKS), arms_of)
    result.add("plan matches protocol", plan_matches_protocol(run, plan), PLAN_DETAIL)
    result.add("freeze", freeze_problems(run, plan), "the freeze record is this protocol.toml's, as plan.json says")
    result.add("gate", gate_v3(plan, rows), GATE_DETAIL)
    result.add("inputs", inputs_v3(plan, read_csv(run / INPUTS), arms_of), "every round's inputs as its seed draws")
    result.add("captures", capture_problems, "one capture row per timed arm of every graph case")
    result.add("rounds", rounds(plan, timings, arms_of), ROUNDS_DETAIL)
    result.add("order of starts", order_of_starts(plan, timings), ORDER_DETAIL)
    result.add("timed checks", check_problems, "one checked call per round, every verdict re-derived")
    result.add("figures", figures_v3(run, plan, rows, summary, arms_of, failed), FIGURES_DETAIL)


def verify_model_run(run: Path) -> VerifyResult:
    """Every check of a model run directory, each with the problems it found."""
    for name in ("plan.json", "provenance.json", "summary.json", "manifest.json", "timings.csv", "correctness.jsonl"):
        if not (run / name).is_file():
            raise RunDirError(f"{run}: {name} is missing; not a finished model run directory")
    plan = read_json(run / "plan.json")
    rows = read_jsonl(run / "correctness.jsonl")
    result = VerifyResult(run)
    result.add("manifest", manifest(run), "every file listed with its sha256, none added or missing")
    result.add("finished", finished(run), "provenance.json records the end of the run")
    result.add("protocol", protocol(run, plan), "protocol.toml is the protocol the plan was built from")
    try:
        summary = read_model_summary(run)
    except RunDirError as error:
        result.add("summary", [f"summary: {error}"], "")
        return result
    result.add("summary", [], "summary.json reads as its schema's record")
    if summary.schema_ == MODEL_SUMMARY_V3:
        verify_v3(run, plan, rows, summary, result)
    elif "modes" in plan:  # written by schema 3's runner: its files and checks are not optional
        result.add(
            "schema", [f"schema: plan.json is schema 3's (it has modes), summary.json says {summary.schema_}"], ""
        )
    else:
        timings = read_csv(run / "timings.csv")
        verify_legacy(run, plan, timings, rows, summary, read_csv(run / "attribution.csv"), result)
    return result
