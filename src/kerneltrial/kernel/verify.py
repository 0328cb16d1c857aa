"""Independent verification of a run directory: rebuild every figure from the raw rows.

This module deliberately does NOT import `kerneltrial.stats` or `kernel.summary`: it reads
the files with the csv/json modules and recomputes each figure with its own code (own
median, own quantile interpolation), following only the contract in docs/VERIFY.md. The
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

A run whose plan.json has `"checks": 1` (issue 10: what is timed is what was checked) needs a
schema-4 summary and gets more checks: every timing sample has its timed check (an arm that
raised has none after), the seeded order over the arms still in each unit, the statuses
`failed while timed` and `implausible`, the `inconclusive` verdict, the new aggregates and gate
reasons, the ulp histograms, frozen_at, and the file integrity of kernel/integrity.py
(manifest, source archive, provenance, freeze). For older runs these checks are listed as not
applicable.

A run whose plan.json has `"checks": 3` (issue 24, isolated arms) needs a schema-6 summary and gets
the check `isolation bounds` (kernel/verify_isolation.py): plan `isolated` is what the protocol
names, every timing row of an isolated arm claims no more than the harness's wall bound beside it
(and no other row has one), the summary's bounds and far-inside warnings follow; isolated arms
have no host.csv rows.

A run whose plan.json has `host` (issue 16) needs a schema-5 summary: host.csv holds exactly
`host.samples` rows (samples 0..n-1, `host.calls` calls each) for every (case, arm) that passed
correctness and did not raise while timed, and nothing else; each arm entry's host_ns_per_call
(median of ns / calls), host_samples and host_behind are recomputed from them.

Any run whose ceilings.csv has `triton_launch` rows (the Triton launch floor, issue 16) gets the
check `triton launch floor`: each row has bytes 0, ns > 0 and its own sample number, and the
summary's ceilings triton_launch_floor_ns / triton_launch_samples are their median and count.
Runs without such rows (every run before it) list the check as not applicable, and their
summary must not claim a Triton floor.
Likewise `copy_matched` rows (a copy of each case's traffic) get the check `size-matched copies`:
well-formed rows, exactly one size per case's bytes (rounded down to even), and every case's
matched_copy_gbps their median GB/s.

A run whose plan.json has `floor` (issue 27) needs a schema-6 summary and gets the check
`speed-of-light floor`: plan.json names the model this code knows (rundir/layout.py
FLOOR_MODEL), every case's floor_ns is the median `triton_launch` ns + its bytes / the median
`copy` GB/s, and every arm's fraction_of_floor is that floor / its median ns per call, recomputed
from timings.csv. Older runs list the check as not applicable and must claim no floor figure.
Every kernel run also gets `required files` and `no downgrade` (kernel/schema_requirements.py:
the declared contract's files and keys are present, and no witness shows a later contract than
the one declared), `source commit` and `device` (kernel/provenance_checks.py), and `report.md`
and `ERRATA.md` (kernel/derived.py: the page is the rendering of the directory; the hand-written
errata's machine-read lines are well formed).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerneltrial.kernel import derived, integrity, links, provenance_checks, schema_requirements
from kerneltrial.kernel.verify_isolation import isolation_problems
from kerneltrial.rundir import streams
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import (
    ERRATA,
    FLOOR_MODEL,
    HOST,
    INPUT_FILES,
    MANIFEST,
    REPORT,
    SOURCE_ARCHIVE,
    TIMED_CHECKS,
    kind_of,
)

REL_TOL = 1e-9
BASE_FIGURE_FIELDS = (
    "median_ns_per_call",
    "n_samples",
    "ci_units",
    "speedup",
    "ci_low",
    "ci_high",
    "verdict",
    "gbps",
    "pct_of_copy_ceiling",
)
FIGURE_FIELDS = (*BASE_FIGURE_FIELDS, "throttled_samples", "spread")
LEGACY_SCHEMA = "kerneltrial.summary/1"
SCHEMA_2 = "kerneltrial.summary/2"  # before the realized slowdown of slow: arms
SCHEMA_3 = "kerneltrial.summary/3"  # before timed checks (plan.json without `checks`)
SCHEMA_4 = "kerneltrial.summary/4"  # plan.json `"checks": 1` or 2
SCHEMA_5 = "kerneltrial.summary/5"  # plan.json `"checks"` and `host` (host cost per call)
SCHEMA_6 = "kerneltrial.summary/6"  # and plan.json `floor` (the speed-of-light floor, issue 27)
SCHEMA_7 = "kerneltrial.summary/7"  # plan.json `"checks": 3` (isolated arms and the harness's bounds)
CPU_HOST_CALLS = 2  # host-cost calls per sample the runner uses at most without a GPU
HOST_FIELDS = ("host_ns_per_call", "host_samples", "host_behind")
CHECKS_EVERY_CALL = 2  # checks 2: fresh values before every call, a random call of each sample checked
CHECKS_ISOLATED = 3  # checks 3: as 2, and plan `isolated` arms whose timing rows carry the harness's bound
NOMINAL_FACTOR = 1.5  # power at nominal: cases whose realized slowdown <= this x injected_slowdown
CLOCK_FIELDS = ("max_sm_mhz", "throttle_fraction", "threshold_mhz", "samples_with_clock", "throttled_samples")
CALIBRATION_DEFAULTS = {"injected_slowdown": 0.03, "max_false_positive_rate": 0.05, "min_power": 0.9}
# plausibility defaults the runner writes into plan.json (docs/VERIFY.md, "Statistics"):
PLAUSIBILITY_DEFAULTS = {
    # the highest honest figure in the committed H200 runs is 104.2% of the copy ceiling
    # (results/archive/h200/silu_and_mul-s2, 65536x12288, liger): 15% above the best ceiling is not real work
    "bandwidth_margin": 0.15,
    # a stated convention: the fastest honest kernel in the committed runs (4.06 us,
    # results/archive/h200/sigmoid_gate_mul-r2, 1x2048) is far above half an empty launch
    "launch_floor_fraction": 0.5,
}
# protocol.toml keys that plan.json copies, with the protocol's defaults
PROTOCOL_DEFAULTS = {
    "control": "control",
    "seeds": [0, 1, 2],
    "rounds": 7,
    "tie_band": 0.02,
    "gate": "no_loss",
    "bootstrap_resamples": 2000,
    "bootstrap_seed": 20261129,
    "confidence": 0.95,
    "l2": "cold",
    "layout": "contiguous",
    "dtype": "bfloat16",
    "throttle_fraction": 0.9,
    "target_ci_width": None,
    "max_rounds": 50,
    "time_budget_s": 600.0,
    "exact": False,
    "host_samples": 5,
    "host_calls": 200,
    **CALIBRATION_DEFAULTS,
    **PLAUSIBILITY_DEFAULTS,
}
# correctness outcome of a (case, arm) -> its status in summary.json ("passed" without rows is "not timed")
STATUS_OF = {"passed": "timed", "failed": "failed correctness", "unchecked": "not timed", "unavailable": "unavailable"}
AGGREGATE_FIELDS = (
    "n_cases",
    "geomean",
    "geomean_ci_low",
    "geomean_ci_high",
    "mean",
    "worst",
    "worst_case",
    "wins",
    "ties",
    "losses",
    "failed_correctness",
)
CHECKED_AGGREGATE_FIELDS = (*AGGREGATE_FIELDS, "inconclusive", "failed_while_timed", "implausible", "ulp_hist")
FAILED_WHILE_TIMED, IMPLAUSIBLE = "failed while timed", "implausible"
NOT_COMPARED = "not compared with the control"  # timed, but the control has no timing in the case
RAISED = "raised while timed: "
# every failing timed check's message starts with one of these (the runner's contract)
TIMED_FAILURE_PREFIXES = (
    "wrong result while timed: ",
    "modified its inputs while timed: ",
    "wrote outside its output: ",
    "returns a persistent buffer: ",
    RAISED,
)
ULP_BINS = 6  # correctness.jsonl ulp_hist: elements at 0, (0,1], (1,2], (2,4], (4,16], >16 ulps
UNFROZEN_WARNING = "the protocol was not frozen before the run: its settings were not preregistered"
NO_LAUNCH_WARNING = "ceilings.csv has no launch samples; the launch-floor plausibility check was not applied"
TRITON_LAUNCH = "triton_launch"  # ceilings.csv kind of the Triton launch floor; optional
TRITON_FLOOR_FIELDS = ("triton_launch_floor_ns", "triton_launch_samples")
COPY_MATCHED = "copy_matched"  # ceilings.csv kind of a copy of one case's traffic; optional
PARTIAL_LAYOUT_KINDS = ("peer", "calibration")  # the only arm kinds plan.json may give `layouts`
# the checks only a run with timed checks has; listed as not applicable for older runs
CHECKED_RUN_CHECKS = (
    "plan contract fields",
    "timed checks",
    "dropped arms",
    "ulp histograms",
    "plausibility",
    "summary frozen_at",
    "manifest",
    "provenance",
    "source archive",
    "protocol freeze",
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    applicable: bool = True  # False: the check does not apply to this run (listed, never failed)


@dataclass(frozen=True)
class Contract:
    """What a summary schema covers. plan.json `checks` (1: schema 4) or else the summary's
    `schema` (1, 2 or 3) selects one; each later schema adds figures to check."""

    schema: str
    clocks: bool  # clock figures, spreads, per-case rounds, calibration, their warnings (schema 2 on)
    realized: bool  # realized slowdown of slow: arms (schema 3 on)
    checked: bool  # timed checks, plausibility, inconclusive, ulp histograms, file integrity (schema 4)
    host: bool = False  # host cost per call, host.csv (schema 5)
    floor: bool = False  # the speed-of-light floor per case and arm (schema 6)
    isolation: bool = False  # isolated arms, the harness's wall bounds (schema 7)

    def verdict(self, low: float, high: float, band: float) -> str:
        """win / loss outside the band; schema 4: tie only inside it, else inconclusive; before: tie."""
        if low > 1 + band:
            return "win"
        if high < 1 - band:
            return "loss"
        if not self.checked or (1 - band <= low and high <= 1 + band):
            return "tie"
        return "inconclusive"


CONTRACTS = {
    c.schema: c
    for c in (
        Contract(LEGACY_SCHEMA, clocks=False, realized=False, checked=False),
        Contract(SCHEMA_2, clocks=True, realized=False, checked=False),
        Contract(SCHEMA_3, clocks=True, realized=True, checked=False),
        Contract(SCHEMA_4, clocks=True, realized=True, checked=True),
        Contract(SCHEMA_5, clocks=True, realized=True, checked=True, host=True),
        Contract(SCHEMA_6, clocks=True, realized=True, checked=True, host=True, floor=True),
        Contract(SCHEMA_7, clocks=True, realized=True, checked=True, host=True, floor=True, isolation=True),
    )
}


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

    def not_applicable(self, name: str, why: str) -> None:
        self.checks.append(Check(name, True, why, applicable=False))

    def record(self, name: str, problems: list[str] | None, detail: str) -> None:
        """`add`, or, when `problems` is None, `not_applicable` with `detail` as the reason."""
        if problems is None:
            self.not_applicable(name, detail)
        else:
            self.add(name, problems, detail)


# ---------------------------------------------------------------- reading


def _read_json(run_dir: Path, name: str) -> Any:
    return read_json(run_dir / name)


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
        return [
            Sample(
                r["case"],
                int(r["seed"]),
                int(r["round"]),
                int(r["position"]),
                r["arm"],
                int(r["calls"]),
                float(r["ns"]),
                _mhz(r.get("sm_mhz")),
            )
            for r in rows
        ]
    except (TypeError, ValueError) as error:
        raise RunDirError(f"{run_dir / 'timings.csv'}: unparsable row ({error})") from error


@dataclass(frozen=True)
class TimedRow:
    """One row of timed_checks.jsonl (the fields verify checks)."""

    case: str
    seed: int
    round: int
    arm: str
    values_seed: int
    passed: bool
    message: str
    checked_call: Any = None  # checks 2: which call of the sample was checked

    @property
    def key(self) -> tuple[str, int, int, str]:
        return self.case, self.seed, self.round, self.arm

    @property
    def raised(self) -> bool:
        return self.message.startswith(RAISED)


def _timed_row(row: Any) -> TimedRow:
    """A timed_checks.jsonl row with every contract field of the right type; TypeError otherwise."""
    fields = {
        "case": str,
        "seed": int,
        "round": int,
        "arm": str,
        "values_seed": int,
        "passed": bool,
        "max_abs": (int, float),
        "max_rel": (int, float),
        "ulp": (int, float),
        "message": str,
    }
    if not isinstance(row, dict):
        raise TypeError(f"{row!r} is not an object")
    wrong = [
        name
        for name, kind in fields.items()
        if not isinstance(row.get(name), kind) or (kind is int and isinstance(row.get(name), bool))
    ]
    if wrong:
        raise TypeError(f"fields {wrong} missing or of the wrong type in {row!r}")
    return TimedRow(
        row["case"],
        row["seed"],
        row["round"],
        row["arm"],
        row["values_seed"],
        row["passed"],
        row["message"],
        row.get("checked_call"),
    )


def _read_timed_rows(run_dir: Path) -> tuple[list[TimedRow], list[str]]:
    """The rows of timed_checks.jsonl and the problems reading it (a missing file is one)."""
    path = run_dir / TIMED_CHECKS
    if not path.is_file():
        return [], [f"{TIMED_CHECKS} is missing: a run with timed checks writes one row per timing sample"]
    rows, problems = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(_timed_row(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as error:
                problems.append(f"{TIMED_CHECKS} line {number}: {error}")
    return rows, problems


@dataclass(frozen=True)
class TimedChecks:
    """The timed checks of a run and what follows from them."""

    rows: list[TimedRow]
    raised: dict[tuple[str, str], tuple[int, int]]  # (case, arm) -> the (seed, round) where it first raised

    def failures(self, case: str, arm: str) -> list[str]:
        """Messages of the (case, arm)'s failed timed checks, in file order."""
        return [r.message for r in self.rows if r.case == case and r.arm == arm and not r.passed]

    def raised_in(self) -> dict[tuple[str, int, int], list[str]]:
        """Arms that raised, by (case, seed, round) unit."""
        units: dict[tuple[str, int, int], list[str]] = {}
        for row in self.rows:
            if row.raised:
                units.setdefault((row.case, row.seed, row.round), []).append(row.arm)
        return units


def _unit_order(plan: dict[str, Any]) -> Callable[[int, int], tuple[int, int, int]]:
    """When a (seed, round) unit ran: the planned rounds seed by seed (plan `seeds` order), then
    each round the noise rule added, across the seeds (docs/VERIFY.md, "Timed checks"; the runner's loop)."""
    seeds, planned = _as_list(plan["seeds"]), len(_as_list(plan["rounds"]))

    def order(seed: int, rnd: int) -> tuple[int, int, int]:
        index = seeds.index(seed) if seed in seeds else len(seeds)
        return (0, index, rnd) if rnd < planned else (1, rnd, index)

    return order


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
    return [
        f"{where} {key}: summary {recorded.get(key)!r} != recomputed {recomputed[key]!r}"
        for key in fields
        if not _same(recorded.get(key), recomputed[key])
    ]


# ---------------------------------------------------------------- the checks


def verify_run_dir(run_dir: Path) -> VerifyResult:
    """Recompute every figure of a kernel run directory and compare; see VerifyResult.checks.
    Any other directory is its own package's (replicates/, suite/, fleet/, serving/, model/; the CLI
    picks by `rundir.layout.kind_of`)."""
    run_dir = Path(run_dir)
    kind = kind_of(run_dir)
    if kind != "kernel":
        raise RunDirError(f"{run_dir}: a {kind} run directory, not a kernel one; check it with `kerneltrial verify`")
    return _verify_kernel(run_dir, _read_json(run_dir, "provenance.json"))


def member_checks(name: str, run_dir: Path) -> list[Check]:
    """The kernel checks of one run of a replicate, suite or fleet directory, each prefixed with
    `name`; an unreadable run is one failed check (it does not stop the other runs' checks)."""
    try:
        checks = verify_run_dir(run_dir).checks
    except RunDirError as error:
        checks = [Check("run directory", False, str(error))]
    return [Check(f"{name}: {c.name}", c.ok, c.detail, c.applicable) for c in checks]


def kernel_page(run_dir: Path) -> derived.Render:
    """report.md of a kernel run as a function of `unverified` (kernel/report.py)."""

    def render(unverified: bool) -> str:
        from kerneltrial.kernel.report import report_text  # matplotlib: imported only where a report.md exists

        return report_text(run_dir, unverified)

    return render


def check_written_after(result: VerifyResult, run_dir: Path, page: Path, render: derived.Render) -> None:
    """The files written after the run (kernel/derived.py): `page` (report.md or replicates.md) is
    what its renderer gives, and ERRATA.md's machine-read lines are well formed; each not
    applicable where the directory has none."""
    checks = (
        (page.name, derived.derived_problems(page, render), "what `kerneltrial report` renders from this directory"),
        (ERRATA, derived.errata_problems(run_dir), "its `Superseded by:` and `Reason:` lines are well formed"),
    )
    for name, problems, detail in checks:
        result.record(
            name, problems, detail if problems is not None else f"not applicable: no {name} in this directory"
        )


def _verify_kernel(run_dir: Path, provenance: dict[str, Any]) -> VerifyResult:
    missing = [name for name in ("protocol.toml", "summary.json", *INPUT_FILES) if not (run_dir / name).is_file()]
    if missing:
        raise RunDirError(f"{run_dir}: missing {', '.join(missing)}; not a complete kernel run directory")
    result = VerifyResult(run_dir)
    plan = _read_json(run_dir, "plan.json")
    summary = _read_json(run_dir, "summary.json")
    digest = sha256_file(run_dir / "protocol.toml")
    for name, document in (("provenance.json", provenance), ("plan.json", plan), ("summary.json", summary)):
        recorded = document.get("protocol_sha256")
        result.add(
            f"protocol hash in {name}",
            [] if recorded == digest else [f"{name} says {recorded}, protocol.toml hashes to {digest}"],
            f"sha256 {digest[:12]}... matches protocol.toml",
        )

    samples = _samples(run_dir)
    correctness = read_jsonl(run_dir / "correctness.jsonl")
    ceiling_rows = _read_csv_rows(run_dir, "ceilings.csv", ["kind", "sample", "bytes", "ns"])
    contract = _check_schema(plan, summary, samples, result)
    inputs = (*INPUT_FILES, TIMED_CHECKS) if contract.checked else INPUT_FILES
    inputs = (*inputs, HOST) if contract.host else inputs
    result.add(
        "raw files unchanged since summary",
        _changed_inputs(run_dir, summary.get("inputs_sha256", {}), inputs),
        f"{', '.join(inputs)} hash as recorded in summary.json",
    )
    _check_protocol(run_dir, plan, result)
    _check_confirmation(run_dir, provenance, plan, result)
    floor = _check_contract(run_dir, plan, provenance, correctness, ceiling_rows, result)
    result.record("source commit", *provenance_checks.commit_problems(provenance))
    clock_readings = [s.sm_mhz for s in samples if s.sm_mhz is not None]
    result.add("device", *provenance_checks.device_problems(provenance, plan, ceiling_rows, clock_readings))
    outcome = _correctness_outcome(plan, correctness, result)
    timed = None
    if contract.checked:
        timed = _check_timed_checks(run_dir, plan, summary, samples, outcome, result)
        _check_integrity(run_dir, plan, provenance, digest, correctness, result)
    else:
        why = "plan.json has no `checks` (a run from before timed checks)"
        _not_checked(CHECKED_RUN_CHECKS, why, floor.checks >= 1, result)
    _check_rows(plan, samples, outcome, result, timed)
    _check_order(plan, samples, outcome, result, timed)
    _check_figures(plan, summary, samples, outcome, ceiling_rows, correctness, result, contract, timed)
    if contract.host:
        _check_host(run_dir, plan, summary, outcome, timed, result)
    else:
        _not_checked(("host cost",), "plan.json has no `host` (a run from before host cost)", floor.host, result)
    if contract.isolation:
        result.add("isolation bounds", *isolation_problems(run_dir, plan, summary, _median))
    else:
        why = "plan.json checks < 3 (a run from before isolation)"
        _not_checked(("isolation bounds",), why, floor.checks >= CHECKS_ISOLATED, result)
    check_written_after(result, run_dir, run_dir / REPORT, kernel_page(run_dir))
    return result


def _check_contract(
    run_dir: Path,
    plan: dict[str, Any],
    provenance: dict[str, Any],
    correctness: list[dict[str, Any]],
    ceiling_rows: list[dict[str, str]],
    result: VerifyResult,
) -> schema_requirements.WriterContract:
    """`required files` (what the declared contract makes a run hold) and `no downgrade` (the
    declaration is not below what the code and rows show; kernel/schema_requirements.py).
    Returns the least contract the witnesses show."""
    declared = schema_requirements.declared(plan)
    result.add(
        "required files",
        schema_requirements.required_problems(run_dir, plan, provenance, declared),
        f"every file and key a run of {declared} writes is present",
    )
    floor, witnesses = schema_requirements.writer_floor(
        run_dir, plan, provenance, correctness, {row["kind"] for row in ceiling_rows}
    )
    result.add(
        "no downgrade",
        schema_requirements.downgrade_problems(declared, witnesses),
        f"plan.json declares {declared}; "
        + (
            f"no later contract shown by {', '.join(w.what for w in witnesses)}"
            if witnesses
            else "no witness of a later one"
        ),
    )
    return floor


def _not_checked(names: tuple[str, ...], why: str, required: bool, result: VerifyResult) -> None:
    """Checks a run's declared contract does not have: not applicable, or failed where `no
    downgrade` shows the run was written under a contract that has them."""
    for name in names:
        if required:
            result.add(
                name,
                [f"not checked: {why}, yet the run was written under a contract that has it (see no downgrade)"],
                "",
            )
        else:
            result.not_applicable(name, f"not applicable: {why}")


def _check_host(
    run_dir: Path,
    plan: dict[str, Any],
    summary: dict[str, Any],
    outcome: dict[tuple[str, str], str],
    timed: TimedChecks | None,
    result: VerifyResult,
) -> None:
    """host.csv covers every (case, arm) timed to the end of its case with plan `host.samples`
    samples of `host.calls` calls, and the summary's host figures are its medians and counts."""
    if not (run_dir / HOST).is_file():
        result.add(
            "host cost", [f"{HOST} is missing: a plan with `host` measures the host cost of every timed arm"], ""
        )
        return
    settings = plan["host"]
    samples, calls = int(settings["samples"]), int(settings["calls"])
    raised = set(timed.raised) if timed else set()
    isolated = set(plan.get("isolated") or [])  # an isolated arm's host cost is not measured
    expected = {
        (case, arm, s)
        for (case, arm), state in outcome.items()
        if state == "passed" and (case, arm) not in raised and arm not in isolated
        for s in range(samples)
    }
    problems: list[str] = []
    per_call: dict[tuple[str, str], list[float]] = {}
    behind: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str, int]] = set()
    for number, row in enumerate(_read_csv_rows(run_dir, HOST, ["case", "arm", "sample", "calls", "ns", "behind"]), 2):
        try:
            key = (row["case"], row["arm"], int(row["sample"]))
            row_calls, ns, flag = int(row["calls"]), int(row["ns"]), int(row["behind"])
        except ValueError as error:
            problems.append(f"{HOST} line {number}: unparsable ({error})")
            continue
        if key in seen:
            problems.append(f"{HOST} line {number}: duplicate sample {key}")
        elif key not in expected:
            problems.append(f"{HOST} line {number}: unexpected sample {key} (not a timed arm's planned sample)")
        if row_calls != calls or ns <= 0 or flag not in (0, 1):
            problems.append(f"{HOST} line {number}: calls {row_calls} (plan: {calls}), ns {ns}, behind {flag}")
        seen.add(key)
        per_call.setdefault(key[:2], []).append(ns / row_calls)
        behind[key[:2]] = behind.get(key[:2], 0) + flag
    missing = sorted(expected - seen)
    if missing:
        problems.append(f"{len(missing)} host sample(s) missing, e.g. {missing[:3]}")
    recorded_top = summary.get("host") or {}
    problems += _diff(
        "summary host",
        recorded_top,
        {"samples": samples, "calls": calls, "rows": len(seen)},
        ("samples", "calls", "rows"),
    )
    for case in summary.get("cases", []):
        for arm, entry in (case.get("arms") or {}).items():
            values = per_call.get((str(case["case"]), arm), [])
            figures = {
                "host_ns_per_call": _median(values) if values else None,
                "host_samples": len(values),
                "host_behind": behind.get((str(case["case"]), arm), 0),
            }
            problems += _diff(f"case {case['case']} arm {arm}", entry, figures, HOST_FIELDS)
    result.add(
        "host cost",
        problems,
        f"{len(seen)} host samples ({samples} per timed arm and case, {calls} calls each); summary medians recomputed",
    )


def _check_timed_checks(
    run_dir: Path,
    plan: dict[str, Any],
    summary: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    result: VerifyResult,
) -> TimedChecks:
    """Every timing sample has exactly one timed check, and a raise none; records `timed checks` and
    (through `_check_dropped_arms`) `dropped arms`."""
    rows, problems = _read_timed_rows(run_dir)
    counts: dict[tuple[str, int, int, str], int] = {}
    values: dict[tuple[str, int, int], set[int]] = {}
    for row in rows:
        counts[row.key] = counts.get(row.key, 0) + 1
        values.setdefault((row.case, row.seed, row.round), set()).add(row.values_seed)
    sampled = {(s.case, s.seed, s.round, s.arm) for s in samples}
    listed = [
        ("timing rows without a timed check", sorted(sampled - set(counts))),
        ("duplicated timed checks", sorted(key for key, n in counts.items() if n > 1)),
        (
            "timed checks without a timing row that did not raise",
            sorted(r.key for r in rows if not r.raised and r.key not in sampled),
        ),
        ("raised while timed but has a timing row", sorted(r.key for r in rows if r.raised and r.key in sampled)),
        (
            "timed checks of an arm not timed in the case",
            sorted({(r.case, r.arm) for r in rows if outcome.get((r.case, r.arm)) != "passed"}),
        ),
        ("units whose arms got different values_seed", sorted(unit for unit, seen in values.items() if len(seen) > 1)),
        (
            "failed timed checks whose message has no contract prefix, or a raise that passed",
            [
                r.key
                for r in rows
                if (not r.passed and not r.message.startswith(TIMED_FAILURE_PREFIXES)) or (r.raised and r.passed)
            ],
        ),
    ]
    if plan.get("checks") in (CHECKS_EVERY_CALL, CHECKS_ISOLATED):  # a random call of each sample checked: which one
        calls = {str(c["case"]): int(c["calls"]) for c in plan["cases"]}
        listed.append(
            (
                "timed checks without a checked_call in 0..calls-1",
                sorted(
                    r.key
                    for r in rows
                    if not r.raised
                    and not (
                        isinstance(r.checked_call, int)
                        and not isinstance(r.checked_call, bool)
                        and 0 <= r.checked_call < calls.get(r.case, 0)
                    )
                ),
            )
        )
    problems += [f"{label}: {len(keys)}, e.g. {keys[:3]}" for label, keys in listed if keys]
    failed = sum(not r.passed for r in rows)
    problems += _diff(
        "summary timed_checks",
        summary.get("timed_checks") or {},
        {"rows": len(rows), "failed": failed},
        ("rows", "failed"),
    )
    result.add("timed checks", problems, f"{len(rows)} timed checks, one per timing sample ({failed} failed)")
    return TimedChecks(rows, _check_dropped_arms(plan, samples, rows, result))


def _check_dropped_arms(
    plan: dict[str, Any], samples: list[Sample], rows: list[TimedRow], result: VerifyResult
) -> dict[tuple[str, str], tuple[int, int]]:
    """An arm that raised while timed has no row in the later units of its case; returns where each raised."""
    order = _unit_order(plan)
    raised: dict[tuple[str, str], tuple[int, int]] = {}
    for row in sorted((r for r in rows if r.raised), key=lambda r: order(r.seed, r.round)):
        raised.setdefault((row.case, row.arm), (row.seed, row.round))
    later = []
    for (case, arm), unit in raised.items():
        after = sorted(
            {
                (x.seed, x.round)
                for x in (*samples, *rows)
                if x.case == case and x.arm == arm and order(x.seed, x.round) > order(*unit)
            }
        )
        if after:
            later.append(
                f"arm {arm} raised while timed in ({case}, {unit[0]}, {unit[1]}) but has rows in "
                f"{len(after)} later unit(s), e.g. {after[:3]}"
            )
    result.add(
        "dropped arms", later, f"{len(raised)} arm(s) raised while timed, each absent from the later units of its case"
    )
    return raised


def _check_integrity(
    run_dir: Path,
    plan: dict[str, Any],
    provenance: dict[str, Any],
    digest: str,
    correctness: list[dict[str, Any]],
    result: VerifyResult,
) -> None:
    """The checks of a run with timed checks that read no timing figure: plan fields, ulp histograms,
    manifest, provenance, source archive and freeze (kernel/integrity.py)."""
    result.add(
        "plan contract fields",
        _plan_contract_problems(plan),
        f"checks {plan.get('checks')}, exact {plan.get('exact')}, plausibility {plan.get('plausibility')}, "
        f"frozen_at {plan.get('frozen_at')}",
    )
    result.add(
        "ulp histograms",
        _ulp_problems(plan, correctness),
        f"{len(correctness)} correctness rows, each with a {ULP_BINS}-bin ulp histogram",
    )
    result.add(
        "manifest",
        integrity.manifest_problems(run_dir),
        f"every file hashes as {MANIFEST} recorded; no file added but report.md, *.png, ERRATA.md",
    )
    result.add(
        "provenance",
        integrity.provenance_problems(provenance),
        "versions, device, source digest, start and end recorded",
    )
    result.add(
        "source archive",
        integrity.source_problems(run_dir, provenance),
        f"{SOURCE_ARCHIVE} digests to git.source_sha256",
    )
    frozen = plan.get("frozen_at")
    result.add(
        "protocol freeze",
        integrity.freeze_problems(provenance, plan, digest),
        "not frozen (plan and provenance agree)"
        if frozen is None
        else f"frozen at {frozen}, the record of protocol.toml",
    )


def _plan_contract_problems(plan: dict[str, Any]) -> list[str]:
    """The plan.json fields of the timed-check contract, present and of their types."""
    problems = []
    if not isinstance(plan.get("exact"), bool):
        problems.append(f"exact {plan.get('exact')!r} is not true or false")
    settings = plan.get("plausibility")
    numbers = {key: (settings or {}).get(key) for key in PLAUSIBILITY_DEFAULTS} if isinstance(settings, dict) else {}
    if not numbers or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in numbers.values()
    ):
        problems.append(f"plausibility {settings!r} lacks non-negative numbers {list(PLAUSIBILITY_DEFAULTS)}")
    if "frozen_at" not in plan or not isinstance(plan["frozen_at"], (str, type(None))):
        problems.append(f"frozen_at {plan.get('frozen_at', 'absent')!r} is not a time or null")
    if plan.get("order_seed") is None:
        problems.append("order_seed is missing: the round order of a run with timed checks is seeded")
    return problems


def _ulp_problems(plan: dict[str, Any], correctness: list[dict[str, Any]]) -> list[str]:
    """Every correctness row has `ulp_hist` (6 counts); under `exact`, a passed row has every element at 0 ulps."""
    malformed, inexact = [], []
    for row in correctness:
        hist = row.get("ulp_hist")
        where = (row.get("case"), row.get("seed"), row.get("arm"))
        if not (
            isinstance(hist, list)
            and len(hist) == ULP_BINS
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in hist)
        ):
            malformed.append(f"{where}: {hist!r}")
        elif plan.get("exact") is True and row.get("passed") is True and any(hist[1:]):
            inexact.append(f"{where}: {hist}")
    problems = (
        [f"{len(malformed)} correctness row(s) without a {ULP_BINS}-bin ulp_hist, e.g. {malformed[:3]}"]
        if malformed
        else []
    )
    if inexact:
        problems.append(
            f"{len(inexact)} passed row(s) of an exact run with elements off the reference, e.g. {inexact[:3]}"
        )
    return problems


def _check_protocol(run_dir: Path, plan: dict[str, Any], result: VerifyResult) -> None:
    """plan.json says what protocol.toml says: the run ran the preregistered trial."""
    try:
        protocol = {**PROTOCOL_DEFAULTS, **tomllib.loads((run_dir / "protocol.toml").read_text())}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        result.add("plan matches protocol", [f"protocol.toml is not valid TOML ({error})"], "")
        return
    cases = [
        f"{'x'.join(str(n) for n in c.get('shape', []))}/{c.get('layout', PROTOCOL_DEFAULTS['layout'])}/"
        f"{c.get('dtype', PROTOCOL_DEFAULTS['dtype'])}"
        for c in protocol.get("cases", [])
    ]
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
    if "order_seed" in plan and not plan.get("order_seed_override"):  # replicates override it (`run --order-seed`)
        pairs.append(("order_seed", plan["order_seed"], protocol.get("order_seed", 0)))
    if "exact" in plan:
        pairs.append(("exact", plan["exact"], protocol["exact"]))
    if isinstance(plan.get("host"), dict):
        declared_calls = int(protocol["host_calls"])
        pairs += [
            ("host.samples", plan["host"].get("samples"), protocol["host_samples"]),
            (
                "host.calls",
                plan["host"].get("calls"),
                declared_calls if plan.get("is_gpu") else min(declared_calls, CPU_HOST_CALLS),
            ),
        ]
    if isinstance(plan.get("plausibility"), dict):
        pairs += [
            (f"plausibility.{key}", plan["plausibility"].get(key), protocol[key]) for key in PLAUSIBILITY_DEFAULTS
        ]
    # the noise settings are optional in plan.json (older runs); compared where present
    for section, keys in (
        ("clocks", ("throttle_fraction",)),
        ("noise_rule", ("target_ci_width", "max_rounds", "time_budget_s")),
        ("calibration", tuple(CALIBRATION_DEFAULTS)),
    ):
        recorded = plan.get(section)
        if isinstance(recorded, dict):
            pairs += [(f"{section}.{key}", recorded[key], protocol[key]) for key in keys if key in recorded]
    problems = [
        f"{name}: plan.json has {planned!r}, protocol.toml says {declared!r}"
        for name, planned, declared in pairs
        if not _same_value(planned, declared)
    ]
    result.add(
        "plan matches protocol",
        problems,
        f"arms, {len(cases)} case ids, seeds, rounds, tie band, gate, bootstrap and L2 as protocol.toml says",
    )


def _check_confirmation(run_dir: Path, provenance: dict[str, Any], plan: dict[str, Any], result: VerifyResult) -> None:
    """A confirmation run (protocol.toml phase "confirmation"): its links (provenance.json
    `confirmation`, relative to the run directory) resolve to the digests recorded, its one
    candidate is the `user:<stem>` arm of its one user module, whose rule is the linked one,
    and no linked run used one of its seeds (by a plan.json that hashes as that run's
    summary.json records it). Other runs get no such lines."""
    try:
        protocol = tomllib.loads((run_dir / "protocol.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return  # "plan matches protocol" already fails it
    if protocol.get("phase", "exploratory") != "confirmation":
        return
    record = provenance.get("confirmation")
    if not isinstance(record, dict):
        result.add("confirmation links", ["provenance.json has no `confirmation` links"], "")
        return
    found = links.Links.from_record(record)
    result.add(
        "confirmation links",
        links.link_problems(found, run_dir),
        f"the rule and {len(found.runs)} derived-from run(s) hash as recorded",
    )
    modules = list(provenance.get("impl_modules") or {})
    stem = Path(modules[0]).stem if len(modules) == 1 and modules[0].endswith(".py") else None
    candidates = protocol.get("candidates", [])
    result.add(
        "confirmation candidate",
        []
        if stem is not None and candidates == [f"user:{stem}"] and Path(found.rule.path).name == f"{stem}.rule.toml"
        else [
            f"candidates {candidates} with user modules {modules} and rule {found.rule.path}: a confirmation "
            "has one user module, its `user:<stem>` arm as the one candidate, and links that module's rule"
        ],
        f"the one candidate user:{stem} is the dispatcher whose rule is linked",
    )
    seeds = [int(s) for s in plan.get("seeds", [])]
    result.add(
        "confirmation seeds fresh",
        links.seed_problems(found, run_dir, seeds, streams.plan_bounds(plan)),
        f"seeds {seeds} draw inputs no derived-from run drew (its plan.json as its summary.json records it)",
    )


def _same_value(a: Any, b: Any) -> bool:
    """Equal, with ints and floats compared by value (a TOML 600 and a JSON 600.0 agree); bools stay bools."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _check_order(
    plan: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    result: VerifyResult,
    timed: TimedChecks | None,
) -> None:
    """Interleaving evidence: in each (case, seed, round) unit the timed arms hold positions 0..k-1,
    and, with plan `order_seed`, exactly the order its seeded generator gives. With timed checks the
    arms of a unit are those still in the case there (a timing row, or the raise that dropped the
    arm): the raising arm keeps its position and has no row at it."""
    arm_order = [a["name"] for a in plan["arms"]]
    case_index = {str(c["case"]): i for i, c in enumerate(plan["cases"])}
    case_arms = {case: [arm for arm in arm_order if outcome.get((case, arm)) == "passed"] for case in case_index}
    raised_in = timed.raised_in() if timed else {}
    units: dict[tuple[str, int, int], list[Sample]] = {unit: [] for unit in raised_in}
    for s in samples:
        units.setdefault((s.case, s.seed, s.round), []).append(s)
    order_seed = plan.get("order_seed")
    bad_positions, bad_order = [], []
    for (case, seed, rnd), rows in sorted(units.items()):
        raised = raised_in.get((case, seed, rnd), [])
        here = {s.arm for s in rows} | set(raised)
        arms = case_arms.get(case, []) if timed is None else [arm for arm in arm_order if arm in here]
        positions = sorted(s.position for s in rows)
        if (
            len(set(positions)) != len(positions)
            or len(positions) != len(arms) - len(raised)
            or not all(0 <= p < len(arms) for p in positions)
        ):
            bad_positions.append(
                f"({case}, {seed}, {rnd}) positions {positions} for {len(arms)} timed arm(s)"
                + (f" ({len(raised)} raised)" if raised else "")
            )
            continue
        if order_seed is None or sorted([*(s.arm for s in rows), *raised]) != sorted(arms) or case not in case_index:
            continue  # an incomplete unit already fails the timing-rows check
        permutation = np.random.default_rng([int(order_seed), case_index[case], seed, rnd]).permutation(len(arms))
        expected = {arms[i]: position for position, i in enumerate(permutation)}
        wrong = [
            f"{s.arm} at {s.position}, seeded order puts it at {expected[s.arm]}"
            for s in rows
            if expected[s.arm] != s.position
        ]
        if wrong:
            bad_order.append(f"({case}, {seed}, {rnd}): " + ", ".join(wrong))
    problems = (
        [f"{len(bad_positions)} unit(s) whose positions are not 0..k-1, e.g. {bad_positions[:3]}"]
        if bad_positions
        else []
    )
    if bad_order:
        problems.append(f"{len(bad_order)} unit(s) not in the order of order_seed {order_seed}, e.g. {bad_order[:3]}")
    result.add(
        "interleaving order",
        problems,
        f"{len(units)} (case, seed, round) units, positions 0..k-1"
        + ("" if order_seed is None else f", each in the seeded order of order_seed {order_seed}"),
    )


def _check_schema(
    plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], result: VerifyResult
) -> Contract:
    """The contract the run is verified under. plan.json `"checks": 1` needs a schema-4 summary;
    a run without `checks` a schema 1-3 one (schema 1 only for raw files without the newer fields)."""
    schema = summary.get("schema")
    if "checks" in plan:
        if plan["checks"] not in (1, CHECKS_EVERY_CALL, CHECKS_ISOLATED) or isinstance(plan["checks"], bool):
            raise RunDirError(
                f"plan.json checks {plan['checks']!r}: this kerneltrial verifies timed-check contracts 1, 2 and 3 "
                "(or none); update kerneltrial to verify this run"
            )
        wanted = (
            SCHEMA_7
            if plan["checks"] == CHECKS_ISOLATED
            else SCHEMA_6
            if "floor" in plan
            else SCHEMA_5
            if "host" in plan
            else SCHEMA_4
        )
        result.add(
            "summary schema",
            []
            if schema == wanted
            else [
                f"summary schema {schema!r} is not {wanted}, which a plan with checks {plan['checks']}"
                + (" and host" if "host" in plan else "")
                + (" and floor" if "floor" in plan else "")
                + " needs"
            ],
            f"{schema}",
        )
        return CONTRACTS[wanted]
    if schema != LEGACY_SCHEMA:
        result.add(
            "summary schema",
            []
            if schema in (SCHEMA_3, SCHEMA_2)
            else [
                f"summary schema {schema!r} is not {SCHEMA_3} (or /2, /1) for a plan without checks"
                + (" (a schema-4 summary needs plan.json checks 1)" if schema == SCHEMA_4 else "")
            ],
            f"{schema}",
        )
        return CONTRACTS[SCHEMA_2 if schema == SCHEMA_2 else SCHEMA_3]
    newer = []
    if any(s.sm_mhz is not None for s in samples):
        newer.append("timings.csv has sm_mhz readings")
    if any(
        c.get("rounds") is not None and len(_rounds_of(plan, c)) != len(_as_list(plan["rounds"])) for c in plan["cases"]
    ):
        newer.append("plan.json cases have their own rounds")
    if any(_calibration_arm(a["name"]) for a in plan["arms"]):
        newer.append("plan.json has aa:/slow: calibration arms")
    result.add(
        "summary schema",
        [f"{LEGACY_SCHEMA} summary lacks the figures for raw data it must cover: " + "; ".join(newer)] if newer else [],
        f"{LEGACY_SCHEMA}: no clock, per-case rounds or calibration data to check",
    )
    return CONTRACTS[LEGACY_SCHEMA]


def _changed_inputs(run_dir: Path, recorded: dict[str, str], names: tuple[str, ...]) -> list[str]:
    problems = []
    for name in names:
        if not (run_dir / name).is_file():
            problems.append(f"{name} is missing")
            continue
        digest = sha256_file(run_dir / name)
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
    available = [a for a in plan["arms"] if a["available"]]
    outcome: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    partial = [a["name"] for a in plan["arms"] if "layouts" in a and a.get("kind") not in PARTIAL_LAYOUT_KINDS]
    if partial:
        problems.append(
            f"arm(s) {partial} have `layouts` but only a peer may skip layouts; the plan is not the runner's"
        )
    for plan_case in plan["cases"]:
        case = str(plan_case["case"])
        # a peer whose `layouts` exclude the case's is not checked there, like an unavailable one
        for arm in [
            a["name"]
            for a in available
            if "layouts" not in a
            or a.get("kind") not in PARTIAL_LAYOUT_KINDS
            or plan_case.get("layout") in a["layouts"]
        ]:
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
    result.add(
        "correctness coverage",
        problems,
        f"{len(rows)} checks; {sum(v == 'failed' for v in outcome.values())} (case, arm) failed",
    )
    return outcome


def _check_rows(
    plan: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    result: VerifyResult,
    timed: TimedChecks | None,
) -> None:
    """One timing row per (case, seed, round, timed arm); with timed checks, none from the unit where
    an arm raised on (it was dropped from the case)."""
    rounds = {str(c["case"]): _rounds_of(plan, c) for c in plan["cases"]}
    order = _unit_order(plan)
    raised = timed.raised if timed else {}
    expected = {
        (case, seed, rnd, arm)
        for (case, arm), state in outcome.items()
        if state == "passed"
        for seed in _as_list(plan["seeds"])
        for rnd in rounds[case]
        if (case, arm) not in raised or order(seed, rnd) < order(*raised[(case, arm)])
    }
    counts: dict[tuple[str, int, int, str], int] = {}
    for s in samples:
        counts[(s.case, s.seed, s.round, s.arm)] = counts.get((s.case, s.seed, s.round, s.arm), 0) + 1
    missing = sorted(expected - set(counts))
    unexpected = sorted(set(counts) - expected)
    duplicated = sorted(key for key, n in counts.items() if n > 1)
    problems = [
        f"{label} (case, seed, round, arm) rows: {len(keys)}, e.g. {keys[:3]}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("duplicated", duplicated))
        if keys
    ]
    calls = {str(c["case"]): int(c["calls"]) for c in plan["cases"]}
    wrong_calls = [s for s in samples if calls.get(s.case) is not None and s.calls != calls[s.case]]
    if wrong_calls:
        problems.append(f"{len(wrong_calls)} row(s) with calls different from plan, e.g. {wrong_calls[0]}")
    bad_ns = [s for s in samples if not (s.ns > 0 and math.isfinite(s.ns))]
    if bad_ns:
        problems.append(f"{len(bad_ns)} row(s) with non-positive or non-finite ns, e.g. {bad_ns[0]}")
    result.add("timing rows", problems, f"{len(samples)} rows, each expected (case, seed, round, arm) exactly once")
    result.add(
        "rounds per case",
        _rounds_problems(plan),
        "rounds per case: " + ", ".join(f"{case} {len(r)}" for case, r in rounds.items()),
    )

    failed_but_timed = sorted({(s.case, s.arm) for s in samples if outcome.get((s.case, s.arm)) == "failed"})
    result.add(
        "correctness consistency",
        [f"arm {arm} failed correctness in case {case} but has timing rows" for case, arm in failed_but_timed],
        "no arm is timed in a case where it failed correctness",
    )


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
            problems.append(
                f"case {case['case']}: {n} rounds but {planned} planned and no noise rule "
                "(noise_rule.target_ci_width) allows extra rounds"
            )
        elif n > planned and rule.get("max_rounds") is not None and n > int(rule["max_rounds"]):
            problems.append(f"case {case['case']}: {n} rounds exceed the noise rule's max_rounds {rule['max_rounds']}")
    return problems


@dataclass(frozen=True)
class Limits:
    """Plausibility limits recomputed from plan.json and ceilings.csv (None: that limit does not apply)."""

    margin: float
    fraction: float
    ceiling: float | None  # the best of the copy and read ceilings, GB/s
    floor: float | None  # the launch floor, ns

    def reason(self, gbps: float, median: float) -> str | None:
        """Why figures cannot be real work (bandwidth first, joined with '; '), or None."""
        reasons = []
        if self.ceiling is not None and gbps > self.ceiling * (1 + self.margin):
            reasons.append(
                f"implausible: {gbps:.0f} GB/s is {100 * gbps / self.ceiling:.0f}% of the best ceiling "
                f"measured in this run ({self.ceiling:.0f} GB/s); more than {100 * self.margin:g}% above "
                "it cannot be real work"
            )
        if self.floor is not None and median < self.fraction * self.floor:
            reasons.append(
                f"implausible: {median:.0f} ns per call is below {self.fraction:g} x the launch floor "
                f"measured in this run ({self.floor:.0f} ns): no kernel can run that fast"
            )
        return "; ".join(reasons) or None


def _limits(plan: dict[str, Any], ceiling_rows: list[dict[str, str]]) -> Limits:
    """Judged only in GPU runs timed with CUDA events; bandwidth only with a cold L2 (a hot L2 can beat DRAM)."""
    applied = bool(plan["is_gpu"]) and plan["backend"] == "cuda-events"
    recorded = plan.get("plausibility") if isinstance(plan.get("plausibility"), dict) else {}
    # a setting that is not a number fails `plan contract fields`; the figures use the default meanwhile
    settings = {
        key: value if isinstance(value := recorded.get(key), (int, float)) else default
        for key, default in PLAUSIBILITY_DEFAULTS.items()
    }
    ceilings = [
        c for c in (_ceiling_median(ceiling_rows, "copy"), _ceiling_median(ceiling_rows, "read")) if c is not None
    ]
    floor = _launch_floor(ceiling_rows)
    return Limits(
        float(settings["bandwidth_margin"]),
        float(settings["launch_floor_fraction"]),
        max(ceilings) if applied and plan.get("l2") == "cold" and ceilings else None,
        floor if applied else None,
    )


def _check_triton_floor(recorded: dict[str, Any], ceiling_rows: list[dict[str, str]], result: VerifyResult) -> None:
    """The Triton launch floor: its rows are well formed and the summary's figures are their median and count."""
    rows = [r for r in ceiling_rows if r["kind"] == TRITON_LAUNCH]
    name = "triton launch floor"
    if not rows:
        claimed = [key for key in TRITON_FLOOR_FIELDS if key in recorded]
        if claimed:
            result.add(name, [f"summary ceilings has {claimed} but ceilings.csv has no {TRITON_LAUNCH} rows"], "")
        else:
            result.not_applicable(
                name, f"not applicable: ceilings.csv has no {TRITON_LAUNCH} rows (a run from before it)"
            )
        return
    samples, problems = _ceiling_sets(rows, TRITON_LAUNCH, _copy_count(ceiling_rows))
    problems += [f"{TRITON_LAUNCH} sample(s) of {moved} bytes: must be 0" for moved in samples if moved != 0]
    launches = [ns for values in samples.values() for ns in values]
    floor = _median(launches) if launches else None
    problems += _diff(
        "ceilings",
        recorded,
        {"triton_launch_floor_ns": floor, "triton_launch_samples": len(launches)},
        TRITON_FLOOR_FIELDS,
    )
    result.add(name, problems, f"{floor} ns, the median of {len(launches)} one-element Triton launches")


def _copy_count(ceiling_rows: list[dict[str, str]]) -> int | None:
    """Samples per ceiling kind (and size): as many as the `copy` rows (the runner takes the same
    number of each); None without copy rows."""
    return sum(r["kind"] == "copy" for r in ceiling_rows) or None


def _ceiling_sets(
    rows: list[dict[str, str]], kind: str, per_set: int | None
) -> tuple[dict[int, list[float]], list[str]]:
    """ns of well-formed rows of one ceiling kind by bytes, and the problems: unparsable rows, ns not
    finite and > 0, and any size whose sample numbers are not exactly 0..per_set-1 (a missing sample
    may be a dropped fast one; a repeated one, an added slow one)."""
    found: dict[int, list[float]] = {}
    numbers: dict[int, list[str]] = {}
    problems: list[str] = []
    for row in rows:
        try:
            ns, moved = float(row["ns"]), int(row["bytes"])
        except ValueError as error:
            problems.append(f"{kind} sample {row['sample']}: unparsable ({error})")
            continue
        numbers.setdefault(moved, []).append(row["sample"])
        found.setdefault(moved, [])  # a size with only bad rows is still a size
        if not (math.isfinite(ns) and ns > 0):
            problems.append(f"{kind} sample {row['sample']} of {moved} bytes: ns {ns:g} (must be finite and > 0)")
            continue
        found.setdefault(moved, []).append(ns)
    for moved, samples in numbers.items():
        expected = [str(i) for i in range(per_set if per_set is not None else len(samples))]
        if sorted(samples, key=lambda x: (len(x), x)) != expected:
            problems.append(f"{kind} samples of {moved} bytes are {sorted(samples)}, not 0..{len(expected) - 1}")
    return found, problems


def _check_matched_copies(
    plan: dict[str, Any], summary: dict[str, Any], ceiling_rows: list[dict[str, str]], result: VerifyResult
) -> None:
    """The copies of each case's traffic: well-formed rows, one set per case's bytes (rounded down
    to even), and every case's matched_copy_gbps their median GB/s."""
    rows = [r for r in ceiling_rows if r["kind"] == COPY_MATCHED]
    name = "size-matched copies"
    recorded = {str(c.get("case")): c for c in summary.get("cases", [])}
    if not rows:
        claimed = [case for case, c in recorded.items() if "matched_copy_gbps" in c]
        if claimed:
            result.add(
                name, [f"cases {claimed} have matched_copy_gbps but ceilings.csv has no {COPY_MATCHED} rows"], ""
            )
        else:
            result.not_applicable(
                name, f"not applicable: ceilings.csv has no {COPY_MATCHED} rows (a run from before it)"
            )
        return
    samples, problems = _ceiling_sets(rows, COPY_MATCHED, _copy_count(ceiling_rows))
    problems += [
        f"{COPY_MATCHED} sample(s) of {moved} bytes: must be even and > 0"
        for moved in samples
        if moved <= 0 or moved % 2
    ]
    rates = {moved: [moved / ns for ns in values] for moved, values in samples.items()}
    wanted = {int(case["bytes"]) - int(case["bytes"]) % 2 for case in plan["cases"]} - {0}  # the runner skips < 2
    if set(rates) != wanted:
        problems.append(f"{COPY_MATCHED} sizes {sorted(rates)} are not the cases' traffic {sorted(wanted)}")
    for case in plan["cases"]:
        moved = int(case["bytes"]) - int(case["bytes"]) % 2
        expected = _median(rates[moved]) if rates.get(moved) else None
        problems += _diff(
            f"case {case['case']}",
            recorded.get(str(case["case"]), {}),
            {"matched_copy_gbps": expected},
            ("matched_copy_gbps",),
        )
    result.add(name, problems, f"{len(rates)} sizes, {len(rows)} samples")


def _check_floor(
    plan: dict[str, Any],
    summary: dict[str, Any],
    ceiling_rows: list[dict[str, str]],
    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]],
    contract: Contract,
    result: VerifyResult,
) -> None:
    """The speed-of-light floor (schema 6): each case's floor_ns is the median `triton_launch` ns
    plus its bytes over the median `copy` GB/s, and each arm's fraction_of_floor that floor over
    its median ns per call (null where the summary has no median). Older runs must claim none."""
    name = "speed-of-light floor"
    cases = summary.get("cases", [])
    claimed = [str(c.get("case")) for c in cases if "floor_ns" in c] + [
        f"{c.get('case')}/{arm}" for c in cases for arm, e in c.get("arms", {}).items() if "fraction_of_floor" in e
    ]
    if not contract.floor:
        if claimed:
            result.add(name, [f"{claimed[:3]} have floor figures but plan.json has no `floor`"], "")
        else:
            result.not_applicable(name, "not applicable: plan.json has no `floor` (a run from before it)")
        return
    problems = [] if plan["floor"] == FLOOR_MODEL else [f"plan.json floor {plan['floor']!r} is not {FLOOR_MODEL}"]
    kind = FLOOR_MODEL["launch"]  # its well-formed rows, as `triton launch floor` takes them (it names bad ones)
    sets, _ = _ceiling_sets([r for r in ceiling_rows if r["kind"] == kind], kind, None)
    launches = [ns for values in sets.values() for ns in values]
    launch, rate = (_median(launches) if launches else None), _ceiling_median(ceiling_rows, FLOOR_MODEL["rate"])
    recorded = {str(c.get("case")): c for c in cases}
    for case in plan["cases"]:
        case_id = str(case["case"])
        entry = recorded.get(case_id, {})
        floor = launch + int(case["bytes"]) / rate if launch is not None and rate else None
        problems += _diff(f"case {case_id}", entry, {"floor_ns": floor}, ("floor_ns",))
        for arm, figures in entry.get("arms", {}).items():
            times = per_unit.get((case_id, arm))
            timed = figures.get("median_ns_per_call") is not None and times and floor is not None
            expected = floor / _median(list(times.values())) if timed else None
            problems += _diff(
                f"case {case_id} arm {arm}", figures, {"fraction_of_floor": expected}, ("fraction_of_floor",)
            )
    result.add(name, problems, f"launch {launch} ns + bytes / {rate} GB/s, per case and arm")


def _launch_floor(ceiling_rows: list[dict[str, str]]) -> float | None:
    launches = [float(r["ns"]) for r in ceiling_rows if r["kind"] == "launch"]
    return _median(launches) if launches else None


@dataclass(frozen=True)
class ArmState:
    """What the raw rows say of one (case, arm): its status and the samples its figures come from."""

    status: str
    times: dict[tuple[int, int], float] | None = None  # per-call ns by unit: timed or implausible
    messages: list[str] | None = None  # failed while timed: the failing timed checks' messages
    reason: str | None = None  # implausible: why


def _arm_state(
    case: dict[str, Any],
    name: str,
    outcome: dict[tuple[str, str], str],
    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]],
    timed: TimedChecks | None,
    limits: Limits | None,
) -> ArmState:
    case_id = str(case["case"])
    state = outcome.get((case_id, name), "unavailable")
    if state != "passed":
        return ArmState(STATUS_OF[state])
    failures = timed.failures(case_id, name) if timed else []
    if failures:
        return ArmState(FAILED_WHILE_TIMED, messages=failures)
    times = per_unit.get((case_id, name))
    if not times:
        return ArmState("not timed")
    if limits is not None:
        median = _median(list(times.values()))
        reason = limits.reason(float(case["bytes"]) / median, median)
        if reason:
            return ArmState(IMPLAUSIBLE, times, reason=reason)
    return ArmState("timed", times)


def _first_failures(correctness: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """The first failed correctness check's message of each (case, arm), in file order."""
    first: dict[tuple[str, str], str] = {}
    for row in correctness:
        if row.get("passed") is not True:
            first.setdefault((str(row["case"]), row["arm"]), row.get("message") or "failed")
    return first


def _check_figures(
    plan: dict[str, Any],
    summary: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    ceiling_rows: list[dict[str, str]],
    correctness: list[dict[str, Any]],
    result: VerifyResult,
    contract: Contract,
    timed: TimedChecks | None,
) -> None:
    band = float(plan["tie_band"])
    bootstrap = plan["bootstrap"]
    control = next((a["name"] for a in plan["arms"] if a["kind"] == "control"), None)
    header = {"backend": plan["backend"], "is_gpu": plan["is_gpu"], "control": control}
    if contract.checked:
        header["exact"] = plan.get("exact")
    result.add(
        "run header",
        _diff("summary", summary, header, tuple(header))
        + (
            []
            if plan["is_gpu"] or "NOT GPU" in str(summary.get("label"))
            else [f"label {summary.get('label')!r} does not say NOT GPU for a non-GPU run"]
        ),
        f"backend {plan['backend']}, is_gpu {plan['is_gpu']}, control {control}",
    )

    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    throttled: dict[tuple[str, str], int] = {}
    _, _, threshold = _threshold(plan)
    for s in samples:
        per_unit.setdefault((s.case, s.arm), {})[(s.seed, s.round)] = s.ns / s.calls
        throttled[(s.case, s.arm)] = throttled.get((s.case, s.arm), 0) + _throttled(s, threshold)
    if contract.clocks:
        _check_clocks(plan, summary, samples, result)
    copy = _ceiling_median(ceiling_rows, "copy")
    recorded_ceilings = summary.get("ceilings", {})
    result.add(
        "ceilings",
        _diff(
            "ceilings",
            recorded_ceilings,
            {"copy_gbps": copy, "read_gbps": _ceiling_median(ceiling_rows, "read")},
            ("copy_gbps", "read_gbps"),
        ),
        f"copy {copy} GB/s median",
    )
    _check_triton_floor(recorded_ceilings, ceiling_rows, result)
    _check_matched_copies(plan, summary, ceiling_rows, result)
    _check_floor(plan, summary, ceiling_rows, per_unit, contract, result)
    limits = _limits(plan, ceiling_rows) if contract.checked else None
    if contract.checked:
        _check_checked_summary(plan, summary, ceiling_rows, result)

    recorded_cases = {str(c.get("case")): c for c in summary.get("cases", [])}
    plan_cases = [str(c["case"]) for c in plan["cases"]]
    result.add(
        "summary cases",
        []
        if list(recorded_cases) == plan_cases
        else [f"summary cases {list(recorded_cases)} != plan cases {plan_cases}"],
        f"{len(plan_cases)} cases",
    )

    speedups: dict[str, list[tuple[str, float, str]]] = {}
    intervals: dict[str, list[tuple[float, float]]] = {}
    disqualified: dict[str, dict[str, list[tuple[str, str]]]] = {}  # arm -> status -> [(case, first reason)]
    first_failure = _first_failures(correctness)
    fields = FIGURE_FIELDS if contract.clocks else BASE_FIGURE_FIELDS
    medians: dict[tuple[str, str], float | None] = {}
    spread_warnings: list[str] = []
    for case in plan["cases"]:
        case_id = str(case["case"])
        recorded = recorded_cases.get(case_id, {}).get("arms", {})
        if contract.clocks:
            n_rounds = len(_rounds_of(plan, case))
            result.add(
                f"case header case={case_id}",
                _diff(
                    f"case {case_id}",
                    recorded_cases.get(case_id, {}),
                    {
                        "rounds": n_rounds,
                        "units_planned": n_rounds * len(_as_list(plan["seeds"])),
                        "injected_delay_ns": case.get("injected_delay_ns"),
                    },
                    ("rounds", "units_planned", "injected_delay_ns"),
                ),
                f"{n_rounds} rounds",
            )
        states = {a["name"]: _arm_state(case, a["name"], outcome, per_unit, timed, limits) for a in plan["arms"]}
        control_times = states[control].times if control in states and states[control].status == "timed" else None
        for arm in plan["arms"]:
            name, state = arm["name"], states[arm["name"]]
            first = {
                "failed correctness": first_failure.get((case_id, name)),
                IMPLAUSIBLE: state.reason,
                FAILED_WHILE_TIMED: (state.messages or [None])[0],
            }
            if state.status in first:
                disqualified.setdefault(name, {}).setdefault(state.status, []).append(
                    (case_id, str(first[state.status]))
                )
            compared = control_times if name != control and state.status == "timed" else None
            figures = _arm_figures(case, state.times, compared, copy, bootstrap, band, contract)
            if contract.checked and name != control and state.status == "timed" and figures["speedup"] is None:
                control_status = states[control].status if control in states else "absent"
                disqualified.setdefault(name, {}).setdefault(NOT_COMPARED, []).append(
                    (case_id, f"no verdict against the control (control: {control_status})")
                )
            figures["throttled_samples"] = throttled.get((case_id, name), 0) if state.times else 0
            figures["spread"] = _spread(list(state.times.values())) if state.times else None
            medians[(case_id, name)] = figures["median_ns_per_call"]
            if figures["speedup"] is not None:
                speedups.setdefault(name, []).append((case_id, figures["speedup"], figures["verdict"]))
                intervals.setdefault(name, []).append((figures["ci_low"], figures["ci_high"]))
            if name == control and figures["spread"] is not None and figures["spread"] > band:
                spread_warnings.append(
                    f"case {case_id}: control run-to-run spread {100 * figures['spread']:.1f}% "
                    f"exceeds the tie band {100 * band:g}%"
                )
            result.add(
                f"figures case={case_id} arm={name}",
                _entry_problems(f"case {case_id} arm {name}", recorded.get(name, {}), figures, state, fields),
                _describe(figures, state.status),
            )

    if contract.clocks:
        missing = [w for w in spread_warnings if w not in summary.get("warnings", [])]
        result.add(
            "spread warnings",
            [f"summary warnings lack {w!r}" for w in missing],
            f"{len(spread_warnings)} case(s) with control spread above the tie band, each warned",
        )
        _check_calibration(
            plan, summary, control, speedups, intervals, medians if contract.realized else None, result, contract
        )
    _check_aggregates(plan, summary, control, speedups, disqualified, correctness, bootstrap, result, contract)


def _check_checked_summary(
    plan: dict[str, Any], summary: dict[str, Any], ceiling_rows: list[dict[str, str]], result: VerifyResult
) -> None:
    """The top-level figures of a schema-4 summary: plausibility limits, launch floor, frozen_at, their warnings."""
    limits = _limits(plan, ceiling_rows)
    applied = bool(plan["is_gpu"]) and plan["backend"] == "cuda-events"
    launches = sum(r["kind"] == "launch" for r in ceiling_rows)
    figures = {
        "bandwidth_margin": limits.margin,
        "launch_floor_fraction": limits.fraction,
        "applied": applied,
        "bandwidth_limit_gbps": None if limits.ceiling is None else limits.ceiling * (1 + limits.margin),
        "time_limit_ns": None if limits.floor is None else limits.fraction * limits.floor,
    }
    problems = _diff("plausibility", summary.get("plausibility") or {}, figures, tuple(figures))
    problems += _diff(
        "ceilings",
        summary.get("ceilings") or {},
        {"launch_floor_ns": _launch_floor(ceiling_rows), "launch_samples": launches},
        ("launch_floor_ns", "launch_samples"),
    )
    warnings = summary.get("warnings", [])
    if applied and not launches and NO_LAUNCH_WARNING not in warnings:
        problems.append(f"summary warnings lack {NO_LAUNCH_WARNING!r}")
    result.add(
        "plausibility",
        problems,
        "judged: " + ", ".join(f"{k} {v}" for k, v in figures.items() if k.endswith(("gbps", "ns")))
        if applied
        else "not judged: not a GPU run timed with CUDA events",
    )

    frozen_at = plan.get("frozen_at")
    problems = _diff("summary", summary, {"frozen_at": frozen_at}, ("frozen_at",))
    if "frozen_at" not in summary:
        problems.append("summary has no frozen_at (null when the protocol was not frozen)")
    if frozen_at is None and UNFROZEN_WARNING not in warnings:
        problems.append(f"summary warnings lack {UNFROZEN_WARNING!r}")
    result.add(
        "summary frozen_at",
        problems,
        "not frozen, and the summary warns" if frozen_at is None else f"frozen at {frozen_at}",
    )


def _check_clocks(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], result: VerifyResult) -> None:
    top, fraction, threshold = _threshold(plan)
    flagged = sum(_throttled(s, threshold) for s in samples)
    figures = {
        "max_sm_mhz": top,
        "throttle_fraction": fraction,
        "threshold_mhz": threshold,
        "samples_with_clock": sum(s.sm_mhz is not None for s in samples),
        "throttled_samples": flagged,
    }
    problems = _diff("clocks", summary.get("clocks") or {}, figures, CLOCK_FIELDS)
    if flagged and not any(
        w.startswith(f"{flagged} of {len(samples)} timing samples were throttled") and f"{threshold:g} MHz" in w
        for w in summary.get("warnings", [])
    ):
        problems.append(
            f"summary warnings do not say {flagged} of {len(samples)} samples were throttled below {threshold:g} MHz"
        )
    result.add(
        "clocks",
        problems,
        f"{figures['samples_with_clock']} samples with a clock reading, {flagged} "
        f"throttled (threshold {threshold} MHz)",
    )


def _check_calibration(
    plan: dict[str, Any],
    summary: dict[str, Any],
    control: str | None,
    speedups: dict[str, list[tuple[str, float, str]]],
    intervals: dict[str, list[tuple[float, float]]],
    medians: dict[tuple[str, str], float | None] | None,
    result: VerifyResult,
    contract: Contract,
) -> None:
    """Calibration figures; `medians` None for a schema-2 summary, written before the realized slowdown.
    A false positive of an A/A arm is a win or a loss; schema 4 counts its inconclusive verdicts apart."""
    arms = [(a["name"], _calibration_arm(a["name"])) for a in plan["arms"]]
    arms = [(name, parsed) for name, parsed in arms if parsed]
    recorded = summary.get("calibration")
    if not arms:
        result.add(
            "calibration",
            [] if recorded is None else ["summary has a calibration section but plan.json has no aa:/slow: arm"],
            "no calibration arms",
        )
        return
    if not isinstance(recorded, dict):
        result.add("calibration", ["summary has no calibration section for the aa:/slow: arms"], "")
        return
    settings = {**CALIBRATION_DEFAULTS, **(plan.get("calibration") or {})}
    max_fpr, min_power = float(settings["max_false_positive_rate"]), float(settings["min_power"])
    nominal = float(settings["injected_slowdown"])
    problems = _diff(
        "calibration",
        recorded,
        {
            "injected_slowdown": float(settings["injected_slowdown"]),
            "max_false_positive_rate": max_fpr,
            "min_power": min_power,
        },
        ("injected_slowdown", "max_false_positive_rate", "min_power"),
    )
    passed = True
    recorded_arms = recorded.get("arms") or {}
    for name, (kind, base) in arms:
        verdicts = [v for _, _, v in speedups.get(name, [])]
        n = len(verdicts)
        if kind == "aa":
            claimed = sum(v in ("win", "loss") for v in verdicts)
            widths = [high - low for low, high in intervals.get(name, [])]
            counts = (
                {"false_positives": claimed, "inconclusive": verdicts.count("inconclusive")}
                if contract.checked
                else {"not_tie": claimed}
            )
            figures = {
                "kind": kind,
                "base": base,
                "n_cases": n,
                **counts,
                "false_positive_rate": claimed / n if n else None,
                "mean_ci_width": math.fsum(widths) / n if n else None,
            }
            passed = passed and n > 0 and figures["false_positive_rate"] <= max_fpr
        else:
            losses = verdicts.count("loss")
            figures = {"kind": kind, "base": base, "n_cases": n, "losses": losses, "power": losses / n if n else None}
            passed = passed and n > 0 and figures["power"] >= min_power
            if medians is not None:
                problems += _realized_problems(
                    name,
                    speedups.get(name, []),
                    base,
                    medians,
                    nominal,
                    recorded_arms.get(name) or {},
                    str(recorded.get("sentence", "")),
                    summary.get("warnings", []),
                )
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


def _realized_problems(
    name: str,
    rows: list[tuple[str, float, str]],
    base: str,
    medians: dict[tuple[str, str], float | None],
    nominal: float,
    recorded: dict[str, Any],
    sentence: str,
    warnings: list[str],
) -> list[str]:
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
    figures = {
        "realized_min": low,
        "realized_max": high,
        "power_at_nominal": near.count("loss") / len(near) if near else None,
    }
    problems = _diff(f"calibration {name}", recorded, figures, tuple(figures))
    shown = recorded.get("realized_slowdown")
    if (
        not isinstance(shown, dict)
        or list(shown) != list(realized)
        or not all(_same(shown[case], value) for case, value in realized.items())
    ):
        problems.append(f"calibration {name} realized_slowdown: summary {shown!r} != recomputed {realized!r}")
    sentence_part = (
        f"{name} ({100 * nominal:g}% nominal, "
        + ("n/a" if low is None else f"{100 * low:.1f}-{100 * high:.1f}%")
        + " realized)"
    )
    power_part = "power at nominal " + (
        "n/a" if figures["power_at_nominal"] is None else f"{100 * figures['power_at_nominal']:.0f}%"
    )
    missing = [part for part in (sentence_part, power_part) if part not in sentence]
    if missing:
        problems.append(f"calibration sentence {sentence!r} does not state {missing}")
    if (
        low is not None
        and low > NOMINAL_FACTOR * nominal
        and not any(
            w.startswith(f"calibration arm {name}: the injected slowdown was never as small as nominal")
            and w.endswith("power at nominal is not demonstrated")
            for w in warnings
        )
    ):
        problems.append(
            f"summary warnings do not say that {name}'s injected slowdown was never as small as "
            f"nominal (realized at least {100 * low:.1f}%, nominal {100 * nominal:g}%)"
        )
    return problems


def _entry_problems(
    where: str, entry: dict[str, Any], figures: dict[str, Any], state: ArmState, fields: tuple[str, ...] = FIGURE_FIELDS
) -> list[str]:
    problems = _diff(where, entry, figures, fields)
    if entry.get("status") != state.status:
        problems.append(f"{where} status: summary {entry.get('status')!r} != {state.status!r}")
    if state.reason is not None and entry.get("reason") != state.reason:
        problems.append(f"{where} reason: summary {entry.get('reason')!r} != recomputed {state.reason!r}")
    if state.messages is not None and entry.get("messages") != state.messages:
        problems.append(
            f"{where} messages: summary {entry.get('messages')!r} != the failed timed checks' {state.messages!r}"
        )
    return problems


def _describe(figures: dict[str, Any], status: str) -> str:
    if figures["speedup"] is not None:
        return (
            f"speedup {figures['speedup']:.4f} [{figures['ci_low']:.4f}, {figures['ci_high']:.4f}] {figures['verdict']}"
        )
    if figures["median_ns_per_call"] is not None:
        return f"{status}, median {figures['median_ns_per_call']:.1f} ns/call"
    return status


def _ceiling_median(rows: list[dict[str, str]], kind: str) -> float | None:
    rates = [float(r["bytes"]) / float(r["ns"]) for r in rows if r["kind"] == kind]
    return _median(rates) if rates else None


def _arm_figures(
    case: dict[str, Any],
    times: dict[tuple[int, int], float] | None,
    control_times: dict[tuple[int, int], float] | None,
    copy: float | None,
    bootstrap: dict[str, Any],
    band: float,
    contract: Contract,
) -> dict[str, Any]:
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
            figures.update(ci_low=low, ci_high=high, verdict=contract.verdict(low, high, band))
    return figures


def _check_aggregates(
    plan: dict[str, Any],
    summary: dict[str, Any],
    control: str | None,
    speedups: dict[str, list[tuple[str, float, str]]],
    disqualified: dict[str, dict[str, list[tuple[str, str]]]],
    correctness: list[dict[str, Any]],
    bootstrap: dict[str, Any],
    result: VerifyResult,
    contract: Contract,
) -> None:
    """Per-arm aggregates and the gate. Schema 4: the gate fails an arm disqualified in any case (failed
    correctness, failed while timed, implausible), and its reasons are recomputed word for word."""
    no_loss, floor = _gate_terms(plan["gate"])
    compared = [a["name"] for a in plan["arms"] if a["available"] and a["name"] != control]
    recorded = summary.get("aggregates", {})
    recorded_gate = summary.get("gate", {}).get("arms", {})
    extra = sorted(set(recorded) - set(compared)) + sorted(set(recorded_gate) - set(compared))
    result.add(
        "aggregate arms",
        [f"summary has aggregates/gate for arms not compared: {extra}"] if extra else [],
        f"compared arms {compared}",
    )
    recomputed_passed: list[str] = []
    for name in compared:
        rows = speedups.get(name, [])
        causes = disqualified.get(name, {})
        figures = _aggregate(rows, len(causes.get("failed correctness", [])), bootstrap)
        reasons = _rule_reasons(figures, no_loss, floor)
        fields = AGGREGATE_FIELDS
        if contract.checked:
            fields = CHECKED_AGGREGATE_FIELDS
            figures.update(
                inconclusive=[v for _, _, v in rows].count("inconclusive"),
                failed_while_timed=len(causes.get(FAILED_WHILE_TIMED, [])),
                implausible=len(causes.get(IMPLAUSIBLE, [])),
                ulp_hist=_ulp_sum(correctness, name),
            )
            reasons = [
                f"{cause} in {len(hits)} case(s) (first: {hits[0][0]}: {hits[0][1]})"
                for cause in ("failed correctness", FAILED_WHILE_TIMED, IMPLAUSIBLE, NOT_COMPARED)
                if (hits := causes.get(cause))
            ] + reasons
        elif figures["failed_correctness"]:
            reasons.insert(0, f"failed correctness in {figures['failed_correctness']} case(s)")
        problems = _diff(f"arm {name}", recorded.get(name, {}), figures, fields)
        passed = not reasons
        if passed:
            recomputed_passed.append(name)
        recorded_passed = recorded_gate.get(name, {}).get("passed")
        if recorded_passed is not passed:
            problems.append(f"arm {name} gate: summary {recorded_passed!r} != recomputed {passed}")
        if contract.checked and recorded_gate.get(name, {}).get("reasons") != reasons:
            problems.append(
                f"arm {name} gate reasons: summary {recorded_gate.get(name, {}).get('reasons')!r} != "
                f"recomputed {reasons!r}"
            )
        shown = f"geomean {figures['geomean']:.4f}" if figures["geomean"] is not None else "no speedups"
        counts = f"{figures['wins']}W/{figures['ties']}T/{figures['losses']}L" + (
            f"/{figures['inconclusive']}I" if contract.checked else ""
        )
        result.add(f"aggregates arm={name}", problems, f"{shown}, {counts}, gate {'pass' if passed else 'fail'}")
    gate = summary.get("gate", {})
    result.add(
        "gate",
        []
        if gate.get("passed_arms") == recomputed_passed and gate.get("rule") == plan["gate"]
        else [
            f"summary gate rule {gate.get('rule')!r}, passed_arms {gate.get('passed_arms')} != "
            f"recomputed rule {plan['gate']!r}, passed_arms {recomputed_passed}"
        ],
        f"rule {plan['gate']!r}: passed {recomputed_passed}",
    )


def _rule_reasons(figures: dict[str, Any], no_loss: bool, floor: float | None) -> list[str]:
    """Why an arm fails the gate's own terms (no_loss counts losses only, never inconclusive verdicts)."""
    reasons = []
    if no_loss and figures["losses"]:
        reasons.append(f"no_loss: {figures['losses']} loss(es)")
    if floor is not None and figures["geomean"] is None:
        reasons.append(f"geomean>={floor:g}: no case timed against the control")
    elif floor is not None and figures["geomean"] < floor:
        reasons.append(f"geomean>={floor:g}: geomean is {figures['geomean']:.4f}")
    return reasons


def _ulp_sum(correctness: list[dict[str, Any]], arm: str) -> list[int] | None:
    """Element-wise sum of the arm's correctness `ulp_hist` rows (rows without one skipped); None if none has one."""
    hists = [row["ulp_hist"] for row in correctness if row.get("arm") == arm and isinstance(row.get("ulp_hist"), list)]
    return [sum(column) for column in zip(*hists, strict=False)] if hists else None


def _aggregate(rows: list[tuple[str, float, str]], failed: int, bootstrap: dict[str, Any]) -> dict[str, Any]:
    verdicts = [v for _, _, v in rows]
    figures: dict[str, Any] = dict.fromkeys(AGGREGATE_FIELDS)
    figures.update(
        n_cases=len(rows),
        wins=verdicts.count("win"),
        ties=verdicts.count("tie"),
        losses=verdicts.count("loss"),
        failed_correctness=failed,
    )
    if not rows:
        return figures
    values = [s for _, s, _ in rows]
    logs = np.log(np.array(values))
    idx = _resample_indices(int(bootstrap["seed"]), int(bootstrap["resamples"]), len(values))
    low, high = _percentile_ci(np.exp(logs[idx].sum(axis=1) / len(values)), float(bootstrap["confidence"]))
    worst_case, worst, _ = min(rows, key=lambda row: row[1])
    figures.update(
        geomean=math.exp(math.fsum(math.log(v) for v in values) / len(values)),
        geomean_ci_low=low,
        geomean_ci_high=high,
        mean=math.fsum(values) / len(values),
        worst=worst,
        worst_case=worst_case,
    )
    return figures
