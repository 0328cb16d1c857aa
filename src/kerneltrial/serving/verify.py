"""Independent check of a serving run directory: `verify_serving_run(path) -> problems`.

Recomputes every figure of summary.json from the raw `vllm bench serve` JSON files and the
accuracy records, with its own arithmetic (it does not import metrics.py), checks the protocol
hash and the raw files' sha256, and decides each launch's proof of dispatch again from its call
records (verify_dispatch.py). It checks the evidence under the figures (verify_evidence.py):
per-request times against the run's duration and concurrency, requests.csv, the launch order
against the seed, and every stored answer re-graded. Three things it takes from the code it
checks, because they are definitions rather than arithmetic: the grader (re-grading means
running the grader that graded, accuracy.grade, at the recorded version), the seeded launch
order (order.planned_launches) and the acceptance rule (acceptance.py, the one rule the trial
and the report apply, fed here with verify's own figures). An empty list means everything matched.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving import verify_evidence as evidence
from kerneltrial.serving.acceptance import Check, LaunchFigure, Rule, case_record, compare_case, judge
from kerneltrial.serving.verify_dispatch import check_dispatch

REL_TOL = 1e-9
ABS_TOL = 1e-9


def _pct(xs: list[float], p: float) -> float:
    """numpy.percentile's default (linear) method, written out."""
    if not xs:
        return 0.0
    s = sorted(xs)
    h = (len(s) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def _stats(xs: list[float], name: str, pcts: list[float]) -> dict[str, float]:
    v = xs or [0.0]
    out = {
        f"mean_{name}_ms": math.fsum(v) / len(v) * 1000,
        f"median_{name}_ms": statistics.median(v) * 1000,
        f"std_{name}_ms": statistics.pstdev(v) * 1000,
    }
    for p in pcts:
        w = str(int(p)) if int(p) == p else str(p)
        out[f"p{w}_{name}_ms"] = _pct(v, p) * 1000
    return out


def _good(raw: dict[str, Any], i: int, slos: dict[str, float]) -> bool:
    """Request i meets every SLO (ms): TTFT, TPOT (0 for a single output token), E2E latency."""
    lat, ttft, n = raw["latencies"][i], raw["ttfts"][i], raw["output_lens"][i]
    tpot = (lat - ttft) / (n - 1) if n > 1 else 0.0
    return all({"ttft": ttft, "tpot": tpot, "e2el": lat}[k] * 1000 <= ms for k, ms in slos.items())


def recompute_run(raw: dict[str, Any], pcts: list[float], slos: dict[str, float] | None = None) -> dict[str, float]:
    n = len(raw["input_lens"])
    good = [not raw["errors"][i] and raw["latencies"][i] > 0 for i in range(n)]
    dur = raw["duration"]
    tin = sum(raw["input_lens"][i] for i in range(n) if good[i])
    tout = sum(raw["output_lens"])
    done = sum(good)
    tp = [
        (raw["latencies"][i] - raw["ttfts"][i]) / (raw["output_lens"][i] - 1)
        for i in range(n)
        if good[i] and raw["output_lens"][i] > 1
    ]
    out = {
        "completed": done,
        "failed": n - done,
        "duration": dur,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": done / dur,
        "output_throughput": tout / dur,
        "total_token_throughput": (tin + tout) / dur,
    }
    if raw.get("start_times") is not None:
        out["max_output_tokens_per_s"] = _peak_tokens_per_s(raw, good)
    if slos:
        out["request_goodput"] = sum(1 for i in range(n) if good[i] and _good(raw, i, slos)) / dur
    out |= _stats([raw["ttfts"][i] for i in range(n) if good[i]], "ttft", pcts)
    out |= _stats(tp, "tpot", pcts)
    out |= _stats([x for i in range(n) if good[i] for x in raw["itls"][i]], "itl", pcts)
    out |= _stats([raw["latencies"][i] for i in range(n) if good[i]], "e2el", pcts)
    return out


def _peak_tokens_per_s(raw: dict[str, Any], good: list[bool]) -> float:
    """vLLM's peak output tok/s: each successful request's tokens (first at start + TTFT, each
    next one ITL later) in one-second buckets from the earliest successful start; the fullest."""
    idx = [i for i in range(len(good)) if good[i]]
    if not idx:
        return 0.0
    t0 = min(raw["start_times"][i] for i in idx)
    end = max(raw["start_times"][i] + raw["latencies"][i] for i in idx)
    counts = [0] * (math.ceil(end - t0) + 1)
    for i in idx:
        t = raw["start_times"][i] + raw["ttfts"][i]
        for gap in [0.0, *raw["itls"][i]]:
            t += gap
            if 0 <= int(t - t0) < len(counts):
                counts[int(t - t0)] += 1
    return float(max(counts))


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return bool(a == b)


# MATH-500 problems per level (written out here, apart from serving/accuracy.py: verify does not
# trust the writer's table). The gate needs the protocol's `limit`, else the whole level.
_FULL_SET_SIZE = {"1": 43, "2": 90, "3": 105, "4": 128, "5": 134}


def _required_n(acc_plan: dict[str, Any]) -> int | None:
    if acc_plan.get("limit") is not None:
        return int(acc_plan["limit"])
    level = acc_plan.get("level")
    if level is None:
        return 500
    return _FULL_SET_SIZE.get(str(level).removeprefix("Level ").strip())


def _wilson(k: int, n: int, conf: float) -> tuple[float, float]:
    # scipy's Wilson interval, the one accuracy.py records (through metrics.py): here the interval
    # is not an independent formula any more; what verify checks independently is its inputs,
    # k and n recounted from records.jsonl, and that the recorded bounds are the ones they give.
    if n <= 0:
        return (0.0, 1.0)
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=conf, method="wilson")
    return (float(ci.low), float(ci.high))


def _read_jsonl(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file; a line that is not JSON becomes a problem (and no rows)."""
    try:
        return read_jsonl(path)
    except RunDirError as error:
        problems.append(str(error))
        return []


def incomplete(prov: dict[str, Any], summarised: bool) -> str | None:
    """Why a run directory is not finished evidence, from provenance.json's status; None when the
    run ended ("finished", or "failed" with the failure recorded and summarised)."""
    status, at, where = prov.get("status"), prov.get("finished_at"), prov.get("stopped_in") or {}
    launch = f" in launch {where['launch']} ({where['arm']})" if where else ""
    if status == "interrupted":
        return f"incomplete run: interrupted at {at}{launch}; it is not evidence, run the trial again"
    if status == "failed" and not summarised:
        return f"incomplete run: failed at {at}{launch} ({prov.get('error')}) before its summary was written"
    if status not in ("finished", "failed") or not at:
        return (
            f"incomplete run: provenance.json says status {status!r} with no finished record (finished_at {at}): "
            "the run was killed (kill -9, a crash, a lost machine) before it finished; run the trial again"
        )
    return None


def _launch_problems(
    where: str, rows: list[dict[str, Any]], launches: list[int], per_launch: list[dict[str, float]], recorded: Any
) -> list[str]:
    """The summary's per-launch figures, which report and compare show with their intervals: one
    entry per launch run, its kept runs (all but the first, the warm-up rule) and their mean figures."""
    entries = [e for e in recorded if isinstance(e, dict)] if isinstance(recorded, list) else []
    if [e.get("launch") for e in entries] != launches:
        return [f"{where}: summary launches {[e.get('launch') for e in entries]} are not the launches run {launches}"]
    problems = []
    for launch, entry, figures in zip(launches, entries, per_launch, strict=True):
        kept = [r["run"] for r in sorted((r for r in rows if r["launch"] == launch), key=lambda r: r["run"])[1:]]
        if entry.get("kept_runs") != kept:
            problems.append(
                f"{where} launch {launch}: summary kept_runs {entry.get('kept_runs')}, the runs after warm-up are {kept}"
            )
        problems += [
            f"{where} launch {launch}: summary {k} = {entry[k]}, recomputed {v}"
            for k, v in figures.items()
            if k in entry and not _close(entry[k], v)
        ]
    return problems


def verified_detail(path: Path) -> str:
    """What `kerneltrial verify` says of a serving run whose checks all pass. A run that failed
    (a launch refused, a gate, a dispatch proof) verifies as the record of its failure, and the
    line says so: it shows what happened, it is no evidence for any arm."""
    if not (Path(path) / "provenance.json").is_file():
        return "every serving figure matches"  # verify_serving_run names the missing file
    prov = read_json(Path(path) / "provenance.json")
    summary_path = Path(path) / "summary.json"
    summary = read_json(summary_path) if summary_path.is_file() else {}
    if prov.get("status") != "failed" and summary.get("status") == "ok":
        return "every serving figure matches"
    why = prov.get("error") or next(iter(summary.get("failures") or []), "a run or a dispatch proof failed")
    return (
        f"every serving figure matches, as the record of a FAILED run ({why}): it shows what happened, "
        "it is no evidence for any arm"
    )


def verify_serving_run(path: Path, regrade: bool = True) -> list[str]:
    """Every problem found; `regrade=False` trusts the stored grades (the caller says so)."""
    path = Path(path)
    problems: list[str] = []
    prov_path = path / "provenance.json"
    if prov_path.is_file() and (why := incomplete(read_json(prov_path), (path / "summary.json").is_file())):
        return [why]  # before the summary: a killed run's summary may be planted or stale
    need = ["protocol.toml", "provenance.json", "plan.json", "runs.jsonl", "summary.json"]
    missing = [f for f in need if not (path / f).is_file()]
    if missing:
        return [f"missing file(s): {', '.join(missing)}"]
    sha = sha256_file(path / "protocol.toml")
    prov = read_json(path / "provenance.json")
    plan = read_json(path / "plan.json")
    summary = read_json(path / "summary.json")
    if prov.get("kind") != "serving":
        problems.append(f"provenance.json kind is {prov.get('kind')!r}, not 'serving'")
    for name, doc in (("provenance.json", prov), ("plan.json", plan), ("summary.json", summary)):
        if doc.get("protocol_sha256") != sha:
            problems.append(f"{name} protocol_sha256 does not match protocol.toml (sha256 {sha[:12]}...)")
    pcts = [float(p) for p in plan.get("percentiles", [99])]
    slos = plan.get("goodput")  # --goodput SLOs (ms); before issue 26: none
    repeats, rounds = int(plan["repeats"]), int(plan["rounds"])
    rows = _read_jsonl(path / "runs.jsonl", problems)
    concurrency = {c["case"]: int(c["concurrency"]) for c in plan["cases"]}
    raws: dict[tuple[Any, ...], dict[str, Any]] = {}

    # every run: raw file present, hash, figures, status, the per-request evidence
    for r in rows:
        where = f"run {r.get('arm')}/{r.get('case')}/launch {r.get('launch')}/run {r.get('run')}"
        rawp = path / r.get("raw", "")
        if not rawp.is_file():
            if r.get("status") == "ok":
                problems.append(f"{where}: raw file {r.get('raw')} missing")
            continue
        if r.get("raw_sha256") != sha256_file(rawp):
            problems.append(f"{where}: raw file {r.get('raw')} sha256 differs from runs.jsonl")
        if "completed" not in r:
            continue
        raw = json.loads(rawp.read_text())
        got = recompute_run(raw, pcts, slos)
        for k, v in got.items():
            if k not in r or not _close(r[k], v):
                problems.append(f"{where}: {k} is {r.get(k)} in runs.jsonl, recomputed {v}")
        raws[(r.get("launch"), r.get("arm"), r.get("case"), r.get("run"))] = raw
        problems += evidence.request_time_problems(raw, where)
        problems += evidence.duration_problems(raw, where)
        problems += evidence.concurrency_problems(raw, concurrency[r["case"]], where)
        problems += evidence.client_figure_problems(raw, got, where)
        want_status = "ok" if got["completed"] == r.get("num_requests") else "FAILED"
        if r.get("status") != want_status:
            problems.append(
                f"{where}: status {r.get('status')} but completed {got['completed']} of {r.get('num_requests')}"
            )
        if raw.get("completed") is not None and raw["completed"] != got["completed"]:
            problems.append(
                f"{where}: vLLM's own completed ({raw['completed']}) differs from the recount {got['completed']}"
            )

    problems += evidence.requests_table_problems(path, raws)

    # per (arm, case) summaries: warm-up rule per launch, mean over launches
    res = summary.get("results", {})
    keys_seen: set[str] = set()
    recomputed_launches: dict[tuple[str, str], list[tuple[int, dict[str, float]]]] = {}  # for acceptance
    for arm in plan["arms"]:
        a = arm["name"]
        for c in plan["cases"]:
            cid = c["case"]
            s = res.get(a, {}).get(cid)
            if s is None:
                problems.append(f"summary lacks {a}/{cid}")
                continue
            rr = [r for r in rows if r["arm"] == a and r["case"] == cid]
            launches = sorted({r["launch"] for r in rr})
            ok = (
                rr
                and all(r["status"] == "ok" for r in rr)
                and len(launches) == rounds
                and all(sum(1 for r in rr if r["launch"] == L) == repeats for L in launches)
            )
            if (s.get("status") == "ok") != bool(ok):
                problems.append(
                    f"{a}/{cid}: summary status {s.get('status')} but the runs say {'ok' if ok else 'not ok'}"
                )
                continue
            if not ok:
                continue
            per_launch = []
            for L in launches:
                lr = sorted((r for r in rr if r["launch"] == L), key=lambda r: r["run"])[1:]
                recomputed = {}
                for k in lr[0]:
                    if (
                        k.endswith("_ms") and not k.startswith("std_") and (k.startswith(("mean_", "median_", "p99_")))
                    ) or k in (
                        "total_token_throughput",
                        "output_throughput",
                        "request_throughput",
                        "max_output_tokens_per_s",
                        "request_goodput",
                    ):
                        recomputed[k] = math.fsum(
                            recompute_run(json.loads((path / r["raw"]).read_text()), pcts, slos)[k] for r in lr
                        ) / len(lr)
                per_launch.append(recomputed)
            recomputed_launches[(a, cid)] = list(zip(launches, per_launch, strict=True))
            problems += _launch_problems(f"{a}/{cid}", rr, launches, per_launch, s.get("launches"))
            for k in per_launch[0]:
                if k in s:
                    keys_seen.add(k)
                    v = math.fsum(g[k] for g in per_launch) / len(per_launch)
                    if not _close(s[k], v):
                        problems.append(f"{a}/{cid}: summary {k} = {s[k]}, recomputed {v}")
            for k in ("total_token_throughput", "mean_ttft_ms"):
                if k not in s:
                    problems.append(f"{a}/{cid}: summary lacks {k}")

    # accuracy: recount records, Wilson interval, gate
    acc_sum = summary.get("accuracy", {}) or {}
    acc_plan = plan.get("accuracy")
    for a, s in acc_sum.items():
        recs = _read_jsonl(path / "accuracy" / a / "records.jsonl", problems)
        n, k = len(recs), sum(1 for r in recs if r.get("correct") is True)
        errs = sum(1 for r in recs if r.get("error"))
        lo, hi = _wilson(k, n, float(s.get("confidence", 0.95)))
        gate = float((acc_plan or {}).get("gate", s.get("gate", 0.95)))
        need = _required_n(acc_plan or {}) if "required_n" in s else None  # older runs: any n
        want = {
            "n": n,
            "correct": k,
            "errors": errs,
            "accuracy": k / n if n else 0.0,
            "ci_low": lo,
            "ci_high": hi,
            "passed": bool(n > 0 and errs == 0 and k / n >= gate and (need is None or n >= need)),
        }
        if "required_n" in s and s["required_n"] != need:
            problems.append(f"accuracy {a}: required_n = {s['required_n']}, the protocol gives {need}")
        for key, v in want.items():
            if not math.isclose(float(s.get(key, float("nan"))), float(v), rel_tol=1e-6, abs_tol=1e-9):
                problems.append(f"accuracy {a}: {key} = {s.get(key)}, recomputed {v}")

    if regrade:
        problems += evidence.regrade_problems(path, acc_sum)

    launches = _read_jsonl(path / "launches.jsonl", problems)
    finished = prov.get("status") == "finished"
    problems += evidence.launch_order_problems(path, finished, plan.get("launches"), launches)
    problems += evidence.nonce_problems(plan, launches, rows)
    problems += evidence.client_problems(plan, rows)
    problems += evidence.pins_problems(path, plan, launches, summary, prov)
    dispatch_valid = check_dispatch(path, plan, launches, summary, problems)

    # acceptance verdict: serving/acceptance.py's rule, on the per-launch figures recomputed above
    acc_rule = summary.get("acceptance")
    names = {arm["role"]: arm["name"] for arm in plan["arms"]}
    if "baseline" in names and "candidate" in names:
        if not acc_rule:
            problems.append("summary has no acceptance block although the protocol has baseline and candidate")
        else:
            rule = Rule(
                float(plan["acceptance"]["noise_band"]),
                float(plan["acceptance"]["ttft_ratio_max"]),
                float(plan["acceptance"].get("confidence", 0.95)),
            )
            round_of = {int(L["launch"]): int(L["round"]) for L in plan.get("launches", [])}

            def figures(arm: str, case: str) -> list[LaunchFigure] | None:
                got = recomputed_launches.get((arm, case))
                if got is None:
                    return None
                return [LaunchFigure(round_of[L], f["total_token_throughput"], f["mean_ttft_ms"]) for L, f in got]

            base, cand = names["baseline"], names["candidate"]
            cases = [
                compare_case(c["case"], figures(cand, c["case"]), figures(base, c["case"]), rule) for c in plan["cases"]
            ]
            checks = [Check(dispatch_valid.get(names[role]) is not False, role) for role in ("baseline", "candidate")]
            if acc_plan is not None:
                checks.append(Check(bool(acc_sum.get(cand, {}).get("passed")), "accuracy"))
            v = judge(cand, base, cases, checks, rule)
            for c in cases:
                got = acc_rule.get("cases", {}).get(c.case, {})
                for key, want in case_record(c).items():
                    if not _close(got.get(key), want):
                        problems.append(f"acceptance {c.case}: {key} {got.get(key)}, recomputed {want}")
            if bool(acc_rule.get("accepted")) != v.accepted or acc_rule.get("verdict", v.verdict) != v.verdict:
                problems.append(
                    f"acceptance verdict {acc_rule.get('verdict', acc_rule.get('accepted'))}, recomputed {v.verdict}"
                )
    return problems
