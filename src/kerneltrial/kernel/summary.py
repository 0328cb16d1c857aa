"""Build summary.json of a kernel run directory: every figure the report shows.

Reads plan.json, protocol.toml, correctness.jsonl, timings.csv, ceilings.csv and, in runs
with timed checks, timed_checks.jsonl (the contract in docs/VERIFY.md;
the files in docs/RUNDIR.md) and computes the figures with `kerneltrial.stats`. The runner calls
`write_summary(run_dir)` at the end of a run.

plan.json `checks`, `host`, `floor` and `isolated` pick the schema, one adapter each (`SchemaV3`
to `SchemaV7`): a run without `checks` (every run before issue 10) gets `kerneltrial.summary/3`,
unchanged; `"checks": 1` or 2 gets `kerneltrial.summary/4`, with `host` (issue 16)
`kerneltrial.summary/5`, and with `floor` too (issue 27) `kerneltrial.summary/6`; `"checks": 3`
(isolated arms, issue 24; with `host` and `floor`) `kerneltrial.summary/7`, each described after
the schema-3 fields.

summary.json (schema `kerneltrial.summary/3`):
  schema, protocol_sha256, backend, is_gpu, l2, op, label (plan's timing_label if given),
  control, tie_band, bootstrap, arms (copied from plan.json), noise_rule (plan's, or null),
  ceilings: {copy_gbps, copy_samples, read_gbps, read_samples},
  clocks: {max_sm_mhz, throttle_fraction, threshold_mhz, samples_with_clock, throttled_samples},
  cases: [{case, shape, layout, dtype, bytes, calls, rounds, units_planned, injected_delay_ns,
           arms: {name: {kind, status, median_ns_per_call, n_samples, ci_units, speedup,
                         ci_low, ci_high, verdict, gbps, pct_of_copy_ceiling, throttled_samples,
                         spread, messages, reason}}}],
  aggregates: {arm: {n_cases, geomean, geomean_ci_low, geomean_ci_high, mean, worst,
                     worst_case, wins, ties, losses, failed_correctness}},
  gate: {rule, arms: {arm: {passed, reasons}}, passed_arms},
  calibration (only when an `aa:`/`slow:` arm exists): {injected_slowdown,
      max_false_positive_rate, min_power,
      arms: {arm: {kind: "aa", base, n_cases, not_tie, false_positive_rate, mean_ci_width}
                  or {kind: "slow", base, n_cases, losses, power, realized_slowdown: {case: float},
                      realized_min, realized_max, power_at_nominal}}, passed, sentence},
  warnings: [str],
  inputs_sha256: {file: sha256} of plan.json, correctness.jsonl, timings.csv, ceilings.csv
`status` is `timed`, `failed correctness`, `unavailable` or `not timed` (no correctness check
or no timing rows: an incomplete run). `ci_units` is the number of (seed, round) units shared
with the control and used by the CI. Figures that do not apply (the control's own speedup,
an untimed arm) are null. Medians are ns per call; GB/s is bytes per ns.
`rounds` is the case's `rounds` in plan.json (the preregistered noise rule may have added
rounds), else plan `rounds`. `spread` is (p90 - p10) / median of the arm's per-sample times;
`throttled_samples` counts its samples whose SM clock was below `clocks.threshold_mhz`. The
top-level clock counts are over every row of timings.csv. Schema 1 summaries (written before
clocks, per-case rounds and calibration arms existed) lack these fields; schema 2 summaries lack
the realized slowdown of `slow:` arms (`realized_slowdown`, `realized_min`, `realized_max`,
`power_at_nominal`).

Schema `kerneltrial.summary/4` (plan.json `"checks": 1`) adds, over schema 3:
  statuses `failed while timed` (a timed check of the (case, arm) failed; `messages` are the
  failing rows' messages, figures null) and `implausible` (figures kept, speedup, CI and
  verdict null, `reason` says why); verdict `inconclusive` (a CI straddling a band edge);
  exact (plan's), frozen_at (plan's; null: not frozen, and a warning says so),
  plausibility: {bandwidth_margin, launch_floor_fraction, applied, bandwidth_limit_gbps,
                 time_limit_ns},
  timed_checks: {rows, failed},
  ceilings gain launch_floor_ns, launch_samples;
  aggregates gain inconclusive, failed_while_timed, implausible (cases) and ulp_hist (the
  element-wise sum of the arm's correctness `ulp_hist` rows, null when none has one);
  gate reasons name each disqualification's count and first case;
  calibration `aa:` arms: false_positives (win or loss) and inconclusive instead of not_tie;
  inputs_sha256 also covers timed_checks.jsonl.

Schema `kerneltrial.summary/5` (plan.json `host`, host.csv) adds, over schema 4:
  host: {samples, calls, rows} (plan's samples and calls per sample; rows of host.csv),
  and in every case's arm entry host_ns_per_call (median over the arm's host.csv samples of
  ns / calls; null without rows), host_samples (its rows) and host_behind (its samples whose
  device was still busy at the end: device-bound, see trial/timing.py `host_sample`);
  inputs_sha256 also covers host.csv.

Schema `kerneltrial.summary/6` (plan.json `floor`, issue 27) adds, over schema 5:
  every case floor_ns (the speed-of-light floor: the Triton launch floor + bytes / copy_gbps,
  kernel/floor.py; null without `triton_launch` or `copy` rows) and in every arm entry
  fraction_of_floor (floor_ns / median_ns_per_call; null where either is null).

Schema `kerneltrial.summary/7` (plan.json `"checks": 3`, isolated arms, issue 24) adds, over schema 6:
  isolation: {arms (plan's `isolated`), far_inside, bounds: [{case, arm, samples,
  claimed_ns_per_call, bound_ns_per_call, ratio}]}: per timed (case, isolated arm) the median
  ns / calls the arm's worker claimed and the median wall_ns / calls the harness measured around
  the same samples (kernel/bounds.py); a warning for each claim more than `far_inside` times
  inside its bound. Isolated arms have no host.csv rows (host figures null).

Any schema: when ceilings.csv has `triton_launch` rows (a one-element Triton kernel, measured
from issue 16 on, trial/floor.py), `ceilings` gains triton_launch_floor_ns (their median) and
triton_launch_samples (their count); summaries of runs without such rows have neither key.
Likewise `copy_matched` rows (a copy of each case's traffic, trial/runner.py `run_ceilings`) give
every case matched_copy_gbps: the median GB/s of the copy of its bytes (rounded down to even).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from kerneltrial import gate_rule, stats
from kerneltrial.kernel.bounds import isolation_fields
from kerneltrial.kernel.floor import CaseFloors
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl, write_json
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.rundir.layout import (
    COPY_MATCHED,
    HOST,
    INPUT_FILES,
    PARTIAL_LAYOUT_KINDS,
    TIMED_CHECKS,
    TRITON_LAUNCH,
)

SCHEMA_V3 = "kerneltrial.summary/3"
SCHEMA_V4 = "kerneltrial.summary/4"
SCHEMA_V5 = "kerneltrial.summary/5"
SCHEMA_V6 = "kerneltrial.summary/6"
SCHEMA = "kerneltrial.summary/7"
MIN_UNITS = 10  # fewer (seed, round) units than this and a case's CI gets a warning

TIMED = "timed"
FAILED = "failed correctness"
UNAVAILABLE = "unavailable"
NOT_TIMED = "not timed"
FAILED_WHILE_TIMED = "failed while timed"
IMPLAUSIBLE = "implausible"
NOT_COMPARED = "not compared with the control"  # timed, but the control has no timing in the case

UNFROZEN_WARNING = "the protocol was not frozen before the run: its settings were not preregistered"
NO_LAUNCH_WARNING = "ceilings.csv has no launch samples; the launch-floor plausibility check was not applied"

TIMING_COLUMNS = ["case", "seed", "round", "position", "arm", "calls", "ns"]
CLOCK_COLUMNS = ["sm_mhz", "mem_mhz"]  # optional; empty where the clock is unknown
CEILING_COLUMNS = ["kind", "sample", "bytes", "ns"]
HOST_COLUMNS = ["case", "arm", "sample", "calls", "ns", "behind"]


@dataclass(frozen=True)
class TimedCheck:
    """One row of timed_checks.jsonl: the check of one timing sample's output (the fields the summary uses)."""

    case: str
    seed: int
    round: int
    arm: str
    passed: bool
    message: str


@dataclass(frozen=True)
class RunFiles:
    """The raw files of a kernel run directory, parsed."""

    plan: dict[str, Any]
    protocol_sha256: str
    correctness: list[dict[str, Any]]
    timings: pd.DataFrame
    ceilings: pd.DataFrame
    timed_checks: list[TimedCheck] | None = None  # None: the run has no timed_checks.jsonl
    host: pd.DataFrame | None = None  # None: the run has no host.csv


def timing_label(backend: str, is_gpu: bool) -> str:
    """What the timings measure, in words; CPU runs say plainly they are not GPU performance."""
    if not is_gpu:
        if backend == "host-clock":
            return "host clock, Triton interpreter: NOT GPU performance"
        return f"{backend} without a GPU: NOT GPU performance"
    if backend == "cuda-graph":
        return "CUDA events on GPU, replayed as CUDA graphs (launch overhead amortised)"
    return "CUDA events on GPU"


def _require(run_dir: Path, name: str) -> Path:
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir}: missing {name}; not a complete kernel run directory")
    return path


def _read_csv(path: Path, columns: list[str], dtypes: dict[str, type]) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype=dtypes)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise RunDirError(f"{path}: missing column(s) {missing}; expected header {','.join(columns)}")
    return frame


def load_run(run_dir: Path) -> RunFiles:
    """Parse the raw files of a kernel run directory; RunDirError names anything missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    protocol_bytes = _require(run_dir, "protocol.toml").read_bytes()
    plan = read_json(_require(run_dir, "plan.json"))
    correctness = read_jsonl(_require(run_dir, "correctness.jsonl"))
    timings_path = _require(run_dir, "timings.csv")
    timings = _read_csv(timings_path, TIMING_COLUMNS, {"case": str, "arm": str})
    for column in CLOCK_COLUMNS:
        if column not in timings.columns:
            timings[column] = float("nan")  # a run directory from before clocks were recorded
        try:
            timings[column] = pd.to_numeric(timings[column]).astype(float)
        except (TypeError, ValueError) as error:
            raise RunDirError(f"{timings_path}: column {column} is not MHz or empty ({error})") from error
    ceilings = _read_csv(_require(run_dir, "ceilings.csv"), CEILING_COLUMNS, {"kind": str})
    timed_checks = _timed_checks(run_dir / TIMED_CHECKS) if (run_dir / TIMED_CHECKS).is_file() else None
    host = _read_csv(run_dir / HOST, HOST_COLUMNS, {"case": str, "arm": str}) if (run_dir / HOST).is_file() else None
    return RunFiles(plan, sha256_bytes(protocol_bytes), correctness, timings, ceilings, timed_checks, host)


def _timed_checks(path: Path) -> list[TimedCheck]:
    rows = []
    for number, row in enumerate(read_jsonl(path), start=1):
        try:
            rows.append(
                TimedCheck(
                    str(row["case"]),
                    int(row["seed"]),
                    int(row["round"]),
                    str(row["arm"]),
                    row["passed"] is True,
                    str(row.get("message") or ""),
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            raise RunDirError(
                f"{path}: row {number}: not a timed-check row ({error!r}); expected the fields case, "
                "seed, round, arm, values_seed, passed, max_abs, max_rel, ulp, message"
            ) from error
    return rows


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list) else int(value)


def case_rounds(plan: dict[str, Any], case: dict[str, Any] | None = None) -> int:
    """Rounds run for a case: its own `rounds` (the noise rule may have added some), else plan `rounds`."""
    if case is not None and case.get("rounds") is not None:
        return int(case["rounds"])
    return _count(plan["rounds"])


def planned_units(plan: dict[str, Any], case: dict[str, Any] | None = None) -> int:
    """Number of (seed, round) units of a case (or of the plan); `seeds`/`rounds` may be a list or a count."""
    return _count(plan["seeds"]) * case_rounds(plan, case)


def control_arm(plan: dict[str, Any]) -> str:
    """Name of the single available control arm; RunDirError otherwise."""
    controls = [arm for arm in plan["arms"] if arm["kind"] == "control"]
    if len(controls) != 1 or not controls[0]["available"]:
        names = [arm["name"] for arm in controls]
        raise RunDirError(f"plan.json: need exactly one available arm of kind 'control', found {names}")
    return controls[0]["name"]


def correctness_by_case_arm(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((str(row["case"]), row["arm"]), []).append(row)
    return grouped


def unit_series(timings: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """Per-call ns of every (case, arm), indexed by (seed, round) and sorted; duplicates are an error."""
    per_call = timings.assign(per_call=timings["ns"] / timings["calls"])
    result: dict[tuple[str, str], pd.Series] = {}
    for (case, arm), rows in per_call.groupby(["case", "arm"], sort=False):
        series = rows.set_index(["seed", "round"])["per_call"].astype(float).sort_index()
        if series.index.has_duplicates:
            duplicated = sorted(set(series.index[series.index.duplicated()]))
            raise RunDirError(f"timings.csv: case {case!r} arm {arm!r} has duplicate (seed, round) rows {duplicated}")
        result[(case, arm)] = series
    return result


# ---------------------------------------------------------------- one adapter per summary schema


class SchemaV3:
    """Runs whose plan.json has no `checks` (every run before issue 10): summary/3, as it always was."""

    schema = SCHEMA_V3
    input_files: tuple[str, ...] = INPUT_FILES

    def verdict(self, ci: stats.Interval, tie_band: float) -> str:
        return stats.three_way_verdict(ci, tie_band)

    def timed_failures(self, case_id: str, arm: str) -> list[str]:
        """Messages of the arm's failed timed checks in the case: none before timed checks existed."""
        return []

    def implausibility(self, achieved_gbps: float, median_ns: float) -> str | None:
        """Why a timed arm's figures cannot be real work: never judged before summary/4."""
        return None

    def ceiling_fields(self) -> dict[str, Any]:
        return {}

    def aggregate_fields(self, name: str, cases: list[dict[str, Any]], agg: stats.ArmAggregate) -> dict[str, Any]:
        return {}

    def gate_verdict(
        self, gate: gate_rule.Gate, agg: stats.ArmAggregate, name: str, cases: list[dict[str, Any]]
    ) -> stats.GateVerdict:
        return stats.gate_verdict(gate, agg, sum(c["arms"][name]["status"] == FAILED for c in cases))

    def aa_fields(self, figures: stats.AACalibration) -> dict[str, Any]:
        return {"not_tie": figures.false_positives}  # verdicts are win, tie or loss: not tie = win or loss

    def top_level_fields(self, warnings: list[str]) -> dict[str, Any]:
        return {}

    def host_fields(self, case_id: str, arm: str) -> dict[str, Any]:
        """Host cost figures of one (case, arm): none before summary/5."""
        return {}

    def floor_fields(self, case_bytes: int, arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The case's speed-of-light floor (and each arm's fraction of it): none before summary/6."""
        return {}


@dataclass
class SchemaV4(SchemaV3):
    """plan.json `"checks": 1` (issue 10, what is timed is what was checked): summary/4."""

    plan: dict[str, Any]
    timed_checks: list[TimedCheck]
    correctness: list[dict[str, Any]]
    limits: stats.PlausibilityLimits
    launch_floor_ns: float | None  # measured, reported even where plausibility is not judged
    launch_samples: int
    applied: bool  # plausibility is judged: a GPU run timed with CUDA events
    failures: dict[tuple[str, str], list[str]] = field(init=False)

    schema = SCHEMA_V4
    input_files = (*INPUT_FILES, TIMED_CHECKS)

    def __post_init__(self) -> None:
        self.failures = {}
        for row in self.timed_checks:
            if not row.passed:
                self.failures.setdefault((row.case, row.arm), []).append(row.message or "failed")

    @classmethod
    def from_run(cls, run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV4:
        plan = run.plan
        if run.timed_checks is None:
            raise RunDirError(
                f"plan.json has checks {plan['checks']!r} but the run directory has no {TIMED_CHECKS}; "
                "a run with timed checks writes one row per timing sample"
            )
        settings = plan.get("plausibility")
        if not isinstance(settings, dict) or not {"bandwidth_margin", "launch_floor_fraction"} <= set(settings):
            raise RunDirError(
                f"plan.json plausibility {settings!r}: a checks-1 plan holds "
                "{bandwidth_margin, launch_floor_fraction} (the runner writes them)"
            )
        applied = bool(plan["is_gpu"]) and plan["backend"] == "cuda-events"
        ceilings = [c for c in (copy_gbps, read_gbps) if c is not None]
        launch = run.ceilings[run.ceilings["kind"] == "launch"]["ns"].to_numpy()
        floor = stats.launch_floor(launch)
        limits = stats.PlausibilityLimits(
            bandwidth_margin=float(settings["bandwidth_margin"]),
            launch_floor_fraction=float(settings["launch_floor_fraction"]),
            ceiling_gbps=max(ceilings) if applied and plan.get("l2") == "cold" and ceilings else None,
            launch_floor_ns=floor if applied else None,
        )
        return cls(plan, run.timed_checks, run.correctness, limits, floor, len(launch), applied)

    def verdict(self, ci: stats.Interval, tie_band: float) -> str:
        return stats.verdict(ci, tie_band)

    def timed_failures(self, case_id: str, arm: str) -> list[str]:
        return self.failures.get((case_id, arm), [])

    def implausibility(self, achieved_gbps: float, median_ns: float) -> str | None:
        return stats.implausibility(achieved_gbps, median_ns, self.limits)

    def ceiling_fields(self) -> dict[str, Any]:
        return {"launch_floor_ns": self.launch_floor_ns, "launch_samples": self.launch_samples}

    def aggregate_fields(self, name: str, cases: list[dict[str, Any]], agg: stats.ArmAggregate) -> dict[str, Any]:
        hists = [row.get("ulp_hist") for row in self.correctness if row["arm"] == name]
        return {
            "inconclusive": agg.inconclusive,
            "failed_while_timed": sum(c["arms"][name]["status"] == FAILED_WHILE_TIMED for c in cases),
            "implausible": sum(c["arms"][name]["status"] == IMPLAUSIBLE for c in cases),
            "ulp_hist": stats.ulp_hist_sum(hists),
        }

    def gate_verdict(
        self, gate: gate_rule.Gate, agg: stats.ArmAggregate, name: str, cases: list[dict[str, Any]]
    ) -> stats.GateVerdict:
        disqualified = []
        for cause in (FAILED, FAILED_WHILE_TIMED, IMPLAUSIBLE):
            hit = [c for c in cases if c["arms"][name]["status"] == cause]
            if hit:
                first = hit[0]["arms"][name]
                disqualified.append(
                    stats.Disqualification(
                        cause, tuple(c["case"] for c in hit), first["reason"] or first["messages"][0]
                    )
                )
        # Timed but without a verdict: the control was excluded there (an arm cannot pass `no_loss`
        # by getting the control disqualified in every case).
        uncompared = [c for c in cases if c["arms"][name]["status"] == TIMED and c["arms"][name]["verdict"] is None]
        if uncompared:
            control = next(a for a, e in uncompared[0]["arms"].items() if e["kind"] == "control")
            disqualified.append(
                stats.Disqualification(
                    NOT_COMPARED,
                    tuple(c["case"] for c in uncompared),
                    f"no verdict against the control (control: {uncompared[0]['arms'][control]['status']})",
                )
            )
        return stats.gate_verdict_v4(gate, agg, disqualified)

    def aa_fields(self, figures: stats.AACalibration) -> dict[str, Any]:
        return {"false_positives": figures.false_positives, "inconclusive": figures.inconclusive}

    def top_level_fields(self, warnings: list[str]) -> dict[str, Any]:
        frozen_at = self.plan.get("frozen_at")
        if frozen_at is None:
            warnings.append(UNFROZEN_WARNING)
        if self.applied and not self.launch_samples:
            warnings.append(NO_LAUNCH_WARNING)
        return {
            "exact": self.plan.get("exact"),
            "frozen_at": frozen_at,
            "plausibility": {
                "bandwidth_margin": self.limits.bandwidth_margin,
                "launch_floor_fraction": self.limits.launch_floor_fraction,
                "applied": self.applied,
                "bandwidth_limit_gbps": self.limits.bandwidth_limit_gbps,
                "time_limit_ns": self.limits.time_limit_ns,
            },
            "timed_checks": {"rows": len(self.timed_checks), "failed": sum(not r.passed for r in self.timed_checks)},
        }


@dataclass
class SchemaV5(SchemaV4):
    """plan.json `host` (issue 16, host cost per call): summary/5."""

    host: pd.DataFrame = field(default_factory=pd.DataFrame)
    host_samples: int = 0
    host_calls: int = 0

    schema = SCHEMA_V5
    input_files = (*INPUT_FILES, TIMED_CHECKS, HOST)

    @classmethod
    def from_run(cls, run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV5:
        settings = run.plan["host"]
        if run.host is None:
            raise RunDirError(
                f"plan.json has host {settings!r} but the run directory has no {HOST}; "
                "a run with a host stage writes one row per host sample"
            )
        base = super().from_run(run, copy_gbps, read_gbps)
        return replace(base, host=run.host, host_samples=int(settings["samples"]), host_calls=int(settings["calls"]))

    def host_fields(self, case_id: str, arm: str) -> dict[str, Any]:
        rows = self.host[(self.host["case"] == case_id) & (self.host["arm"] == arm)]
        per_call = (rows["ns"] / rows["calls"]).to_numpy(dtype=float)
        return {
            "host_ns_per_call": stats.median(per_call) if len(rows) else None,
            "host_samples": len(rows),
            "host_behind": int(rows["behind"].astype(int).sum()),
        }

    def top_level_fields(self, warnings: list[str]) -> dict[str, Any]:
        return super().top_level_fields(warnings) | {
            "host": {"samples": self.host_samples, "calls": self.host_calls, "rows": len(self.host)}
        }


@dataclass
class SchemaV6(SchemaV5):
    """plan.json `floor` (issue 27): summary/6, the floor figures of kernel/floor.py."""

    floors: CaseFloors | None = None

    schema = SCHEMA_V6

    @classmethod
    def from_run(cls, run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV6:
        launches = run.ceilings[run.ceilings["kind"] == TRITON_LAUNCH]["ns"].to_numpy(dtype=float)
        floors = CaseFloors.for_plan(run.plan, stats.launch_floor(launches), copy_gbps)
        return replace(super().from_run(run, copy_gbps, read_gbps), floors=floors)

    def floor_fields(self, case_bytes: int, arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return self.floors.fields(case_bytes, arms) if self.floors else {}


@dataclass
class SchemaV7(SchemaV6):
    """plan.json `checks` 3 (issue 24, isolated arms): summary/7."""

    timings: pd.DataFrame = field(default_factory=pd.DataFrame)

    schema = SCHEMA

    @classmethod
    def from_run(cls, run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV7:
        if "wall_ns" not in run.timings.columns:
            raise RunDirError("plan.json has checks 3 but timings.csv has no wall_ns column (the harness's bound)")
        return replace(super().from_run(run, copy_gbps, read_gbps), timings=run.timings)

    def top_level_fields(self, warnings: list[str]) -> dict[str, Any]:
        return super().top_level_fields(warnings) | {"isolation": isolation_fields(self.plan, self.timings, warnings)}


def schema_of(run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV3:
    """The adapter plan.json `checks` and `host` ask for; RunDirError for a version this code does not know."""
    checks = run.plan.get("checks")
    if checks is None:
        return SchemaV3()
    if checks in (1, 2) and not isinstance(checks, bool):  # 2: every call on fresh values, a random one checked
        schema = SchemaV6 if "floor" in run.plan else SchemaV5 if "host" in run.plan else SchemaV4
        return schema.from_run(run, copy_gbps, read_gbps)
    if checks == 3 and not isinstance(checks, bool) and {"host", "floor"} <= run.plan.keys():  # 3: isolated arms
        return SchemaV7.from_run(run, copy_gbps, read_gbps)
    raise RunDirError(
        f"plan.json checks {checks!r}: this kerneltrial reads timed-check contracts 1, 2 and 3 (3 with host and floor; "
        "or none); update kerneltrial to read this run"
    )


def _empty_entry(kind: str, status: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "status": status,
        "median_ns_per_call": None,
        "n_samples": 0,
        "ci_units": None,
        "speedup": None,
        "ci_low": None,
        "ci_high": None,
        "verdict": None,
        "gbps": None,
        "pct_of_copy_ceiling": None,
        "throttled_samples": 0,
        "spread": None,
        "messages": [],
        "reason": None,
    }


def takes_layout(arm: dict[str, Any], case: dict[str, Any]) -> bool:
    """Whether plan.json's arm takes the case's layout: an arm with `layouts` (a peer that only
    takes some, e.g. contiguous rows) is neither checked nor timed in the others."""
    if "layouts" not in arm or arm["kind"] not in PARTIAL_LAYOUT_KINDS:  # a candidate's `layouts` is ignored
        return True
    return case.get("layout") in arm["layouts"]


def _arm_entry(
    arm: dict[str, Any],
    checks: list[dict[str, Any]],
    times: pd.Series | None,
    throttled: int,
    case: dict[str, Any],
    copy_ceiling: float | None,
    schema: SchemaV3,
) -> dict[str, Any]:
    """Status and per-arm figures of one (case, arm), speedup excluded."""
    if not arm["available"]:
        return _empty_entry(arm["kind"], UNAVAILABLE) | {"reason": arm.get("reason")}
    if not takes_layout(arm, case):
        return _empty_entry(arm["kind"], UNAVAILABLE) | {"reason": f"does not take layout {case['layout']!r}"}
    if not checks:
        return _empty_entry(arm["kind"], NOT_TIMED) | {"reason": "no correctness check recorded"}
    if not all(row["passed"] for row in checks):
        messages = [row.get("message") or "failed" for row in checks if not row["passed"]]
        return _empty_entry(arm["kind"], FAILED) | {"messages": messages}
    timed_failures = schema.timed_failures(str(case["case"]), arm["name"])
    if timed_failures:
        return _empty_entry(arm["kind"], FAILED_WHILE_TIMED) | {"messages": timed_failures}
    if times is None:
        return _empty_entry(arm["kind"], NOT_TIMED) | {"reason": "passed correctness but has no timing rows"}
    median = stats.median(times.to_numpy())
    achieved = stats.gbps(case["bytes"], median)
    reason = schema.implausibility(achieved, median)
    return _empty_entry(arm["kind"], TIMED if reason is None else IMPLAUSIBLE) | {
        "median_ns_per_call": median,
        "n_samples": int(times.size),
        "gbps": achieved,
        "pct_of_copy_ceiling": None if copy_ceiling is None else stats.pct_of_ceiling(achieved, copy_ceiling),
        "throttled_samples": throttled,
        "spread": stats.relative_spread(times.to_numpy()),
        "reason": reason,
    }


def _case_summary(
    run: RunFiles,
    series: dict[tuple[str, str], pd.Series],
    throttled: dict[tuple[str, str], int],
    checks: dict[tuple[str, str], list[dict[str, Any]]],
    case: dict[str, Any],
    control: str,
    copy_ceiling: float | None,
    matched: dict[int, float],
    rule: stats.BootstrapRule,
    schema: SchemaV3,
    warnings: list[str],
) -> dict[str, Any]:
    case_id = str(case["case"])
    arms: dict[str, dict[str, Any]] = {}
    for arm in run.plan["arms"]:
        name = arm["name"]
        times = series.get((case_id, name))
        entry = _arm_entry(
            arm, checks.get((case_id, name), []), times, throttled.get((case_id, name), 0), case, copy_ceiling, schema
        )
        entry |= schema.host_fields(case_id, name)
        if entry["status"] == NOT_TIMED:
            warnings.append(f"case {case_id}: arm {name} not timed: {entry['reason']}")
        if entry["status"] in (FAILED, UNAVAILABLE, NOT_TIMED) and times is not None:
            warnings.append(f"case {case_id}: arm {name} is {entry['status']} but has timing rows; ignored")
        arms[name] = entry

    timed = {name: series[(case_id, name)] for name, e in arms.items() if e["status"] == TIMED}
    if control not in timed:
        warnings.append(_untimed_control_warning(case_id, control, arms[control]["status"]))
    else:
        for name, times in timed.items():
            if name != control:
                _add_speedup(
                    arms[name], timed[control], times, case_id, name, run.plan["tie_band"], rule, schema, warnings
                )

    band = run.plan["tie_band"]
    spread = arms[control]["spread"] if control in arms else None
    if spread is not None and spread > band:
        warnings.append(
            f"case {case_id}: control run-to-run spread {100 * spread:.1f}% exceeds the tie band {100 * band:g}%"
        )
    rounds = case_rounds(run.plan, case)
    _check_rounds(run.plan, case_id, rounds, warnings)
    units = planned_units(run.plan, case)
    short = [name for name, times in timed.items() if times.size < units]
    if short:
        warnings.append(f"case {case_id}: arm(s) {short} have fewer than the {units} planned (seed, round) units")
    return {
        "case": case_id,
        "shape": case.get("shape"),
        "layout": case.get("layout"),
        "dtype": case.get("dtype"),
        "bytes": case["bytes"],
        **matched_copy_field(matched, int(case["bytes"])),
        **schema.floor_fields(int(case["bytes"]), arms),
        "calls": case["calls"],
        "rounds": rounds,
        "units_planned": units,
        "injected_delay_ns": case.get("injected_delay_ns"),
        "arms": arms,
    }


def _untimed_control_warning(case_id: str, control: str, status: str) -> str:
    """No speedups in a case whose control has no usable times (its times may exist: implausible)."""
    state = f"is {status}" if status in (IMPLAUSIBLE, FAILED_WHILE_TIMED) else "was not timed"
    return f"case {case_id}: control {control} {state}; no speedups for this case"


def _check_rounds(plan: dict[str, Any], case_id: str, rounds: int, warnings: list[str]) -> None:
    """Rounds beyond the plan's are legitimate only when the preregistered noise rule added them."""
    planned = _count(plan["rounds"])
    rule = plan.get("noise_rule") or {}
    if rounds < planned:
        warnings.append(f"case {case_id}: plan.json says {rounds} rounds, fewer than the planned {planned}")
    elif rounds > planned and rule.get("target_ci_width") is None:
        warnings.append(
            f"case {case_id}: {rounds} rounds run but only {planned} planned and no noise rule "
            "(target_ci_width) allows more"
        )
    elif rule.get("max_rounds") is not None and rounds > planned and rounds > int(rule["max_rounds"]):
        warnings.append(
            f"case {case_id}: {rounds} rounds run, more than the noise rule's max_rounds {rule['max_rounds']}"
        )


def _add_speedup(
    entry: dict[str, Any],
    control: pd.Series,
    arm: pd.Series,
    case_id: str,
    name: str,
    tie_band: float,
    rule: stats.BootstrapRule,
    schema: SchemaV3,
    warnings: list[str],
) -> None:
    paired = control.index.intersection(arm.index).sort_values()
    entry["ci_units"] = len(paired)
    if len(paired) == 0:
        warnings.append(f"case {case_id}: arm {name} shares no (seed, round) unit with the control; no CI")
        return
    if len(paired) < MIN_UNITS:
        warnings.append(f"case {case_id}: arm {name} has only {len(paired)} units (< {MIN_UNITS}); CI is rough")
    entry["speedup"] = stats.speedup(stats.median(control.to_numpy()), entry["median_ns_per_call"])
    ci = stats.bootstrap_speedup_ci(control.loc[paired].to_numpy(), arm.loc[paired].to_numpy(), rule)
    entry["ci_low"], entry["ci_high"] = ci.low, ci.high
    entry["verdict"] = schema.verdict(ci, tie_band)


def aggregates_and_gate(
    cases: list[dict[str, Any]], plan: dict[str, Any], control: str, rule: stats.BootstrapRule, schema: SchemaV3
) -> tuple[dict[str, Any], dict[str, Any]]:
    gate = gate_rule.parse_gate(plan["gate"])
    aggregates: dict[str, Any] = {}
    verdicts: dict[str, Any] = {}
    for arm in plan["arms"]:
        name = arm["name"]
        if name == control or not arm["available"]:
            continue
        timed = [c for c in cases if c["arms"][name]["speedup"] is not None]
        failed = sum(c["arms"][name]["status"] == FAILED for c in cases)
        agg = stats.aggregate_arm(
            [c["case"] for c in timed],
            [c["arms"][name]["speedup"] for c in timed],
            [c["arms"][name]["verdict"] for c in timed],
            rule,
        )
        aggregates[name] = {
            "n_cases": agg.n_cases,
            "geomean": agg.geomean,
            "geomean_ci_low": agg.geomean_ci.low if agg.geomean_ci else None,
            "geomean_ci_high": agg.geomean_ci.high if agg.geomean_ci else None,
            "mean": agg.mean,
            "worst": agg.worst,
            "worst_case": agg.worst_case,
            "wins": agg.wins,
            "ties": agg.ties,
            "losses": agg.losses,
            "failed_correctness": failed,
        } | schema.aggregate_fields(name, cases, agg)
        result = schema.gate_verdict(gate, agg, name, cases)
        verdicts[name] = {"passed": result.passed, "reasons": result.reasons}
    passed = [name for name, v in verdicts.items() if v["passed"]]
    return aggregates, {"rule": gate.rule, "arms": verdicts, "passed_arms": passed}


def _ceiling(frame: pd.DataFrame, kind: str) -> tuple[float | None, int]:
    rows = frame[frame["kind"] == kind]
    return stats.ceiling_gbps(rows["bytes"].to_numpy(), rows["ns"].to_numpy()), len(rows)


def matched_copies(frame: pd.DataFrame) -> dict[int, float]:
    """GB/s of the copy of each case's traffic (ceilings.csv `copy_matched`, keyed by bytes
    moved); empty for a run from before it was measured."""
    rows = frame[frame["kind"] == COPY_MATCHED]
    return {
        int(moved): stats.ceiling_gbps(group["bytes"].to_numpy(), group["ns"].to_numpy())
        for moved, group in rows.groupby("bytes")
    }


def matched_copy_field(matched: dict[int, float], case_bytes: int) -> dict[str, Any]:
    """A case's `matched_copy_gbps` (its traffic rounded down to even, as the runner copies it);
    no field for a run without `copy_matched` rows."""
    return {"matched_copy_gbps": matched.get(case_bytes - case_bytes % 2)} if matched else {}


def _triton_floor(frame: pd.DataFrame) -> dict[str, Any]:
    """The Triton launch floor's figures; none for a run from before it was measured."""
    launches = frame[frame["kind"] == TRITON_LAUNCH]["ns"].to_numpy(dtype=float)
    if not len(launches):
        return {}
    return {"triton_launch_floor_ns": stats.launch_floor(launches), "triton_launch_samples": len(launches)}


def _clock_figures(
    plan: dict[str, Any], timings: pd.DataFrame, warnings: list[str]
) -> tuple[dict[str, Any], pd.Series]:
    """Top-level `clocks` figures and a per-row throttled flag (over every row of timings.csv)."""
    clocks = plan.get("clocks") or {}
    max_sm = clocks.get("max_sm_mhz")
    fraction = float(clocks.get("throttle_fraction", 0.9))
    threshold = stats.throttle_threshold(max_sm, fraction)
    sm = timings["sm_mhz"]
    flags = pd.Series(
        [stats.is_throttled(None if pd.isna(v) else float(v), threshold) for v in sm], index=timings.index, dtype=bool
    )
    figures = {
        "max_sm_mhz": max_sm,
        "throttle_fraction": fraction,
        "threshold_mhz": threshold,
        "samples_with_clock": int(sm.notna().sum()),
        "throttled_samples": int(flags.sum()),
    }
    if figures["throttled_samples"]:
        warnings.append(
            f"{figures['throttled_samples']} of {len(timings)} timing samples were throttled: SM clock "
            f"below {threshold:g} MHz ({fraction:g} x max {max_sm} MHz); their times may be slow"
        )
    return figures, flags


def _calibration(
    plan: dict[str, Any], cases: list[dict[str, Any]], control: str, schema: SchemaV3, warnings: list[str]
) -> dict[str, Any] | None:
    """Calibration figures of the `aa:`/`slow:` arms (None when there are none)."""
    found = [(arm["name"], stats.calibration_base(arm["name"])) for arm in plan["arms"]]
    found = [(name, parsed) for name, parsed in found if parsed is not None]
    if not found:
        return None
    settings = stats.CALIBRATION_DEFAULTS | (plan.get("calibration") or {})
    nominal = float(settings["injected_slowdown"])
    arms: dict[str, Any] = {}
    aa_figures, slow_figures = [], []
    for name, (kind, base) in found:
        if base != control:
            warnings.append(
                f"calibration arm {name} is compared with the control {control}, not with {base}; "
                "its calibration figures do not measure what they claim"
            )
        compared = [c["arms"][name] for c in cases if c["arms"][name]["verdict"] is not None]
        verdicts = [e["verdict"] for e in compared]
        if kind == "aa":
            figures = stats.aa_calibration(verdicts, [stats.Interval(e["ci_low"], e["ci_high"]) for e in compared])
            aa_figures.append(figures)
            arms[name] = {
                "kind": kind,
                "base": base,
                "n_cases": figures.n_cases,
                **schema.aa_fields(figures),
                "false_positive_rate": figures.false_positive_rate,
                "mean_ci_width": figures.mean_ci_width,
            }
        else:
            realized = {
                c["case"]: _realized(c["arms"][name], c["arms"].get(base))
                for c in cases
                if c["arms"][name]["verdict"] is not None
            }
            figures = stats.slow_calibration(verdicts, list(realized.values()), nominal)
            slow_figures.append(figures)
            arms[name] = {
                "kind": kind,
                "base": base,
                "n_cases": figures.n_cases,
                "losses": figures.losses,
                "power": figures.power,
                "realized_slowdown": {case: r for case, r in realized.items() if r is not None},
                "realized_min": figures.realized_min,
                "realized_max": figures.realized_max,
                "power_at_nominal": figures.power_at_nominal,
            }
            if figures.realized_min is not None and figures.realized_min > stats.NOMINAL_FACTOR * nominal:
                warnings.append(never_nominal_warning(name, figures.realized_min, figures.realized_max, nominal))
    max_fpr, min_power = float(settings["max_false_positive_rate"]), float(settings["min_power"])
    passed = stats.calibration_passed(aa_figures, slow_figures, max_fpr, min_power)
    return {
        "injected_slowdown": nominal,
        "max_false_positive_rate": max_fpr,
        "min_power": min_power,
        "arms": arms,
        "passed": passed,
        "sentence": calibration_sentence(arms, passed, nominal, max_fpr, min_power),
    }


def _realized(slow: dict[str, Any], base: dict[str, Any] | None) -> float | None:
    """Realized slowdown of a slowed arm in one case; None when the base arm has no median."""
    if base is None or base["median_ns_per_call"] is None or slow["median_ns_per_call"] is None:
        return None
    return stats.realized_slowdown(slow["median_ns_per_call"], base["median_ns_per_call"])


def never_nominal_warning(name: str, realized_min: float, realized_max: float, nominal: float) -> str:
    """The warning for a slowed arm whose smallest realized slowdown exceeds NOMINAL_FACTOR x nominal."""
    return (
        f"calibration arm {name}: the injected slowdown was never as small as nominal "
        f"({_realized_range(realized_min, realized_max)} realized, {100 * nominal:g}% nominal): "
        "power at nominal is not demonstrated"
    )


def _realized_range(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"{100 * low:.1f}-{100 * high:.1f}%"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _claimed(aa: dict[str, Any]) -> str:
    """An A/A arm's false positives, and under summary/4 its inconclusive verdicts (summary/3: `not_tie`)."""
    if "false_positives" not in aa:
        return str(aa["not_tie"])
    return f"{aa['false_positives']} ({aa['inconclusive']} inconclusive)"


def calibration_sentence(
    arms: dict[str, Any], passed: bool, injected_slowdown: float, max_fpr: float, min_power: float
) -> str:
    """One sentence saying whether the timing method told A from A and caught an injected slowdown."""
    parts = [
        f"A/A arm {name} was called different from its copy in {_claimed(f)} of {f['n_cases']} case(s) "
        f"(false-positive rate {_pct(f['false_positive_rate'])}, at most {_pct(max_fpr)} allowed; "
        f"mean CI width {'n/a' if f['mean_ci_width'] is None else format(f['mean_ci_width'], '.4f')})"
        for name, f in arms.items()
        if f["kind"] == "aa"
    ]
    near = stats.NOMINAL_FACTOR * injected_slowdown
    parts += [
        f"slowed arm {name} ({100 * injected_slowdown:g}% nominal, "
        f"{_realized_range(f['realized_min'], f['realized_max'])} realized) was called a loss in {f['losses']} of "
        f"{f['n_cases']} case(s) (power {_pct(f['power'])}, at least {_pct(min_power)} required; "
        f"power at nominal {_pct(f['power_at_nominal'])} over the "
        f"{sum(r <= near for r in f['realized_slowdown'].values())} case(s) realized at most {100 * near:g}%)"
        for name, f in arms.items()
        if f["kind"] == "slow"
    ]
    return f"Calibration {'passed' if passed else 'FAILED'}: " + "; ".join(parts) + "."


def build_summary(run_dir: Path) -> dict[str, Any]:
    """Compute every figure of a kernel run directory (does not write anything)."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    plan = run.plan
    if plan.get("protocol_sha256") != run.protocol_sha256:
        raise RunDirError(
            f"{run_dir}: plan.json protocol_sha256 {plan.get('protocol_sha256')!r} does not match "
            f"protocol.toml ({run.protocol_sha256}); the protocol was changed after the run started"
        )
    control = control_arm(plan)
    bootstrap = plan["bootstrap"]
    rule = stats.BootstrapRule(int(bootstrap["resamples"]), int(bootstrap["seed"]), float(bootstrap["confidence"]))
    warnings: list[str] = []
    label = plan.get("timing_label") or timing_label(plan["backend"], bool(plan["is_gpu"]))
    if not plan["is_gpu"]:
        warnings.append(f"{label}; do not quote these figures as GPU timings")
    copy_gbps, copy_n = _ceiling(run.ceilings, "copy")
    read_gbps, read_n = _ceiling(run.ceilings, "read")
    if copy_gbps is None:
        warnings.append("ceilings.csv has no copy samples; % of copy ceiling is not available")
    clocks, flags = _clock_figures(plan, run.timings, warnings)
    throttled = {
        (str(case), str(arm)): int(n)
        for (case, arm), n in run.timings.assign(throttled=flags)
        .groupby(["case", "arm"], sort=False)["throttled"]
        .sum()
        .items()
    }
    schema = schema_of(run, copy_gbps, read_gbps)
    series = unit_series(run.timings)
    checks = correctness_by_case_arm(run.correctness)
    matched = matched_copies(run.ceilings)
    cases = [
        _case_summary(run, series, throttled, checks, case, control, copy_gbps, matched, rule, schema, warnings)
        for case in plan["cases"]
    ]
    aggregates, gate = aggregates_and_gate(cases, plan, control, rule, schema)
    calibration = _calibration(plan, cases, control, schema, warnings)
    summary = {
        "schema": schema.schema,
        "protocol_sha256": run.protocol_sha256,
        "backend": plan["backend"],
        "is_gpu": bool(plan["is_gpu"]),
        "l2": plan.get("l2"),
        "op": plan.get("op"),
        "label": label,
        "control": control,
        "tie_band": plan["tie_band"],
        "bootstrap": {"resamples": rule.resamples, "seed": rule.seed, "confidence": rule.confidence},
        "arms": plan["arms"],
        "noise_rule": plan.get("noise_rule"),
        "ceilings": {
            "copy_gbps": copy_gbps,
            "copy_samples": copy_n,
            "read_gbps": read_gbps,
            "read_samples": read_n,
            **schema.ceiling_fields(),
            **_triton_floor(run.ceilings),
        },
        "clocks": clocks,
        "cases": cases,
        "aggregates": aggregates,
        "gate": gate,
        **schema.top_level_fields(warnings),
        "warnings": warnings,
        "inputs_sha256": {name: sha256_file(run_dir / name) for name in schema.input_files},
    }
    if calibration is not None:
        summary["calibration"] = calibration
    return summary


def write_summary(run_dir: Path, overwrite: bool = False) -> Path:
    """Write `run_dir/summary.json` and return its path. Refuses to replace one unless `overwrite`."""
    run_dir = Path(run_dir)
    path = run_dir / "summary.json"
    if path.exists() and not overwrite:
        raise RunDirError(f"{path} already exists; a finished run directory is not overwritten (pass overwrite=True)")
    summary = build_summary(run_dir)
    write_json(path, summary)
    return path
