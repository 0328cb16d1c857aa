"""Independent check of a serving run directory: `verify_serving_run(path) -> VerifyResult`.

Recomputes every figure of summary.json from the raw `vllm bench serve` JSON files and the
accuracy records, with its own arithmetic (not metrics.py's), checks the protocol
hash and the raw files' sha256, and decides each launch's proof of dispatch again from its call
records (verify_dispatch.py). It checks the evidence under the figures (verify_evidence.py):
per-request times against the run's duration and concurrency, requests.csv, the launch order
against the seed, and every stored answer re-graded. Three things it takes from the code it
checks, because they are definitions rather than arithmetic: the grader (re-grading means
running the grader that graded, accuracy.grade, at the recorded version), the seeded launch
order (order.planned_launches) and the acceptance rule (acceptance.py, the one rule the trial
and the report apply, fed here with verify's own figures); a fourth, the accuracy gate's interval
and pass probability at the gate (accuracy_stats.py), is fed with verify_accuracy.py's recounts.
Each defect family is one named check (rundir/checks.py).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltrial.kernel.provenance_checks import commit_problems
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving import verify_evidence as evidence
from kerneltrial.serving.acceptance import GateCheck, LaunchFigure, Rule, case_record, compare_case, judge
from kerneltrial.serving.calibration_evidence import calibration_checks
from kerneltrial.serving.verify_accuracy import accuracy_problems, cross_grade_problems
from kerneltrial.serving.verify_dispatch import check_dispatch
from kerneltrial.serving.verify_plan import RunProtocol, floor_problems, plan_problems, read_run_protocol
from kerneltrial.serving.verify_requests import completeness_problems
from kerneltrial.serving.verify_served import served_problems

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


def finished_detail(prov: dict[str, Any], summary: dict[str, Any]) -> str:
    """What `run finished` says of a run that ended. A run that failed (a launch refused, a gate, a
    dispatch proof) verifies as the record of its failure, and the line says so: it shows what
    happened, it is no evidence for any arm."""
    if prov.get("status") != "failed" and summary.get("status") == "ok":
        return "provenance.json records the end of the run"
    why = prov.get("error") or next(iter(summary.get("failures") or []), "a run or a dispatch proof failed")
    return (
        f"provenance.json records the end of a FAILED run ({why}): every check below reads the record "
        "of what happened, it is no evidence for any arm"
    )


@dataclass(frozen=True)
class ServingRun:
    """The documents of a serving run directory that the checks read."""

    path: Path
    prov: dict[str, Any]
    plan: dict[str, Any]
    summary: dict[str, Any]
    rows: list[dict[str, Any]]  # runs.jsonl
    pcts: list[float]  # the plan's percentiles
    slos: dict[str, float] | None  # --goodput SLOs (ms); before issue 26: none
    protocol: RunProtocol  # protocol.toml, parsed once for the plan, the launch order and the pins


@dataclass(frozen=True)
class Recounted:
    """One run of runs.jsonl whose raw `vllm bench serve` file was read, and its figures recomputed."""

    where: str
    row: dict[str, Any]
    raw: dict[str, Any]
    figures: dict[str, float]


NEEDED = ["protocol.toml", "provenance.json", "plan.json", "runs.jsonl", "summary.json"]
# runs.jsonl figures the summary averages (warm-up rule per launch, mean over launches), besides the
# mean, median and p99 latencies
AVERAGED = (
    "total_token_throughput",
    "output_throughput",
    "request_throughput",
    "max_output_tokens_per_s",
    "request_goodput",
)
Launches = dict[tuple[str, str], list[tuple[int, dict[str, float]]]]  # (arm, case) -> (launch, its figures)


def verify_serving_run(path: Path, regrade: bool = True) -> VerifyResult:
    """Every check of a serving run directory, each with the problems it found; `regrade=False`
    trusts the stored grades (the caller says so)."""
    path = Path(path)
    result = VerifyResult(path)
    prov_path = path / "provenance.json"
    if prov_path.is_file() and (why := incomplete(read_json(prov_path), (path / "summary.json").is_file())):
        result.add("run finished", [why], "")  # before the summary: a killed run's summary may be planted or stale
        return result
    missing = [f for f in NEEDED if not (path / f).is_file()]
    if missing:
        result.add("required files", [f"missing file(s): {', '.join(missing)}"], "")
        return result
    run, unreadable = _read_run(path)
    result.add("run finished", [], finished_detail(run.prov, run.summary))
    result.add("required files", [], ", ".join(NEEDED) + " present")
    result.add("runs.jsonl", unreadable, f"{len(run.rows)} rows, each a JSON object")
    _check_documents(run, result)
    commit, detail = commit_problems(run.prov)  # the commit the plan's keys are read at is the code that ran
    if commit is None:
        result.not_applicable("source commit", detail)
    else:
        result.add("source commit", commit, detail)
    result.add("plan derived", *plan_problems(run.protocol, run.plan, run.prov))
    _check_runs(run, result)
    recomputed = _check_summary(run, result)
    _check_accuracy(run, regrade, result)
    launches = _check_launches(run, result)
    dispatch_problems: list[str] = []
    dispatch_valid = check_dispatch(path, run.plan, launches, run.summary, dispatch_problems)
    if dispatch_valid or dispatch_problems:
        result.add(
            "dispatch proof", dispatch_problems, "every launch's proof of dispatch decided again from its records"
        )
    else:
        result.not_applicable("dispatch proof", "not applicable: the run records no proof of dispatch (an older run)")
    roles = {arm["role"] for arm in run.plan["arms"]}
    if {"baseline", "candidate"} <= roles:
        result.add(
            "acceptance",
            _acceptance_problems(run, recomputed, dispatch_valid),
            "the acceptance verdict recomputed from the per-launch figures",
        )
        _check_floor(run, result)
    else:
        result.not_applicable("acceptance", "not applicable: the protocol has no baseline and candidate")

    def verify_run(where: Path) -> list[str]:
        return verify_serving_run(where, regrade).problems

    for check in calibration_checks(path, run.prov, run.plan, run.summary, run.rows, run.protocol, verify_run):
        if check.problems is None:
            result.not_applicable(check.name, check.not_applicable)
        else:
            result.add(check.name, check.problems, check.detail)
    return result


def _read_run(path: Path) -> tuple[ServingRun, list[str]]:
    """The documents, and the problem of a runs.jsonl line that is not JSON (its rows are then none)."""
    problems: list[str] = []
    plan = read_json(path / "plan.json")
    rows = _read_jsonl(path / "runs.jsonl", problems)
    run = ServingRun(
        path,
        read_json(path / "provenance.json"),
        plan,
        read_json(path / "summary.json"),
        rows,
        [float(p) for p in plan.get("percentiles", [99])],
        plan.get("goodput"),
        read_run_protocol(path),
    )
    return run, problems


def _check_documents(run: ServingRun, result: VerifyResult) -> None:
    """`run kind` and `protocol hash`: a serving run of the protocol.toml beside it."""
    kind = run.prov.get("kind")
    result.add(
        "run kind",
        [] if kind == "serving" else [f"provenance.json kind is {kind!r}, not 'serving'"],
        "provenance.json says serving",
    )
    sha = sha256_file(run.path / "protocol.toml")
    result.add(
        "protocol hash",
        [
            f"{name} protocol_sha256 does not match protocol.toml (sha256 {sha[:12]}...)"
            for name, doc in (("provenance.json", run.prov), ("plan.json", run.plan), ("summary.json", run.summary))
            if doc.get("protocol_sha256") != sha
        ],
        f"sha256 {sha[:12]}... in provenance.json, plan.json and summary.json",
    )


def _check_runs(run: ServingRun, result: VerifyResult) -> None:
    """`raw files`, `run figures`, `request evidence` and `requests table`: every run of runs.jsonl
    from its raw file."""
    raw_problems, recounted = _recount(run)
    result.add("raw files", raw_problems, f"{len(run.rows)} runs, each raw file present and hashed as runs.jsonl says")
    result.add(
        "run figures",
        [p for r in recounted for p in _figure_problems(r)],
        f"{len(recounted)} runs' figures recomputed from their raw files",
    )
    cases = {c["case"]: c for c in run.plan["cases"]}
    result.add(
        "complete requests",
        [p for r in recounted for p in completeness_problems(r.row, r.raw, cases.get(r.row.get("case")), r.where)],
        "every run's status recounted from its requests: each completed, with the output tokens its case asks for",
    )
    concurrency = {c["case"]: int(c["concurrency"]) for c in run.plan["cases"]}
    result.add(
        "request evidence",
        [
            p
            for r in recounted
            for p in (
                *evidence.request_time_problems(r.raw, r.where),
                *evidence.duration_problems(r.raw, r.where),
                *evidence.concurrency_problems(r.raw, concurrency[r.row["case"]], r.where),
                *evidence.client_figure_problems(r.raw, r.figures, r.where),
            )
        ],
        "per-request times within each run's duration and concurrency; the client's figures agree",
    )
    if (csv_problems := evidence.script_csv_problems(run.path, run.plan, run.rows)) is None:
        result.not_applicable("script CSVs", "not applicable: the run has no benchmark_results/ (an older run)")
    else:
        result.add("script CSVs", csv_problems, "benchmark_results/ is the organisers' script's CSVs of runs.jsonl")
    raws = {(r.row.get("launch"), r.row.get("arm"), r.row.get("case"), r.row.get("run")): r.raw for r in recounted}
    result.add(
        "requests table", evidence.requests_table_problems(run.path, raws), "requests.csv is the raw files' requests"
    )


def _recount(run: ServingRun) -> tuple[list[str], list[Recounted]]:
    """The problems of the raw files (missing, or not the sha256 runs.jsonl records), and every
    run with figures, recomputed from its raw file."""
    problems: list[str] = []
    recounted: list[Recounted] = []
    for r in run.rows:
        where = f"run {r.get('arm')}/{r.get('case')}/launch {r.get('launch')}/run {r.get('run')}"
        rawp = run.path / r.get("raw", "")
        if not rawp.is_file():
            if r.get("status") == "ok":
                problems.append(f"{where}: raw file {r.get('raw')} missing")
            continue
        if r.get("raw_sha256") != sha256_file(rawp):
            problems.append(f"{where}: raw file {r.get('raw')} sha256 differs from runs.jsonl")
        if "completed" in r:
            raw = json.loads(rawp.read_text())
            recounted.append(Recounted(where, r, raw, recompute_run(raw, run.pcts, run.slos)))
    return problems, recounted


def _figure_problems(run: Recounted) -> list[str]:
    """A run's figures in runs.jsonl and vLLM's own count against the recount (its status:
    verify_requests.py, the `complete requests` check)."""
    r, got, where = run.row, run.figures, run.where
    problems = [
        f"{where}: {k} is {r.get(k)} in runs.jsonl, recomputed {v}"
        for k, v in got.items()
        if k not in r or not _close(r[k], v)
    ]
    if run.raw.get("completed") is not None and run.raw["completed"] != got["completed"]:
        problems.append(
            f"{where}: vLLM's own completed ({run.raw['completed']}) differs from the recount {got['completed']}"
        )
    return problems


def _check_summary(run: ServingRun, result: VerifyResult) -> Launches:
    """`summary figures`: per (arm, case), the warm-up rule per launch and the mean over launches;
    returns the per-launch figures recomputed (the acceptance rule reads them)."""
    problems: list[str] = []
    recomputed: Launches = {}
    for arm in run.plan["arms"]:
        for c in run.plan["cases"]:
            problems += _arm_case_problems(run, arm["name"], c["case"], recomputed)
    result.add("summary figures", problems, "every (arm, case) summary recomputed from its runs")
    return recomputed


def _arm_case_problems(run: ServingRun, a: str, cid: str, recomputed: Launches) -> list[str]:
    """One (arm, case) of summary.json against its runs; its per-launch figures go into `recomputed`."""
    s = run.summary.get("results", {}).get(a, {}).get(cid)
    if s is None:
        return [f"summary lacks {a}/{cid}"]
    repeats, rounds = int(run.plan["repeats"]), int(run.plan["rounds"])
    rr = [r for r in run.rows if r["arm"] == a and r["case"] == cid]
    launches = sorted({r["launch"] for r in rr})
    ok = (
        rr
        and all(r["status"] == "ok" for r in rr)
        and len(launches) == rounds
        and all(sum(1 for r in rr if r["launch"] == L) == repeats for L in launches)
    )
    if (s.get("status") == "ok") != bool(ok):
        return [f"{a}/{cid}: summary status {s.get('status')} but the runs say {'ok' if ok else 'not ok'}"]
    if not ok:
        return []
    per_launch = [
        _launch_means(run, sorted((r for r in rr if r["launch"] == L), key=lambda r: r["run"])[1:]) for L in launches
    ]
    recomputed[(a, cid)] = list(zip(launches, per_launch, strict=True))
    problems = _launch_problems(f"{a}/{cid}", rr, launches, per_launch, s.get("launches"))
    for k in per_launch[0]:
        if k in s:
            v = math.fsum(g[k] for g in per_launch) / len(per_launch)
            if not _close(s[k], v):
                problems.append(f"{a}/{cid}: summary {k} = {s[k]}, recomputed {v}")
    return problems + [
        f"{a}/{cid}: summary lacks {k}" for k in ("total_token_throughput", "mean_ttft_ms") if k not in s
    ]


def _averaged(key: str) -> bool:
    latency = key.endswith("_ms") and not key.startswith("std_") and key.startswith(("mean_", "median_", "p99_"))
    return latency or key in AVERAGED


def _launch_means(run: ServingRun, kept: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of each averaged figure over a launch's kept runs, recomputed from their raw files."""
    figures = [recompute_run(json.loads((run.path / r["raw"]).read_text()), run.pcts, run.slos) for r in kept]
    return {k: math.fsum(f[k] for f in figures) / len(kept) for k in kept[0] if _averaged(k)}


def _check_accuracy(run: ServingRun, regrade: bool, result: VerifyResult) -> None:
    """`accuracy` (records recounted under the run's spec: k samples per problem, interval, pass
    probability at the gate, the gate rule; verify_accuracy.py), `accuracy cross-grade` (its counts
    recounted) and `accuracy grades` (every answer re-graded)."""
    acc_sum = run.summary.get("accuracy", {}) or {}
    problems = accuracy_problems(run.path, run.plan.get("accuracy"), acc_sum)
    result.add("accuracy", problems, f"{len(acc_sum)} arm(s)' accuracy recounted from records.jsonl")
    crossed = cross_grade_problems(run.path, acc_sum)
    if crossed is None:
        result.not_applicable("accuracy cross-grade", "no cross-grade recorded (a run from before the trial ran one)")
    else:
        result.add("accuracy cross-grade", crossed, "each arm's cross-grade recounted from records.jsonl")
    if regrade:
        result.add("accuracy grades", evidence.regrade_problems(run.path, acc_sum), "every stored answer re-graded")
    else:
        result.not_applicable("accuracy grades", "not re-graded (--no-regrade): the stored correct flags are trusted")


def _check_launches(run: ServingRun, result: VerifyResult) -> list[dict[str, Any]]:
    """`launch order`, `launch nonces`, `bench client`, `served ledger` and `pins` from launches.jsonl;
    returns its rows."""
    problems: list[str] = []
    launches = _read_jsonl(run.path / "launches.jsonl", problems)
    finished = run.prov.get("status") == "finished"
    problems += evidence.launch_order_problems(run.protocol, finished, run.plan.get("launches"), launches)
    result.add("launch order", problems, f"{len(launches)} launches in the order the seed gives")
    result.add(
        "launch nonces",
        evidence.nonce_problems(run.plan, launches, run.rows),
        "each run's client named its launch's nonce",
    )
    result.add("bench client", evidence.client_problems(run.plan, run.rows), "every run's client as the plan says")
    if (served := served_problems(run.path, run.plan, launches, run.rows)) is None:
        result.not_applicable(
            "served ledger", "not applicable: the plan keeps no ledger (before issue 36, or no nonce)"
        )
    else:
        result.add("served ledger", served, "every run's answers are in its server's own ledger")
    result.add(
        "pins",
        evidence.pins_problems(run.protocol, run.plan, launches, run.summary, run.prov),
        "the launches ran the pinned versions",
    )
    return launches


def _check_floor(run: ServingRun, result: VerifyResult) -> None:
    """An accepted run's runner is no older than the records its acceptance rests on."""
    acceptance = run.summary.get("acceptance")
    if not (isinstance(acceptance, dict) and acceptance.get("accepted")):
        result.not_applicable("acceptance runner", "not applicable: the run accepts nothing")
    elif (found := floor_problems(run.prov)) is None:
        result.not_applicable(
            "acceptance runner",
            "this checkout's history lacks the acceptance floor (no git, or a shallow clone): a run naming an "
            "older commit than the records need would pass",
        )
    else:
        result.add("acceptance runner", *found)


def _acceptance_problems(run: ServingRun, recomputed: Launches, dispatch_valid: dict[str, bool | None]) -> list[str]:
    """serving/acceptance.py's rule (protocol.toml's, not plan.json's word), on the per-launch figures
    recomputed above."""
    plan, acc_rule, proto = run.plan, run.summary.get("acceptance"), run.protocol.proto
    names = {arm["role"]: arm["name"] for arm in plan["arms"]}
    if not acc_rule:
        return ["summary has no acceptance block although the protocol has baseline and candidate"]
    if proto is None:
        return [f"protocol.toml does not parse, so the acceptance rule cannot be derived: {run.protocol.error}"]
    rule = Rule(proto.acceptance.noise_band, proto.acceptance.ttft_ratio_max, proto.acceptance.confidence)
    round_of = {int(L["launch"]): int(L["round"]) for L in plan.get("launches", [])}

    def figures(arm: str, case: str) -> list[LaunchFigure] | None:
        got = recomputed.get((arm, case))
        if got is None:
            return None
        return [LaunchFigure(round_of[L], f["total_token_throughput"], f["mean_ttft_ms"]) for L, f in got]

    base, cand = names["baseline"], names["candidate"]
    cases = [compare_case(c["case"], figures(cand, c["case"]), figures(base, c["case"]), rule) for c in plan["cases"]]
    gates = [GateCheck(dispatch_valid.get(names[role]) is not False, role) for role in ("baseline", "candidate")]
    if plan.get("accuracy") is not None:
        gates.append(GateCheck(bool((run.summary.get("accuracy", {}) or {}).get(cand, {}).get("passed")), "accuracy"))
    v = judge(cand, base, cases, gates, rule)
    problems = [
        f"acceptance {c.case}: {key} {acc_rule.get('cases', {}).get(c.case, {}).get(key)}, recomputed {want}"
        for c in cases
        for key, want in case_record(c).items()
        if not _close(acc_rule.get("cases", {}).get(c.case, {}).get(key), want)
    ]
    if bool(acc_rule.get("accepted")) != v.accepted or acc_rule.get("verdict", v.verdict) != v.verdict:
        problems.append(
            f"acceptance verdict {acc_rule.get('verdict', acc_rule.get('accepted'))}, recomputed {v.verdict}"
        )
    return problems
