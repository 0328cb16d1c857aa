"""The throughput figures (issue 40) recomputed from the raw rows: `achieved TFLOPS` (plan.json
case `flops` / the arm's median ns per call, recomputed from timings.csv, / 1000) and `peak memory`
(the largest timings.csv `peak_bytes` of the arm's samples in the case, where plan.json
`peak_memory` says the run measured it: on a GPU timed with CUDA events, never for an isolated
arm). A run without case `flops` (an operator without a FLOP count, or a run from before issue 40)
lists the first as not applicable, one without `peak_memory` the second; either must then claim
no such figure."""

from __future__ import annotations

from typing import Any

from kerneltrial.kernel.verify.arithmetic import diff
from kerneltrial.kernel.verify.rows import Sample
from kerneltrial.rundir.checks import VerifyResult

Medians = dict[tuple[str, str], float | None]  # (case, arm) -> median ns per call, recomputed; None: no times
TFLOPS = "achieved TFLOPS"
PEAK = "peak memory"


def _entries(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("case")): c for c in summary.get("cases", []) if isinstance(c, dict)}


def _claims(summary: dict[str, Any], field: str, cases: set[str]) -> list[str]:
    """Arm entries outside `cases` that hold `field` (a figure without the raw data it comes from)."""
    return [
        f"case {case_id} arm {name} has {field} but the run has no data it comes from"
        for case_id, case in _entries(summary).items()
        if case_id not in cases
        for name, entry in (case.get("arms") or {}).items()
        if isinstance(entry, dict) and field in entry
    ]


def check_tflops(plan: dict[str, Any], summary: dict[str, Any], medians: Medians, result: VerifyResult) -> None:
    """Every arm's tflops where its case has `flops`; no tflops (nor case flops) elsewhere."""
    counted = {str(c["case"]): c["flops"] for c in plan["cases"] if c.get("flops") is not None}
    recorded = _entries(summary)
    problems = _claims(summary, "tflops", set(counted))
    problems += [
        f"case {case_id} has flops but plan.json's case has none"
        for case_id, case in recorded.items()
        if case_id not in counted and "flops" in case
    ]
    if not counted and not problems:
        result.not_applicable(
            TFLOPS, "not applicable: plan.json cases have no flops (no FLOP count, or before issue 40)"
        )
        return
    figures = 0
    for case_id, flops in counted.items():
        if not isinstance(flops, int) or isinstance(flops, bool) or flops <= 0:
            problems.append(f"plan.json case {case_id} flops {flops!r}: must be a count > 0")
            continue
        case = recorded.get(case_id, {})
        problems += diff(f"case {case_id}", case, {"flops": flops}, ("flops",))
        for arm in plan["arms"]:
            name, median = arm["name"], medians.get((case_id, arm["name"]))
            entry = (case.get("arms") or {}).get(name, {})
            if "tflops" not in entry:
                problems.append(f"case {case_id} arm {name} lacks tflops (its case has flops)")
                continue
            problems += diff(
                f"case {case_id} arm {name}",
                entry,
                {"tflops": None if median is None else flops / median / 1e3},
                ("tflops",),
            )
            figures += median is not None
    result.add(TFLOPS, problems, f"{figures} figure(s): plan flops / the median ns per call / 1000, recomputed")


def _peak_rows(plan: dict[str, Any], samples: list[Sample]) -> tuple[dict[tuple[str, str], int], list[str]]:
    """The largest peak_bytes of each (case, arm), and the rows that break the rule: a value where
    none is measured (the run says so, or the arm is isolated), none where one is, or a negative one."""
    measured, isolated = plan.get("peak_memory") is True, set(plan.get("isolated") or [])
    largest: dict[tuple[str, str], int] = {}
    problems: list[str] = []
    for s in samples:
        where = f"timings.csv row case={s.case} seed={s.seed} round={s.round} arm={s.arm}"
        wanted = measured and s.arm not in isolated
        if s.peak_bytes is None:
            if wanted:
                problems.append(f"{where} has no peak_bytes; the run measured it for this arm")
            continue
        if not wanted:
            problems.append(f"{where} has peak_bytes {s.peak_bytes}, but it is not measured here")
        elif s.peak_bytes < 0:
            problems.append(f"{where} peak_bytes {s.peak_bytes}: must be >= 0")
        largest[(s.case, s.arm)] = max(s.peak_bytes, largest.get((s.case, s.arm), 0))
    return largest, problems


def check_peak_memory(
    plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], medians: Medians, result: VerifyResult
) -> None:
    """Every arm's peak_bytes in a run with plan.json `peak_memory`; no figure and no row value without it."""
    if "peak_memory" not in plan:
        problems = _claims(summary, "peak_bytes", set())
        problems += [f"timings.csv has peak_bytes for {s.case} {s.arm}" for s in samples if s.peak_bytes is not None]
        if problems:
            result.add(PEAK, [*problems, "plan.json has no peak_memory"], "")
        else:
            result.not_applicable(PEAK, "not applicable: plan.json has no peak_memory (a run from before issue 40)")
        return
    expected = plan["is_gpu"] is True and plan.get("backend") == "cuda-events"
    problems = (
        [] if plan["peak_memory"] is expected else [f"plan.json peak_memory {plan['peak_memory']!r} != {expected}"]
    )
    largest, row_problems = _peak_rows(plan, samples)
    problems += row_problems
    recorded = _entries(summary)
    for case in plan["cases"]:
        case_id = str(case["case"])
        for arm in plan["arms"]:
            name = arm["name"]
            entry = (recorded.get(case_id, {}).get("arms") or {}).get(name, {})
            figure = largest.get((case_id, name)) if medians.get((case_id, name)) is not None else None
            if "peak_bytes" not in entry:
                problems.append(f"case {case_id} arm {name} lacks peak_bytes (plan.json has peak_memory)")
            problems += diff(f"case {case_id} arm {name}", entry, {"peak_bytes": figure}, ("peak_bytes",))
    detail = f"{len(largest)} (case, arm) peak(s) from timings.csv peak_bytes" if expected else "not measured here"
    result.add(PEAK, problems, detail)
