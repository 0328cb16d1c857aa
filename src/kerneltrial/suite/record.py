"""A suite: every protocol of one directory run one after another (`kerneltrial suite`).

A suite directory holds one kernel run directory per protocol, named after the protocol
file's stem, and suite.json: the suite's name (the protocol directory's), its tag (free text,
one word: the Track 2 harness's `--tag E0`), the description (the protocol directory's
README.md, if any), the protocol files with their sha256, each run's sub-directory and status,
start and end times, and the git state and source digest of the code that ran. The runner
(trial/suite.py) writes it before the first run and again after each.

`verify DIR` verifies every run (its checks prefixed with the run's name) and then the record
(`suite_problems`): every listed protocol ran to a finished run whose protocol.toml has the
listed sha256, by the code the suite recorded, and every sub-directory is a listed run. Like
a replicate table, a record rewritten together with its runs is not caught (docs/VERIFY.md,
"What verify can and cannot prove").

`report DIR` writes each run's report.md and a short report.md for the suite: one table per
run (median and speedup per case and arm) with a link to the run's own report.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field

from kerneltrial.publication import titled
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.documents import Document, Git, read_provenance, validate
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, write_json
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import PROTOCOL, REPORT, SUITE
from kerneltrial.rundir.summary_doc import ArmFigures, Summary, read_summary

SCHEMA = "kerneltrial.suite/1"
# pending: not started; running: started, not ended (a suite interrupted or killed leaves it);
# finished: `run` exited 0 or 1 (the gate is a result) with a summary.json; failed: any other end.
Status = Literal["pending", "running", "finished", "failed"]


class SuiteRun(Document):
    protocol: str  # the protocol file's name in the suite's protocol directory
    sha256: str  # of the protocol file when the suite started
    # the run directory in the suite directory: the protocol file's stem, one path component
    run: str = Field(pattern=r"^[^/\\.][^/\\]*$")
    status: Status = "pending"
    # of its last `kerneltrial run`; None before one ended, or when --resume found the run ended
    # (manifest.json written) but not recorded (the suite was stopped in between)
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None


class Suite(Document):
    schema_: Literal["kerneltrial.suite/1"] = Field(default=SCHEMA, alias="schema")
    name: str  # the protocol directory's name
    tag: str
    protocols_dir: str  # as given on the command line
    description: str | None  # the protocol directory's README.md
    git: Git  # the code that ran every run (rundir.provenance.git_state)
    started_at: str
    finished_at: str | None  # None until every run finished
    runs: list[SuiteRun]

    @property
    def complete(self) -> bool:
        return all(r.status == "finished" for r in self.runs)


def read_suite(root: Path) -> Suite:
    path = Path(root) / SUITE
    return validate(Suite, read_json(path), path, f"schema {SCHEMA}")


def write_suite(root: Path, suite: Suite) -> None:
    write_json(Path(root) / SUITE, suite.model_dump(mode="json", by_alias=True))


# ---------------------------------------------------------------- verify


def suite_problems(root: Path) -> list[str]:
    """suite.json against the directory: every listed protocol ran to a finished run of that
    protocol (same sha256) by the suite's code, the suite ended, no run directory is unlisted."""
    suite = read_suite(root)
    problems = []
    names = [r.run for r in suite.runs]
    if len(set(names)) != len(names):
        problems.append(f"suite.json lists a run directory twice: {names}")
    for entry in suite.runs:
        run_dir = root / entry.run
        if entry.run != Path(entry.protocol).stem:
            problems.append(f"run {entry.run!r} is not named after its protocol {entry.protocol!r}")
        if entry.status != "finished" or entry.finished_at is None:
            problems.append(f"{entry.protocol} did not finish (status {entry.status}, exit {entry.exit_code})")
        if not (run_dir / PROTOCOL).is_file():
            problems.append(f"{entry.protocol} has no run: {entry.run}/{PROTOCOL} is missing")
            continue
        if sha256_file(run_dir / PROTOCOL) != entry.sha256:
            problems.append(
                f"{entry.run}/{PROTOCOL} is not the protocol {entry.protocol} the suite ran (sha256 "
                f"{sha256_file(run_dir / PROTOCOL)[:12]}..., listed {entry.sha256[:12]}...)"
            )
        if entry.status == "finished":
            try:
                ran_with = read_provenance(run_dir).git.source_sha256
            except RunDirError as error:
                problems.append(str(error))
                continue
            if ran_with != suite.git.source_sha256:
                problems.append(
                    f"{entry.run} ran other code (source sha256 {str(ran_with)[:12]}...) than the suite "
                    f"({str(suite.git.source_sha256)[:12]}...)"
                )
    if suite.finished_at is None:
        problems.append(
            "the suite did not end (finished_at is null): continue it with `kerneltrial suite ... --resume`"
        )
    unlisted = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name not in names)
    if unlisted:
        problems.append(f"run directories not in suite.json: {', '.join(unlisted)}; a suite lists every run it holds")
    return problems


# ---------------------------------------------------------------- report


def _cell(entry: ArmFigures, is_control: bool) -> str:
    if entry.median_ns_per_call is None or entry.status != "timed":
        return entry.status
    us = f"{entry.median_ns_per_call / 1e3:,.2f}"
    if is_control or entry.speedup is None:
        return us
    return f"{us} ({entry.speedup:.2f}x {entry.verdict})"


def run_table(summary: Summary) -> list[str]:
    """One row per case: each available arm's median µs per call, and its speedup and verdict."""
    arms = [a.name for a in summary.arms if a.available]
    lines = ["| case | " + " | ".join(f"`{a}`" for a in arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for case in summary.cases:
        cells = [_cell(case.arms[a], a == summary.control) for a in arms]
        lines.append(f"| `{case.case}` | " + " | ".join(cells) + " |")
    return lines


def suite_markdown(root: Path, unverified: bool = False) -> str:
    """The suite's report.md (a function of the directory: verify renders it again and compares)."""
    from kerneltrial.analysis.performance import overview_table  # matplotlib: not on verify's path

    suite = read_suite(root)
    commit = suite.git.commit or "unknown"
    lines = [titled(f"# Suite `{suite.name}`, tag `{suite.tag}`", unverified), ""]
    if suite.description:
        lines += [suite.description.strip(), ""]
    lines += [
        f"- code: commit `{commit}`{' (dirty)' if suite.git.dirty else ''}, source sha256 `{suite.git.source_sha256}`",
        f"- started {suite.started_at}, finished {suite.finished_at or 'NOT FINISHED'}",
        "- cells: median µs per call (speedup over the control with its verdict); "
        "each run's report.md has the CIs, bandwidth and checks",
        "",
    ]
    finished = [root / r.run for r in suite.runs if r.status == "finished"]
    lines += overview_table(finished)  # our entry point against the fastest peer, one line per run
    for entry in suite.runs:
        if entry.status != "finished":
            lines += [f"## `{entry.run}`: {entry.status} (exit {entry.exit_code})", ""]
            continue
        summary = read_summary(root / entry.run)
        lines += [
            f"## {summary.op or entry.run}: [`{entry.run}`]({entry.run}/{REPORT})",
            "",
            f"Timing: {summary.label}; gate `{summary.gate.rule}` passed by "
            f"{', '.join(summary.gate.passed_arms) or 'no arm'}.",
            "",
            *run_table(summary),
        ]
        unavailable = [f"`{a.name}` ({a.reason})" for a in summary.arms if not a.available]
        if unavailable:
            lines += ["", "Unavailable here: " + "; ".join(unavailable)]
        lines.append("")
    return "\n".join(lines)


def write_suite_report(root: Path, unverified: bool = False) -> Path:
    """Each finished run's report.md (and figures), then the suite's report.md; returns its path.
    `unverified`: every title says the suite was not required to verify."""
    from kerneltrial.kernel.report import write_report

    root = Path(root)
    for entry in read_suite(root).runs:
        if entry.status == "finished":
            write_report(root / entry.run, unverified)
    path = root / REPORT
    path.write_text(suite_markdown(root, unverified))
    return path


def verify_suite(root: Path) -> VerifyResult:
    """A suite directory: every run present verified (checks prefixed with the run's name), then
    the suite record against the directory (`suite_problems`: every listed protocol ran)."""
    from kerneltrial.kernel.verify import check_written_after, member_checks

    result = VerifyResult(root)
    for entry in read_suite(root).runs:
        if (root / entry.run).is_dir():  # else suite_problems names it
            result.checks += member_checks(entry.run, root / entry.run)
    result.add("suite runs", suite_problems(root), "every listed protocol ran to a finished, unaltered run")
    check_written_after(result, root, root / REPORT, functools.partial(suite_markdown, root))
    return result
