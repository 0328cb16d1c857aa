"""The typed, frozen reader of a kernel run's summary.json (`Summary`, `read_summary`) and its
writer's shape (`summary_json`): every version still read passes through its adapter
(rundir/summary_versions.py), as rundir/documents.py says of plan.json and provenance.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from kerneltrial.rundir.documents import Bootstrap, Document, NoiseRule, PlanArm, document_data, validate
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.integrity_notes import WALL_SLACK
from kerneltrial.rundir.layout import PROTOCOL, PROVENANCE, SUMMARY
from kerneltrial.rundir.summary_versions import SUMMARY_ADAPTERS, SUMMARY_DOWNGRADES, SUMMARY_V1, SUMMARY_V6, SUMMARY_V7

# ---------------------------------------------------------------- summary.json


class ArmFigures(Document):
    """One arm in one case."""

    kind: str = Field(description="The arm's kind, as in plan.json.")
    status: str = Field(
        description="`timed`, `failed correctness`, `failed while timed`, `implausible`, `unavailable`, `not timed`, ..."
    )
    median_ns_per_call: float | None = Field(
        description="Median over the (seed, round) units of ns / calls; null when not timed."
    )
    n_samples: int = Field(description="Timing rows of the arm in the case.")
    ci_units: int | None = Field(description="Units paired in the bootstrap; null without a speedup.")
    speedup: float | None = Field(
        description="median(control) / median(arm); null when either is missing or the arm is implausible."
    )
    ci_low: float | None = Field(description="The speedup interval's low end.")
    ci_high: float | None = Field(description="The speedup interval's high end.")
    verdict: str | None = Field(
        description="`win`, `tie`, `loss` or `inconclusive` against the tie band; null without a speedup."
    )
    gbps: float | None = Field(description="bytes / median ns per call.")
    pct_of_copy_ceiling: float | None = Field(description="GB/s as a percentage of the run's median copy ceiling.")
    throttled_samples: int = Field(description="Rows whose SM clock is below the throttle threshold.")
    spread: float | None = Field(
        description="(p90 - p10) / median of the per-sample times; null: not timed (or a summary/1)."
    )
    messages: list[str] = Field(description="The failing checks' messages, in file order.")
    reason: str | None = Field(description="Why the arm has no figures here (unavailable, implausible, ...).")
    host_ns_per_call: float | None = Field(
        description="Median host time per call (host.csv); null: not measured (before summary/5)."
    )
    host_samples: int = Field(description="Host-cost rows of the arm in the case.")
    host_behind: int | None = Field(
        description="Host samples whose device was still busy at their end; null before summary/5."
    )
    fraction_of_floor: float | None = Field(
        description="The case's floor / this median (kernel/floor.py); null before summary/6."
    )
    tflops: float | None = Field(
        default=None,
        description="Achieved TFLOPS: the case's flops / median ns per call / 1000; null where the arm has no median; absent where the case has no `flops`.",
    )
    peak_bytes: int | None = Field(
        default=None,
        description="The arm's own extra peak memory: the largest timings.csv `peak_bytes` of its samples in the case; null where none was measured (a CPU, an isolated arm, no median); absent in a run without plan.json `peak_memory`.",
    )

    @property
    def device_bound(self) -> bool:
        """Some host sample ended with the device still busy: its time may include device time."""
        return bool(self.host_behind)


class SummaryCase(Document):
    case: str = Field(description="The case id.")
    shape: list[int] = Field(description="The input shape.")
    layout: str = Field(description="The input layout.")
    dtype: str = Field(description="The input dtype.")
    bytes: int = Field(description="Bytes moved per call.")
    flops: int | None = Field(
        default=None, description="FLOPs per call (plan.json's); absent where the operator defines no count."
    )
    matched_copy_gbps: float | None = Field(
        default=None,
        description="Median GB/s of a copy of this case's own traffic (`copy_matched` rows); absent: not measured (before issue 16).",
    )
    floor_ns: float | None = Field(
        description="The speed-of-light floor: median `triton_launch` ns + bytes / median `copy` GB/s (kernel/floor.py); null before summary/6 or unmeasured."
    )
    calls: int = Field(description="Calls per timed sample.")
    rounds: int | None = Field(description="Rounds run; null in summary/1.")
    units_planned: int | None = Field(description="seeds x rounds; null in summary/1.")
    injected_delay_ns: float | None = Field(description="Copied from plan.json; null without one.")
    arms: dict[str, ArmFigures] = Field(description="Each arm's figures, by name.")


class Aggregate(Document):
    n_cases: int = Field(description="Cases with a speedup.")
    geomean: float | None = Field(description="Geometric mean of the speedups.")
    geomean_ci_low: float | None = Field(description="Its interval's low end (bootstrap over cases of log speedups).")
    geomean_ci_high: float | None = Field(description="Its interval's high end.")
    mean: float | None = Field(description="Arithmetic mean of the speedups.")
    worst: float | None = Field(description="The smallest speedup.")
    worst_case: str | None = Field(description="The case of the smallest speedup.")
    wins: int = Field(description="Cases won.")
    ties: int = Field(description="Cases tied.")
    losses: int = Field(description="Cases lost.")
    failed_correctness: int = Field(description="Cases in which the arm failed correctness.")
    # None before timed checks (summary/3 had no inconclusive verdict, nothing failed while timed
    # and nothing was judged implausible)
    inconclusive: int | None = Field(
        description="Inconclusive cases; null before timed checks (summary/3 had no inconclusive verdict)."
    )
    failed_while_timed: int | None = Field(description="Cases failed while timed; null before timed checks.")
    implausible: int | None = Field(description="Cases judged implausible; null before timed checks.")
    ulp_hist: list[int] | None = Field(
        description="Element-wise sum of the arm's correctness `ulp_hist` rows; null when none has one."
    )


class GateArm(Document):
    passed: bool = Field(description="Whether the arm passed the gate.")
    reasons: list[str] = Field(
        description="Why it failed: the cause in order (failed correctness, failed while timed, implausible), then the rule's reasons."
    )


class Gate(Document):
    rule: str = Field(description="The preregistered gate, as in plan.json.")
    arms: dict[str, GateArm] = Field(description="Each compared arm's outcome.")
    passed_arms: list[str] = Field(description="The arms that passed, in plan order.")


class Ceilings(Document):
    copy_gbps: float | None = Field(
        description="Median GB/s of the 1 GiB device-to-device copy (bytes = read + written)."
    )
    copy_samples: int = Field(description="Its samples.")
    read_gbps: float | None = Field(description="Median GB/s of the read-only stream.")
    read_samples: int = Field(description="Its samples.")
    launch_floor_ns: float | None = Field(
        default=None,
        description="Median ns of one empty launch (torch's add of 0 to one element); runs with timed checks.",
    )
    launch_samples: int | None = Field(default=None, description="Its samples.")
    # a one-element Triton kernel (issue 16); None / 0: the run did not measure it (no key in its summary)
    triton_launch_floor_ns: float | None = Field(
        default=None, description="Median ns of a one-element Triton kernel (issue 16); absent: not measured."
    )
    triton_launch_samples: int = Field(default=0, description="Its samples; absent: 0.")


class Clocks(Document):
    max_sm_mhz: int | None = Field(description="The maximum SM clock, as plan.json gives it.")
    throttle_fraction: float = Field(description="As plan.json gives it.")
    threshold_mhz: float | None = Field(
        description="throttle_fraction x max_sm_mhz; null when max_sm_mhz is null (nothing is flagged)."
    )
    samples_with_clock: int = Field(description="Timing rows with an SM clock reading.")
    throttled_samples: int = Field(description="Rows below the threshold.")


class AACalibration(Document):
    kind: Literal["aa"] = Field(description="`aa`: an A/A copy of its base arm.")
    base: str = Field(description="The arm it copies.")
    n_cases: int = Field(description="Cases with a verdict.")
    false_positives: int = Field(description="Win or loss verdicts (summary/3: `not_tie`, the same count).")
    inconclusive: int | None = Field(description="Inconclusive verdicts; null in summary/3, which had none.")
    false_positive_rate: float | None = Field(description="false_positives / n_cases; null when n_cases is 0.")
    mean_ci_width: float | None = Field(description="Mean of ci_high - ci_low.")


class SlowCalibration(Document):
    kind: Literal["slow"] = Field(description="`slow`: its base arm plus an injected delay.")
    base: str = Field(description="The arm it slows.")
    n_cases: int = Field(description="Cases with a verdict.")
    losses: int = Field(description="Loss verdicts.")
    power: float | None = Field(description="losses / n_cases; null when n_cases is 0.")
    realized_slowdown: dict[str, float] = Field(description="Per case, median(slow) / median(base) - 1.")
    realized_min: float | None = Field(description="The smallest realized slowdown; null when none.")
    realized_max: float | None = Field(description="The largest; null when none.")
    power_at_nominal: float | None = Field(
        description="losses / cases among the cases whose realized slowdown is at most 1.5 x nominal; null when none qualifies."
    )


class Calibration(Document):
    injected_slowdown: float = Field(description="As plan.json gives it.")
    max_false_positive_rate: float = Field(description="As plan.json gives it.")
    min_power: float = Field(description="As plan.json gives it.")
    arms: dict[str, AACalibration | SlowCalibration] = Field(description="Each calibration arm's figures, by name.")
    passed: bool = Field(
        description="Every `aa:` rate at most max_false_positive_rate and every `slow:` power at least min_power (a null rate fails)."
    )
    sentence: str = Field(description="One sentence starting `Calibration passed` or `Calibration FAILED`.")


class SummaryPlausibility(Document):
    bandwidth_margin: float = Field(description="As plan.json gives it.")
    launch_floor_fraction: float = Field(description="As plan.json gives it.")
    applied: bool = Field(description="Whether plausibility was judged (GPU and `cuda-events` only).")
    bandwidth_limit_gbps: float | None = Field(
        description="The GB/s above which an arm is implausible; null where not judged."
    )
    time_limit_ns: float | None = Field(
        description="The ns per call below which an arm is implausible; null where not judged."
    )


class TimedCheckCounts(Document):
    rows: int = Field(description="timed_checks.jsonl rows.")
    failed: int = Field(description="Failed rows.")


class HostCounts(Document):
    samples: int = Field(description="Host samples per (case, arm), as plan.json gives it.")
    calls: int = Field(description="Calls per host sample, as plan.json gives it.")
    rows: int = Field(description="host.csv rows.")


class IsolationBound(Document):
    case: str = Field(description="The case id.")
    arm: str = Field(description="The isolated arm.")
    samples: int = Field(description="Its timed samples.")
    claimed_ns_per_call: float = Field(description="Median ns / calls: the worker's own clock.")
    bound_ns_per_call: float = Field(
        description="Median wall_ns / calls: the harness's wall clock around the same samples."
    )
    ratio: float | None = Field(
        description="bound / claimed; above `far_inside` the summary warns that the figure rests on the arm's own clock."
    )
    roundtrip_ns: float | None = Field(
        default=None,
        description="The case's round trip: the median of its roundtrip.csv rows' wall_ns - ns (what a sample of the trusted reference worker cost beside its calls) plus 3 median absolute deviations; absent without a floor (plan.json `roundtrip` null or absent).",
    )
    floor_ns_per_call: float | None = Field(
        default=None,
        description=f"Median of ((1 - tie_band - {WALL_SLACK}) * wall_ns - roundtrip_ns) / calls ({WALL_SLACK}: rundir/integrity_notes.py WALL_SLACK): the least the harness vouches the arm's calls took; a median claim per call below it is implausible. Absent without a floor.",
    )
    under_samples: int | None = Field(
        default=None,
        description=f"Samples whose claim (ns) is below their floor (1 - tie_band - {WALL_SLACK}) * wall_ns - roundtrip_ns. Absent without a floor.",
    )


class IsolationFigures(Document):
    arms: list[str] = Field(description="The isolated arms.")
    far_inside: float = Field(description="The ratio above which a claim is warned (2.0).")
    bounds: list[IsolationBound] = Field(description="One entry per timed (case, isolated arm).")


class Summary(Document):
    schema_: str = Field(
        alias="schema",
        description="`kerneltrial.summary/7` (isolated arms, `checks` 3), `/6` (plan.json `floor`), `/5` (host stage), `/4` (timed checks), `/3`; `/1` and `/2` are still read.",
    )
    protocol_sha256: str = Field(description="sha256 of protocol.toml's bytes.")
    backend: str = Field(description="The timer, as plan.json gives it.")
    is_gpu: bool = Field(description="As plan.json gives it.")
    l2: str = Field(description="As plan.json gives it.")
    op: str | None = Field(description="The operator; null: a plan without `op` (the protocol names it).")
    label: str = Field(description="What the times measure (plan `timing_label`).")
    control: str = Field(description="The control arm's name.")
    tie_band: float = Field(description="As plan.json gives it.")
    bootstrap: Bootstrap = Field(description="As plan.json gives it.")
    arms: list[PlanArm] = Field(description="plan.json's arms.")
    noise_rule: NoiseRule | None = Field(description="As plan.json gives it; null: the plan has none (or a summary/1).")
    ceilings: Ceilings = Field(description="The run's measured ceilings and launch floors.")
    clocks: Clocks | None = Field(description="The clock readings; null in summary/1.")
    cases: list[SummaryCase] = Field(description="Every case's figures.")
    aggregates: dict[str, Aggregate] = Field(description="Each compared arm's figures over the cases.")
    gate: Gate = Field(description="The gate's outcome.")
    exact: bool = Field(description="As plan.json gives it.")
    frozen_at: str | None = Field(
        description="The freeze time; null: not frozen (summary/3: not recorded; see provenance.json)."
    )
    plausibility: SummaryPlausibility | None = Field(
        description="The plausibility limits applied; null before timed checks."
    )
    timed_checks: TimedCheckCounts | None = Field(
        description="The timed checks' counts; null before timed checks (summary/3)."
    )
    host: HostCounts | None = Field(description="The host stage's counts; null before host cost (summary/4 and older).")
    isolation: IsolationFigures | None = Field(
        description="Isolated arms' bounds; null before isolated arms (summary/6 and older)."
    )
    warnings: list[str] = Field(
        description="Throttled samples, wide control spreads, calibration, far-inside claims, a protocol not frozen, ..."
    )
    inputs_sha256: dict[str, str] = Field(
        description="sha256 of each raw file the summary was computed from (plan.json, correctness.jsonl, timings.csv, ceilings.csv, timed_checks.jsonl, host.csv)."
    )
    calibration: Calibration | None = Field(
        default=None,
        description="Calibration runs only (unset, and not written, otherwise); last, as the writer orders keys.",
    )

    @property
    def records_floor(self) -> bool:
        """Whether cases and arms carry the floor figures (summary/6 on); older runs' floor is computed
        from their ceilings (kernel/floor.py)."""
        return self.schema_ in (SUMMARY_V6, SUMMARY_V7)

    @property
    def records_spreads(self) -> bool:
        """Whether per-arm spreads were computed (from summary/2 on; summary/1 has none)."""
        return self.schema_ != SUMMARY_V1

    def compared_arms(self) -> list[str]:
        """Available arms other than the control, in plan order."""
        return [a.name for a in self.arms if a.available and a.name != self.control]


def summary_json(summary: Summary) -> dict[str, Any]:
    """summary.json's document for `summary`, in the shape of its own version (`schema`)."""
    versions = list(SUMMARY_DOWNGRADES)
    if summary.schema_ not in versions:
        raise RunDirError(f"summary schema {summary.schema_!r}: kerneltrial writes {', '.join(versions)}")
    data = summary.model_dump(by_alias=True, exclude_unset=True)
    for version in versions[1 : versions.index(summary.schema_) + 1]:
        data = SUMMARY_DOWNGRADES[version](data)
    return data


def read_summary(run_dir: Path) -> Summary:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    if not (run_dir / SUMMARY).is_file():
        raise RunDirError(f"{run_dir}: no {SUMMARY}; {_why_no_summary(run_dir)}")
    data = document_data(run_dir, SUMMARY)
    versions = list(SUMMARY_ADAPTERS)
    if data.get("schema") not in versions:
        raise RunDirError(
            f"{run_dir / SUMMARY}: schema {data.get('schema')!r}; reports read {', '.join(versions)} "
            "(rewrite it with kerneltrial.kernel.summary.write_summary(run_dir, overwrite=True))"
        )
    for version in versions[versions.index(data["schema"]) :]:
        adapter = SUMMARY_ADAPTERS[version]
        data = adapter(data) if adapter else data
    return validate(Summary, data, run_dir / SUMMARY)


def _why_no_summary(run_dir: Path) -> str:
    """What to do about a kernel run directory without summary.json: an interrupted run
    (provenance.json without finished_at) continues with `run --resume`."""
    provenance = run_dir / PROVENANCE
    if provenance.is_file() and not read_json(provenance).get("finished_at"):
        return (
            "the run did not finish (interrupted or still running): continue it with "
            f"`kerneltrial run PROTOCOL --out {run_dir} --resume`, PROTOCOL being the file it started from "
            f"(the same bytes as {run_dir / PROTOCOL})"
        )
    return "the runner writes it when a run ends; is this a run directory (`kerneltrial run ... --out DIR`)?"
