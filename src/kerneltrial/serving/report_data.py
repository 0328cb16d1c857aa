"""A serving run directory read for its report and comparisons: plan.json, summary.json,
runs.jsonl and launches.jsonl as typed records (`load_run`), and the figures derived from them
(log-scale intervals across launches and kept runs, the acceptance rule applied to any two arms).
Nothing is measured here; `kerneltrial verify` rebuilds the figures from the raw files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.layout import LAUNCHES, PLAN, PROTOCOL, PROVENANCE, RUNS
from kerneltrial.rundir.serving_summary_doc import ServingSummary, read_serving_summary
from kerneltrial.serving.acceptance import (
    GateCheck,
    LaunchFigure,
    Rule,
    Verdict,
    accuracy_check,
    compare_case,
    dispatch_check,
    judge,
)
from kerneltrial.serving.dispatch_proof import intended_ops
from kerneltrial.serving.effective import Override, command_line, overrides, written
from kerneltrial.serving.fl_policy import SelectionError
from kerneltrial.serving.protocol import OPERATOR_SELECTION_ENV, FlPlatform, ProtocolError, parse_protocol
from kerneltrial.serving.summary import launch_figures as case_launch_figures
from kerneltrial.stats import t_half_width

M = TypeVar("M", bound=BaseModel)
NOT_RECORDED = "not recorded"
THROUGHPUT, TTFT = "total_token_throughput", "mean_ttft_ms"  # the figures the acceptance rule compares

# ---------------------------------------------------------------- the files, as typed records

_READ = ConfigDict(extra="ignore", frozen=True)  # the run files carry more than the report shows


class PlanArm(BaseModel):
    model_config = _READ
    name: str
    role: str
    argv: list[str]
    env: dict[str, str]

    @property
    def selection(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k in OPERATOR_SELECTION_ENV}

    selection_files: dict[str, dict[str, str | None]] = {}  # copies of VLLM_FL_CONFIG / VLLM_FL_OP_CONFIG files


class PlanCase(BaseModel):
    model_config = _READ
    case: str
    label: str = ""  # the built-in case set it comes from (bench.CASE_SETS); runs before issue 26: none

    @property
    def heading(self) -> str:
        return f"{self.case} ({self.label})" if self.label else self.case


class AcceptanceRule(BaseModel):
    model_config = _READ
    noise_band: float
    ttft_ratio_max: float
    confidence: float = 0.95  # the default before the key existed

    @property
    def rule(self) -> Rule:
        return Rule(self.noise_band, self.ttft_ratio_max, self.confidence)


class PlanLaunch(BaseModel):
    model_config = _READ
    launch: int
    round: int


class AccuracyPlan(BaseModel):
    model_config = _READ
    gate: float
    level: str | None = None
    samples: int = 1  # runs before samples: one per problem, the point rule
    rule: str = "point"


class Plan(BaseModel):
    model_config = _READ
    arms: list[PlanArm]
    goodput: dict[str, float] | None = None  # --goodput SLOs (ms); runs before issue 26: none
    fl_platform: dict[str, object] | None = None  # protocol [server.fl_platform]; runs before issue 26: none
    cases: list[PlanCase]
    rounds: int
    repeats: int
    launches: list[PlanLaunch]
    acceptance: AcceptanceRule
    accuracy: AccuracyPlan | None = None


LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
PERCENTILES = (("median", "p50"), ("p99", "p99"))


class RunRow(BaseModel):
    model_config = _READ
    launch: int
    arm: str
    case: str
    run: int
    status: str
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None


class LaunchDispatch(BaseModel):
    model_config = _READ
    valid: bool
    reason: str


class LaunchRow(BaseModel):
    model_config = _READ
    launch: int
    arm: str
    status: str
    dispatch: LaunchDispatch | None = None


@dataclass(frozen=True)
class ServingRun:
    name: str
    plan: Plan
    summary: ServingSummary
    runs: list[RunRow]
    launches: list[LaunchRow]
    gpu: str | None
    ops: dict[str, frozenset[tuple[str, str]]]  # arm -> (dispatch op, implementation) it swaps in
    overrides: tuple[Override, ...] | None = None  # the command line's values beside protocol.toml (None: unreadable)


def arm_ops(run_dir: Path, plan: Plan) -> dict[str, frozenset[tuple[str, str]]]:
    """(dispatch op, implementation) pairs each arm swaps in, as the dispatch proof reads them: with
    the run's platform table and the copies of the arm's selection files."""
    platform = FlPlatform.model_validate(plan.fl_platform).table if plan.fl_platform else None
    out = {}
    for a in plan.arms:
        texts = {v: (run_dir / c["copy"]).read_text() if c.get("copy") else None for v, c in a.selection_files.items()}
        try:
            out[a.name] = frozenset(intended_ops(a.env, platform, texts).items())
        except SelectionError:
            out[a.name] = frozenset()  # the dispatch proof names the unreadable file
    return out


def _read(model: type[M], path: Path, data: object) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"])
        raise RunDirError(f"{path}: {where}: {first['msg']}; is this a serving run directory?") from None


def load_run(run_dir: Path) -> ServingRun:
    run_dir = Path(run_dir)
    provenance = read_json(run_dir / PROVENANCE)
    gpus = provenance.get("gpu") if isinstance(provenance, dict) else None
    gpu = gpus[0].get("name") if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) else None
    launches = read_jsonl(run_dir / LAUNCHES) if (run_dir / LAUNCHES).is_file() else []
    plan = _read(Plan, run_dir / PLAN, read_json(run_dir / PLAN))
    return ServingRun(
        name=run_dir.name,
        plan=plan,
        summary=read_serving_summary(run_dir),
        runs=[_read(RunRow, run_dir / RUNS, r) for r in read_jsonl(run_dir / RUNS)],
        launches=[_read(LaunchRow, run_dir / LAUNCHES, r) for r in launches],
        gpu=gpu,
        ops=arm_ops(run_dir, plan),
        overrides=command_overrides(run_dir, provenance),
    )


def command_overrides(run_dir: Path, provenance: object) -> tuple[Override, ...] | None:
    """The values provenance.json `argv` gave on the command line that differ from protocol.toml's
    (serving/effective.py); None where protocol.toml does not parse."""
    argv = provenance.get("argv") if isinstance(provenance, dict) else None
    try:
        text = (run_dir / PROTOCOL).read_text(encoding="utf-8")
        proto = parse_protocol(text, run_dir)
    except (OSError, UnicodeDecodeError, ProtocolError):
        return None
    return tuple(overrides(written(text, proto), command_line(argv)))


# ---------------------------------------------------------------- figures derived for the report


@dataclass(frozen=True)
class GeomeanInterval:
    """Geometric mean of n positive values and its Student-t interval on the log scale (None below two values)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @classmethod
    def of(cls, values: list[float], confidence: float) -> GeomeanInterval:
        """The geometric mean and exp(mean log -+ t sd(log) / sqrt(n)): positive figures (tok/s, ms)
        whose noise is multiplicative, so the interval is never negative. Without two positive
        values there is no interval (a zero, e.g. a failed figure, gives the plain mean)."""
        if min(values) <= 0:
            return cls(math.fsum(values) / len(values), None, None, len(values))
        logs = [math.log(v) for v in values]
        centre = math.fsum(logs) / len(logs)
        half = t_half_width(logs, confidence)
        if half is None:
            return cls(math.exp(centre), None, None, len(values))
        return cls(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(values))

    def cell(self, spec: str) -> str:
        if self.low is None or self.high is None:
            return f"{self.mean:{spec}} (n={self.n})"
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


@dataclass(frozen=True)
class LaunchSpread:
    launch: int
    throughput: GeomeanInterval  # total tok/s over the kept runs of the launch
    ttft_ms: GeomeanInterval  # mean TTFT over the kept runs


@dataclass(frozen=True)
class ArmCase:
    arm: str
    case: str
    status: str
    throughput: GeomeanInterval | None  # across launches
    ttft_ms: GeomeanInterval | None
    launches: tuple[LaunchSpread, ...]


def arm_case(run: ServingRun, arm: str, case: str) -> ArmCase:
    result = run.summary.results.get(arm, {}).get(case)
    if result is None or result.status != "ok" or not result.launches:
        return ArmCase(arm, case, result.status if result else "missing", None, None, ())
    conf = run.plan.acceptance.confidence
    spreads = []
    for fig in result.launches:
        kept = [
            r
            for r in run.runs
            if r.arm == arm
            and r.case == case
            and r.launch == fig.launch
            and r.run in fig.kept_runs
            and r.status == "ok"
        ]
        tput = [r.total_token_throughput for r in kept if r.total_token_throughput is not None]
        ttft = [r.mean_ttft_ms for r in kept if r.mean_ttft_ms is not None]
        spreads.append(
            LaunchSpread(
                fig.launch,
                GeomeanInterval.of(tput, conf) if tput else GeomeanInterval(fig.needed(THROUGHPUT), None, None, 0),
                GeomeanInterval.of(ttft, conf) if ttft else GeomeanInterval(fig.needed(TTFT), None, None, 0),
            )
        )
    return ArmCase(
        arm,
        case,
        "ok",
        GeomeanInterval.of([f.needed(THROUGHPUT) for f in result.launches], conf),
        GeomeanInterval.of([f.needed(TTFT) for f in result.launches], conf),
        tuple(spreads),
    )


def launch_figures(run: ServingRun, arm: str, case: str) -> list[LaunchFigure] | None:
    """An arm's per-launch figures in a case, each with its round (None unless the case is ok)."""
    result = run.summary.results.get(arm, {}).get(case)
    if result is None or not result.launches:
        return None
    return case_launch_figures(result, {L.launch: L.round for L in run.plan.launches})


def accuracy_gate(run: ServingRun, arm: str) -> GateCheck | None:
    """The arm's MATH-500 gate (None: no gate in the protocol)."""
    if run.plan.accuracy is None:
        return None
    acc = run.summary.accuracy.get(arm)
    lower_end = acc.ci_low if acc and run.plan.accuracy.rule == "lower_bound" else None
    return accuracy_check(
        acc.accuracy if acc else None,
        acc.errors if acc else 0,
        bool(acc and acc.passed),
        run.plan.accuracy.gate,
        lower_end,
    )


def dispatch_gate(run: ServingRun, arm: str) -> GateCheck | None:
    """The arm's proof of dispatch (None: not recorded by this run)."""
    if run.summary.dispatch is None:
        return None
    role = next(a.role for a in run.plan.arms if a.name == arm)
    proof = run.summary.dispatch.get(arm)
    return dispatch_check(
        role, arm, proof.valid if proof else False, proof.reason if proof else "no verdict for this arm"
    )


def verdict(run: ServingRun, arm: str, against: str) -> Verdict:
    """`arm` against `against` by the trial's rule (serving/acceptance.py), from summary.json's per-launch figures."""
    rule = run.plan.acceptance.rule
    cases = [
        compare_case(c.case, launch_figures(run, arm, c.case), launch_figures(run, against, c.case), rule)
        for c in run.plan.cases
    ]
    checks = [accuracy_gate(run, arm), dispatch_gate(run, arm), dispatch_gate(run, against)]
    return judge(arm, against, cases, [c for c in checks if c is not None], rule)


def parts_of(run: ServingRun, combined: PlanArm) -> list[PlanArm]:
    """The arms that swap in a non-empty proper part of what `combined` swaps in (E1, E2 for E3)."""
    mine = run.ops[combined.name]
    return [a for a in run.plan.arms if a.role != "baseline" and run.ops[a.name] and run.ops[a.name] < mine]
