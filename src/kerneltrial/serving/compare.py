"""Two serving runs side by side (`kerneltrial compare RUN_A RUN_B` on serving run directories).

Comparing two serving runs means: the same arm and case measured twice (another day, machine
or build of the server). For every (arm, case) both runs measured: total tok/s and mean TTFT
in A and in B, each the mean over launches (the unit a serving protocol replicates) with its
95% Student-t interval across launches (report_data.GeomeanInterval), and the ratio B/A of the means.
Arms or cases only one run has are listed, never silently dropped. Reads plan.json and
summary.json through report.load_run; nothing is recomputed (that is `verify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kerneltrial.analysis.compare import only_in_lines
from kerneltrial.publication import titled
from kerneltrial.serving.report_data import GeomeanInterval, ServingRun, arm_case, load_run


@dataclass(frozen=True)
class ComparedArmCase:
    arm: str
    case: str
    status_a: str
    status_b: str
    throughput_a: GeomeanInterval | None  # total tok/s across launches
    throughput_b: GeomeanInterval | None
    throughput_ratio: float | None  # B / A of the means
    ttft_ms_a: GeomeanInterval | None  # mean TTFT across launches
    ttft_ms_b: GeomeanInterval | None
    ttft_ratio: float | None


@dataclass(frozen=True)
class ServingComparison:
    run_a: str
    run_b: str
    notes: list[str]
    rows: list[ComparedArmCase]
    only_in_a: list[str]
    only_in_b: list[str]


def _ratio(b: GeomeanInterval | None, a: GeomeanInterval | None) -> float | None:
    return None if a is None or b is None or a.mean == 0 else b.mean / a.mean


def _pairs(run: ServingRun) -> list[tuple[str, str]]:
    return [(arm.name, case.case) for arm in run.plan.arms for case in run.plan.cases]


def comparison(a: Path, b: Path) -> ServingComparison:
    run_a, run_b = load_run(Path(a)), load_run(Path(b))
    notes = []
    if run_a.gpu != run_b.gpu:
        notes.append(
            f"The runs ran on different GPUs ({run_a.gpu or 'none recorded'} and {run_b.gpu or 'none recorded'})."
        )
    rule_a, rule_b = ((r.plan.rounds, r.plan.repeats) for r in (run_a, run_b))
    if rule_a != rule_b:
        notes.append(f"The runs have different (rounds, repeats): {rule_a} and {rule_b}.")
    pairs_a, pairs_b = _pairs(run_a), _pairs(run_b)
    rows = []
    for arm, case in pairs_a:
        if (arm, case) not in pairs_b:
            continue
        x, y = arm_case(run_a, arm, case), arm_case(run_b, arm, case)
        rows.append(
            ComparedArmCase(
                arm,
                case,
                x.status,
                y.status,
                x.throughput,
                y.throughput,
                _ratio(y.throughput, x.throughput),
                x.ttft_ms,
                y.ttft_ms,
                _ratio(y.ttft_ms, x.ttft_ms),
            )
        )
    return ServingComparison(
        str(a),
        str(b),
        notes,
        rows,
        [f"{arm} {case}" for arm, case in pairs_a if (arm, case) not in pairs_b],
        [f"{arm} {case}" for arm, case in pairs_b if (arm, case) not in pairs_a],
    )


def _cell(value: GeomeanInterval | None, spec: str, status: str) -> str:
    return value.cell(spec) if value is not None else status


def _ratio_cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def compare_runs(a: Path, b: Path, unverified: bool = False) -> str:
    """The markdown comparison of serving runs `a` and `b` (see `comparison`); `unverified`: the
    title says the runs were not required to verify."""
    c = comparison(a, b)
    lines = [titled("# Serving runs compared", unverified), "", f"A: `{a}`", f"B: `{b}`", ""]
    for note in c.notes:
        lines += [note, ""]
    lines += [
        "Means over launches with their 95% interval across launches; ratio = B / A.",
        "",
        "| arm | case | total tok/s A | total tok/s B | B/A | mean TTFT ms A | mean TTFT ms B | B/A |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in c.rows:
        lines.append(
            f"| {r.arm} | {r.case} | {_cell(r.throughput_a, '.1f', r.status_a)} | "
            f"{_cell(r.throughput_b, '.1f', r.status_b)} | {_ratio_cell(r.throughput_ratio)} | "
            f"{_cell(r.ttft_ms_a, '.2f', r.status_a)} | {_cell(r.ttft_ms_b, '.2f', r.status_b)} | "
            f"{_ratio_cell(r.ttft_ratio)} |"
        )
    return "\n".join(lines + only_in_lines(c.only_in_a, c.only_in_b)) + "\n"
