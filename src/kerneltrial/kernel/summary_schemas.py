"""One adapter per kernel summary schema (`SchemaV3` to `SchemaV7`, kernel/summary.py's docstring
describes each): what a version judges and records beyond the one before it.

Every adapter gives the figures of the newest summary shape (rundir/summary_doc.py `Summary`); a
version gives None (or 0) for what it does not record, exactly what the reader's adapter of that
version fills in, and `summary_json` leaves those fields out of the document it writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from kerneltrial import gate_rule, stats
from kerneltrial.kernel.bounds import floor_of, isolation_figures, roundtrips
from kerneltrial.kernel.floor import CaseFloors
from kerneltrial.kernel.summary_inputs import RunFiles, TimedCheck
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.integrity_notes import implausibly_under, under_claim_reason
from kerneltrial.rundir.layout import HOST, INPUT_FILES, ROUNDTRIP, TIMED_CHECKS, TRITON_LAUNCH
from kerneltrial.rundir.summary_doc import (
    HostCounts,
    IsolationFigures,
    SummaryCase,
    SummaryPlausibility,
    TimedCheckCounts,
)
from kerneltrial.rundir.summary_versions import SUMMARY_V3, SUMMARY_V4, SUMMARY_V5, SUMMARY_V6, SUMMARY_V7

SCHEMA = SUMMARY_V7  # what a new run's summary is

TIMED = "timed"
FAILED = "failed correctness"
UNAVAILABLE = "unavailable"
NOT_TIMED = "not timed"
FAILED_WHILE_TIMED = "failed while timed"
IMPLAUSIBLE = "implausible"
NOT_COMPARED = "not compared with the control"  # timed, but the control has no timing in the case

UNFROZEN_WARNING = "the protocol was not frozen before the run: its settings were not preregistered"
NO_LAUNCH_WARNING = "ceilings.csv has no launch samples; the launch-floor plausibility check was not applied"


@dataclass(frozen=True)
class HostFigures:
    """One (case, arm)'s host cost per call (summary/5 on)."""

    ns_per_call: float | None = None
    samples: int = 0
    behind: int | None = None


@dataclass(frozen=True)
class CheckCounts:
    """An arm's aggregate counts of the timed-check contract (summary/4 on; None before)."""

    inconclusive: int | None = None
    failed_while_timed: int | None = None
    implausible: int | None = None
    ulp_hist: list[int] | None = None


@dataclass(frozen=True)
class Contract:
    """The top-level record of the timed-check contract (summary/4 on)."""

    exact: bool = False
    frozen_at: str | None = None
    plausibility: SummaryPlausibility | None = None
    timed_checks: TimedCheckCounts | None = None


def statuses(cases: list[SummaryCase], name: str, status: str) -> list[SummaryCase]:
    """The cases in which arm `name` has `status`."""
    return [c for c in cases if c.arms[name].status == status]


class SchemaV3:
    """Runs whose plan.json has no `checks` (every run before issue 10): summary/3, as it always was."""

    schema = SUMMARY_V3
    input_files: tuple[str, ...] = INPUT_FILES

    def verdict(self, ci: stats.Interval, tie_band: float) -> str:
        return stats.three_way_verdict(ci, tie_band)

    def timed_failures(self, case_id: str, arm: str) -> list[str]:
        """Messages of the arm's failed timed checks in the case: none before timed checks existed."""
        return []

    def implausibility(self, achieved_gbps: float, median_ns: float) -> str | None:
        """Why a timed arm's figures cannot be real work: never judged before summary/4."""
        return None

    def under_claim(self, case_id: str, arm: str, median_ns: float) -> str | None:
        """Why an isolated arm's claim is below the harness's floor: no floor before plan.json `roundtrip`."""
        return None

    def launch_ceiling(self) -> tuple[float | None, int | None]:
        """ceilings `launch_floor_ns` and `launch_samples`: not measured before summary/4."""
        return None, None

    def check_counts(self, name: str, cases: list[SummaryCase], agg: stats.ArmAggregate) -> CheckCounts:
        return CheckCounts()

    def gate_verdict(
        self, gate: gate_rule.Gate, agg: stats.ArmAggregate, name: str, cases: list[SummaryCase]
    ) -> stats.GateVerdict:
        return stats.gate_verdict(gate, agg, len(statuses(cases, name, FAILED)))

    def aa_inconclusive(self, figures: stats.AACalibration) -> int | None:
        """An A/A arm's inconclusive verdicts: none before summary/4 (its verdicts are win, tie or loss)."""
        return None

    def contract(self, warnings: list[str]) -> Contract:
        return Contract()

    def host_counts(self) -> HostCounts | None:
        return None

    def host_figures(self, case_id: str, arm: str) -> HostFigures:
        """Host cost figures of one (case, arm): none before summary/5."""
        return HostFigures()

    def case_floor(self, case_bytes: int) -> float | None:
        """The case's speed-of-light floor: none before summary/6."""
        return None

    def isolation(self, warnings: list[str]) -> IsolationFigures | None:
        return None


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

    schema = SUMMARY_V4
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

    def launch_ceiling(self) -> tuple[float | None, int | None]:
        return self.launch_floor_ns, self.launch_samples

    def check_counts(self, name: str, cases: list[SummaryCase], agg: stats.ArmAggregate) -> CheckCounts:
        hists = [row.get("ulp_hist") for row in self.correctness if row["arm"] == name]
        return CheckCounts(
            inconclusive=agg.inconclusive,
            failed_while_timed=len(statuses(cases, name, FAILED_WHILE_TIMED)),
            implausible=len(statuses(cases, name, IMPLAUSIBLE)),
            ulp_hist=stats.ulp_hist_sum(hists),
        )

    def gate_verdict(
        self, gate: gate_rule.Gate, agg: stats.ArmAggregate, name: str, cases: list[SummaryCase]
    ) -> stats.GateVerdict:
        disqualified = []
        for cause in (FAILED, FAILED_WHILE_TIMED, IMPLAUSIBLE):
            hit = statuses(cases, name, cause)
            if hit:
                first = hit[0].arms[name]
                reason = first.reason or first.messages[0]
                disqualified.append(stats.Disqualification(cause, tuple(c.case for c in hit), reason))
        # Timed but without a verdict: the control was excluded there (an arm cannot pass `no_loss`
        # by getting the control disqualified in every case).
        uncompared = [c for c in statuses(cases, name, TIMED) if c.arms[name].verdict is None]
        if uncompared:
            control = next(e for e in uncompared[0].arms.values() if e.kind == "control")
            disqualified.append(
                stats.Disqualification(
                    NOT_COMPARED,
                    tuple(c.case for c in uncompared),
                    f"no verdict against the control (control: {control.status})",
                )
            )
        return stats.gate_verdict_v4(gate, agg, disqualified)

    def aa_inconclusive(self, figures: stats.AACalibration) -> int | None:
        return figures.inconclusive

    def contract(self, warnings: list[str]) -> Contract:
        frozen_at = self.plan.get("frozen_at")
        if frozen_at is None:
            warnings.append(UNFROZEN_WARNING)
        if self.applied and not self.launch_samples:
            warnings.append(NO_LAUNCH_WARNING)
        plausibility = SummaryPlausibility(
            bandwidth_margin=self.limits.bandwidth_margin,
            launch_floor_fraction=self.limits.launch_floor_fraction,
            applied=self.applied,
            bandwidth_limit_gbps=self.limits.bandwidth_limit_gbps,
            time_limit_ns=self.limits.time_limit_ns,
        )
        failed = sum(not r.passed for r in self.timed_checks)
        return Contract(
            self.plan.get("exact"),
            frozen_at,
            plausibility,
            TimedCheckCounts(rows=len(self.timed_checks), failed=failed),
        )


@dataclass
class SchemaV5(SchemaV4):
    """plan.json `host` (issue 16, host cost per call): summary/5."""

    host: pd.DataFrame = field(default_factory=pd.DataFrame)
    host_samples: int = 0
    host_calls: int = 0

    schema = SUMMARY_V5
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

    def host_figures(self, case_id: str, arm: str) -> HostFigures:
        rows = self.host[(self.host["case"] == case_id) & (self.host["arm"] == arm)]
        per_call = (rows["ns"] / rows["calls"]).to_numpy(dtype=float)
        median = stats.median(per_call) if len(rows) else None
        return HostFigures(median, len(rows), int(rows["behind"].astype(int).sum()))

    def host_counts(self) -> HostCounts | None:
        return HostCounts(samples=self.host_samples, calls=self.host_calls, rows=len(self.host))


@dataclass
class SchemaV6(SchemaV5):
    """plan.json `floor` (issue 27): summary/6, the floor figures of kernel/floor.py."""

    floors: CaseFloors | None = None

    schema = SUMMARY_V6

    @classmethod
    def from_run(cls, run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV6:
        launches = run.ceilings[run.ceilings["kind"] == TRITON_LAUNCH]["ns"].to_numpy(dtype=float)
        floors = CaseFloors.for_plan(run.plan, stats.launch_floor(launches), copy_gbps)
        return replace(super().from_run(run, copy_gbps, read_gbps), floors=floors)

    def case_floor(self, case_bytes: int) -> float | None:
        return self.floors.case_floor(case_bytes) if self.floors else None


@dataclass
class SchemaV7(SchemaV6):
    """plan.json `checks` 3 (issue 24, isolated arms): summary/7."""

    timings: pd.DataFrame = field(default_factory=pd.DataFrame)

    schema = SUMMARY_V7

    roundtrip: pd.DataFrame | None = None  # roundtrip.csv: runs with plan.json `roundtrip` (kernel/bounds.py)

    @classmethod
    def from_run(cls, run: RunFiles, copy_gbps: float | None, read_gbps: float | None) -> SchemaV7:
        if "wall_ns" not in run.timings.columns:
            raise RunDirError("plan.json has checks 3 but timings.csv has no wall_ns column (the harness's bound)")
        if run.plan.get("roundtrip") and run.roundtrip is None:
            raise RunDirError(
                f"plan.json has roundtrip {run.plan['roundtrip']!r} but the run directory has no {ROUNDTRIP}; "
                "a run with a round trip writes a row after each round that timed an isolated arm"
            )
        roundtrip = run.roundtrip if run.plan.get("roundtrip") else None
        return replace(super().from_run(run, copy_gbps, read_gbps), timings=run.timings, roundtrip=roundtrip)

    def isolation(self, warnings: list[str]) -> IsolationFigures | None:
        return isolation_figures(self.plan, self.timings, warnings, self.roundtrip)

    def under_claim(self, case_id: str, arm: str, median_ns: float) -> str | None:
        """The reason an isolated arm's claims are below the harness's floor (kernel/bounds.py)."""
        cost = roundtrips(self.roundtrip).get(case_id)
        if cost is None or arm not in self.plan.get("isolated", []):
            return None
        rows = self.timings[(self.timings["case"] == case_id) & (self.timings["arm"] == arm)]
        floor, under = floor_of(rows, cost, float(self.plan["tie_band"]))
        if not implausibly_under(median_ns, floor, under, len(rows)):
            return None
        return under_claim_reason(under, len(rows), median_ns, floor, cost)


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
