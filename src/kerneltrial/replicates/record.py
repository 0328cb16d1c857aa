"""The cross-run table of replicates: N runs of one frozen protocol (`kerneltrial replicate`).

Read only from each run's summary.json (verified run by run). Per (case, candidate): each
run's verdict, speedup and CI; `wins` = the runs whose verdict is `win`; between-run spread
of the speedup (max - min, and the sample standard deviation over runs) next to the mean
within-run CI width (ci_high - ci_low), so one sees whether runs differ by more than each run
says it is uncertain. Per candidate: each run's preregistered gate, and the stricter Track 1
gate `every_case_every_run`: a win on every case in every run.

A replicate directory holds run-1..N, replicates.json (this table, with N: `requested_runs`)
and replicates.md. `verify DIR` verifies each run and recomputes the table (`table_problems`):
the table covers run-1..N, every run-* directory present is one of them, and the order seeds
are the protocol's + 1..N, so no run can be left out of the table unnoticed.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kerneltrial.publication import titled
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.layout import REPLICATES, REPLICATES_MD

SCHEMA = "kerneltrial.replicates/2"
# replicates/1 tables did not record N: verify takes it from the run directories present.
SCHEMA_1 = "kerneltrial.replicates/1"


@dataclass(frozen=True)
class CaseRow:
    case: str
    arm: str
    verdicts: list[str | None]  # per run; None: not timed against the control there
    speedups: list[float | None]
    ci_low: list[float | None]
    ci_high: list[float | None]
    wins: int
    between_run_range: float | None  # max - min of the speedups (None unless every run has one)
    between_run_sd: float | None
    within_run_ci_width: float | None  # mean over runs of ci_high - ci_low


@dataclass(frozen=True)
class ArmRow:
    arm: str
    gate_passed: list[bool]  # each run's preregistered gate
    every_case_every_run: bool


@dataclass(frozen=True)
class ReplicateTable:
    protocol_sha256: str
    requested_runs: int  # N, as `kerneltrial replicate --runs N` was asked
    runs: list[str]  # run-1..N, relative to the replicate directory
    order_seeds: list[int | None]
    cases: list[CaseRow]
    arms: list[ArmRow]

    def record(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}


def _summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise RunDirError(f"{run_dir}: missing summary.json; a replicate run did not finish")
    return json.loads(path.read_text())


def run_names(n: int) -> list[str]:
    """The run directories of `n` replicates: run-1..n."""
    return [f"run-{i}" for i in range(1, n + 1)]


def case_row(case: str, arm: str, figures: list[dict[str, Any]]) -> CaseRow:
    """One (case, arm) over runs: `figures` is the arm's entry of the case in each run's summary
    ({} where the run lacks it). Fleet runs (fleet/record.py) use the same row per worker."""
    speedups = [f.get("speedup") for f in figures]
    lows, highs = [f.get("ci_low") for f in figures], [f.get("ci_high") for f in figures]
    known = [v for v in speedups if v is not None]
    widths = [h - lo for lo, h in zip(lows, highs, strict=True) if lo is not None and h is not None]
    complete = len(known) == len(figures)
    return CaseRow(
        case=case,
        arm=arm,
        verdicts=[f.get("verdict") for f in figures],
        speedups=speedups,
        ci_low=lows,
        ci_high=highs,
        wins=sum(f.get("verdict") == "win" for f in figures),
        between_run_range=max(known) - min(known) if complete else None,
        between_run_sd=statistics.stdev(known) if complete and len(known) > 1 else None,
        within_run_ci_width=statistics.fmean(widths) if widths else None,
    )


def cross_run(root: Path, n: int) -> ReplicateTable:
    """The table over `root`/run-1..n (same protocol required)."""
    runs = run_names(n)
    summaries = [_summary(root / name) for name in runs]
    plans = [json.loads((root / name / "plan.json").read_text()) for name in runs]
    digests = {s["protocol_sha256"] for s in summaries}
    if len(digests) != 1:
        raise RunDirError(f"{root}: the runs ran different protocols ({sorted(digests)}); replicates share one")
    control = summaries[0]["control"]
    rows: list[CaseRow] = []
    arms = [a["name"] for a in summaries[0]["arms"] if a["name"] != control]
    for index, entry in enumerate(summaries[0]["cases"]):
        for arm in arms:
            rows.append(case_row(entry["case"], arm, [s["cases"][index]["arms"].get(arm, {}) for s in summaries]))
    arm_rows = [
        ArmRow(
            arm=arm,
            gate_passed=[arm in s["gate"].get("passed_arms", []) for s in summaries],
            every_case_every_run=all(r.wins == len(runs) for r in rows if r.arm == arm),
        )
        for arm in arms
    ]
    return ReplicateTable(digests.pop(), n, runs, [p.get("order_seed") for p in plans], rows, arm_rows)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def to_markdown(table: ReplicateTable, unverified: bool = False) -> str:
    """replicates.md (verify renders it again from the recomputed table and compares)."""
    n = len(table.runs)
    lines = [
        titled(f"# Replicates: {n} runs of protocol {table.protocol_sha256[:12]}...", unverified),
        "",
        f"Order seeds {table.order_seeds}. Between-run spread of the speedup (range, sd) next to the mean within-run CI width.",
        "",
        "| case | arm | verdicts | wins | speedups | between-run range | between-run sd | within-run CI width |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.cases:
        verdicts = " / ".join(v or "n/a" for v in r.verdicts)
        speedups = " / ".join(_fmt(s) for s in r.speedups)
        lines.append(
            f"| {r.case} | {r.arm} | {verdicts} | {r.wins} of {n} | {speedups} | {_fmt(r.between_run_range)} "
            f"| {_fmt(r.between_run_sd)} | {_fmt(r.within_run_ci_width)} |"
        )
    lines.append("")
    for a in table.arms:
        strict = "PASSED" if a.every_case_every_run else "FAILED"
        lines.append(
            f"- {a.arm}: preregistered gate passed in {sum(a.gate_passed)} of {n} runs; "
            f"win on every case in every run: {strict}"
        )
    return "\n".join(lines) + "\n"


def write_table(root: Path, table: ReplicateTable) -> None:
    (root / REPLICATES).write_text(json.dumps(table.record(), indent=2) + "\n")
    (root / REPLICATES_MD).write_text(to_markdown(table))


def recorded_runs(root: Path) -> int:
    """N of a replicate directory: replicates.json `requested_runs` (replicates/1: the run-* present)."""
    recorded = json.loads((root / REPLICATES).read_text())
    return int(recorded.get("requested_runs") or len([d for d in root.glob("run-*") if d.is_dir()]))


def write_replicates_report(root: Path, unverified: bool = False) -> Path:
    """Each run's report.md (and figures), then replicates.md from the table recomputed from the
    runs; returns replicates.md's path. `unverified`: every title says the runs were not required to verify."""
    from kerneltrial.kernel.report import write_report  # matplotlib: not on verify's path

    table = cross_run(root, recorded_runs(root))
    for name in table.runs:
        write_report(root / name, unverified)
    path = root / REPLICATES_MD
    path.write_text(to_markdown(table, unverified))
    return path


def table_problems(root: Path) -> list[str]:
    """replicates.json against the table recomputed from the runs' summaries, after checking
    that it covers every run-* directory present (run-1..N) and that the order seeds are the
    protocol's + 1..N: a table cannot drop a run it does not like."""
    recorded = json.loads((root / REPLICATES).read_text())
    schema = recorded.get("schema")
    if schema not in (SCHEMA, SCHEMA_1):
        return [f"replicates.json schema {schema!r} is not {SCHEMA!r}"]
    present = sorted(d.name for d in root.glob("run-*") if d.is_dir())
    n = recorded["requested_runs"] if schema == SCHEMA else len(present)
    expected = run_names(n)
    if present != sorted(expected) or recorded.get("runs") != expected:
        return [
            f"replicates.json covers runs {recorded.get('runs')} of {n} requested, the directory holds {present}: "
            f"a table covers every replicate run-1..run-{n}, none left out"
        ]
    table = cross_run(root, n)
    recomputed = table.record()
    if schema == SCHEMA_1:
        recomputed = {k: v for k, v in recomputed.items() if k != "requested_runs"} | {"schema": SCHEMA_1}
    problems = []
    if recomputed != recorded:
        changed = [k for k, v in recomputed.items() if recorded.get(k) != v]
        problems.append(f"replicates.json differs from the table recomputed from the runs in: {', '.join(changed)}")
    base = tomllib.loads((root / expected[0] / "protocol.toml").read_text()).get("order_seed", 0)
    seeds = [base + i for i in range(1, n + 1)]
    if table.order_seeds != seeds:
        problems.append(
            f"order seeds {table.order_seeds} are not {seeds} (the protocol's {base} + 1..{n}): "
            "replicate i runs with order seed protocol + i, so a gap or repeat means a run was swapped or left out"
        )
    return problems


def verify_replicates(root: Path) -> VerifyResult:
    """A replicate directory: every run verified (its checks prefixed with the run's name),
    then the cross-run table recomputed from their summaries (`table_problems`)."""
    from kerneltrial.kernel.verify import check_written_after, verify_run_dir

    result = VerifyResult(root)
    for name in read_json(root / REPLICATES)["runs"]:
        for check in verify_run_dir(root / name).checks:
            result.checks.append(check.renamed(f"{name}: {check.name}"))
    result.add("cross-run table", table_problems(root), "replicates.json is the table recomputed from the runs")
    page = root / REPLICATES_MD
    check_written_after(
        result, root, page, lambda unverified: to_markdown(cross_run(root, recorded_runs(root)), unverified)
    )
    return result
