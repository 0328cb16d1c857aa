"""Independent verification of a run directory: rebuild every figure from the raw rows.

This module deliberately does NOT import `analysis.stats` or `analysis.summary`: it reads
the files with the csv/json modules and recomputes each figure with its own code (own
median, own quantile interpolation), following only the contract in docs/DESIGN.md. The
one thing shared by necessity is numpy's generator, because the contract defines the
bootstrap resamples as `numpy.random.default_rng(seed).integers(0, n, size=(resamples, n))`.

Checks: protocol hash in provenance/plan/summary; one timing row per expected
(case, seed, round, arm) and nothing else; correctness coverage and consistency; every
figure in summary.json (floats to a relative 1e-9).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.analysis.errors import RunDirError

REL_TOL = 1e-9
FIGURE_FIELDS = ("median_ns_per_call", "n_samples", "ci_units", "speedup", "ci_low", "ci_high",
                 "verdict", "gbps", "pct_of_copy_ceiling")
# correctness outcome of a (case, arm) -> its status in summary.json ("passed" without rows is "not timed")
STATUS_OF = {"passed": "timed", "failed": "failed correctness", "unchecked": "not timed", "unavailable": "unavailable"}
INPUT_FILES = ("plan.json", "correctness.jsonl", "timings.csv", "ceilings.csv")
AGGREGATE_FIELDS = ("n_cases", "geomean", "geomean_ci_low", "geomean_ci_high", "mean", "worst",
                    "worst_case", "wins", "ties", "losses", "failed_correctness")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class VerifyResult:
    run_dir: Path
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def add(self, name: str, problems: list[str], ok_detail: str) -> None:
        """Record a check that passed when `problems` is empty, else failed with them listed."""
        self.checks.append(Check(name, not problems, ok_detail if not problems else "; ".join(problems)))


# ---------------------------------------------------------------- reading

def _read_json(run_dir: Path, name: str) -> Any:
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir}: missing {name}; not a complete run directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RunDirError(f"{path}: not valid JSON ({error})") from error


def _read_csv_rows(run_dir: Path, name: str, header: list[str]) -> list[dict[str, str]]:
    path = run_dir / name
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not set(header) <= set(reader.fieldnames):
            raise RunDirError(f"{path}: header {reader.fieldnames} lacks {header}")
        return list(reader)


@dataclass(frozen=True)
class Sample:
    case: str
    seed: int
    round: int
    position: int
    arm: str
    calls: int
    ns: float


def _samples(run_dir: Path) -> list[Sample]:
    rows = _read_csv_rows(run_dir, "timings.csv", ["case", "seed", "round", "position", "arm", "calls", "ns"])
    try:
        return [Sample(r["case"], int(r["seed"]), int(r["round"]), int(r["position"]), r["arm"],
                       int(r["calls"]), float(r["ns"])) for r in rows]
    except (TypeError, ValueError) as error:
        raise RunDirError(f"{run_dir / 'timings.csv'}: unparsable row ({error})") from error


def _as_list(value: Any) -> list[int]:
    """plan `seeds`/`rounds`: a list of values, or a count meaning 0..count-1."""
    return [int(v) for v in value] if isinstance(value, list) else list(range(int(value)))


# ---------------------------------------------------------------- arithmetic (own implementations)

def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _row_medians(matrix: np.ndarray) -> np.ndarray:
    """Median of each row: sort the rows, take the middle (mean of the two middles when even)."""
    ordered = np.sort(matrix, axis=1)
    n = ordered.shape[1]
    mid = n // 2
    return ordered[:, mid] if n % 2 else (ordered[:, mid - 1] + ordered[:, mid]) / 2


def _quantile(sorted_values: np.ndarray, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method), written out."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo]))


def _percentile_ci(statistics: np.ndarray, confidence: float) -> tuple[float, float]:
    ordered = np.sort(statistics)
    return _quantile(ordered, (1 - confidence) / 2), _quantile(ordered, (1 + confidence) / 2)


@functools.lru_cache(maxsize=4)
def _resample_indices(seed: int, resamples: int, n: int) -> np.ndarray:
    """The contract's draw. A fresh generator per (case, arm) makes every draw of size n
    identical, so one cached, read-only copy serves them all."""
    indices = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    indices.flags.writeable = False
    return indices


def _verdict(low: float, high: float, band: float) -> str:
    return "win" if low > 1 + band else "loss" if high < 1 - band else "tie"


def _gate_terms(rule: str) -> tuple[bool, float | None]:
    """(no_loss, minimum geomean) of a gate rule; RunDirError on anything else."""
    no_loss, floor = False, None
    for term in (t.strip() for t in rule.split(" and ")):
        found = re.fullmatch(r"geomean>=(\d+(?:\.\d+)?)", term)
        if term == "no_loss" and not no_loss:
            no_loss = True
        elif found and floor is None:
            floor = float(found.group(1))
        else:
            raise RunDirError(f"plan.json gate {rule!r}: unknown or repeated term {term!r}")
    return no_loss, floor


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b))
    return a == b


def _diff(where: str, recorded: dict[str, Any], recomputed: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    return [f"{where} {key}: summary {recorded.get(key)!r} != recomputed {recomputed[key]!r}"
            for key in fields if not _same(recorded.get(key), recomputed[key])]


# ---------------------------------------------------------------- the checks

def verify_run_dir(run_dir: Path) -> VerifyResult:
    """Recompute every figure of a run directory and compare; see VerifyResult.checks."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    provenance = _read_json(run_dir, "provenance.json")
    kind = provenance.get("kind")
    if kind == "serving":
        return _verify_serving(run_dir)
    if kind != "kernel":
        raise RunDirError(f"{run_dir / 'provenance.json'}: kind {kind!r} is neither 'kernel' nor 'serving'")
    return _verify_kernel(run_dir, provenance)


def _verify_serving(run_dir: Path) -> VerifyResult:
    from kerneltrial.serving.verify import verify_serving_run

    result = VerifyResult(run_dir)
    problems = verify_serving_run(run_dir)
    result.add("serving run", list(problems), "every serving figure matches")
    return result


def _verify_kernel(run_dir: Path, provenance: dict[str, Any]) -> VerifyResult:
    missing = [name for name in ("protocol.toml", "summary.json", *INPUT_FILES) if not (run_dir / name).is_file()]
    if missing:
        raise RunDirError(f"{run_dir}: missing {', '.join(missing)}; not a complete kernel run directory")
    result = VerifyResult(run_dir)
    plan = _read_json(run_dir, "plan.json")
    summary = _read_json(run_dir, "summary.json")
    digest = hashlib.sha256((run_dir / "protocol.toml").read_bytes()).hexdigest()
    for name, document in (("provenance.json", provenance), ("plan.json", plan), ("summary.json", summary)):
        recorded = document.get("protocol_sha256")
        result.add(f"protocol hash in {name}",
                   [] if recorded == digest else [f"{name} says {recorded}, protocol.toml hashes to {digest}"],
                   f"sha256 {digest[:12]}... matches protocol.toml")
    result.add("raw files unchanged since summary", _changed_inputs(run_dir, summary.get("inputs_sha256", {})),
               f"{', '.join(INPUT_FILES)} hash as recorded in summary.json")

    samples = _samples(run_dir)
    correctness = [json.loads(line) for line in (run_dir / "correctness.jsonl").read_text().splitlines()
                   if line.strip()]
    ceiling_rows = _read_csv_rows(run_dir, "ceilings.csv", ["kind", "sample", "bytes", "ns"])
    outcome = _correctness_outcome(plan, correctness, result)
    _check_rows(plan, samples, outcome, result)
    _check_figures(plan, summary, samples, outcome, ceiling_rows, result)
    return result


def _changed_inputs(run_dir: Path, recorded: dict[str, str]) -> list[str]:
    problems = []
    for name in INPUT_FILES:
        digest = hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
        if digest != recorded.get(name):
            problems.append(f"{name} hashes to {digest[:12]}..., summary.json recorded {recorded.get(name)}")
    return problems


def _correctness_outcome(
    plan: dict[str, Any], rows: list[dict[str, Any]], result: VerifyResult
) -> dict[tuple[str, str], str]:
    """Per (case, available arm): 'passed', 'failed' or 'unchecked'; records the coverage check."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((str(row["case"]), row["arm"]), []).append(row)
    seeds = set(_as_list(plan["seeds"]))
    available = [a["name"] for a in plan["arms"] if a["available"]]
    case_ids = [str(c["case"]) for c in plan["cases"]]
    outcome: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    for case in case_ids:
        for arm in available:
            checks = by_key.get((case, arm), [])
            if not checks:
                outcome[(case, arm)] = "unchecked"
                problems.append(f"case {case} arm {arm}: no correctness check")
            elif all(c["passed"] is True for c in checks):
                outcome[(case, arm)] = "passed"
                missing = seeds - {int(c["seed"]) for c in checks}
                if missing:
                    problems.append(f"case {case} arm {arm}: no correctness check for seed(s) {sorted(missing)}")
            else:
                outcome[(case, arm)] = "failed"
    stray = sorted(set(by_key) - set(outcome))
    if stray:
        problems.append(f"correctness rows for unknown or unavailable (case, arm): {stray}")
    result.add("correctness coverage", problems,
               f"{len(rows)} checks; {sum(v == 'failed' for v in outcome.values())} (case, arm) failed")
    return outcome


def _check_rows(plan: dict[str, Any], samples: list[Sample], outcome: dict[tuple[str, str], str],
                result: VerifyResult) -> None:
    expected = {(case, seed, rnd, arm)
                for (case, arm), state in outcome.items() if state == "passed"
                for seed in _as_list(plan["seeds"]) for rnd in _as_list(plan["rounds"])}
    counts: dict[tuple[str, int, int, str], int] = {}
    for s in samples:
        counts[(s.case, s.seed, s.round, s.arm)] = counts.get((s.case, s.seed, s.round, s.arm), 0) + 1
    missing = sorted(expected - set(counts))
    unexpected = sorted(set(counts) - expected)
    duplicated = sorted(key for key, n in counts.items() if n > 1)
    problems = [f"{label} (case, seed, round, arm) rows: {len(keys)}, e.g. {keys[:3]}"
                for label, keys in (("missing", missing), ("unexpected", unexpected), ("duplicated", duplicated))
                if keys]
    calls = {str(c["case"]): int(c["calls"]) for c in plan["cases"]}
    wrong_calls = [s for s in samples if calls.get(s.case) is not None and s.calls != calls[s.case]]
    if wrong_calls:
        problems.append(f"{len(wrong_calls)} row(s) with calls different from plan, e.g. {wrong_calls[0]}")
    bad_ns = [s for s in samples if not (s.ns > 0 and math.isfinite(s.ns))]
    if bad_ns:
        problems.append(f"{len(bad_ns)} row(s) with non-positive or non-finite ns, e.g. {bad_ns[0]}")
    result.add("timing rows", problems, f"{len(samples)} rows, each expected (case, seed, round, arm) exactly once")

    failed_but_timed = sorted({(s.case, s.arm) for s in samples if outcome.get((s.case, s.arm)) == "failed"})
    result.add("correctness consistency",
               [f"arm {arm} failed correctness in case {case} but has timing rows" for case, arm in failed_but_timed],
               "no arm is timed in a case where it failed correctness")


def _check_figures(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample],
                   outcome: dict[tuple[str, str], str], ceiling_rows: list[dict[str, str]],
                   result: VerifyResult) -> None:
    band = float(plan["tie_band"])
    bootstrap = plan["bootstrap"]
    control = next((a["name"] for a in plan["arms"] if a["kind"] == "control"), None)
    header = {"backend": plan["backend"], "is_gpu": plan["is_gpu"], "control": control}
    result.add("run header", _diff("summary", summary, header, ("backend", "is_gpu", "control"))
               + ([] if plan["is_gpu"] or "NOT GPU" in str(summary.get("label")) else
                  [f"label {summary.get('label')!r} does not say NOT GPU for a non-GPU run"]),
               f"backend {plan['backend']}, is_gpu {plan['is_gpu']}, control {control}")

    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for s in samples:
        per_unit.setdefault((s.case, s.arm), {})[(s.seed, s.round)] = s.ns / s.calls
    copy = _ceiling_median(ceiling_rows, "copy")
    recorded_ceilings = summary.get("ceilings", {})
    result.add("ceilings", _diff("ceilings", recorded_ceilings,
                                 {"copy_gbps": copy, "read_gbps": _ceiling_median(ceiling_rows, "read")},
                                 ("copy_gbps", "read_gbps")),
               f"copy {copy} GB/s median")

    recorded_cases = {str(c.get("case")): c for c in summary.get("cases", [])}
    plan_cases = [str(c["case"]) for c in plan["cases"]]
    result.add("summary cases", [] if list(recorded_cases) == plan_cases else
               [f"summary cases {list(recorded_cases)} != plan cases {plan_cases}"], f"{len(plan_cases)} cases")

    speedups: dict[str, list[tuple[str, float, str]]] = {}
    failures: dict[str, int] = {}
    for case in plan["cases"]:
        case_id = str(case["case"])
        recorded = recorded_cases.get(case_id, {}).get("arms", {})
        control_times = per_unit.get((case_id, control)) if outcome.get((case_id, control)) == "passed" else None
        for arm in plan["arms"]:
            name = arm["name"]
            state = outcome.get((case_id, name), "unavailable")
            failures[name] = failures.get(name, 0) + (state == "failed")
            times = per_unit.get((case_id, name)) if state == "passed" else None
            figures = _arm_figures(case, times, control_times if name != control else None, copy, bootstrap, band)
            if figures["speedup"] is not None:
                speedups.setdefault(name, []).append((case_id, figures["speedup"], figures["verdict"]))
            status = STATUS_OF[state] if times or state != "passed" else "not timed"
            result.add(f"figures case={case_id} arm={name}",
                       _entry_problems(f"case {case_id} arm {name}", recorded.get(name, {}), figures, status),
                       _describe(figures, status))

    _check_aggregates(plan, summary, control, speedups, failures, bootstrap, result)


def _entry_problems(where: str, entry: dict[str, Any], figures: dict[str, Any], status: str) -> list[str]:
    problems = _diff(where, entry, figures, FIGURE_FIELDS)
    if entry.get("status") != status:
        problems.append(f"{where} status: summary {entry.get('status')!r} != {status!r}")
    return problems


def _describe(figures: dict[str, Any], status: str) -> str:
    if figures["speedup"] is not None:
        return (f"speedup {figures['speedup']:.4f} [{figures['ci_low']:.4f}, {figures['ci_high']:.4f}] "
                f"{figures['verdict']}")
    if figures["median_ns_per_call"] is not None:
        return f"{status}, median {figures['median_ns_per_call']:.1f} ns/call"
    return status


def _ceiling_median(rows: list[dict[str, str]], kind: str) -> float | None:
    rates = [float(r["bytes"]) / float(r["ns"]) for r in rows if r["kind"] == kind]
    return _median(rates) if rates else None


def _arm_figures(case: dict[str, Any], times: dict[tuple[int, int], float] | None,
                 control_times: dict[tuple[int, int], float] | None, copy: float | None,
                 bootstrap: dict[str, Any], band: float) -> dict[str, Any]:
    figures: dict[str, Any] = dict.fromkeys(FIGURE_FIELDS)
    figures["n_samples"] = 0
    if not times:
        return figures
    med = _median(list(times.values()))
    figures.update(median_ns_per_call=med, n_samples=len(times), gbps=float(case["bytes"]) / med)
    if copy is not None:
        figures["pct_of_copy_ceiling"] = 100.0 * figures["gbps"] / copy
    if control_times:
        units = sorted(set(times) & set(control_times))
        figures["ci_units"] = len(units)
        if units:
            figures["speedup"] = _median(list(control_times.values())) / med
            c = np.array([control_times[u] for u in units])
            a = np.array([times[u] for u in units])
            idx = _resample_indices(int(bootstrap["seed"]), int(bootstrap["resamples"]), len(units))
            low, high = _percentile_ci(_row_medians(c[idx]) / _row_medians(a[idx]), float(bootstrap["confidence"]))
            figures.update(ci_low=low, ci_high=high, verdict=_verdict(low, high, band))
    return figures


def _check_aggregates(plan: dict[str, Any], summary: dict[str, Any], control: str | None,
                      speedups: dict[str, list[tuple[str, float, str]]], failures: dict[str, int],
                      bootstrap: dict[str, Any], result: VerifyResult) -> None:
    no_loss, floor = _gate_terms(plan["gate"])
    compared = [a["name"] for a in plan["arms"] if a["available"] and a["name"] != control]
    recorded = summary.get("aggregates", {})
    recorded_gate = summary.get("gate", {}).get("arms", {})
    extra = sorted(set(recorded) - set(compared)) + sorted(set(recorded_gate) - set(compared))
    result.add("aggregate arms", [f"summary has aggregates/gate for arms not compared: {extra}"] if extra else [],
               f"compared arms {compared}")
    recomputed_passed: list[str] = []
    for name in compared:
        rows = speedups.get(name, [])
        figures = _aggregate(rows, failures.get(name, 0), bootstrap)
        problems = _diff(f"arm {name}", recorded.get(name, {}), figures, AGGREGATE_FIELDS)
        passed = (not failures.get(name, 0) and not (no_loss and figures["losses"])
                  and not (floor is not None and (figures["geomean"] is None or figures["geomean"] < floor)))
        if passed:
            recomputed_passed.append(name)
        recorded_passed = recorded_gate.get(name, {}).get("passed")
        if recorded_passed is not passed:
            problems.append(f"arm {name} gate: summary {recorded_passed!r} != recomputed {passed}")
        shown = f"geomean {figures['geomean']:.4f}" if figures["geomean"] is not None else "no speedups"
        counts = f"{figures['wins']}W/{figures['ties']}T/{figures['losses']}L"
        result.add(f"aggregates arm={name}", problems, f"{shown}, {counts}, gate {'pass' if passed else 'fail'}")
    gate = summary.get("gate", {})
    result.add("gate", [] if gate.get("passed_arms") == recomputed_passed and gate.get("rule") == plan["gate"] else
               [f"summary gate rule {gate.get('rule')!r}, passed_arms {gate.get('passed_arms')} != "
                f"recomputed rule {plan['gate']!r}, passed_arms {recomputed_passed}"],
               f"rule {plan['gate']!r}: passed {recomputed_passed}")


def _aggregate(rows: list[tuple[str, float, str]], failed: int, bootstrap: dict[str, Any]) -> dict[str, Any]:
    verdicts = [v for _, _, v in rows]
    figures: dict[str, Any] = dict.fromkeys(AGGREGATE_FIELDS)
    figures.update(n_cases=len(rows), wins=verdicts.count("win"), ties=verdicts.count("tie"),
                   losses=verdicts.count("loss"), failed_correctness=failed)
    if not rows:
        return figures
    values = [s for _, s, _ in rows]
    logs = np.log(np.array(values))
    idx = _resample_indices(int(bootstrap["seed"]), int(bootstrap["resamples"]), len(values))
    low, high = _percentile_ci(np.exp(logs[idx].sum(axis=1) / len(values)), float(bootstrap["confidence"]))
    worst_case, worst, _ = min(rows, key=lambda row: row[1])
    figures.update(geomean=math.exp(math.fsum(math.log(v) for v in values) / len(values)),
                   geomean_ci_low=low, geomean_ci_high=high, mean=math.fsum(values) / len(values),
                   worst=worst, worst_case=worst_case)
    return figures
