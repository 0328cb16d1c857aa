"""Independent verification of a run directory: rebuild every figure from the raw rows.

This module deliberately does NOT import `analysis.stats` or `analysis.summary`: it reads
the files with the csv/json modules and recomputes each figure with its own code (own
median, own quantile interpolation), following only the contract in docs/DESIGN.md. The
one thing shared by necessity is numpy's generator, because the contract defines the
bootstrap resamples as `numpy.random.default_rng(seed).integers(0, n, size=(resamples, n))`.

Checks: protocol hash in provenance/plan/summary; plan.json against protocol.toml (arms,
case ids, seeds, rounds, tie band, gate, bootstrap, L2 and the noise settings plan.json
carries); one timing row per expected
(case, seed, round, arm) and nothing else, with each case's own rounds (which only the
preregistered noise rule may raise above plan `rounds`); correctness coverage and
consistency; within each (case, seed, round) unit, positions 0..k-1 for the k timed arms,
and, when plan.json has `order_seed`, the seeded order itself; every figure in summary.json
(floats to a relative 1e-9), including the clock counts, run-to-run spreads, calibration
figures (realized slowdown of `slow:` arms too) and the warnings those must raise.
A schema-1 summary (written before clocks, per-case rounds and calibration arms existed) is
accepted without those figures only when the raw files have none of those fields either; a
schema-2 summary is accepted without the realized-slowdown figures of `slow:` arms.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.analysis.errors import RunDirError

REL_TOL = 1e-9
BASE_FIGURE_FIELDS = ("median_ns_per_call", "n_samples", "ci_units", "speedup", "ci_low", "ci_high",
                      "verdict", "gbps", "pct_of_copy_ceiling")
FIGURE_FIELDS = (*BASE_FIGURE_FIELDS, "throttled_samples", "spread")
LEGACY_SCHEMA = "kerneltrial.summary/1"
SCHEMA_2 = "kerneltrial.summary/2"  # before the realized slowdown of slow: arms
SCHEMA = "kerneltrial.summary/3"
NOMINAL_FACTOR = 1.5  # power at nominal: cases whose realized slowdown <= this x injected_slowdown
CLOCK_FIELDS = ("max_sm_mhz", "throttle_fraction", "threshold_mhz", "samples_with_clock", "throttled_samples")
CALIBRATION_DEFAULTS = {"injected_slowdown": 0.03, "max_false_positive_rate": 0.05, "min_power": 0.9}
# protocol.toml keys that plan.json copies, with the protocol's defaults
PROTOCOL_DEFAULTS = {"control": "control", "seeds": [0, 1, 2], "rounds": 7, "tie_band": 0.02, "gate": "no_loss",
                     "bootstrap_resamples": 2000, "bootstrap_seed": 20261129, "confidence": 0.95, "l2": "cold",
                     "layout": "contiguous", "dtype": "bfloat16", "throttle_fraction": 0.9, "target_ci_width": None,
                     "max_rounds": 50, "time_budget_s": 600.0, **CALIBRATION_DEFAULTS}
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
    sm_mhz: float | None = None  # None: no clock reading (column absent or empty)


def _mhz(text: str | None) -> float | None:
    return None if text is None or text.strip() == "" else float(text)


def _samples(run_dir: Path) -> list[Sample]:
    rows = _read_csv_rows(run_dir, "timings.csv", ["case", "seed", "round", "position", "arm", "calls", "ns"])
    try:
        return [Sample(r["case"], int(r["seed"]), int(r["round"]), int(r["position"]), r["arm"],
                       int(r["calls"]), float(r["ns"]), _mhz(r.get("sm_mhz"))) for r in rows]
    except (TypeError, ValueError) as error:
        raise RunDirError(f"{run_dir / 'timings.csv'}: unparsable row ({error})") from error


def _as_list(value: Any) -> list[int]:
    """plan `seeds`/`rounds`: a list of values, or a count meaning 0..count-1."""
    return [int(v) for v in value] if isinstance(value, list) else list(range(int(value)))


def _rounds_of(plan: dict[str, Any], case: dict[str, Any]) -> list[int]:
    """Rounds of one case: its own `rounds` count when plan.json has one, else plan `rounds`."""
    return _as_list(case["rounds"] if case.get("rounds") is not None else plan["rounds"])


def _threshold(plan: dict[str, Any]) -> tuple[Any, float, float | None]:
    """(max_sm_mhz, throttle_fraction, threshold MHz or None) from plan `clocks`."""
    clocks = plan.get("clocks") or {}
    top, fraction = clocks.get("max_sm_mhz"), float(clocks.get("throttle_fraction", 0.9))
    return top, fraction, (None if top is None else fraction * float(top))


def _throttled(sample: Sample, threshold: float | None) -> bool:
    return threshold is not None and sample.sm_mhz is not None and sample.sm_mhz < threshold


def _calibration_arm(name: str) -> tuple[str, str] | None:
    kind, sep, base = name.partition(":")
    return (kind, base) if kind in ("aa", "slow") and sep else None


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


def _quantile(sorted_values: np.ndarray | list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method), written out."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo]))


def _spread(values: list[float]) -> float:
    """(p10 .. p90 range) / median, quantiles by linear interpolation between closest ranks."""
    ordered = sorted(values)
    return (_quantile(ordered, 0.9) - _quantile(ordered, 0.1)) / _median(ordered)


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
    _check_protocol(run_dir, plan, result)
    outcome = _correctness_outcome(plan, correctness, result)
    _check_rows(plan, samples, outcome, result)
    _check_order(plan, samples, outcome, result)
    legacy = _check_schema(plan, summary, samples, result)
    realized = summary.get("schema") not in (LEGACY_SCHEMA, SCHEMA_2)
    _check_figures(plan, summary, samples, outcome, ceiling_rows, result, legacy, realized)
    return result


def _check_protocol(run_dir: Path, plan: dict[str, Any], result: VerifyResult) -> None:
    """plan.json says what protocol.toml says: the run ran the preregistered trial."""
    try:
        protocol = {**PROTOCOL_DEFAULTS, **tomllib.loads((run_dir / "protocol.toml").read_text())}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        result.add("plan matches protocol", [f"protocol.toml is not valid TOML ({error})"], "")
        return
    cases = [f"{'x'.join(str(n) for n in c.get('shape', []))}/{c.get('layout', PROTOCOL_DEFAULTS['layout'])}/"
             f"{c.get('dtype', PROTOCOL_DEFAULTS['dtype'])}" for c in protocol.get("cases", [])]
    bootstrap = plan.get("bootstrap") or {}
    # (field, value in plan.json, value the protocol implies)
    pairs = [
        ("arms", [a.get("name") for a in plan.get("arms", [])], [protocol["control"], *protocol.get("candidates", [])]),
        ("cases", [str(c.get("case")) for c in plan.get("cases", [])], cases),
        ("seeds", plan.get("seeds"), protocol["seeds"]),
        ("rounds", plan.get("rounds"), protocol["rounds"]),
        ("tie_band", plan.get("tie_band"), protocol["tie_band"]),
        ("gate", plan.get("gate"), protocol["gate"]),
        ("bootstrap.resamples", bootstrap.get("resamples"), protocol["bootstrap_resamples"]),
        ("bootstrap.seed", bootstrap.get("seed"), protocol["bootstrap_seed"]),
        ("bootstrap.confidence", bootstrap.get("confidence"), protocol["confidence"]),
        ("l2", plan.get("l2"), protocol["l2"]),
    ]
    if "op" in plan and "op" in protocol:
        pairs.append(("op", plan["op"], protocol["op"]))
    if "order_seed" in plan:
        pairs.append(("order_seed", plan["order_seed"], protocol.get("order_seed", 0)))
    # the noise settings are optional in plan.json (older runs); compared where present
    for section, keys in (("clocks", ("throttle_fraction",)),
                          ("noise_rule", ("target_ci_width", "max_rounds", "time_budget_s")),
                          ("calibration", tuple(CALIBRATION_DEFAULTS))):
        recorded = plan.get(section)
        if isinstance(recorded, dict):
            pairs += [(f"{section}.{key}", recorded[key], protocol[key]) for key in keys if key in recorded]
    problems = [f"{name}: plan.json has {planned!r}, protocol.toml says {declared!r}"
                for name, planned, declared in pairs if not _same_value(planned, declared)]
    result.add("plan matches protocol", problems,
               f"arms, {len(cases)} case ids, seeds, rounds, tie band, gate, bootstrap and L2 as protocol.toml says")


def _same_value(a: Any, b: Any) -> bool:
    """Equal, with ints and floats compared by value (a TOML 600 and a JSON 600.0 agree); bools stay bools."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _check_order(plan: dict[str, Any], samples: list[Sample], outcome: dict[tuple[str, str], str],
                 result: VerifyResult) -> None:
    """Interleaving evidence: in each (case, seed, round) unit the timed arms hold positions 0..k-1,
    and, with plan `order_seed`, exactly the order its seeded generator gives."""
    arm_order = [a["name"] for a in plan["arms"]]
    case_index = {str(c["case"]): i for i, c in enumerate(plan["cases"])}
    timed = {case: [arm for arm in arm_order if outcome.get((case, arm)) == "passed"] for case in case_index}
    units: dict[tuple[str, int, int], list[Sample]] = {}
    for s in samples:
        units.setdefault((s.case, s.seed, s.round), []).append(s)
    order_seed = plan.get("order_seed")
    bad_positions, bad_order = [], []
    for (case, seed, rnd), rows in sorted(units.items()):
        arms = timed.get(case, [])
        if sorted(s.position for s in rows) != list(range(len(arms))):
            bad_positions.append(f"({case}, {seed}, {rnd}) positions {sorted(s.position for s in rows)} for "
                                 f"{len(arms)} timed arm(s)")
            continue
        if order_seed is None or sorted(s.arm for s in rows) != sorted(arms):
            continue  # an incomplete unit already fails the timing-rows check
        permutation = np.random.default_rng([int(order_seed), case_index[case], seed, rnd]).permutation(len(arms))
        expected = {arms[i]: position for position, i in enumerate(permutation)}
        wrong = [f"{s.arm} at {s.position}, seeded order puts it at {expected[s.arm]}"
                 for s in rows if expected[s.arm] != s.position]
        if wrong:
            bad_order.append(f"({case}, {seed}, {rnd}): " + ", ".join(wrong))
    problems = ([f"{len(bad_positions)} unit(s) whose positions are not 0..k-1, e.g. {bad_positions[:3]}"]
                if bad_positions else [])
    if bad_order:
        problems.append(f"{len(bad_order)} unit(s) not in the order of order_seed {order_seed}, e.g. {bad_order[:3]}")
    result.add("interleaving order", problems,
               f"{len(units)} (case, seed, round) units, positions 0..k-1"
               + ("" if order_seed is None else f", each in the seeded order of order_seed {order_seed}"))


def _check_schema(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], result: VerifyResult) -> bool:
    """True for a schema-1 summary, which is accepted only for raw files without the newer fields."""
    schema = summary.get("schema")
    if schema != LEGACY_SCHEMA:
        result.add("summary schema", [] if schema in (SCHEMA, SCHEMA_2) else
                   [f"summary schema {schema!r} is not {SCHEMA} (or /2, /1)"], f"{schema}")
        return False
    newer = []
    if any(s.sm_mhz is not None for s in samples):
        newer.append("timings.csv has sm_mhz readings")
    if any(c.get("rounds") is not None and len(_rounds_of(plan, c)) != len(_as_list(plan["rounds"]))
           for c in plan["cases"]):
        newer.append("plan.json cases have their own rounds")
    if any(_calibration_arm(a["name"]) for a in plan["arms"]):
        newer.append("plan.json has aa:/slow: calibration arms")
    result.add("summary schema", [f"{LEGACY_SCHEMA} summary lacks the figures for raw data it must cover: "
                                  + "; ".join(newer)] if newer else [],
               f"{LEGACY_SCHEMA}: no clock, per-case rounds or calibration data to check")
    return True


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
    rounds = {str(c["case"]): _rounds_of(plan, c) for c in plan["cases"]}
    expected = {(case, seed, rnd, arm)
                for (case, arm), state in outcome.items() if state == "passed"
                for seed in _as_list(plan["seeds"]) for rnd in rounds[case]}
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
    result.add("rounds per case", _rounds_problems(plan),
               "rounds per case: " + ", ".join(f"{case} {len(r)}" for case, r in rounds.items()))

    failed_but_timed = sorted({(s.case, s.arm) for s in samples if outcome.get((s.case, s.arm)) == "failed"})
    result.add("correctness consistency",
               [f"arm {arm} failed correctness in case {case} but has timing rows" for case, arm in failed_but_timed],
               "no arm is timed in a case where it failed correctness")


def _rounds_problems(plan: dict[str, Any]) -> list[str]:
    """A case may run more rounds than planned only under the preregistered noise rule, up to max_rounds."""
    planned = len(_as_list(plan["rounds"]))
    rule = plan.get("noise_rule") or {}
    problems = []
    for case in plan["cases"]:
        n = len(_rounds_of(plan, case))
        if n < planned:
            problems.append(f"case {case['case']}: {n} rounds, fewer than the planned {planned}")
        elif n > planned and rule.get("target_ci_width") is None:
            problems.append(f"case {case['case']}: {n} rounds but {planned} planned and no noise rule "
                            "(noise_rule.target_ci_width) allows extra rounds")
        elif n > planned and rule.get("max_rounds") is not None and n > int(rule["max_rounds"]):
            problems.append(f"case {case['case']}: {n} rounds exceed the noise rule's max_rounds {rule['max_rounds']}")
    return problems


def _check_figures(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample],
                   outcome: dict[tuple[str, str], str], ceiling_rows: list[dict[str, str]],
                   result: VerifyResult, legacy: bool = False, realized: bool = True) -> None:
    band = float(plan["tie_band"])
    bootstrap = plan["bootstrap"]
    control = next((a["name"] for a in plan["arms"] if a["kind"] == "control"), None)
    header = {"backend": plan["backend"], "is_gpu": plan["is_gpu"], "control": control}
    result.add("run header", _diff("summary", summary, header, ("backend", "is_gpu", "control"))
               + ([] if plan["is_gpu"] or "NOT GPU" in str(summary.get("label")) else
                  [f"label {summary.get('label')!r} does not say NOT GPU for a non-GPU run"]),
               f"backend {plan['backend']}, is_gpu {plan['is_gpu']}, control {control}")

    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    throttled: dict[tuple[str, str], int] = {}
    _, _, threshold = _threshold(plan)
    for s in samples:
        per_unit.setdefault((s.case, s.arm), {})[(s.seed, s.round)] = s.ns / s.calls
        throttled[(s.case, s.arm)] = throttled.get((s.case, s.arm), 0) + _throttled(s, threshold)
    if not legacy:
        _check_clocks(plan, summary, samples, result)
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
    intervals: dict[str, list[tuple[float, float]]] = {}
    failures: dict[str, int] = {}
    fields = BASE_FIGURE_FIELDS if legacy else FIGURE_FIELDS
    medians: dict[tuple[str, str], float | None] = {}
    spread_warnings: list[str] = []
    for case in plan["cases"]:
        case_id = str(case["case"])
        recorded = recorded_cases.get(case_id, {}).get("arms", {})
        if not legacy:
            n_rounds = len(_rounds_of(plan, case))
            result.add(f"case header case={case_id}", _diff(
                f"case {case_id}", recorded_cases.get(case_id, {}),
                {"rounds": n_rounds, "units_planned": n_rounds * len(_as_list(plan["seeds"])),
                 "injected_delay_ns": case.get("injected_delay_ns")}, ("rounds", "units_planned", "injected_delay_ns")),
                f"{n_rounds} rounds")
        control_times = per_unit.get((case_id, control)) if outcome.get((case_id, control)) == "passed" else None
        for arm in plan["arms"]:
            name = arm["name"]
            state = outcome.get((case_id, name), "unavailable")
            failures[name] = failures.get(name, 0) + (state == "failed")
            times = per_unit.get((case_id, name)) if state == "passed" else None
            figures = _arm_figures(case, times, control_times if name != control else None, copy, bootstrap, band)
            figures["throttled_samples"] = throttled.get((case_id, name), 0) if times else 0
            figures["spread"] = _spread(list(times.values())) if times else None
            medians[(case_id, name)] = figures["median_ns_per_call"]
            if figures["speedup"] is not None:
                speedups.setdefault(name, []).append((case_id, figures["speedup"], figures["verdict"]))
                intervals.setdefault(name, []).append((figures["ci_low"], figures["ci_high"]))
            if name == control and figures["spread"] is not None and figures["spread"] > band:
                spread_warnings.append(f"case {case_id}: control run-to-run spread {100 * figures['spread']:.1f}% "
                                       f"exceeds the tie band {100 * band:g}%")
            status = STATUS_OF[state] if times or state != "passed" else "not timed"
            result.add(f"figures case={case_id} arm={name}",
                       _entry_problems(f"case {case_id} arm {name}", recorded.get(name, {}), figures, status, fields),
                       _describe(figures, status))

    if not legacy:
        missing = [w for w in spread_warnings if w not in summary.get("warnings", [])]
        result.add("spread warnings", [f"summary warnings lack {w!r}" for w in missing],
                   f"{len(spread_warnings)} case(s) with control spread above the tie band, each warned")
        _check_calibration(plan, summary, control, speedups, intervals, medians if realized else None, result)
    _check_aggregates(plan, summary, control, speedups, failures, bootstrap, result)


def _check_clocks(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], result: VerifyResult) -> None:
    top, fraction, threshold = _threshold(plan)
    flagged = sum(_throttled(s, threshold) for s in samples)
    figures = {"max_sm_mhz": top, "throttle_fraction": fraction, "threshold_mhz": threshold,
               "samples_with_clock": sum(s.sm_mhz is not None for s in samples), "throttled_samples": flagged}
    problems = _diff("clocks", summary.get("clocks") or {}, figures, CLOCK_FIELDS)
    if flagged and not any(w.startswith(f"{flagged} of {len(samples)} timing samples were throttled")
                           and f"{threshold:g} MHz" in w for w in summary.get("warnings", [])):
        problems.append(f"summary warnings do not say {flagged} of {len(samples)} samples were throttled "
                        f"below {threshold:g} MHz")
    result.add("clocks", problems, f"{figures['samples_with_clock']} samples with a clock reading, {flagged} "
               f"throttled (threshold {threshold} MHz)")


def _check_calibration(plan: dict[str, Any], summary: dict[str, Any], control: str | None,
                       speedups: dict[str, list[tuple[str, float, str]]],
                       intervals: dict[str, list[tuple[float, float]]],
                       medians: dict[tuple[str, str], float | None] | None, result: VerifyResult) -> None:
    """Calibration figures; `medians` None for a schema-2 summary, written before the realized slowdown."""
    arms = [(a["name"], _calibration_arm(a["name"])) for a in plan["arms"]]
    arms = [(name, parsed) for name, parsed in arms if parsed]
    recorded = summary.get("calibration")
    if not arms:
        result.add("calibration", [] if recorded is None else ["summary has a calibration section but plan.json "
                                                               "has no aa:/slow: arm"], "no calibration arms")
        return
    if not isinstance(recorded, dict):
        result.add("calibration", ["summary has no calibration section for the aa:/slow: arms"], "")
        return
    settings = {**CALIBRATION_DEFAULTS, **(plan.get("calibration") or {})}
    max_fpr, min_power = float(settings["max_false_positive_rate"]), float(settings["min_power"])
    nominal = float(settings["injected_slowdown"])
    problems = _diff("calibration", recorded, {"injected_slowdown": float(settings["injected_slowdown"]),
                                               "max_false_positive_rate": max_fpr, "min_power": min_power},
                     ("injected_slowdown", "max_false_positive_rate", "min_power"))
    passed = True
    recorded_arms = recorded.get("arms") or {}
    for name, (kind, base) in arms:
        verdicts = [v for _, _, v in speedups.get(name, [])]
        n = len(verdicts)
        if kind == "aa":
            not_tie = sum(v != "tie" for v in verdicts)
            widths = [high - low for low, high in intervals.get(name, [])]
            figures = {"kind": kind, "base": base, "n_cases": n, "not_tie": not_tie,
                       "false_positive_rate": not_tie / n if n else None,
                       "mean_ci_width": math.fsum(widths) / n if n else None}
            passed = passed and n > 0 and figures["false_positive_rate"] <= max_fpr
        else:
            losses = verdicts.count("loss")
            figures = {"kind": kind, "base": base, "n_cases": n, "losses": losses, "power": losses / n if n else None}
            passed = passed and n > 0 and figures["power"] >= min_power
            if medians is not None:
                problems += _realized_problems(name, speedups.get(name, []), base, medians, nominal,
                                               recorded_arms.get(name) or {}, str(recorded.get("sentence", "")),
                                               summary.get("warnings", []))
        problems += _diff(f"calibration {name}", recorded_arms.get(name) or {}, figures, tuple(figures))
    extra = sorted(set(recorded_arms) - {name for name, _ in arms})
    if extra:
        problems.append(f"calibration lists arms that are not aa:/slow: arms of plan.json: {extra}")
    if recorded.get("passed") is not passed:
        problems.append(f"calibration passed: summary {recorded.get('passed')!r} != recomputed {passed}")
    word = "passed" if passed else "FAILED"
    if not str(recorded.get("sentence", "")).startswith(f"Calibration {word}"):
        problems.append(f"calibration sentence {recorded.get('sentence')!r} does not start 'Calibration {word}'")
    result.add("calibration", problems, f"calibration {word}: " + ", ".join(name for name, _ in arms))


def _realized_problems(name: str, rows: list[tuple[str, float, str]], base: str,
                       medians: dict[tuple[str, str], float | None], nominal: float, recorded: dict[str, Any],
                       sentence: str, warnings: list[str]) -> list[str]:
    """Realized slowdown of a slowed arm per compared case, its range, power at nominal, and the warning."""
    realized: dict[str, float] = {}
    near: list[str] = []
    for case, _, verdict in rows:
        arm_median, base_median = medians.get((case, name)), medians.get((case, base))
        if arm_median is None or base_median is None:
            continue
        realized[case] = arm_median / base_median - 1
        if realized[case] <= NOMINAL_FACTOR * nominal:
            near.append(verdict)
    low = min(realized.values()) if realized else None
    high = max(realized.values()) if realized else None
    figures = {"realized_min": low, "realized_max": high,
               "power_at_nominal": near.count("loss") / len(near) if near else None}
    problems = _diff(f"calibration {name}", recorded, figures, tuple(figures))
    shown = recorded.get("realized_slowdown")
    if not isinstance(shown, dict) or list(shown) != list(realized) or \
            not all(_same(shown[case], value) for case, value in realized.items()):
        problems.append(f"calibration {name} realized_slowdown: summary {shown!r} != recomputed {realized!r}")
    sentence_part = f"{name} ({100 * nominal:g}% nominal, " + (
        "n/a" if low is None else f"{100 * low:.1f}-{100 * high:.1f}%") + " realized)"
    power_part = "power at nominal " + ("n/a" if figures["power_at_nominal"] is None
                                        else f"{100 * figures['power_at_nominal']:.0f}%")
    missing = [part for part in (sentence_part, power_part) if part not in sentence]
    if missing:
        problems.append(f"calibration sentence {sentence!r} does not state {missing}")
    if low is not None and low > NOMINAL_FACTOR * nominal and not any(
            w.startswith(f"calibration arm {name}: the injected slowdown was never as small as nominal")
            and w.endswith("power at nominal is not demonstrated") for w in warnings):
        problems.append(f"summary warnings do not say that {name}'s injected slowdown was never as small as "
                        f"nominal (realized at least {100 * low:.1f}%, nominal {100 * nominal:g}%)")
    return problems


def _entry_problems(where: str, entry: dict[str, Any], figures: dict[str, Any], status: str,
                    fields: tuple[str, ...] = FIGURE_FIELDS) -> list[str]:
    problems = _diff(where, entry, figures, fields)
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
    figures.update(n_samples=0, throttled_samples=0)
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
