"""`kerneltrial serve calibrate`: can this set-up tell the baseline from itself?

The calibration is an A/A trial: the protocol's settings (server, cases, repeats, seed,
acceptance rule) with two arms that are both the baseline (same argv, same environment),
named A (role baseline) and A-prime (role candidate), `--launches` launches each (default the
protocol's rounds). No accuracy gate: the calibration measures the noise of throughput and
TTFT. It writes an ordinary serving run directory plus calibration.json: per case the intervals
of the gain and the TTFT ratio (serving/acceptance.py) and their widths, and the
false-acceptance rate: the fraction of A/A comparisons the rule accepts, counted over every
case in both directions (A-prime against A and A against A-prime; a trial's labels are
arbitrary, so the swapped comparison is as likely a trial as the other). It estimates the
probability that the rule accepts a candidate no different from the baseline at this number of
launches on this set-up; from one calibration it rests on 2 x cases comparisons, so it is
coarse (resolution 1 / comparisons), and comparisons of one case share their launches.

A trial protocol may require a passed calibration (`[acceptance] calibration = DIR`):
`require_calibration` checks before the first launch that it calibrated the same model, the
same server argv and environment apart from operator selection and the same cases, and that
its false-acceptance rate is at most the trial's `max_false_acceptance_rate`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, write_json
from kerneltrial.serving.acceptance import MIN_ROUNDS, compare_case
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.protocol import Arm, Protocol, non_operator_difference
from kerneltrial.serving.summary import acceptance_rule, launch_figures

CALIBRATION = "calibration.json"
SCHEMA = "kerneltrial.serving-calibration/1"
ARM_A, ARM_A_PRIME = "A", "A-prime"


class CalibrationError(ValueError):
    """A calibration cannot be made or does not qualify; the message says which and the fix."""


class Comparison(BaseModel):
    model_config = ConfigDict(frozen=True)
    case: str
    arm: str
    against: str
    gain: float
    gain_low: float
    gain_high: float
    ttft_ratio: float
    ttft_ratio_low: float
    ttft_ratio_high: float
    accepted: bool  # the rule's throughput and TTFT criteria both met: a false acceptance

    @property
    def gain_width(self) -> float:
        return self.gain_high - self.gain_low

    @property
    def ttft_width(self) -> float:
        return self.ttft_ratio_high - self.ttft_ratio_low


class CalibrationRecord(BaseModel):
    """calibration.json."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    schema_: str = Field(alias="schema")
    model: str | None
    model_id: str
    argv: list[str]  # the baseline's argv, before {port}/{model} are filled in
    env: dict[str, str]
    cases: list[str]
    launches_per_arm: int
    noise_band: float
    ttft_ratio_max: float
    confidence: float
    status: str  # the A/A run's summary status
    comparisons: list[Comparison]
    false_acceptances: int
    false_acceptance_rate: float
    max_false_acceptance_rate: float
    passed: bool
    sentence: str


def calibration_protocol(text: str, launches: int | None) -> str:
    """The protocol's settings with arms A and A-prime, both its baseline (else its first arm)."""
    import tomli_w

    data = tomllib.loads(text)
    arms = data.get("arms") or []
    if not arms:
        raise CalibrationError("the protocol has no [[arms]]; a calibration needs a baseline arm to copy")
    base = next((a for a in arms if a.get("role") == "baseline"), arms[0])
    rounds = data.get("rounds", 1) if launches is None else launches
    if rounds < MIN_ROUNDS:
        raise CalibrationError(
            f"a calibration with {rounds} launch(es) per arm has no interval; pass --launches {2 * MIN_ROUNDS} "
            f"(at least {MIN_ROUNDS}; an even number completes the A B / B A blocks)"
        )
    copy = {k: v for k, v in base.items() if k in ("argv", "env")}
    data.update(
        name=f"{data.get('name', 'serving-trial')}-calibration",
        rounds=rounds,
        arms=[{"name": ARM_A, "role": "baseline", **copy}, {"name": ARM_A_PRIME, "role": "candidate", **copy}],
    )
    data.pop("accuracy", None)
    data.get("acceptance", {}).pop("calibration", None)
    return tomli_w.dumps(data)


def calibration_record(proto: Protocol, summary: dict[str, Any]) -> CalibrationRecord:
    """calibration.json's content for an A/A run of `proto` (from calibration_protocol) and its summary."""
    rule = acceptance_rule(proto)
    rounds = {x.launch: x.round for x in planned_launches(proto.arms, proto.rounds, proto.seed)}
    comparisons = []
    for case in proto.bench.cases:
        for arm, against in ((ARM_A_PRIME, ARM_A), (ARM_A, ARM_A_PRIME)):
            c = compare_case(
                case.id,
                launch_figures(summary["results"][arm][case.id], rounds),
                launch_figures(summary["results"][against][case.id], rounds),
                rule,
            )
            if c.throughput is None or c.ttft is None or c.throughput.interval is None or c.ttft.interval is None:
                continue  # a failed case: the run's status says so
            comparisons.append(
                Comparison(
                    case=case.id,
                    arm=arm,
                    against=against,
                    gain=c.throughput.estimate - 1,
                    gain_low=c.throughput.interval.low - 1,
                    gain_high=c.throughput.interval.high - 1,
                    ttft_ratio=c.ttft.estimate,
                    ttft_ratio_low=c.ttft.interval.low,
                    ttft_ratio_high=c.ttft.interval.high,
                    accepted=c.throughput_ok and c.ttft_ok,
                )
            )
    false = sum(c.accepted for c in comparisons)
    rate = false / len(comparisons) if comparisons else 1.0
    bound = proto.acceptance.max_false_acceptance_rate
    passed = summary["status"] == "ok" and bool(comparisons) and rate <= bound
    widths = ", ".join(
        f"{c.case} gain +-{c.gain_width / 2:.2%}, TTFT +-{c.ttft_width / 2:.4f}" for c in comparisons[::2]
    )
    sentence = (
        f"Calibration {'passed' if passed else 'FAILED'}: the rule accepted {false} of {len(comparisons)} A/A "
        f"comparison(s) (false-acceptance rate {rate:.2f}, at most {bound:g}) with {proto.rounds} launches per arm; "
        f"interval half-widths: {widths or 'none (no case completed)'}"
    )
    base = proto.arm("baseline") or proto.arms[0]
    return CalibrationRecord(
        schema_=SCHEMA,
        model=proto.server.model,
        model_id=proto.server.model_id,
        argv=base.argv,
        env=base.env,
        cases=[c.id for c in proto.bench.cases],
        launches_per_arm=proto.rounds,
        noise_band=rule.noise_band,
        ttft_ratio_max=rule.ttft_ratio_max,
        confidence=rule.confidence,
        status=summary["status"],
        comparisons=comparisons,
        false_acceptances=false,
        false_acceptance_rate=rate,
        max_false_acceptance_rate=bound,
        passed=passed,
        sentence=sentence,
    )


def write_calibration(run_dir: Path, record: CalibrationRecord) -> Path:
    path = run_dir / CALIBRATION
    write_json(path, record.model_dump(by_alias=True))
    return path


def read_calibration(run_dir: Path) -> CalibrationRecord:
    path = run_dir / CALIBRATION
    if not path.is_file():
        raise CalibrationError(
            f"no {CALIBRATION} in {run_dir}; run `kerneltrial serve calibrate PROTOCOL --out {run_dir}` first"
        )
    data = read_json(path)
    try:
        return CalibrationRecord.model_validate(data)
    except ValidationError as e:
        where = ".".join(str(x) for x in e.errors(include_url=False)[0]["loc"])
        raise RunDirError(f"{path}: {where} is missing or malformed; is this a `serve calibrate` run?") from None


def require_calibration(proto: Protocol, base_dir: Path) -> None:
    """Refuse (CalibrationError, one line) unless the protocol's calibration run passed for the
    same model, server argv and environment (apart from operator selection) and cases, with a
    false-acceptance rate at most this protocol's bound. Nothing to check without `calibration`."""
    name = proto.acceptance.calibration
    if name is None:
        return
    record = read_calibration(base_dir / name)
    where = f"acceptance.calibration {name!r}"
    base = proto.arm("baseline") or proto.arms[0]
    if (record.model, record.model_id) != (proto.server.model, proto.server.model_id):
        raise CalibrationError(
            f"{where} calibrated model {record.model!r} ({record.model_id}), this trial serves "
            f"{proto.server.model!r} ({proto.server.model_id}); calibrate this model first"
        )
    diff = non_operator_difference(Arm(name="calibration", argv=record.argv, env=record.env), base)
    if diff is not None:
        raise CalibrationError(f"{where} used another server: {diff}; calibrate with this protocol")
    cases = [c.id for c in proto.bench.cases]
    if record.cases != cases:
        raise CalibrationError(f"{where} calibrated cases {record.cases}, this trial runs {cases}; calibrate them")
    if record.status != "ok":
        raise CalibrationError(f"{where} did not finish its runs (status {record.status}); calibrate again")
    bound = proto.acceptance.max_false_acceptance_rate
    if not record.false_acceptance_rate <= bound:
        raise CalibrationError(
            f"{where} has a false-acceptance rate {record.false_acceptance_rate:.2f} above this protocol's "
            f"max_false_acceptance_rate {bound:g}: the rule cannot tell this set-up from itself; add launches "
            "(rounds) or widen noise_band"
        )
