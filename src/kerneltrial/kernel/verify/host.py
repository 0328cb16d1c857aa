"""Host cost per call (schema 5 on): host.csv's samples and the summary's medians recomputed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kerneltrial.kernel.verify.arithmetic import diff, median_of
from kerneltrial.kernel.verify.rows import TimedChecks, read_csv_rows
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.layout import (
    HOST,
)

HOST_FIELDS = ("host_ns_per_call", "host_samples", "host_behind")


def check_host(
    run_dir: Path,
    plan: dict[str, Any],
    summary: dict[str, Any],
    outcome: dict[tuple[str, str], str],
    timed: TimedChecks | None,
    result: VerifyResult,
) -> None:
    """host.csv covers every (case, arm) timed to the end of its case with plan `host.samples`
    samples of `host.calls` calls, and the summary's host figures are its medians and counts."""
    if not (run_dir / HOST).is_file():
        result.add(
            "host cost", [f"{HOST} is missing: a plan with `host` measures the host cost of every timed arm"], ""
        )
        return
    settings = plan["host"]
    samples, calls = int(settings["samples"]), int(settings["calls"])
    raised = set(timed.raised) if timed else set()
    isolated = set(plan.get("isolated") or [])  # an isolated arm's host cost is not measured
    expected = {
        (case, arm, s)
        for (case, arm), state in outcome.items()
        if state == "passed" and (case, arm) not in raised and arm not in isolated
        for s in range(samples)
    }
    problems: list[str] = []
    per_call: dict[tuple[str, str], list[float]] = {}
    behind: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str, int]] = set()
    for number, row in enumerate(read_csv_rows(run_dir, HOST, ["case", "arm", "sample", "calls", "ns", "behind"]), 2):
        try:
            key = (row["case"], row["arm"], int(row["sample"]))
            row_calls, ns, flag = int(row["calls"]), int(row["ns"]), int(row["behind"])
        except ValueError as error:
            problems.append(f"{HOST} line {number}: unparsable ({error})")
            continue
        if key in seen:
            problems.append(f"{HOST} line {number}: duplicate sample {key}")
        elif key not in expected:
            problems.append(f"{HOST} line {number}: unexpected sample {key} (not a timed arm's planned sample)")
        if row_calls != calls or ns <= 0 or flag not in (0, 1):
            problems.append(f"{HOST} line {number}: calls {row_calls} (plan: {calls}), ns {ns}, behind {flag}")
        seen.add(key)
        per_call.setdefault(key[:2], []).append(ns / row_calls)
        behind[key[:2]] = behind.get(key[:2], 0) + flag
    missing = sorted(expected - seen)
    if missing:
        problems.append(f"{len(missing)} host sample(s) missing, e.g. {missing[:3]}")
    recorded_top = summary.get("host") or {}
    problems += diff(
        "summary host",
        recorded_top,
        {"samples": samples, "calls": calls, "rows": len(seen)},
        ("samples", "calls", "rows"),
    )
    for case in summary.get("cases", []):
        for arm, entry in (case.get("arms") or {}).items():
            values = per_call.get((str(case["case"]), arm), [])
            figures = {
                "host_ns_per_call": median_of(values) if values else None,
                "host_samples": len(values),
                "host_behind": behind.get((str(case["case"]), arm), 0),
            }
            problems += diff(f"case {case['case']} arm {arm}", entry, figures, HOST_FIELDS)
    result.add(
        "host cost",
        problems,
        f"{len(seen)} host samples ({samples} per timed arm and case, {calls} calls each); summary medians recomputed",
    )
