"""Typed, frozen readers of a kernel run's plan.json, provenance.json and summary.json.

Each reader validates the newest shape of its document; a document written by an older
kerneltrial passes through one adapter for its version, which fills what that version did not
record, so that readers never ask which version they hold. The versions, as committed under
results/ (docs/DESIGN.md, "Run directory: exact format"):

- plan.json: without `order_seed` (the first runs), with it, and with the timed-check contract
  (`checks`, `exact`, `plausibility`, `frozen_at`); `calibration` only in calibration runs.
- provenance.json: without the freeze record and kernel hashes (`freeze`, `impl_modules`), with
  them, and with the lead-check counts (`lead`).
- plan.json `host` (host cost per call, issue 16) only in runs with a host stage; `isolated` (and
  provenance.json `isolation`) only in runs with isolated arms' contract (`checks` 3).
- plan.json and provenance.json of runs from issue 28 on name their shape (`schema`
  `kerneltrial.plan/1`, `kerneltrial.provenance/1`); older ones have no `schema` (read as None).
- summary.json: `kerneltrial.summary/3`, `/4` (timed checks), `/5` (host cost per call), `/6`
  (the speed-of-light floor per case and arm, plan.json `floor`) and `/7` (isolated arms: the
  harness's bounds on their own clocks); `/1`
  (before clocks, spreads, per-case rounds and calibration) and `/2` (before the realized
  slowdown) are still read.

`kerneltrial verify` reads the same files as raw JSON on purpose: it must report a malformed
document field by field, where these readers refuse it whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.layout import PLAN, PROTOCOL, PROVENANCE, SUMMARY

SUMMARY_V1 = "kerneltrial.summary/1"
SUMMARY_V2 = "kerneltrial.summary/2"
SUMMARY_V3 = "kerneltrial.summary/3"
SUMMARY_V4 = "kerneltrial.summary/4"
SUMMARY_V5 = "kerneltrial.summary/5"
SUMMARY_V6 = "kerneltrial.summary/6"
SUMMARY_V7 = "kerneltrial.summary/7"
# plan.json and provenance.json name their shape from issue 28 on; older ones have no `schema`
PLAN_V1 = "kerneltrial.plan/1"
PROVENANCE_V1 = "kerneltrial.provenance/1"


class Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


DocumentT = TypeVar("DocumentT", bound=Document)


# ---------------------------------------------------------------- plan.json


class PlanArm(Document):
    name: str
    kind: str  # control, candidate, peer, user, calibration
    available: bool
    reason: str | None
    layouts: list[str] | None = None  # only these layouts (a peer that takes some); None: every layout


class PlanCase(Document):
    case: str
    shape: list[int]
    layout: str
    dtype: str
    bytes: int
    calls: int
    rounds: int | None = None
    injected_delay_ns: float | None = None
    delay_overhead_ns: float | None = None
    delay_spin_ns: float | None = None


class Bootstrap(Document):
    resamples: int
    seed: int
    confidence: float


class PlanClocks(Document):
    max_sm_mhz: int | None
    throttle_fraction: float


class NoiseRule(Document):
    target_ci_width: float | None
    max_rounds: int
    time_budget_s: float


class CalibrationRule(Document):
    injected_slowdown: float
    max_false_positive_rate: float
    min_power: float


class PlausibilityRule(Document):
    bandwidth_margin: float
    launch_floor_fraction: float


class HostRule(Document):
    samples: int  # host-cost samples per case and timed arm
    calls: int  # back-to-back calls per sample


class PlanTarget(Document):
    name: str
    max_grid: list[int]  # programs allowed per grid dimension


class Plan(Document):
    schema_: Literal["kerneltrial.plan/1"] | None = Field(None, alias="schema")  # None: a plan before the key
    protocol_sha256: str
    op: str
    backend: str
    is_gpu: bool
    timing_label: str
    l2: str
    order_seed: int | None  # None: a run from before the seeded round order was recorded
    arms: list[PlanArm]
    cases: list[PlanCase]
    clocks: PlanClocks | None = None  # None: a plan from before clock readings
    noise_rule: NoiseRule | None = None  # None: a plan from before the noise rule
    seeds: list[int]
    rounds: int
    tie_band: float
    gate: str
    bootstrap: Bootstrap
    calibration: CalibrationRule | None = None  # calibration runs only
    checks: int  # the timed-check contract: 0 before timed checks, then 1, 2 or 3 (3: isolated arms)
    isolated: list[str] = []  # checks 3: the arms that ran in a worker process of their own
    exact: bool
    plausibility: PlausibilityRule | None  # None before timed checks
    frozen_at: str | None  # None: not frozen, or a run from before timed checks
    order_seed_override: bool = False  # True: `run --order-seed` replaced the protocol's (replicates)
    target: PlanTarget | None = None  # `run --target`: the launch limits every Triton launch was checked against
    host: HostRule | None = None  # None: a run from before the host-cost stage
    inputs_seed: int | None = None  # the run's inputs seed (ops/inputs.py); None: a run from before them
    floor: dict[str, str] | None = None  # the floor model summary/6 reports (layout.py FLOOR_MODEL); None before it


def _plan_before_timed_checks(data: dict[str, Any]) -> dict[str, Any]:
    """Runs before issue 10: no timed checks, no exactness or plausibility, frozen_at not recorded."""
    return {"order_seed": None, **data, "checks": 0, "exact": False, "plausibility": None, "frozen_at": None}


def read_plan(run_dir: Path) -> Plan:
    data = _document(run_dir, PLAN)
    return validate(Plan, data if "checks" in data else _plan_before_timed_checks(data), run_dir / PLAN)


# ---------------------------------------------------------------- provenance.json


class Device(Document):
    gpu: str | None
    uuid: str | None = None  # the GPU's UUID (nvidia-smi's GPU-...); None before fleets, and on a CPU
    cpu: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    memory_bytes: int | None = None
    capability: str | None = None
    cuda: str | None = None
    driver: str | None = None


class Git(Document):
    commit: str | None
    dirty: bool | None
    source_sha256: str | None = None  # absent in the earliest runs
    source: str | None = None  # "KERNELTRIAL_SOURCE_COMMIT" when the sender declared the commit
    git_head: str | None = None
    git_dirty: bool | None = None


class Freeze(Document):
    sha256: str
    frozen_at: str


class Lead(Document):
    samples_retaken: int
    final_cycles_per_call: float
    samples_kept_behind: int | None = None  # None: counted since the -t1 runs only
    sessions: Literal["all", "last"] | None = None


class Link(Document):
    path: str  # relative to the run directory
    sha256: str


class RunLink(Document):
    path: str  # relative to the run directory
    summary_sha256: str
    manifest_sha256: str | None


class Confirmation(Document):
    rule: Link
    derived_from: list[RunLink]


class IsolationRecord(Document):
    arms: list[str]  # the protocol's isolated arms
    timeout_s: float  # the deadline of each request to a worker


class Provenance(Document):
    schema_: Literal["kerneltrial.provenance/1"] | None = Field(None, alias="schema")  # None: a run before the key
    kind: Literal["kernel"]
    protocol_sha256: str
    versions: dict[str, str | None]
    device: Device
    triton_interpreter: bool
    clocks_at_start: dict[str, str] | None
    clocks_at_end: dict[str, str] | None = None  # None until the run finished
    hostname: str
    git: Git
    argv: list[str]
    started_at: str
    finished_at: str | None
    records_freeze: bool  # False: a run from before the freeze record (`freeze` then says nothing)
    freeze: Freeze | None  # None: the protocol was not frozen
    impl_modules: dict[str, str]  # sha256 of each user kernel file
    lead: Lead | None = None  # None: before the lead check, or not finished
    confirmation: Confirmation | None = None  # a confirmation run's links to its rule and runs
    inputs_seed: int | None = None  # the run's inputs seed, recorded at start (plan.json copies it)
    isolation: IsolationRecord | None = None  # None: a run from before isolated arms


def _provenance_before_freeze(data: dict[str, Any]) -> dict[str, Any]:
    """Runs before the freeze record and the kernel-module hashes."""
    return {**data, "records_freeze": False, "freeze": None, "impl_modules": {}}


def read_provenance(run_dir: Path) -> Provenance:
    data = _document(run_dir, PROVENANCE)
    data = {**data, "records_freeze": True} if "freeze" in data else _provenance_before_freeze(data)
    return validate(Provenance, data, run_dir / PROVENANCE)


# ---------------------------------------------------------------- summary.json


class ArmFigures(Document):
    """One arm in one case."""

    kind: str
    status: str  # timed, failed correctness, failed while timed, implausible, unavailable, not timed, ...
    median_ns_per_call: float | None
    n_samples: int
    ci_units: int | None
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str | None
    gbps: float | None
    pct_of_copy_ceiling: float | None
    throttled_samples: int
    spread: float | None  # None: not timed (or a summary/1)
    messages: list[str]
    reason: str | None
    host_ns_per_call: float | None  # median host time per call; None: not measured (before summary/5)
    host_samples: int
    host_behind: int | None  # samples whose device was still busy at the end; None before summary/5
    fraction_of_floor: float | None  # the case's floor / this median (kernel/floor.py); None before summary/6

    @property
    def device_bound(self) -> bool:
        """Some host sample ended with the device still busy: its time may include device time."""
        return bool(self.host_behind)


class SummaryCase(Document):
    case: str
    shape: list[int]
    layout: str
    dtype: str
    bytes: int
    matched_copy_gbps: float | None = None  # a copy of this case's traffic; None: not measured (before issue 16)
    floor_ns: float | None  # the speed-of-light floor (kernel/floor.py); None before summary/6 or unmeasured
    calls: int
    rounds: int | None  # None in summary/1
    units_planned: int | None
    injected_delay_ns: float | None
    arms: dict[str, ArmFigures]


class Aggregate(Document):
    n_cases: int
    geomean: float | None
    geomean_ci_low: float | None
    geomean_ci_high: float | None
    mean: float | None
    worst: float | None
    worst_case: str | None
    wins: int
    ties: int
    losses: int
    failed_correctness: int
    # None before timed checks (summary/3 had no inconclusive verdict, nothing failed while timed
    # and nothing was judged implausible)
    inconclusive: int | None
    failed_while_timed: int | None
    implausible: int | None
    ulp_hist: list[int] | None


class GateArm(Document):
    passed: bool
    reasons: list[str]


class Gate(Document):
    rule: str
    arms: dict[str, GateArm]
    passed_arms: list[str]


class Ceilings(Document):
    copy_gbps: float | None
    copy_samples: int
    read_gbps: float | None
    read_samples: int
    launch_floor_ns: float | None = None  # runs with timed checks measure the launch floor
    launch_samples: int | None = None
    # a one-element Triton kernel (issue 16); None / 0: the run did not measure it (no key in its summary)
    triton_launch_floor_ns: float | None = None
    triton_launch_samples: int = 0


class Clocks(Document):
    max_sm_mhz: int | None
    throttle_fraction: float
    threshold_mhz: float | None
    samples_with_clock: int
    throttled_samples: int


class AACalibration(Document):
    kind: Literal["aa"]
    base: str
    n_cases: int
    false_positives: int  # win or loss verdicts (summary/3: `not_tie`, the same count)
    inconclusive: int | None  # None in summary/3, which had no inconclusive verdict
    false_positive_rate: float | None
    mean_ci_width: float | None


class SlowCalibration(Document):
    kind: Literal["slow"]
    base: str
    n_cases: int
    losses: int
    power: float | None
    realized_slowdown: dict[str, float]
    realized_min: float | None
    realized_max: float | None
    power_at_nominal: float | None


class Calibration(Document):
    injected_slowdown: float
    max_false_positive_rate: float
    min_power: float
    arms: dict[str, AACalibration | SlowCalibration]
    passed: bool
    sentence: str


class SummaryPlausibility(Document):
    bandwidth_margin: float
    launch_floor_fraction: float
    applied: bool
    bandwidth_limit_gbps: float | None
    time_limit_ns: float | None


class TimedCheckCounts(Document):
    rows: int
    failed: int


class HostCounts(Document):
    samples: int
    calls: int
    rows: int


class IsolationBound(Document):
    case: str
    arm: str
    samples: int
    claimed_ns_per_call: float  # the worker's own clock
    bound_ns_per_call: float  # the harness's wall clock around the same samples
    ratio: float | None


class IsolationFigures(Document):
    arms: list[str]
    far_inside: float
    bounds: list[IsolationBound]


class Summary(Document):
    schema_: str = Field(alias="schema")
    protocol_sha256: str
    backend: str
    is_gpu: bool
    l2: str
    op: str | None  # None: a plan without `op`; the protocol names the operator
    label: str
    control: str
    tie_band: float
    bootstrap: Bootstrap
    arms: list[PlanArm]
    noise_rule: NoiseRule | None  # None: the plan has no noise rule (or a summary/1)
    ceilings: Ceilings
    clocks: Clocks | None  # None in summary/1
    cases: list[SummaryCase]
    aggregates: dict[str, Aggregate]
    gate: Gate
    exact: bool
    frozen_at: str | None  # None: not frozen (summary/3: not recorded; see provenance.json)
    plausibility: SummaryPlausibility | None  # None before timed checks
    timed_checks: TimedCheckCounts | None  # None before timed checks (summary/3)
    host: HostCounts | None  # None before host cost (summary/4 and older)
    isolation: IsolationFigures | None  # None before isolated arms (summary/6 and older)
    warnings: list[str]
    inputs_sha256: dict[str, str]
    calibration: Calibration | None = None  # calibration runs only (unset, and not written, otherwise)

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


def _summary_v3(data: dict[str, Any]) -> dict[str, Any]:
    """summary/3: no timed checks, no inconclusive verdict; A/A arms counted `not_tie`."""
    nothing = {"inconclusive": None, "failed_while_timed": None, "implausible": None, "ulp_hist": None}
    adapted = {
        **data,
        "aggregates": {name: {**figures, **nothing} for name, figures in data["aggregates"].items()},
        "exact": False,
        "frozen_at": None,
        "plausibility": None,
        "timed_checks": None,
    }
    if data.get("calibration"):
        arms = {
            name: {key: value for key, value in figures.items() if key != "not_tie"}
            | ({"false_positives": figures["not_tie"], "inconclusive": None} if figures["kind"] == "aa" else {})
            for name, figures in data["calibration"]["arms"].items()
        }
        adapted["calibration"] = {**data["calibration"], "arms": arms}
    return adapted


def _summary_v4(data: dict[str, Any]) -> dict[str, Any]:
    """summary/4 and older: no host cost per call (host.csv did not exist)."""
    unmeasured = {"host_ns_per_call": None, "host_samples": 0, "host_behind": None}
    cases = [
        {**case, "arms": {name: {**entry, **unmeasured} for name, entry in case["arms"].items()}}
        for case in data["cases"]
    ]
    return {**data, "cases": cases, "host": None}


def _summary_v5(data: dict[str, Any]) -> dict[str, Any]:
    """summary/5 and older: no speed-of-light floor (plan.json had no `floor`)."""
    cases = [
        {
            **case,
            "floor_ns": None,
            "arms": {name: {**entry, "fraction_of_floor": None} for name, entry in case["arms"].items()},
        }
        for case in data["cases"]
    ]
    return {**data, "cases": cases}


def _summary_v6(data: dict[str, Any]) -> dict[str, Any]:
    """summary/6 and older: no isolated arms (plan.json had no `checks` 3)."""
    return {**data, "isolation": None}


def _summary_v1(data: dict[str, Any]) -> dict[str, Any]:
    """summary/1: no clocks, spreads, throttle counts, per-case rounds, noise rule or calibration."""
    cases = [
        {"rounds": None, "units_planned": None, "injected_delay_ns": None, **case}
        | {"arms": {name: {"throttled_samples": 0, "spread": None, **e} for name, e in case["arms"].items()}}
        for case in data["cases"]
    ]
    return {"clocks": None, "noise_rule": None, **data, "cases": cases}


def _summary_v2(data: dict[str, Any]) -> dict[str, Any]:
    """summary/2: slowed calibration arms without the realized slowdown."""
    if not data.get("calibration"):
        return data
    unknown = {"realized_slowdown": {}, "realized_min": None, "realized_max": None, "power_at_nominal": None}
    arms = {
        name: unknown | figures if figures["kind"] == "slow" else figures
        for name, figures in data["calibration"]["arms"].items()
    }
    return {**data, "calibration": {**data["calibration"], "arms": arms}}


# each version's adapter, applied from the document's version on (summary/1 passes all six)
SUMMARY_ADAPTERS = {
    SUMMARY_V1: _summary_v1,
    SUMMARY_V2: _summary_v2,
    SUMMARY_V3: _summary_v3,
    SUMMARY_V4: _summary_v4,
    SUMMARY_V5: _summary_v5,
    SUMMARY_V6: _summary_v6,
    SUMMARY_V7: None,
}


# ---------------------------------------------------------------- writing summary.json
# Each writable version's downgrade, the inverse of its reader adapter above: a Summary holds the
# newest shape, and `summary_json` drops what the document's own version did not record. A field
# a run did not measure (`matched_copy_gbps`, `triton_launch_*`, `calibration`, an arm's
# `layouts`) is left unset by the writer and not written; the reader leaves it unset too.


def _drop(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in keys}


def _map_arms(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`data` with `keys` dropped from every case's arm entries."""
    cases = [
        {**case, "arms": {name: _drop(entry, *keys) for name, entry in case["arms"].items()}} for case in data["cases"]
    ]
    return {**data, "cases": cases}


def _to_v6(data: dict[str, Any]) -> dict[str, Any]:
    """summary/6: no isolated arms (inverse of `_summary_v6`)."""
    return _drop(data, "isolation")


def _to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """summary/5: no speed-of-light floor (inverse of `_summary_v5`)."""
    data = _map_arms(data, "fraction_of_floor")
    return {**data, "cases": [_drop(case, "floor_ns") for case in data["cases"]]}


def _to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """summary/4: no host cost per call (inverse of `_summary_v4`)."""
    return _drop(_map_arms(data, "host_ns_per_call", "host_samples", "host_behind"), "host")


def _not_tie(figures: dict[str, Any]) -> dict[str, Any]:
    """A summary/3 A/A arm: its false positives named `not_tie`, in their place; no inconclusive count."""
    if figures["kind"] != "aa":
        return figures
    renamed = {("not_tie" if key == "false_positives" else key): value for key, value in figures.items()}
    return _drop(renamed, "inconclusive")


def _to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """summary/3: no timed checks, launch floor or inconclusive verdicts (inverse of `_summary_v3`)."""
    unrecorded = ("inconclusive", "failed_while_timed", "implausible", "ulp_hist")
    adapted = _drop(data, "exact", "frozen_at", "plausibility", "timed_checks")
    adapted["ceilings"] = _drop(data["ceilings"], "launch_floor_ns", "launch_samples")
    adapted["aggregates"] = {name: _drop(figures, *unrecorded) for name, figures in data["aggregates"].items()}
    if "calibration" in data:
        arms = {name: _not_tie(figures) for name, figures in data["calibration"]["arms"].items()}
        adapted["calibration"] = {**data["calibration"], "arms": arms}
    return adapted


# the versions a summary is written in, newest first, each with its step down to it
SUMMARY_DOWNGRADES = {SUMMARY_V7: None, SUMMARY_V6: _to_v6, SUMMARY_V5: _to_v5, SUMMARY_V4: _to_v4, SUMMARY_V3: _to_v3}


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
    data = _document(run_dir, SUMMARY)
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


# ---------------------------------------------------------------- reading


def _document(run_dir: Path, name: str) -> dict[str, Any]:
    data = read_json(Path(run_dir) / name)
    if not isinstance(data, dict):
        raise RunDirError(f"{Path(run_dir) / name}: not a JSON object")
    return data


def validate(model: type[DocumentT], data: Any, path: Path, note: str | None = None) -> DocumentT:
    """`data` read into `model`, or a RunDirError naming the file, the first bad field and `note`
    (default: how many problems there are in all)."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "document"
        note = note or f"{error.error_count()} problem(s) in all"
        raise RunDirError(f"{path}: {where}: {first['msg']} ({note})") from error
