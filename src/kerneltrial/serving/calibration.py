"""`kerneltrial serve calibrate`: can this set-up tell the baseline from itself, and does it have
the power the protocol's noise band asks for?

The calibration is an A/A trial: the protocol's settings (server, cases, repeats, seed,
acceptance rule) with two arms that are both the baseline (same argv, same environment),
named A (role baseline) and A-prime (role candidate), L = `--launches` launches each. No accuracy
gate: the calibration measures the noise of throughput and TTFT. It judges the trial the protocol
describes, n = its `rounds` launches per arm, and writes an ordinary serving run directory plus
calibration.json. It passes only when all three hold (issue 26: `--launches 2` used to pass with a
gain interval of +-2,391,912%, from a false-acceptance rate estimated on 2 comparisons):

- power: per case, the per-round log ratios d_r = ln(A-prime_r / A_r) of total tok/s and of mean
  TTFT over the L rounds give the noise sd; a trial of n rounds then has interval half-widths
  exp(t(n-1) sd / sqrt(n)) - 1, which must be below the noise band (TTFT: below ttft_ratio_max - 1).
  Otherwise the record says how many launches per arm the observed noise would need;
- enough comparisons: the false-acceptance rate is estimated from every A/A trial of n rounds that
  the L rounds contain (each n-subset of rounds, each case, both label directions; a trial's
  labels are arbitrary), at least ceil(1 / max_false_acceptance_rate) of them, so the estimate
  can resolve the stated level. Subsets share launches: the count gives resolution, not
  independence (the rate is coarse; the power criterion is the one that carries weight);
- the rate itself: the rule accepts at most max_false_acceptance_rate of those comparisons.

calibration.json is bound to what it calibrates (issue 36 item 4): `binding` holds the model and
tokenizer, the baseline's argv and environment (apart from operator selection), the cases,
repeats, client, prompt seeds, pins, the acceptance rule and the trial's rounds, and
`binding_sha256` its hash. A trial protocol may require a passed calibration (`[acceptance]
calibration = DIR`): serving/calibration_gate.py checks before the first launch that the
calibration's binding is the trial's, that its run directory verifies and that its record is the
one its run gives (serving/calibration_evidence.py), and that it passed. It records the host it was
measured on too (`host`, serving/calibration_host.py: hostname, CPU, memory, GPUs, the weights'
digest): its noise band is that host's, and a trial on another host is refused (review A5).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from scipy import stats

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, write_json
from kerneltrial.rundir.serving_summary_doc import ServingSummary
from kerneltrial.serving.acceptance import MIN_ROUNDS, LaunchFigure, Rule, compare_case
from kerneltrial.serving.bench import case_dict
from kerneltrial.serving.calibration_host import HostFingerprint
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.protocol import OPERATOR_SELECTION_ENV, Protocol
from kerneltrial.serving.summary import acceptance_rule, launch_figures

CALIBRATION = "calibration.json"
SCHEMA = "kerneltrial.serving-calibration/4"
HOSTLESS = "kerneltrial.serving-calibration/3"  # read (it verifies as the record of its run), with no `host`
HOSTLESS_LACKS = "from before its binding to the host it was measured on (issue 36, review A5)"
BEFORE = {  # older schemas, refused, and what they lack
    "kerneltrial.serving-calibration/1": "from before its power check (issue 26)",
    "kerneltrial.serving-calibration/2": "from before its binding to what it calibrates (issue 36)",
}
ARM_A, ARM_A_PRIME = "A", "A-prime"
MAX_SUBSETS = 5000  # n-subsets of the calibration's rounds judged per case (a seeded sample beyond)
INCOMPLETE = "the A/A run did not complete every case"
NOISE_LEVEL = 0.95  # of the upper confidence bound of a case's noise sd (chi-square, rounds - 1 degrees of freedom)


class CalibrationError(ValueError):
    """A calibration cannot be made or does not qualify; the message says which and the fix."""


class Comparison(BaseModel):
    """One A/A trial of n rounds drawn from the calibration, judged by the acceptance rule."""

    model_config = ConfigDict(frozen=True)
    case: str
    arm: str
    against: str
    rounds: list[int]
    gain: float
    gain_low: float
    gain_high: float
    ttft_ratio: float
    ttft_ratio_low: float
    ttft_ratio_high: float
    accepted: bool  # the rule's throughput and TTFT criteria both met: a false acceptance


class Noise(BaseModel):
    """One case's launch noise and what it means for a trial of n rounds."""

    model_config = ConfigDict(frozen=True)
    case: str
    rounds: int  # paired rounds of the calibration the sd is taken over
    gain_sd: float  # sd of the per-round log ratios of total tok/s
    ttft_sd: float  # the same of mean TTFT
    gain_half_width: float  # of a trial of n rounds: exp(t sd / sqrt(n)) - 1
    ttft_half_width: float
    powered: bool  # both half-widths below their bounds (noise band, ttft_ratio_max - 1)
    launches_needed: int | None  # launches per arm that bring both below (None: a bound is not positive)
    launches_needed_high: int | None  # the same at the upper NOISE_LEVEL confidence bound of both sds


class Binding(BaseModel):
    """What a calibration calibrates: a trial with these values, and only such a trial, may rest on it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str | None
    model_id: str
    tokenizer: str | None
    argv: list[str]  # the baseline's, before {port}/{model} are filled in
    env: dict[str, str]  # the baseline's, apart from operator selection (what the trial's arms differ in)
    cases: list[dict[str, Any]]
    repeats: int
    client: str
    seeding: str
    bench_seed: int
    pins: dict[str, str | None]
    noise_band: float
    ttft_ratio_max: float
    confidence: float
    max_false_acceptance_rate: float
    trial_rounds: int

    def sha256(self) -> str:
        """The hash calibration.json records (`binding_sha256`): of the binding's canonical JSON."""
        text = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def binding(proto: Protocol, trial_rounds: int) -> Binding:
    """The binding of a calibration of `proto` (a trial protocol, or its calibration protocol: its
    baseline is the trial's) for trials of `trial_rounds` launches per arm."""
    base = proto.arm("baseline") or proto.arms[0]
    a = proto.acceptance
    return Binding(
        model=proto.server.model,
        model_id=proto.server.model_id,
        tokenizer=proto.server.effective_tokenizer,
        argv=list(base.argv),
        env={k: v for k, v in sorted(base.env.items()) if k not in OPERATOR_SELECTION_ENV},
        cases=[case_dict(c) for c in proto.bench.cases],
        repeats=proto.repeats,
        client=proto.bench.client,
        seeding=proto.bench.seeding,
        bench_seed=proto.bench.seed,
        pins=proto.pins.flat(),
        noise_band=a.noise_band,
        ttft_ratio_max=a.ttft_ratio_max,
        confidence=a.confidence,
        max_false_acceptance_rate=a.max_false_acceptance_rate,
        trial_rounds=trial_rounds,
    )


class CalibrationRecord(BaseModel):
    """calibration.json."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    schema_: str = Field(alias="schema")
    model: str | None
    model_id: str
    argv: list[str]  # the baseline's argv, before {port}/{model} are filled in
    env: dict[str, str]
    cases: list[str]
    launches_per_arm: int  # L, of the calibration
    trial_rounds: int  # n, of the trial it calibrates (the protocol's rounds)
    noise_band: float
    ttft_ratio_max: float
    confidence: float
    status: str  # the A/A run's summary status
    noise: list[Noise]
    comparisons: list[Comparison]
    comparisons_needed: int | None  # ceil(1 / max_false_acceptance_rate); None for a rate of 0
    false_acceptances: int
    false_acceptance_rate: float
    max_false_acceptance_rate: float
    passed: bool
    reasons: list[str]  # why it did not pass (empty when it did)
    sentence: str
    binding: Binding  # what it calibrates
    binding_sha256: str  # Binding.sha256() of `binding`
    host: HostFingerprint | None = None  # where it was measured; None only in a HOSTLESS record


def comparisons_needed(max_rate: float) -> int | None:
    """A rate estimated from k comparisons moves in steps of 1/k: resolving `max_rate` needs 1/max_rate."""
    return math.ceil(1 / max_rate - 1e-9) if max_rate > 0 else None


def comparisons_available(launches: int, trial_rounds: int, cases: int) -> int:
    return min(math.comb(launches, trial_rounds), MAX_SUBSETS) * 2 * cases


def default_launches(trial_rounds: int, cases: int, max_rate: float) -> int:
    """The fewest launches per arm (even: whole A B / B A blocks) whose n-subsets give enough comparisons."""
    need = comparisons_needed(max_rate) or 0
    L = max(trial_rounds, MIN_ROUNDS)
    while comparisons_available(L, trial_rounds, cases) < need or L % 2:
        L += 1
    return L


def calibration_protocol(text: str, launches: int | None) -> tuple[str, int]:
    """The protocol's settings with arms A and A-prime, both its baseline (else its first arm), and
    L launches each (`launches`, else default_launches); also n, the rounds of the trial calibrated."""
    import tomli_w

    data = tomllib.loads(text)
    arms = data.get("arms") or []
    if not arms:
        raise CalibrationError("the protocol has no [[arms]]; a calibration needs a baseline arm to copy")
    base = next((a for a in arms if a.get("role") == "baseline"), arms[0])
    n = int(data.get("rounds", 1))
    if n < MIN_ROUNDS:
        raise CalibrationError(
            f"the protocol's trial has {n} launch(es) per arm, which gives no interval to calibrate; set rounds >= "
            f"{MIN_ROUNDS} in the protocol (an even number completes the A B / B A blocks)"
        )
    acceptance = data.get("acceptance", {})
    cases = len(data.get("bench", {}).get("cases", [])) or 1
    L = (
        launches
        if launches is not None
        else default_launches(n, cases, acceptance.get("max_false_acceptance_rate", 0.05))
    )
    if L < n:
        raise CalibrationError(
            f"--launches {L} is below the trial's {n} rounds: each A/A comparison is a trial of {n} rounds; "
            f"pass --launches {default_launches(n, cases, acceptance.get('max_false_acceptance_rate', 0.05))}"
        )
    copy = {k: v for k, v in base.items() if k in ("argv", "env")}
    data.update(
        name=f"{data.get('name', 'serving-trial')}-calibration",
        rounds=L,
        arms=[{"name": ARM_A, "role": "baseline", **copy}, {"name": ARM_A_PRIME, "role": "candidate", **copy}],
    )
    data.pop("accuracy", None)
    acceptance.pop("calibration", None)
    return tomli_w.dumps(data), n


def _half_width(sd: float, n: int, confidence: float) -> float:
    """exp(t(n-1) sd / sqrt(n)) - 1: a trial of n rounds' interval half-width, as a fraction."""
    return math.exp(float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)) - 1


def launches_needed(gain_sd: float, ttft_sd: float, rule: Rule) -> int | None:
    """The fewest launches per arm n whose half-widths t(n-1) sd / sqrt(n) (log scale) are below
    ln(1 + noise_band) and ln(ttft_ratio_max); None when a bound is not positive (no n gets there).
    The search starts at the normal approximation's n, which the t quantile only raises."""
    bounds = (math.log1p(rule.noise_band), math.log(rule.ttft_ratio_max))
    if min(bounds) <= 0:
        return None
    z = float(stats.norm.ppf((1 + rule.confidence) / 2))
    n = max(MIN_ROUNDS, math.ceil((z * max(gain_sd / bounds[0], ttft_sd / bounds[1])) ** 2))
    while True:
        scale = float(stats.t.ppf((1 + rule.confidence) / 2, n - 1)) / math.sqrt(n)
        if scale * gain_sd < bounds[0] and scale * ttft_sd < bounds[1]:
            return n
        n += 1


def launches_needed_high(gain_sd: float, ttft_sd: float, rounds: int, rule: Rule) -> int | None:
    """launches_needed at the upper NOISE_LEVEL confidence bound of both sds, estimated from `rounds`
    paired rounds (sd * sqrt((rounds - 1) / chi2(1 - level, rounds - 1))): the noise measured from few
    launches is itself uncertain, and the number of launches it asks for with it."""
    if rounds < MIN_ROUNDS:
        return None
    factor = math.sqrt((rounds - 1) / float(stats.chi2.ppf(1 - NOISE_LEVEL, rounds - 1)))
    return launches_needed(gain_sd * factor, ttft_sd * factor, rule)


def _sd(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def case_noise(case: str, a: list[LaunchFigure], b: list[LaunchFigure], n: int, rule: Rule) -> Noise:
    """The sd of the per-round log ratios of A-prime (b) to A (a) and the half-widths of a trial of n rounds."""
    mine, theirs = {f.round: f for f in b}, {f.round: f for f in a}
    rounds = sorted(mine.keys() & theirs.keys())
    gain = [math.log(mine[r].throughput / theirs[r].throughput) for r in rounds]
    ttft = [math.log(mine[r].ttft_ms / theirs[r].ttft_ms) for r in rounds]
    gain_sd, ttft_sd = _sd(gain), _sd(ttft)
    gh, th = _half_width(gain_sd, n, rule.confidence), _half_width(ttft_sd, n, rule.confidence)
    powered = gh < rule.noise_band and th < rule.ttft_ratio_max - 1
    return Noise(
        case=case,
        rounds=len(rounds),
        gain_sd=gain_sd,
        ttft_sd=ttft_sd,
        gain_half_width=gh,
        ttft_half_width=th,
        powered=powered,
        launches_needed=launches_needed(gain_sd, ttft_sd, rule),
        launches_needed_high=launches_needed_high(gain_sd, ttft_sd, len(rounds), rule),
    )


def subsets(rounds: list[int], n: int) -> list[tuple[int, ...]]:
    """Every n-subset of the rounds, or a seeded sample of MAX_SUBSETS of them."""
    if math.comb(len(rounds), n) <= MAX_SUBSETS:
        return list(itertools.combinations(rounds, n))
    return sorted(random.Random(0).sample(list(itertools.combinations(rounds, n)), MAX_SUBSETS))


def case_comparisons(case: str, a: list[LaunchFigure], b: list[LaunchFigure], n: int, rule: Rule) -> list[Comparison]:
    """Every A/A trial of n rounds in the calibration's rounds, both label directions, judged by the rule."""
    figures = {ARM_A: a, ARM_A_PRIME: b}
    rounds = sorted({f.round for f in a} & {f.round for f in b})
    out = []
    for subset in subsets(rounds, n):
        for arm, against in ((ARM_A_PRIME, ARM_A), (ARM_A, ARM_A_PRIME)):
            pick = [[f for f in figures[x] if f.round in subset] for x in (arm, against)]
            c = compare_case(case, pick[0], pick[1], rule)
            if c.throughput is None or c.ttft is None or c.throughput.interval is None or c.ttft.interval is None:
                continue
            out.append(
                Comparison(
                    case=case,
                    arm=arm,
                    against=against,
                    rounds=list(subset),
                    gain=c.throughput.estimate - 1,
                    gain_low=c.throughput.interval.low - 1,
                    gain_high=c.throughput.interval.high - 1,
                    ttft_ratio=c.ttft.estimate,
                    ttft_ratio_low=c.ttft.interval.low,
                    ttft_ratio_high=c.ttft.interval.high,
                    accepted=c.throughput_ok and c.ttft_ok,
                )
            )
    return out


def calibration_record(
    proto: Protocol,
    summary: ServingSummary,
    trial_rounds: int,
    stopped: str | None = None,
    *,
    host: HostFingerprint | None,
) -> CalibrationRecord:
    """calibration.json's content for an A/A run of `proto` (from calibration_protocol) and its summary;
    `stopped`: why its pilot ended it (serving/pilot.py), the first reason it did not pass; `host`: the
    host it ran on (serving/calibration_host.py `this_host`; verify passes the recorded one)."""
    rule = acceptance_rule(proto)
    round_of = {x.launch: x.round for x in planned_launches(proto.arms, proto.rounds, proto.seed)}
    noise, comparisons = [], []
    for case in proto.bench.cases:
        a = launch_figures(summary.results[ARM_A][case.id], round_of)
        b = launch_figures(summary.results[ARM_A_PRIME][case.id], round_of)
        if a and b and len({f.round for f in a} & {f.round for f in b}) >= MIN_ROUNDS:
            noise.append(case_noise(case.id, a, b, trial_rounds, rule))
            comparisons += case_comparisons(case.id, a, b, trial_rounds, rule)
    bound = proto.acceptance.max_false_acceptance_rate
    false = sum(c.accepted for c in comparisons)
    rate = false / len(comparisons) if comparisons else 1.0
    need = comparisons_needed(bound)
    reasons = _reasons(summary.status, noise, len(proto.bench.cases), trial_rounds, rule, len(comparisons), need)
    if stopped is not None:  # not an incomplete run to calibrate again as it was: the pilot says what to change
        reasons = [stopped, *(r for r in reasons if not r.startswith(INCOMPLETE))]
    if comparisons and rate > bound:
        reasons.append(
            f"the rule accepted {false} of {len(comparisons)} A/A comparisons (false-acceptance rate {rate:.3f}, above "
            f"max_false_acceptance_rate {bound:g}): it cannot tell this set-up from itself; widen noise_band or add rounds"
        )
    passed = not reasons
    base = proto.arm("baseline") or proto.arms[0]
    return CalibrationRecord(
        schema_=SCHEMA,
        model=proto.server.model,
        model_id=proto.server.model_id,
        argv=base.argv,
        env=base.env,
        cases=[c.id for c in proto.bench.cases],
        launches_per_arm=proto.rounds,
        trial_rounds=trial_rounds,
        noise_band=rule.noise_band,
        ttft_ratio_max=rule.ttft_ratio_max,
        confidence=rule.confidence,
        status=summary.status,
        noise=noise,
        comparisons=comparisons,
        comparisons_needed=need,
        false_acceptances=false,
        false_acceptance_rate=rate,
        max_false_acceptance_rate=bound,
        passed=passed,
        reasons=reasons,
        sentence=_sentence(passed, reasons, noise, trial_rounds, false, len(comparisons), rate, bound),
        binding=(bound_to := binding(proto, trial_rounds)),
        binding_sha256=bound_to.sha256(),
        host=host,
    )


def _reasons(
    status: str, noise: list[Noise], cases: int, n: int, rule: Rule, available: int, need: int | None
) -> list[str]:
    """Why a calibration does not pass: a failed A/A run, too little power, too few comparisons."""
    out = []
    if status != "ok" or len(noise) < cases:
        out.append(f"{INCOMPLETE} (status {status}); calibrate again")
    for x in noise:
        if x.powered:
            continue
        high = (
            f"; {x.launches_needed_high} at the {NOISE_LEVEL:.0%} upper bound of the noise"
            if x.launches_needed_high
            else ""
        )
        more = (
            f"the observed noise needs {x.launches_needed} launches per arm (rounds = {x.launches_needed}{high})"
            if x.launches_needed is not None
            else "no number of launches gets there (noise_band and ttft_ratio_max - 1 must be positive)"
        )
        out.append(
            f"{x.case}: a trial of {n} launches per arm has a gain interval of +-{x.gain_half_width:.2%} and a TTFT "
            f"interval of +-{x.ttft_half_width:.2%} (per-round log-ratio sd {x.gain_sd:.2%} and {x.ttft_sd:.2%} over "
            f"{x.rounds} rounds), not below the noise band {rule.noise_band:.2%} and ttft_ratio_max "
            f"{rule.ttft_ratio_max} - 1: {more}"
        )
    if need is None:
        out.append("max_false_acceptance_rate 0 cannot be estimated from finitely many comparisons; set it above 0")
    elif available < need:
        out.append(
            f"{available} A/A comparison(s) cannot estimate a false-acceptance rate of {1 / need:.3g} (at least {need} "
            f"are needed: each {n}-round subset of the calibration's rounds, each case, both directions); pass "
            f"--launches {default_launches(n, cases, 1 / need)}"
        )
    return out


def _sentence(
    passed: bool, reasons: list[str], noise: list[Noise], n: int, false: int, total: int, rate: float, bound: float
) -> str:
    widths = ", ".join(f"{x.case} gain +-{x.gain_half_width:.2%}, TTFT +-{x.ttft_half_width:.2%}" for x in noise)
    head = (
        f"Calibration {'passed' if passed else 'FAILED'} for trials of {n} launches per arm: interval half-widths "
        f"{widths or 'none (no case completed)'}; the rule accepted {false} of {total} A/A comparison(s) "
        f"(false-acceptance rate {rate:.3f}, at most {bound:g})"
    )
    return head if passed else f"{head}. Not passed: " + "; ".join(reasons)


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
    if isinstance(data, dict) and data.get("schema") not in (SCHEMA, HOSTLESS):
        lacks = BEFORE.get(str(data.get("schema")), f"not a {SCHEMA} record")
        raise CalibrationError(
            f"{path} is a {data.get('schema')} calibration, {lacks}; calibrate again with this kerneltrial "
            f"(`kerneltrial serve calibrate PROTOCOL --out DIR`)"
        )
    try:
        record = CalibrationRecord.model_validate(data)
    except ValidationError as e:
        where = ".".join(str(x) for x in e.errors(include_url=False)[0]["loc"])
        raise RunDirError(f"{path}: {where} is missing or malformed; is this a `serve calibrate` run?") from None
    if record.schema_ == SCHEMA and record.host is None:
        raise RunDirError(
            f"{path}: host is missing or null, and a {SCHEMA} calibration records the host it was measured on; "
            "calibrate again on this host (`kerneltrial serve calibrate PROTOCOL --out DIR`)"
        )
    return record
