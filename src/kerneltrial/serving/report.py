"""report.md and PNG figures for a serving run directory (`kerneltrial report RUN`).

The run's files are read as typed records by report_data.py (which also derives the intervals
and verdicts) and the PNGs are drawn by report_figures.py; this module writes the markdown:
the arms, per case each arm's throughput and TTFT (geometric means with log-scale intervals:
issue 26, raw-scale intervals over a few noisy launches went negative, "913.5 tok/s [-5004,
6831]"), latency percentiles (p50 and p99 of TTFT, TPOT, ITL and E2E) and goodput, the trial's
one acceptance rule (serving/acceptance.py) applied to every arm against the baseline and to a
combined arm (E3) against each arm that swaps in a part of it (E1, E2), the accuracy gate, the
dispatch proof and the run's scope. Nothing is measured here; `kerneltrial verify` rebuilds the
figures from the raw files.
"""

from __future__ import annotations

from pathlib import Path

from kerneltrial.publication import titled
from kerneltrial.rundir.layout import REPORT
from kerneltrial.rundir.serving_summary_doc import Scope
from kerneltrial.serving import report_figures as figures
from kerneltrial.serving.acceptance import ACCEPTED, CaseComparison, Verdict
from kerneltrial.serving.protocol import OPERATOR_SELECTION_ENV
from kerneltrial.serving.report_data import (
    LATENCIES,
    NOT_RECORDED,
    PERCENTILES,
    ServingRun,
    accuracy_gate,
    arm_case,
    dispatch_gate,
    load_run,
    parts_of,
    verdict,
)

THROUGHPUT_PNG = "throughput.png"
TTFT_PNG = "ttft.png"
LATENCY_PNG = "latency.png"
GOODPUT_PNG = "goodput.png"  # only when the plan sets goodput SLOs

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
            ", ".join(f"{op} -> {impl}" for op, impl in sorted(run.ops[a.name])) or "nothing (default selection)",
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
        f"Geometric mean with a {run.plan.acceptance.confidence:.0%} Student-t interval on the log scale (launch noise is "
        "multiplicative; the interval is never negative): across launches per arm, across the kept runs within a launch. "
        "Total tok/s counts input and output tokens (vLLM's total_token_throughput); summary.json keeps the arithmetic "
        "means.",
    ]
    for case in run.plan.cases:
        cells = [arm_case(run, a.name, case.case) for a in run.plan.arms]
        out += ["", f"### {case.heading}", ""]
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


def latency_lines(run: ServingRun) -> list[str]:
    """Per case: each arm's p50 and p99 of TTFT, TPOT, ITL and E2E latency (ms), and its goodput
    (req/s) when the plan sets SLOs."""
    header = ["arm", *(f"{p} {label} ms" for _, label in LATENCIES for _, p in PERCENTILES)]
    out = [
        "## Latency percentiles and goodput",
        "",
        "p50 and p99 per run (vLLM's percentiles over the run's requests; ITL over all inter-token gaps), averaged "
        "over the kept runs of a launch and then over launches, as summary.json does.",
    ]
    slos = run.plan.goodput
    if slos:
        header.append("goodput req/s")
        out[-1] += (
            " Goodput: requests meeting every SLO ("
            + ", ".join(f"{k} <= {v:g} ms" for k, v in slos.items())
            + ") per second, vLLM's request_goodput."
        )
    for case in run.plan.cases:
        rows = []
        for a in run.plan.arms:
            result = run.summary.results.get(a.name, {}).get(case.case)
            values = [
                None if result is None else result.latency_ms(stat, metric)
                for metric, _ in LATENCIES
                for stat, _ in PERCENTILES
            ]
            if slos:
                values.append(None if result is None else result.figure("request_goodput"))
            rows.append([a.name, *("-" if v is None else f"{v:.1f}" for v in values)])
        out += ["", f"### {case.heading}", "", *_table(header, rows)]
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


INTERVAL_NAMES = {"wilson": "Wilson", "wilson-design-effect": "Wilson, design effect"}


def accuracy_lines(run: ServingRun) -> list[str]:
    acc = run.plan.accuracy
    if acc is None:
        return ["## Accuracy", "", "No accuracy gate in the protocol."]
    rows, chances = [], []
    for a in run.plan.arms:
        r = run.summary.accuracy.get(a.name)
        if r is None:
            rows.append([a.name, "-", "-", "-", "-", "not measured"])
            continue
        at_gate = r.pass_probability_at_gate
        chances.append(f"{a.name} {NOT_RECORDED if at_gate is None else f'{at_gate:.3f}'}")
        rows.append(
            [
                a.name,
                f"{r.correct}/{r.n * r.samples}" + (f" ({r.n} x {r.samples})" if r.samples > 1 else ""),
                f"{r.accuracy:.3f}",
                f"{r.ci_low:.3f}-{r.ci_high:.3f} ({INTERVAL_NAMES.get(r.interval, r.interval)} {r.confidence:.0%})",
                str(r.errors),
                "passed" if r.passed else "**failed**",
            ]
        )
    rule = "the interval's lower end" if acc.rule == "lower_bound" else "accuracy"
    return [
        "## Accuracy (MATH-500)",
        "",
        f"{acc.level or 'all levels'}; gate: {rule} >= {acc.gate} and no request failed.",
        "",
        *_table(["arm", "correct", "accuracy", "interval", "request errors", "gate"], rows),
        "",
        f"Pass probability at the gate (a model whose every sample is correct with probability exactly "
        f"{acc.gate}, independently, passes this gate with this n and {acc.samples} sample(s) per problem): "
        f"{', '.join(chances) or NOT_RECORDED}.",
        "",
        *cross_grade_lines(run),
    ]


def cross_grade_lines(run: ServingRun) -> list[str]:
    """Each measured arm's cross-grade with evalscope's math_500 (serving/crossgrade.py): the counts
    and the disagreements, or why it did not run."""
    out = ["Cross-grade of the same samples with evalscope's math_500 (the gate stays math-verify's):", ""]
    for a in run.plan.arms:
        r = run.summary.accuracy.get(a.name)
        if r is None:
            continue
        lines = (
            ["not recorded (a run from before the trial ran one)"] if r.cross_grade is None else r.cross_grade.lines()
        )
        out += [f"- {a.name}: {lines[0]}", *(f"  - `{line.strip()}`" for line in lines[1:])]
    return out


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


def _scope_line(scope: Scope | None) -> str:
    if scope is None:
        return f"Scope: {NOT_RECORDED}."
    why = f" Why not official: {'; '.join(scope.reasons)}." if scope.reasons else ""
    return f"Scope: **{scope.kind}** on {scope.hardware}.{why}"


def overrides_line(run: ServingRun) -> str:
    """The values given on the command line (provenance.json argv) that replace protocol.toml's."""
    if run.overrides is None:
        return f"Command line: {NOT_RECORDED} (protocol.toml does not parse)."
    if not run.overrides:
        return "Command line: protocol.toml as written (no value given beside it differs from it)."
    return "Command line overrides protocol.toml: " + "; ".join(str(o) for o in run.overrides) + "."


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
        _scope_line(s.scope),
        "",
        overrides_line(run),
        "",
        *arms_lines(run),
        "",
        *figures_lines(run),
        "",
        *latency_lines(run),
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
        f"![latency percentiles per arm]({LATENCY_PNG})",
        "",
        *([f"![request goodput per arm]({GOODPUT_PNG})", ""] if run.plan.goodput else []),
        "Figures are drawn from summary.json and runs.jsonl; `kerneltrial verify` rebuilds them from the raw files.",
    ]
    return "\n".join(lines) + "\n"


def write_serving_report(run_dir: Path, unverified: bool = False) -> Path:
    """Write report.md, throughput.png, ttft.png and latency.png (goodput.png with SLOs) into a serving
    run directory; returns report.md. `unverified`: every title says the run was not required to verify."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    figures.plot_metric(run, "throughput", run_dir / THROUGHPUT_PNG, unverified)
    figures.plot_metric(run, "ttft", run_dir / TTFT_PNG, unverified)
    figures.plot_latency(run, run_dir / LATENCY_PNG, unverified)
    if run.plan.goodput:
        figures.plot_goodput(run, run_dir / GOODPUT_PNG, unverified)
    path = run_dir / REPORT
    path.write_text(render(run, unverified))
    return path
