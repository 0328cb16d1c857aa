"""Typed, frozen readers of a kernel run's plan.json, provenance.json and summary.json.

Each reader validates the newest shape of its document; a document written by an older
kerneltrial passes through one adapter for its version, which fills what that version did not
record, so that readers never ask which version they hold. The versions, as committed under
results/ (every key: docs/RUNDIR.md, generated from these models):

- plan.json: without `order_seed` (the first runs), with it, and with the timed-check contract
  (`checks`, `exact`, `plausibility`, `frozen_at`); `calibration` only in calibration runs.
- provenance.json: without the freeze record and kernel hashes (`freeze`, `impl_modules`), with
  them, and with the lead-check counts (`lead`).
- plan.json `host` (host cost per call, issue 16) only in runs with a host stage; `isolated` (and
  provenance.json `isolation`) only in runs with isolated arms' contract (`checks` 3).
- plan.json and provenance.json of runs from issue 28 on name their shape (`schema`
  `kerneltrial.plan/1`, `kerneltrial.provenance/1`); older ones have no `schema` (read as None).
- summary.json (versions and their adapters: rundir/summary_versions.py): `kerneltrial.summary/3`, `/4` (timed checks), `/5` (host cost per call), `/6`
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
from kerneltrial.rundir.summary_versions import SUMMARY_ADAPTERS, SUMMARY_DOWNGRADES, SUMMARY_V1, SUMMARY_V6, SUMMARY_V7

# plan.json and provenance.json name their shape from issue 28 on; older ones have no `schema`
PLAN_V1 = "kerneltrial.plan/1"
PROVENANCE_V1 = "kerneltrial.provenance/1"


class Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


DocumentT = TypeVar("DocumentT", bound=Document)


# ---------------------------------------------------------------- plan.json


class PlanArm(Document):
    name: str = Field(
        description="The arm's name: `control`, a candidate, a peer, `user:<module stem>`, or an `aa:`/`slow:` calibration copy."
    )
    kind: str = Field(description="`control`, `candidate`, `peer`, `user` or `calibration`.")
    available: bool = Field(description="Whether the arm could run here (a peer whose package is missing cannot).")
    reason: str | None = Field(description="Why the arm is unavailable; null when it is available.")
    layouts: list[str] | None = Field(
        default=None,
        description="The only layouts the arm takes (a peer, or a calibration copy of one, that takes only contiguous rows); null: every layout. A candidate never has it (verify fails a plan that gives one).",
    )


class PlanCase(Document):
    case: str = Field(
        description="The case id, `{'x'.join(shape)}/{layout}/{dtype}` (rundir.layout.case_id), as every other file names the case."
    )
    shape: list[int] = Field(description="The input shape.")
    layout: str = Field(description="The input layout (`contiguous`, or a strided layout the operator defines).")
    dtype: str = Field(description="The input dtype (`bfloat16`, `float16`, `float32`).")
    bytes: int = Field(
        description="Bytes moved per call (read + written): the numerator of GB/s and of the speed-of-light floor."
    )
    calls: int = Field(description="Back-to-back calls per timed sample (0: no arm timed in the case).")
    rounds: int | None = Field(
        default=None,
        description="Rounds actually run for this case, updated as the noise rule adds rounds; absent: plan `rounds`.",
    )
    injected_delay_ns: float | None = Field(
        default=None, description="The delay added to each call of a `slow:` arm in this case; absent without one."
    )
    delay_overhead_ns: float | None = Field(
        default=None, description="The measured cost of an empty delay kernel, subtracted from the spin requested."
    )
    delay_spin_ns: float | None = Field(
        default=None, description="The spin actually requested: `injected_delay_ns` net of `delay_overhead_ns`."
    )


class Bootstrap(Document):
    resamples: int = Field(description="Bootstrap resamples per interval (protocol `bootstrap_resamples`).")
    seed: int = Field(
        description="The seed of every bootstrap generator, one fresh generator per (case, arm) (protocol `bootstrap_seed`)."
    )
    confidence: float = Field(description="The intervals' confidence level (protocol `confidence`).")


class PlanClocks(Document):
    max_sm_mhz: int | None = Field(description="The GPU's maximum SM clock (NVML); null when unknown (CPU runs).")
    throttle_fraction: float = Field(
        description="A sample whose SM clock is below this fraction of the maximum counts as throttled."
    )


class NoiseRule(Document):
    target_ci_width: float | None = Field(
        description="Rounds are added to a case until its interval is at most this wide; null: no rounds are added."
    )
    max_rounds: int = Field(description="The most rounds a case may reach under the noise rule.")
    time_budget_s: float = Field(description="The wall time the noise rule may spend adding rounds.")


class CalibrationRule(Document):
    injected_slowdown: float = Field(description="The delay a `slow:` arm adds, as a fraction of its base arm's time.")
    max_false_positive_rate: float = Field(
        description="The largest share of non-tie verdicts an `aa:` arm may have for calibration to pass."
    )
    min_power: float = Field(
        description="The smallest share of loss verdicts a `slow:` arm must reach for calibration to pass."
    )


class PlausibilityRule(Document):
    bandwidth_margin: float = Field(
        description="An arm above the run's best cold-L2 ceiling by more than this fraction is implausible."
    )
    launch_floor_fraction: float = Field(
        description="An arm whose median per call is below this fraction of an empty launch is implausible."
    )


class HostRule(Document):
    samples: int = Field(description="Host-cost samples per case and timed arm (protocol `host_samples`).")
    calls: int = Field(
        description="Back-to-back calls per host sample (protocol `host_calls`; at most 2 without a GPU)."
    )


class PlanTarget(Document):
    name: str = Field(description="The target of `run --target` (`ascend`, `nvidia`).")
    max_grid: list[int] = Field(
        description="Programs allowed per grid dimension: every Triton launch was checked against them."
    )


class SandboxRecord(Document):
    allowed: list[str] = Field(
        description="The pieces every worker ran in (uid, pidns, cgroup, no_new_privs, seccomp)."
    )
    missing: dict[str, str] = Field(description="Each piece the host refused, with the reason its probe gave.")


class Plan(Document):
    schema_: Literal["kerneltrial.plan/1"] | None = Field(
        None, alias="schema", description="`kerneltrial.plan/1`; null: a plan from before the key."
    )
    protocol_sha256: str = Field(description="sha256 of protocol.toml's bytes.")
    op: str = Field(description="The operator under trial.")
    backend: str = Field(description="The timer: `cuda-events`, `cuda-graph` or `host-clock`.")
    is_gpu: bool = Field(
        description="Whether the run timed a GPU (false: the Triton interpreter on a CPU, NOT GPU performance)."
    )
    timing_label: str = Field(description="One line saying what the times measure, shown on every report.")
    l2: str = Field(description="`cold` (a buffer larger than L2 written before every call) or `hot`.")
    order_seed: int | None = Field(
        description="The seed of the round order (`numpy.random.default_rng([order_seed, case_index, seed, round])`); null: a run from before the seeded order was recorded."
    )
    arms: list[PlanArm] = Field(
        description="Every arm in plan order: the control, then the candidates, peers and calibration copies."
    )
    cases: list[PlanCase] = Field(description="Every case, in the protocol's order.")
    clocks: PlanClocks | None = Field(
        default=None, description="The clock rule; null: a plan from before clock readings."
    )
    noise_rule: NoiseRule | None = Field(
        default=None, description="The preregistered rule that adds rounds; null: a plan from before it."
    )
    seeds: list[int] = Field(description="The seeds of correctness checks and timing units.")
    rounds: int = Field(description="Planned rounds per (case, seed).")
    tie_band: float = Field(description="The band around 1 inside which a speedup's interval is a tie.")
    gate: str = Field(description="The preregistered gate: `no_loss`, `geomean>=X`, or both joined by ` and `.")
    bootstrap: Bootstrap = Field(description="The bootstrap settings of every interval.")
    calibration: CalibrationRule | None = Field(
        default=None, description="The calibration rule; calibration runs only."
    )
    checks: int = Field(
        description="The timed-check contract: 0 before timed checks, 1 (the sample's last call checked), 2 (fresh values before every call, a random checked call), 3 (as 2, with isolated arms)."
    )
    isolated: list[str] = Field(
        default=[],
        description="`checks` 3: the arms that ran in a worker process of their own, as protocol `isolate` names them.",
    )
    sandbox: SandboxRecord | None = Field(
        default=None,
        description="The sandbox pieces this host gave the isolated workers (trial/confine.py); null without isolated arms, or before the sandbox.",
    )
    roundtrip: str | None = Field(
        default=None,
        description="The control whose trusted isolated worker measured each round's round trip (roundtrip.csv, the floor under isolated arms' claims); null where no floor applies (no isolated arm, or a GPU) or before issue 35.",
    )
    exact: bool = Field(description="Whether outputs must equal the official formula bit for bit.")
    plausibility: PlausibilityRule | None = Field(description="The plausibility rule; null before timed checks.")
    frozen_at: str | None = Field(
        description="The freeze record's time; null: not frozen, or a run from before timed checks."
    )
    order_seed_override: bool = Field(
        default=False,
        description="True when `run --order-seed` replaced the protocol's order seed (replicates, fleet replicas).",
    )
    target: PlanTarget | None = Field(
        default=None, description="The launch limits of `run --target` (`--resume` needs the same); null: none checked."
    )
    host: HostRule | None = Field(default=None, description="The host-cost stage; null: a run from before it.")
    inputs_seed: int | None = Field(
        default=None,
        description="The run's inputs seed (provenance.json's; ops/inputs.py); null: a run from before inputs seeds.",
    )
    floor: dict[str, str] | None = Field(
        default=None,
        description="The floor model summary/6 reports (rundir/layout.py FLOOR_MODEL); null: a run from before it.",
    )


def _plan_before_timed_checks(data: dict[str, Any]) -> dict[str, Any]:
    """Runs before issue 10: no timed checks, no exactness or plausibility, frozen_at not recorded."""
    return {"order_seed": None, **data, "checks": 0, "exact": False, "plausibility": None, "frozen_at": None}


def read_plan(run_dir: Path) -> Plan:
    data = _document(run_dir, PLAN)
    return validate(Plan, data if "checks" in data else _plan_before_timed_checks(data), run_dir / PLAN)


# ---------------------------------------------------------------- provenance.json


class Device(Document):
    gpu: str | None = Field(description="The GPU's name; null on a CPU.")
    uuid: str | None = Field(
        default=None, description="The GPU's UUID (nvidia-smi's GPU-...); null before fleets, and on a CPU."
    )
    cpu: str | None = Field(default=None, description="The CPU's name.")
    sm_count: int | None = Field(default=None, description="Streaming multiprocessors.")
    l2_bytes: int | None = Field(default=None, description="L2 cache size in bytes.")
    memory_bytes: int | None = Field(default=None, description="Device memory in bytes.")
    capability: str | None = Field(default=None, description="CUDA compute capability, e.g. `9.0`.")
    cuda: str | None = Field(default=None, description="CUDA version torch was built with.")
    driver: str | None = Field(default=None, description="The GPU driver's version.")


class Git(Document):
    commit: str | None = Field(
        description="The commit that ran (on a shipped copy: the sender's KERNELTRIAL_SOURCE_COMMIT)."
    )
    dirty: bool | None = Field(
        description="Whether the tree had uncommitted changes (a dirty run is not compared with its commit)."
    )
    source_sha256: str | None = Field(
        default=None,
        description="Digest of the package's .py files that ran (source.tar.gz); absent in the earliest runs.",
    )
    source: str | None = Field(
        default=None,
        description="`KERNELTRIAL_SOURCE_COMMIT` when the sender declared the commit; null: read from git.",
    )
    git_head: str | None = Field(default=None, description="Git's own HEAD beside a declared commit.")
    git_dirty: bool | None = Field(default=None, description="Git's own dirty flag beside a declared commit.")


class Freeze(Document):
    sha256: str = Field(description="sha256 of the protocol bytes that were frozen.")
    frozen_at: str = Field(description="When the protocol was frozen (UTC).")


class Lead(Document):
    samples_retaken: int = Field(description="Samples taken again because the spin lead was too short.")
    final_cycles_per_call: float = Field(description="The final spin lead per call.")
    samples_kept_behind: int | None = Field(
        default=None,
        description="Samples kept although the host fell behind at the longest lead; null: counted since the -t1 runs only.",
    )
    sessions: Literal["all", "last"] | None = Field(
        default=None, description="`all`: the counts cover every session of a resumed run; `last`: only the last."
    )


class Link(Document):
    path: str = Field(description="Relative to the run directory.")
    sha256: str = Field(description="sha256 of the linked file.")


class RunLink(Document):
    path: str = Field(description="A run directory, relative to this one.")
    summary_sha256: str = Field(description="sha256 of that run's summary.json.")
    manifest_sha256: str | None = Field(description="sha256 of that run's manifest.json; null: the run has none.")


class Confirmation(Document):
    rule: Link = Field(description="The dispatcher's rule file.")
    derived_from: list[RunLink] = Field(description="The runs the rule was derived from.")


class IsolationRecord(Document):
    arms: list[str] = Field(description="The protocol's isolated arms.")
    timeout_s: float = Field(description="The deadline of each request to a worker (protocol `isolate_timeout_s`).")


class Provenance(Document):
    schema_: Literal["kerneltrial.provenance/1"] | None = Field(
        None, alias="schema", description="`kerneltrial.provenance/1`; null: a run from before the key."
    )
    kind: Literal["kernel"] = Field(description="`kernel` (`kerneltrial verify` and `report` dispatch on it).")
    protocol_sha256: str = Field(description="sha256 of protocol.toml's bytes.")
    versions: dict[str, str | None] = Field(
        description="Versions of python, torch, triton and the other packages that ran."
    )
    device: Device = Field(description="The device the run timed.")
    triton_interpreter: bool = Field(description="Whether Triton ran in its interpreter (TRITON_INTERPRET=1).")
    clocks_at_start: dict[str, str] | None = Field(description="nvidia-smi's clock query at the start; null on a CPU.")
    clocks_at_end: dict[str, str] | None = Field(
        default=None, description="The same at the end; null until the run finished."
    )
    hostname: str = Field(description="The machine's name (recorded nowhere else, except per unit in a fleet).")
    git: Git = Field(description="The code that ran.")
    argv: list[str] = Field(description="The command line.")
    started_at: str = Field(description="Start time (UTC, milliseconds).")
    finished_at: str | None = Field(description="End time; null until the run finished.")
    records_freeze: bool = Field(
        description="False: a run from before the freeze record (`freeze` then says nothing). Filled by the reader, not in the file."
    )
    freeze: Freeze | None = Field(description="The protocol's freeze record; null: the protocol was not frozen.")
    impl_modules: dict[str, str] = Field(
        description="sha256 of each user kernel module, by path (`--resume` refuses an edited one)."
    )
    lead: Lead | None = Field(
        default=None,
        description="The lead check's counts, written at the end; null before the lead check, or not finished.",
    )
    confirmation: Confirmation | None = Field(
        default=None,
        description="A confirmation run's links to its rule and the runs it was derived from (paths relative to the run directory).",
    )
    inputs_seed: int | None = Field(
        default=None, description="The run's inputs seed, drawn at start (a resumed run keeps it; plan.json copies it)."
    )
    isolation: IsolationRecord | None = Field(
        default=None,
        description="Protocol `isolate` and `isolate_timeout_s` (runs with `checks` 3); null before isolated arms.",
    )


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
        description="Median of ((1 - tie_band) * wall_ns - roundtrip_ns) / calls: the least the harness vouches the arm's calls took; a median claim per call below it is implausible. Absent without a floor.",
    )
    under_samples: int | None = Field(
        default=None,
        description="Samples whose claim (ns) is below their floor (1 - tie_band) * wall_ns - roundtrip_ns. Absent without a floor.",
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
