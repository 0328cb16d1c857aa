"""Typed, frozen readers of a kernel run's plan.json and provenance.json (summary.json's:
rundir/summary_doc.py), and the base they share (`Document`, `validate`).

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
from kerneltrial.rundir.files import read_json, write_json
from kerneltrial.rundir.layout import PLAN, PROVENANCE

# plan.json and provenance.json name their shape from issue 28 on; older ones have no `schema`
PLAN_V1 = "kerneltrial.plan/1"
PROVENANCE_V1 = "kerneltrial.provenance/1"


class Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def as_json(self) -> dict[str, Any]:
        """The document as its file holds it: the keys it was given (those its version records), in
        order, by their aliases."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def write_document(path: Path, document: Document) -> None:
    """Write `document` (`as_json`) to `path` in one step."""
    write_json(path, document.as_json())


DocumentT = TypeVar("DocumentT", bound=Document)


# ---------------------------------------------------------------- plan.json


class FloorRule(Document):
    """The rule of the floor under an isolated arm's claims on the host clock (kernel/bounds.py), as
    rundir/integrity_notes.py's constants set it when the run was written."""

    wall_slack: float = Field(
        description="The share of a sample's wall clock, beside the tie band, left out of its floor."
    )
    roundtrip_spreads: float = Field(
        description="Median absolute deviations of the reference's round trips added to their median."
    )
    min_under: int = Field(description="Samples below their own floor an implausible arm needs (all, with fewer).")


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
    flops: int | None = Field(
        default=None,
        description="FLOPs per call, as the operator counts them (ops/flops.py): the numerator of achieved TFLOPS; absent: the operator defines no count, or a run from before issue 40.",
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
    floor_rule: FloorRule | None = Field(
        default=None,
        description="The floor's rule (it applies where `roundtrip` names a reference); null: a run from before it was recorded.",
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
    peak_memory: bool | None = Field(
        default=None,
        description="Whether the run measured each arm's extra peak memory (timings.csv `peak_bytes`, trial/memory.py): true on a GPU timed with CUDA events; false on a CPU or under `cuda-graph`; null: a run from before issue 40 (no such column).",
    )


def _plan_before_timed_checks(data: dict[str, Any]) -> dict[str, Any]:
    """Runs before issue 10: no timed checks, no exactness or plausibility, frozen_at not recorded."""
    return {"order_seed": None, **data, "checks": 0, "exact": False, "plausibility": None, "frozen_at": None}


def read_plan(run_dir: Path) -> Plan:
    data = document_data(run_dir, PLAN)
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
    samples_retaken_throttled: int | None = Field(
        default=None,
        description="Samples taken again because the SM clock read throttled right after them (protocol throttle_retakes); null: before re-takes.",
    )
    samples_retaken_throttled_by_arm: dict[str, int] | None = Field(
        default=None,
        description="The same re-takes by arm (an arm re-taken more often was timed after a rest more often); {}: none re-taken; null: before per-arm counts.",
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
    data = document_data(run_dir, PROVENANCE)
    data = {**data, "records_freeze": True} if "freeze" in data else _provenance_before_freeze(data)
    return validate(Provenance, data, run_dir / PROVENANCE)


# ---------------------------------------------------------------- reading


def document_data(run_dir: Path, name: str) -> dict[str, Any]:
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
