"""report.md and PNG figures for a serving run directory (`kerneltrial report RUN`).

Drawn from plan.json (arms, cases, acceptance rule), summary.json (per-launch figures after
the warm-up rule, accuracy, the trial's verdict, the dispatch proof when recorded), runs.jsonl
(the kept runs of each launch, for a per-launch interval) and launches.jsonl (per-launch
dispatch verdicts when recorded). Nothing is measured here; `kerneltrial verify` rebuilds the
figures from the raw files.

Intervals of an arm's figures are Student-t intervals of the mean at the protocol's
confidence: across launches for an arm (the unit the protocol replicates), across kept runs
for one launch. Acceptance applies the trial's one rule (serving/acceptance.py: paired
intervals across launches, the gain's lower bound above the noise band and the TTFT ratio's
upper bound at most ttft_ratio_max in every case, the accuracy gate when set, valid dispatch
proofs) to every arm against the baseline, not only to the candidate. An arm
that swaps in several operators (E3) is also compared with each arm that swaps in a part of
them (E1, E2), identified by the operators their selection variables select (dispatch_proof).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, ValidationError

from kerneltrial.analysis.publication import titled
from kerneltrial.analysis.stats import t_half_width
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.layout import LAUNCHES, PLAN, PROVENANCE, REPORT, RUNS, SUMMARY
from kerneltrial.serving.acceptance import (
    ACCEPTED,
    CaseComparison,
    Check,
    LaunchFigure,
    Rule,
    Verdict,
    accuracy_check,
    compare_case,
    dispatch_check,
    judge,
)
from kerneltrial.serving.dispatch_proof import intended_ops
from kerneltrial.serving.protocol import OPERATOR_SELECTION_ENV

THROUGHPUT_PNG = "throughput.png"
TTFT_PNG = "ttft.png"
NOT_RECORDED = "not recorded"
M = TypeVar("M", bound=BaseModel)

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

    @property
    def ops(self) -> frozenset[tuple[str, str]]:
        """(dispatch op, implementation) pairs the arm swaps in, as the dispatch proof reads them."""
        return frozenset(intended_ops(self.env).items())


class PlanCase(BaseModel):
    model_config = _READ
    case: str


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


class Plan(BaseModel):
    model_config = _READ
    arms: list[PlanArm]
    cases: list[PlanCase]
    rounds: int
    repeats: int
    launches: list[PlanLaunch]
    acceptance: AcceptanceRule
    accuracy: AccuracyPlan | None = None


class LaunchFigures(BaseModel):
    model_config = _READ
    launch: int
    kept_runs: list[int]
    total_token_throughput: float
    mean_ttft_ms: float


class CaseResult(BaseModel):
    model_config = _READ
    status: str
    launches: list[LaunchFigures] = []
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None


class AccuracyResult(BaseModel):
    model_config = _READ
    n: int
    correct: int
    errors: int
    accuracy: float
    ci_low: float
    ci_high: float
    confidence: float
    passed: bool


class DispatchCount(BaseModel):
    model_config = _READ
    op: str
    impl: str
    calls: int
    errors: int = 0


class ArmDispatch(BaseModel):
    model_config = _READ
    valid: bool | None
    reason: str
    counts: list[DispatchCount] = []


class TrialVerdict(BaseModel):
    model_config = _READ
    baseline: str
    candidate: str
    accepted: bool
    verdict: str | None = None  # ACCEPTED, REJECTED or INCONCLUSIVE; absent before intervals
    reasons: list[str] = []


class Summary(BaseModel):
    model_config = _READ
    status: str
    results: dict[str, dict[str, CaseResult]]
    accuracy: dict[str, AccuracyResult] = {}
    acceptance: TrialVerdict | None = None
    dispatch: dict[str, ArmDispatch] | None = None
    failures: list[str] = []


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
    summary: Summary
    runs: list[RunRow]
    launches: list[LaunchRow]
    gpu: str | None


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
    return ServingRun(
        name=run_dir.name,
        plan=_read(Plan, run_dir / PLAN, read_json(run_dir / PLAN)),
        summary=_read(Summary, run_dir / SUMMARY, read_json(run_dir / SUMMARY)),
        runs=[_read(RunRow, run_dir / RUNS, r) for r in read_jsonl(run_dir / RUNS)],
        launches=[_read(LaunchRow, run_dir / LAUNCHES, r) for r in launches],
        gpu=gpu,
    )


# ---------------------------------------------------------------- figures derived for the report


@dataclass(frozen=True)
class Interval:
    """Mean of n values and its Student-t interval (None below two values)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @classmethod
    def of(cls, values: list[float], confidence: float) -> Interval:
        mean = math.fsum(values) / len(values)
        half = t_half_width(values, confidence)
        if half is None:
            return cls(mean, None, None, len(values))
        return cls(mean, mean - half, mean + half, len(values))

    def cell(self, spec: str) -> str:
        if self.low is None or self.high is None:
            return f"{self.mean:{spec}} (n={self.n})"
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


@dataclass(frozen=True)
class LaunchSpread:
    launch: int
    throughput: Interval  # total tok/s over the kept runs of the launch
    ttft_ms: Interval  # mean TTFT over the kept runs


@dataclass(frozen=True)
class ArmCase:
    arm: str
    case: str
    status: str
    throughput: Interval | None  # across launches
    ttft_ms: Interval | None
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
                Interval.of(tput, conf) if tput else Interval(fig.total_token_throughput, None, None, 0),
                Interval.of(ttft, conf) if ttft else Interval(fig.mean_ttft_ms, None, None, 0),
            )
        )
    return ArmCase(
        arm,
        case,
        "ok",
        Interval.of([f.total_token_throughput for f in result.launches], conf),
        Interval.of([f.mean_ttft_ms for f in result.launches], conf),
        tuple(spreads),
    )


def launch_figures(run: ServingRun, arm: str, case: str) -> list[LaunchFigure] | None:
    """An arm's per-launch figures in a case, each with its round (None unless the case is ok)."""
    result = run.summary.results.get(arm, {}).get(case)
    if result is None or result.status != "ok" or not result.launches:
        return None
    round_of = {L.launch: L.round for L in run.plan.launches}
    return [LaunchFigure(round_of[f.launch], f.total_token_throughput, f.mean_ttft_ms) for f in result.launches]


def accuracy_gate(run: ServingRun, arm: str) -> Check | None:
    """The arm's MATH-500 gate (None: no gate in the protocol)."""
    if run.plan.accuracy is None:
        return None
    acc = run.summary.accuracy.get(arm)
    return accuracy_check(
        acc.accuracy if acc else None, acc.errors if acc else 0, bool(acc and acc.passed), run.plan.accuracy.gate
    )


def dispatch_gate(run: ServingRun, arm: str) -> Check | None:
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
    return [a for a in run.plan.arms if a.role != "baseline" and a.ops and a.ops < combined.ops]


# ---------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _env(env: dict[str, str]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in sorted(env.items())) or "none"


def _yes(flag: bool | None, yes: str = "yes", no: str = "**no**") -> str:
    return NOT_RECORDED if flag is None else yes if flag else no


def arms_lines(run: ServingRun) -> list[str]:
    arms = run.plan.arms
    rows = [
        [
            a.name,
            a.role,
            _env(a.selection),
            ", ".join(f"{op} -> {impl}" for op, impl in sorted(a.ops)) or "nothing (default selection)",
        ]
        for a in arms
    ]
    first = arms[0]
    shared = {k: v for k, v in first.env.items() if k not in OPERATOR_SELECTION_ENV}
    return [
        "## Arms",
        "",
        *_table(["arm", "role", "operator selection", "swaps in"], rows),
        "",
        "Every arm runs the same command and the same other environment (the protocol loader refuses any "
        "other difference):",
        "",
        f"- argv: `{' '.join(first.argv)}`",
        f"- environment: {_env(shared)}",
        f"- {run.plan.rounds} launch(es) per arm, in counterbalanced blocks (A B then B A); {run.plan.repeats} runs "
        "of each case per launch, run 0 dropped as warm-up",
    ]


def figures_lines(run: ServingRun) -> list[str]:
    out = [
        "## Throughput and TTFT",
        "",
        f"Mean with a {run.plan.acceptance.confidence:.0%} Student-t interval: across launches per arm, across the kept runs within "
        "a launch. Total tok/s counts input and output tokens (vLLM's total_token_throughput).",
    ]
    for case in run.plan.cases:
        cells = [arm_case(run, a.name, case.case) for a in run.plan.arms]
        out += ["", f"### {case.case}", ""]
        out += _table(
            ["arm", "total tok/s", "mean TTFT ms", "status"],
            [
                [
                    c.arm,
                    c.throughput.cell(".1f") if c.throughput else "-",
                    c.ttft_ms.cell(".1f") if c.ttft_ms else "-",
                    c.status,
                ]
                for c in cells
            ],
        )
        out += ["", "Per launch:", ""]
        out += _table(
            ["arm", "launch", "total tok/s", "mean TTFT ms"],
            [
                [c.arm, str(s.launch), s.throughput.cell(".1f"), s.ttft_ms.cell(".1f")]
                for c in cells
                for s in c.launches
            ],
        )
    return out


COMPARISON_HEADER = [
    "arm",
    "against",
    "case",
    "launches",
    "tok/s gain [interval]",
    "TTFT ratio [interval]",
    "gain ok",
    "TTFT ok",
]


def _bounds(c: CaseComparison) -> tuple[str, str]:
    if c.throughput is None or c.ttft is None:
        return "-", "-"
    tput, ttft = c.throughput.interval, c.ttft.interval
    gain = f"{c.throughput.estimate - 1:+.2%}" + (
        "" if tput is None else f" [{tput.low - 1:+.2%}, {tput.high - 1:+.2%}]"
    )
    ratio = f"{c.ttft.estimate:.4f}" + ("" if ttft is None else f" [{ttft.low:.4f}, {ttft.high:.4f}]")
    return gain, ratio


def _comparison_rows(v: Verdict) -> list[list[str]]:
    return [
        [
            v.arm,
            v.against,
            c.case,
            str(c.throughput.n) if c.throughput else "-",
            *_bounds(c),
            _yes(c.throughput_ok),
            _yes(c.ttft_ok),
        ]
        for c in v.cases
    ]


def _shown(v: Verdict) -> str:
    return v.verdict if v.verdict == ACCEPTED else f"**{v.verdict}**"


def acceptance_lines(run: ServingRun) -> list[str]:
    rule = run.plan.acceptance
    base = next((a for a in run.plan.arms if a.role == "baseline"), None)
    if base is None:
        return ["## Acceptance", "", "No baseline arm: nothing is compared."]
    others = [a for a in run.plan.arms if a is not base]
    verdicts = {a.name: verdict(run, a.name, base.name) for a in others}
    gate = f", MATH-500 accuracy >= {run.plan.accuracy.gate}" if run.plan.accuracy else ""
    out = [
        "## Acceptance",
        "",
        f"Each arm against {base.name}, in every case, with {rule.confidence:.0%} intervals across launches (paired "
        f"by round, Student t on the log ratios; serving/acceptance.py): the total tok/s gain's lower bound above "
        f"{rule.noise_band:.2%}, the mean TTFT ratio's upper bound at most {rule.ttft_ratio_max}{gate}, and a valid "
        "dispatch proof when one is recorded. Too few launches for an interval is INCONCLUSIVE.",
        "",
        *_table(COMPARISON_HEADER, [row for v in verdicts.values() for row in _comparison_rows(v)]),
        "",
        *_table(
            ["arm", "accuracy gate", "dispatch proof", "verdict", "reasons"],
            [
                [
                    v.arm,
                    "no gate" if (g := accuracy_gate(run, v.arm)) is None else _yes(g.passed, "passed", "**failed**"),
                    _yes(None if (d := dispatch_gate(run, v.arm)) is None else d.passed, "valid", "**invalid**"),
                    _shown(v),
                    "; ".join(v.reasons) or "-",
                ]
                for v in verdicts.values()
            ],
        ),
    ]
    recorded = run.summary.acceptance
    if recorded is not None:
        shown = recorded.verdict or ("ACCEPTED" if recorded.accepted else "REJECTED")
        out += [
            "",
            f"The trial's own verdict (summary.json, {recorded.candidate} against {recorded.baseline}): {shown}.",
        ]
    for arm in others:
        parts = parts_of(run, arm)
        if len(parts) < 2:
            continue
        qualified = ", ".join(
            f"{p.name} {'qualified' if verdicts[p.name].accepted else 'did not qualify'}" for p in parts
        )
        out += [
            "",
            f"### {arm.name}: a combination of {', '.join(p.name for p in parts)}",
            "",
            f"{arm.name} is preregistered as a fixed combination; it counts only if its single arms qualified "
            f"({qualified}). Against each single arm, by the same rule:",
            "",
            *_table(
                COMPARISON_HEADER,
                [row for p in parts for row in _comparison_rows(verdict(run, arm.name, p.name))],
            ),
        ]
    return out


def accuracy_lines(run: ServingRun) -> list[str]:
    acc = run.plan.accuracy
    if acc is None:
        return ["## Accuracy", "", "No accuracy gate in the protocol."]
    rows = []
    for a in run.plan.arms:
        r = run.summary.accuracy.get(a.name)
        if r is None:
            rows.append([a.name, "-", "-", "-", "-", "not measured"])
            continue
        rows.append(
            [
                a.name,
                f"{r.correct}/{r.n}",
                f"{r.accuracy:.3f}",
                f"{r.ci_low:.3f}-{r.ci_high:.3f} (Wilson {r.confidence:.0%})",
                str(r.errors),
                "passed" if r.passed else "**failed**",
            ]
        )
    return [
        "## Accuracy (MATH-500)",
        "",
        f"{acc.level or 'all levels'}; gate: accuracy >= {acc.gate} and no request failed.",
        "",
        *_table(["arm", "correct", "accuracy", "interval", "request errors", "gate"], rows),
    ]


def dispatch_lines(run: ServingRun) -> list[str]:
    proof = run.summary.dispatch
    out = ["## Dispatch proof", ""]
    if proof is None:
        return [*out, f"Dispatch proof: {NOT_RECORDED} (this run directory predates it)."]
    rows = []
    for a in run.plan.arms:
        p = proof.get(a.name)
        counts = "; ".join(
            f"{c.op}: {c.calls} calls of {c.impl}" + (f" ({c.errors} raised)" if c.errors else "")
            for c in (p.counts if p else [])
        )
        rows.append(
            [a.name, _yes(p.valid if p else None, "valid", "**invalid**"), p.reason if p else "-", counts or "-"]
        )
    out += _table(["arm", "verdict", "reason", "calls served by kerneltrial plugins"], rows)
    out += ["", "Per launch:", ""]
    out += _table(
        ["launch", "arm", "verdict", "reason"],
        [
            [
                str(L.launch),
                L.arm,
                _yes(L.dispatch.valid if L.dispatch else None, "valid", "**invalid**"),
                L.dispatch.reason if L.dispatch else "-",
            ]
            for L in run.launches
        ],
    )
    return out


# ---------------------------------------------------------------- figures


def plot_metric(run: ServingRun, metric: str, path: Path, unverified: bool = False) -> Path:
    """One panel per case: each launch's figure (dots) and the arm's mean with its interval (bar)."""
    cases = run.plan.cases
    fig = Figure(figsize=(4.5 * len(cases), 4))
    names = [a.name for a in run.plan.arms]
    label = "total tok/s" if metric == "throughput" else "mean TTFT (ms)"
    for k, case in enumerate(cases):
        ax = fig.add_subplot(1, len(cases), k + 1)
        for x, name in enumerate(names):
            cell = arm_case(run, name, case.case)
            pooled = cell.throughput if metric == "throughput" else cell.ttft_ms
            if pooled is None:
                ax.plot([x], [0], "x", color="red")
                continue
            per = [s.throughput.mean if metric == "throughput" else s.ttft_ms.mean for s in cell.launches]
            ax.plot([x] * len(per), per, "o", color="grey", alpha=0.6, label="launch" if x == 0 else None)
            err = (
                [[pooled.mean - pooled.low], [pooled.high - pooled.mean]]
                if pooled.low is not None and pooled.high is not None
                else None
            )
            ax.errorbar(
                [x + 0.15],
                [pooled.mean],
                yerr=err,
                fmt="s",
                color="C0",
                capsize=4,
                label=f"mean, {run.plan.acceptance.confidence:.0%} CI" if x == 0 else None,
            )
        ax.set_xticks(range(len(names)), names)
        ax.set_title(case.case, fontsize="small")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        if k == 0:
            ax.legend(fontsize="small")
    fig.suptitle(
        titled(f"{run.name}: {label} per arm and launch" + ("" if run.gpu else " (no GPU recorded)"), unverified)
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def render(run: ServingRun, unverified: bool = False) -> str:
    """report.md of a serving run (verify renders it again and compares); `unverified`: the title says so."""
    s = run.summary
    lines = [
        titled(f"# Serving trial {run.name}", unverified),
        "",
        f"Status: {s.status}"
        + (f"; failures: {'; '.join(s.failures)}" if s.failures else "")
        + f". GPU: {run.gpu or 'not recorded'}.",
        "",
        *arms_lines(run),
        "",
        *figures_lines(run),
        "",
        *acceptance_lines(run),
        "",
        *accuracy_lines(run),
        "",
        *dispatch_lines(run),
        "",
        "## Figures",
        "",
        f"![total tok/s per arm and launch]({THROUGHPUT_PNG})",
        "",
        f"![mean TTFT per arm and launch]({TTFT_PNG})",
        "",
        "Figures are drawn from summary.json and runs.jsonl; `kerneltrial verify` rebuilds them from the raw files.",
    ]
    return "\n".join(lines) + "\n"


def write_serving_report(run_dir: Path, unverified: bool = False) -> Path:
    """Write report.md, throughput.png and ttft.png into a serving run directory; returns report.md.
    `unverified`: every title says the run was not required to verify."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    plot_metric(run, "throughput", run_dir / THROUGHPUT_PNG, unverified)
    plot_metric(run, "ttft", run_dir / TTFT_PNG, unverified)
    path = run_dir / REPORT
    path.write_text(render(run, unverified))
    return path
