"""Preregistered trial protocols: a TOML file, validated, frozen by its sha256 before it runs.

A protocol fixes everything that could be tuned after seeing the data: arms, cases, seeds,
rounds, calls per sample, L2 mode, tie band, the decision gate, and the noise rules (a
target CI width that adds rounds up to max_rounds / time_budget_s; the throttle threshold;
a calibration run that must have passed before this one reports). `freeze` writes
`<file>.freeze.json` next to it (sha256 and time); `run` refuses a protocol whose bytes no
longer match its freeze record. A confirmation protocol must be frozen, name exactly one
candidate chosen beforehand, and use seeds disjoint from the exploratory phase's.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kerneltrial.gate_rule import parse_gate
from kerneltrial.model_fields import describe
from kerneltrial.rundir import streams
from kerneltrial.rundir.files import now
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.integrity_notes import MIN_UNDER, WALL_SLACK
from kerneltrial.rundir.layout import DTYPE_BYTES, case_id

if TYPE_CHECKING:  # torch-free at import: `run` validates a protocol before any heavy import
    from kerneltrial.ops.registry import Case

CALIBRATION_PREFIXES = ("aa:", "slow:")


class ProtocolError(ValueError):
    """A protocol that cannot run; the message names the field and the fix."""


class CaseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shape: list[int] = Field(
        min_length=1, description="Input shape, positive dimensions (the operator defines each, e.g. [rows, hidden])."
    )
    layout: str = Field(
        default="contiguous",
        description="Memory layout of the inputs, one of the operator's (e.g. contiguous, row_strided, qkv_slice).",
    )
    dtype: str = Field(default="bfloat16", description=f"Input dtype: {', '.join(DTYPE_BYTES)}.")

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(s <= 0 for s in shape):
            raise ValueError(f"every dimension must be positive, got {shape}")
        return shape

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, dtype: str) -> str:
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
        return dtype

    @property
    def id(self) -> str:
        return case_id(self.shape, self.layout, self.dtype)

    def case(self) -> Case:
        from kerneltrial.ops.registry import Case

        return Case(tuple(self.shape), self.dtype, self.layout)


class RuleLink(BaseModel):
    """The dispatch rule a confirmation confirms: its path (relative to the protocol's folder) and sha256."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="The rule file, relative to the protocol's folder.")
    sha256: str = Field(description="sha256 of the rule file's bytes.")


class RunLink(BaseModel):
    """A run the confirmed rule was derived from: path (relative to the protocol's folder) and digests."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="The run directory, relative to the protocol's folder.")
    summary_sha256: str = Field(description="sha256 of the run's summary.json.")
    manifest_sha256: str | None = Field(
        default=None, description="sha256 of the run's manifest.json (runs from before manifests have none)."
    )


class Protocol(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Trial name, recorded in the run directory.")
    op: str = Field(description="Operator to time (`kerneltrial ops` lists them).")
    phase: Literal["exploratory", "confirmation"] = Field(
        default="exploratory",
        description="A confirmation must be frozen, name one candidate chosen beforehand and use seeds disjoint from exploratory_seeds.",
    )
    control: str = Field(
        default="control",
        description="The arm every speedup is measured against (speedup = median control time / median arm time).",
    )
    candidates: list[str] = Field(
        min_length=1,
        description="Arms compared with the control: implementations, peers, user:MODULE, or aa:ARM / slow:ARM in a calibration.",
    )
    impl_modules: list[str] = Field(
        default=[],
        description="User kernel modules to load: a .py path (relative to the protocol's folder) or a dotted module; each adds the arm user:MODULE.",
    )
    cases: list[CaseSpec] = Field(
        min_length=1, description="The problems to check and time, one [[cases]] table each; a case id is listed once."
    )
    seeds: list[int] = Field(
        default=[0, 1, 2],
        min_length=1,
        description="Input seeds: each seed's fresh random inputs are checked, then timed over every round.",
    )
    exploratory_seeds: list[int] = Field(
        default=[], description="Confirmation only: the seeds the exploratory phase used (seeds must avoid them)."
    )
    rule: RuleLink | None = Field(
        default=None,
        description="Confirmation only: the dispatch rule it confirms, {path (relative to the protocol's folder), sha256}; written by `kerneltrial protocol confirm`, checked by run and verify.",
    )
    derived_from: list[RunLink] = Field(
        default=[],
        description="Confirmation only: the exploratory runs the rule was derived from, [{path, summary_sha256, manifest_sha256}]; run refuses seeds they used and links that no longer resolve.",
    )
    rounds: int = Field(
        default=7,
        ge=2,
        description="Rounds per case and seed; each round times every arm once, in a seeded random order.",
    )
    warmup: int = Field(
        default=3, ge=1, description="Untimed calls of an arm before it is timed, and before calls_per_sample is sized."
    )
    calls_per_sample: int | Literal["auto"] = Field(
        default="auto",
        description="Calls per timed sample (each on fresh values), or auto: sized on the control so a sample lasts about target_sample_us.",
    )
    target_sample_us: float = Field(
        default=200.0, gt=0, description='Sample length calls_per_sample = "auto" aims at, microseconds.'
    )
    # Host cost (issue 16): how long a caller is blocked issuing one call, beside device time.
    host_samples: int = Field(
        default=5,
        ge=1,
        description="Host-cost stage: samples per case and timed arm, each host_calls back-to-back calls on the same inputs, unsynchronised.",
    )
    host_calls: int = Field(
        default=200,
        ge=1,
        description="Host-cost stage: calls per sample (on a run without a GPU, at most 2: the interpreter takes milliseconds per call).",
    )
    l2: Literal["cold", "hot"] = Field(
        default="cold",
        description="cold: a buffer larger than L2 is written before every call (published figures); hot: the call's values stay in L2.",
    )
    backend: Literal["auto", "cuda-events", "cuda-graph", "host-clock"] = Field(
        default="auto",
        description='Timer; auto: CUDA events on a GPU, else the host clock (interpreter, not GPU performance); cuda-graph needs l2 = "hot".',
    )
    tie_band: float = Field(
        default=0.02,
        ge=0,
        lt=1 - WALL_SLACK,  # the isolation floor keeps (1 - tie_band - WALL_SLACK) of a wall clock: above 0
        description="Verdicts: win when the speedup CI is above 1 + tie_band, loss when below 1 - tie_band, tie when inside.",
    )
    gate: str = Field(
        default="no_loss",
        description='Decision rule per candidate: no_loss, geomean>=X, or both joined by " and "; any correctness failure fails it.',
    )
    bootstrap_resamples: int = Field(
        default=2000, ge=100, description="Resamples of the paired bootstrap behind every confidence interval."
    )
    bootstrap_seed: int = Field(
        default=20261129, description="Seed of the bootstrap resampling (verify redraws the same resamples)."
    )
    confidence: float = Field(
        default=0.95, gt=0, lt=1, description="Confidence level of every interval (speedups, geometric means)."
    )
    order_seed: int = Field(default=0, description="Seed of the arm order within each round.")
    mixed_devices: bool = Field(
        default=False,
        description="Fleet runs (`run --ray`): accept workers on different device models; by default a worker whose model differs from the fleet's is refused.",
    )
    # Noise control (issue: a noisy machine must not fake a win).
    throttle_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="GPU: a sample whose SM clock is below this fraction of the maximum is counted as throttled.",
    )
    throttle_retakes: int = Field(
        default=2,
        ge=0,
        le=10,
        description="GPU: a sample whose SM clock reads throttled right after it is taken again, after throttle_recovery_s, up to this many times; the last is kept (and counted throttled if it still is). provenance.json lead.samples_retaken_throttled counts the re-takes, lead.samples_retaken_throttled_by_arm by arm.",
    )
    throttle_recovery_s: float = Field(
        default=0.5, ge=0, le=60, description="GPU: seconds the device rests before a throttled sample is taken again."
    )
    target_ci_width: float | None = Field(
        default=None,
        gt=0,
        description="Noise rule: add rounds to a case until every speedup CI is narrower (high - low) than this, within max_rounds and time_budget_s; unset: fixed rounds.",
    )
    max_rounds: int = Field(
        default=50, ge=2, description="Most rounds a case reaches under target_ci_width (>= rounds)."
    )
    time_budget_s: float = Field(
        default=600.0, gt=0, description="Seconds of timing after which target_ci_width adds no more rounds."
    )
    # Calibration: `aa:ARM` arms (an A/A copy) and `slow:ARM` arms (ARM plus this injected delay).
    injected_slowdown: float = Field(
        default=0.03,
        gt=0,
        lt=1,
        description="Calibration: the delay a slow:ARM arm adds to each call, as a fraction of the arm's time.",
    )
    max_false_positive_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Calibration passes when each aa: arm has a verdict other than tie in at most this fraction of cases.",
    )
    min_power: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Calibration passes when each slow: arm is a loss in at least this fraction of cases.",
    )
    calibration_run: str | None = Field(
        default=None,
        description="Run directory (relative to the protocol's folder) of a passed `kerneltrial calibrate` of this operator on this device; run refuses to start otherwise.",
    )
    # Checks: bit-identical outputs to the reference; physical plausibility of timed arms.
    exact: bool = Field(
        default=False,
        description="Outputs must equal the official torch formula bit for bit, in the gate and every timed sample.",
    )
    # An arm above the best ceiling (copy or read) of its run by more than this fraction is
    # implausible: the highest honest figure of the committed H200 runs was 104.2% of the
    # copy ceiling (results/archive/h200/silu_and_mul-s2, 65536x12288, liger).
    bandwidth_margin: float = Field(
        default=0.15,
        gt=0,
        description="GPU: an arm above the run's best copy/read ceiling by more than this fraction is implausible (fails the gate).",
    )
    # An arm faster per call than this fraction of an empty kernel launch did not launch its
    # work (a convention; the fastest honest kernel committed, 4.06 us at 1x2048 in
    # results/archive/h200/sigmoid_gate_mul-r2, is well above an empty launch).
    launch_floor_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="GPU: an arm faster per call than this fraction of an empty kernel launch is implausible (fails the gate).",
    )

    # Isolation (issue 24): an arm in a worker process of its own cannot patch the harness or read
    # its frames; the harness draws the values, picks the checked call after the sample, compares.
    isolate: Literal["user", "all", "none"] | list[str] = Field(
        default="user",
        description="Arms that run in a worker process of their own, apart from the harness (docs/CHECKS.md): user (every user: arm), all (every arm but aa:/slow: copies), none, or a list of arm names. The module of an isolated user: arm is imported in its worker only, never in kerneltrial's process; an arm a module registers through kerneltrial's registry cannot be isolated.",
    )
    isolate_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds an isolated arm's worker may take to answer one request (a call, a timed sample); past it the worker is killed and the arm fails that check with `worker hung`.",
    )

    allow_in_process: bool = Field(
        default=False,
        description="Accept a user: arm that `isolate` leaves in kerneltrial's process (its code could patch the harness): `protocol freeze` refuses such a protocol without it, and every page of the run says so.",
    )
    accept_partial_sandbox: bool = Field(
        default=False,
        description="Run a frozen protocol's isolated arms although this host lacks a piece of the sandbox (trial/confine.py: uid, pidns, cgroup, no_new_privs, seccomp); without it such a run refuses to start. The missing pieces are recorded (plan.json `sandbox`) and every page of the run says so.",
    )

    @field_validator("gate")
    @classmethod
    def _gate(cls, gate: str) -> str:
        parse_gate(gate)  # the one grammar the summary uses too
        return gate

    @field_validator("calls_per_sample")
    @classmethod
    def _calls(cls, calls: int | str) -> int | str:
        if isinstance(calls, int) and calls < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return calls

    @model_validator(mode="after")
    def _phase_rules(self) -> Protocol:
        ids = [c.id for c in self.cases]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"cases: {repeated[0]} is listed twice")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: repeated seed in {self.seeds}")
        arms = [self.control, *self.candidates]
        if self.target_ci_width is not None and self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds: must be >= rounds ({self.rounds}) when target_ci_width is set")
        if len(set(arms)) != len(arms):
            raise ValueError(f"candidates: an arm is named twice in {arms}")
        self._isolation_rules(arms)
        if self.phase == "confirmation":
            if len(self.candidates) != 1:
                raise ValueError(
                    f"candidates: a confirmation names exactly one candidate selected beforehand, got {self.candidates}"
                )
            if not self.exploratory_seeds:
                raise ValueError("exploratory_seeds: a confirmation lists the seeds its exploratory phase used")
            reused = streams.shared_streams(self.seeds, self.exploratory_seeds, self.stream_bounds())
            if reused:
                seed, how = reused[0]
                raise ValueError(
                    f"seeds: a confirmation must use fresh seeds; seed {seed} draws inputs of the exploratory phase ({how})"
                )
        return self

    def _isolation_rules(self, arms: list[str]) -> None:
        if isinstance(self.isolate, list):
            unknown = [a for a in self.isolate if a not in arms or a.startswith(CALIBRATION_PREFIXES)]
            if unknown:
                raise ValueError(
                    f"isolate: {unknown[0]!r} is not an arm of this protocol that can be isolated (arms: {arms})"
                )
        bases = {a.partition(":")[2] for a in arms if a.startswith(CALIBRATION_PREFIXES)}
        clash = sorted(bases & set(self.isolated()))
        if clash:
            raise ValueError(
                f"isolate: {clash[0]!r} is the base of a calibration arm, which runs in kerneltrial's process; "
                "an A/A copy is timed as its base is: leave it out of isolate"
            )

    def arms(self) -> list[str]:
        return [self.control, *self.candidates]

    def isolated(self) -> list[str]:
        """The arms that run in a worker process of their own (`isolate`)."""
        if self.isolate == "user":
            return [a for a in self.arms() if a.startswith("user:")]
        if self.isolate == "all":
            return [a for a in self.arms() if not a.startswith(CALIBRATION_PREFIXES)]
        return [] if self.isolate == "none" else list(self.isolate)

    def in_process_user_arms(self) -> list[str]:
        """The `user:` arms `isolate` leaves in kerneltrial's process."""
        isolated = set(self.isolated())
        return [a for a in [self.control, *self.candidates] if a.startswith("user:") and a not in isolated]

    def isolates_module(self, spec: str) -> bool:
        """Whether user module `spec` is imported in a worker only, never in kerneltrial's process: its
        `user:` arm is isolated. (A module whose `user:` arm is not an arm of the trial is imported
        here: it registers its arms through kerneltrial's registry, which only this process has.)"""
        from kerneltrial.ops.registry import user_stem  # torch-free at import (see `Case` above)

        return f"user:{user_stem(spec)}" in self.isolated()

    def stream_bounds(self) -> streams.Bounds:
        """How far this protocol's timed streams reach (rundir/streams.py)."""
        calls = self.calls_per_sample if isinstance(self.calls_per_sample, int) else streams.AUTO_CALLS_LIMIT
        return streams.Bounds(max(self.rounds, self.max_rounds), calls)


def freeze_path(path: Path) -> Path:
    return path.with_name(path.name + ".freeze.json")


def parse(text: str, source: str = "protocol") -> Protocol:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProtocolError(f"{source}: not valid TOML: {exc}") from exc
    try:
        return Protocol.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError(f"{source}: {describe(exc, Protocol)}") from exc


def load(path: Path) -> Protocol:
    """Read and validate a protocol file; refuse one changed since it was frozen."""
    if not path.is_file():
        raise ProtocolError(f"protocol file {path} does not exist")
    protocol = parse(path.read_text(), str(path))
    record = freeze_path(path)
    if record.exists():
        frozen = json.loads(record.read_text())
        if frozen["sha256"] != sha256_file(path):
            raise ProtocolError(
                f"{path} changed after it was frozen at {frozen['frozen_at']} "
                f"(sha256 {frozen['sha256'][:12]}...); restore it or write a new protocol"
            )
    elif protocol.phase == "confirmation":
        raise ProtocolError(f"{path}: a confirmation protocol must be frozen first: kerneltrial protocol freeze {path}")
    return protocol


def is_frozen(path: Path) -> bool:
    return freeze_path(path).exists()


def freeze_record(path: Path) -> dict[str, str] | None:
    """The freeze record of `path` ({sha256, frozen_at}), or None when it was never frozen."""
    record = freeze_path(path)
    return json.loads(record.read_text()) if record.exists() else None


def refuse_in_process(protocol: Protocol, path: Path) -> None:
    """A protocol to be frozen leaves no user: arm in kerneltrial's process, unless it says
    `allow_in_process = true` (then the run's pages say so)."""
    left = protocol.in_process_user_arms()
    if left and not protocol.allow_in_process:
        raise ProtocolError(
            f"{path}: isolate leaves {', '.join(left)} in kerneltrial's process, where its code can patch the "
            'harness; isolate it (isolate = "user"), or accept that in the protocol with allow_in_process = true'
        )


def refuse_thin_isolation(protocol: Protocol, path: Path) -> None:
    """A protocol to be frozen gives each isolated arm more samples per (case, arm) than the
    floor under its claims needs to be shaved (integrity_notes.MIN_UNDER): with fewer, one
    shaved sample moves the arm's median unseen (docs/CHECKS.md, "What a kernel can still do")."""
    isolated = protocol.isolated()
    samples = len(protocol.seeds) * protocol.rounds
    if isolated and samples <= MIN_UNDER:
        raise ProtocolError(
            f"{path}: {', '.join(isolated)} run isolated with {samples} samples per (case, arm) (seeds x rounds = "
            f"{len(protocol.seeds)} x {protocol.rounds}); the harness's floor under an isolated arm's claim needs "
            f"at least {MIN_UNDER + 1}, else one shaved sample moves its median unseen: add seeds or rounds"
        )


def refuse_at_freeze(protocol: Protocol, path: Path) -> None:
    """What `protocol freeze` refuses of a kernel protocol beyond its validation."""
    refuse_in_process(protocol, path)
    refuse_thin_isolation(protocol, path)


def freeze(path: Path, validated: bool = False) -> dict[str, str]:
    """Validate `path` as a kernel protocol (unless the caller `validated` it: a whole-model
    protocol) and record its sha256 and the time; refuse to re-freeze a changed file."""
    if not validated:
        refuse_at_freeze(parse(path.read_text(), str(path)), path)
    record = freeze_path(path)
    digest = sha256_file(path)
    if record.exists():
        frozen = json.loads(record.read_text())
        if frozen["sha256"] != digest:
            raise ProtocolError(
                f"{path} was frozen with another content at {frozen['frozen_at']}; a frozen protocol is never re-frozen"
            )
        return frozen
    frozen = {"sha256": digest, "frozen_at": now()}
    record.write_text(json.dumps(frozen, indent=2) + "\n")
    return frozen


def new(op: str, name: str, candidates: list[str], cases: list[Case], **fields: object) -> str:
    """TOML text of a new protocol (validated before it is returned)."""
    data: dict[str, object] = {"name": name, "op": op, "candidates": candidates, **fields}
    data["cases"] = [{"shape": list(c.shape), "layout": c.layout, "dtype": c.dtype} for c in cases]
    text = tomli_w.dumps(data)
    parse(text, "new protocol")
    return text
