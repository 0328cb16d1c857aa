"""No downgrade: the contract a run was written under fixes what it must hold.

A kernel run declares its run-directory contract at plan time: plan.json `checks` (the
timed-check contract, 1, 2 or 3; absent before issue 10) and `host` (the host-cost stage). The
declaration fixes which files, plan keys, provenance keys and timings.csv columns the run must
have (`requirements`; 3, isolated arms: plan.json `isolated`, provenance.json `isolation`,
timings.csv `wall_ns`); a missing one is a failure with its name (`required_problems`), not a
check listed as not applicable.

The declaration is itself a file a forger can edit: deleting `checks` (with timed_checks.jsonl,
manifest.json and source.tar.gz) would make the run read as one from before timed checks, whose
rules are laxer. So verify also derives the least contract the run was written under from
witnesses a forger must find and remove one by one (`writer_floor`), and fails a declaration
below it (`downgrade_problems`):
- the code that ran: the runner in source.tar.gz, and the runner at the recorded commit in this
  checkout's git history (kernel/git_history.py; used where the run says its tree was that
  commit's), each read for the contract it writes (`writer_contract`);
- traces in the raw files that only a writer of that contract leaves: the files themselves,
  the timed-check keys of plan.json, `ulp_hist` in correctness rows, `launch` rows in
  ceilings.csv, `checked_call` in timed checks, the issue-16 ceiling kinds (written only by
  runners with the host stage), and the isolation traces of contract 3 (plan.json `isolated`,
  provenance.json `isolation`, the `wall_ns` column of timings.csv).
A runner that records the sandbox (plan.json `sandbox`, issue 35) is known from its code alone:
deleting the key, and with it the run's "partial sandbox" warnings, fails `no downgrade`.
So is one that records the floor's rule (plan.json `floor_rule`): deleting it fails the same way.
What it cannot catch: a forger who removes every witness and names a commit from before timed
checks (or one this checkout does not know) has written an older run from scratch; docs/VERIFY.md
("What verify can and cannot prove") says what answers that.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltrial.kernel import integrity
from kerneltrial.kernel.git_history import package_at
from kerneltrial.rundir.files import read_jsonl
from kerneltrial.rundir.layout import (
    COPY_MATCHED,
    HOST,
    MANIFEST,
    ROUNDTRIP,
    SOURCE_ARCHIVE,
    TIMED_CHECKS,
    TIMINGS,
    TRITON_LAUNCH,
)

CHECKS_CONSTANT = re.compile(rb"^CHECKS_VERSION = (\d+)", re.MULTILINE)  # trial/runner.py since 7e5e53b
HOST_KEY = re.compile(rb'"host":\s*\{\s*"samples"')  # plan.json's host stage, written since b961c2c
SANDBOX_KEY = re.compile(rb'"sandbox":\s*sandbox_record\(')  # plan.json `sandbox`, written since 6fd655a
ROUNDTRIP_KEY = re.compile(rb'"roundtrip":\s*roundtrip_reference\(')  # plan.json `roundtrip` (issue 35 item 2)
FLOOR_RULE_KEY = re.compile(rb'"floor_rule":\s*FLOOR_RULE\.model_dump\(')  # plan.json `floor_rule`
RUNNER_PACKAGE = "trial/"  # where the runner that writes plan.json lives in the package
CHECKS_ISOLATED = 3  # the contract of isolated arms (issue 24): plan `isolated`, timings.csv `wall_ns`


@dataclass(frozen=True)
class WriterContract:
    """What a runner writes: the timed-check contract (0: none), whether it runs the host stage,
    whether its plan records the sandbox of isolated arms, whether it writes the round trip
    (plan.json `roundtrip`, roundtrip.csv) and the floor's rule (plan.json `floor_rule`)."""

    checks: int
    host: bool
    sandbox: bool = False
    roundtrip: bool = False
    floor_rule: bool = False

    def __str__(self) -> str:
        return f"checks {self.checks}" + (" with a host stage" if self.host else "")

    def named(self, sandbox: bool, roundtrip: bool = False, floor_rule: bool = False) -> str:
        """As str(), saying whether it records the sandbox where `sandbox`, the round trip where
        `roundtrip` and the floor's rule where `floor_rule` (the differences at issue)."""
        return (
            str(self)
            + ((" with" if self.sandbox else " without") + " a sandbox record" if sandbox else "")
            + ((" with" if self.roundtrip else " without") + " a round trip" if roundtrip else "")
            + ((" with" if self.floor_rule else " without") + " a floor rule" if floor_rule else "")
        )

    def covers(self, other: WriterContract) -> bool:
        return (
            self.checks >= other.checks
            and (self.host or not other.host)
            and (self.sandbox or not other.sandbox)
            and (self.roundtrip or not other.roundtrip)
            and (self.floor_rule or not other.floor_rule)
        )


@dataclass(frozen=True)
class Witness:
    """A trace in the run directory that only a writer of `least` (or a later contract) leaves."""

    least: WriterContract
    what: str


@dataclass(frozen=True)
class Requirement:
    """What a declared contract makes a run hold: files, plan.json keys, provenance.json keys
    (dotted), timings.csv columns."""

    files: tuple[str, ...]
    plan_keys: tuple[str, ...]
    provenance_keys: tuple[str, ...]
    timing_columns: tuple[str, ...] = ()


TIMED_CHECKS_REQUIREMENT = Requirement(
    (TIMED_CHECKS, MANIFEST, SOURCE_ARCHIVE),
    ("checks", "exact", "plausibility", "frozen_at", "order_seed"),
    ("freeze", "git.source_sha256", "finished_at"),
)
HOST_REQUIREMENT = Requirement((HOST,), ("host",), ())
SANDBOX_REQUIREMENT = Requirement((), ("sandbox",), ())
ROUNDTRIP_REQUIREMENT = Requirement((ROUNDTRIP,), ("roundtrip",), ())
FLOOR_RULE_REQUIREMENT = Requirement((), ("floor_rule",), ())
ISOLATION_REQUIREMENT = Requirement((), ("isolated",), ("isolation",), ("wall_ns",))


def declared(plan: dict[str, Any]) -> WriterContract:
    """The contract plan.json declares (verify's schema check refuses a `checks` it does not know)."""
    checks = plan.get("checks")
    checks = checks if isinstance(checks, int) and not isinstance(checks, bool) else 0
    return WriterContract(checks, "host" in plan, "sandbox" in plan, "roundtrip" in plan, "floor_rule" in plan)


def requirements(contract: WriterContract) -> list[Requirement]:
    return [
        r
        for r, needed in (
            (TIMED_CHECKS_REQUIREMENT, contract.checks >= 1),
            (HOST_REQUIREMENT, contract.host),
            (SANDBOX_REQUIREMENT, contract.sandbox),
            (ROUNDTRIP_REQUIREMENT, contract.roundtrip),
            (FLOOR_RULE_REQUIREMENT, contract.floor_rule),
            (ISOLATION_REQUIREMENT, contract.checks >= CHECKS_ISOLATED),
        )
        if needed
    ]


def _dotted(document: dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(document, dict) or part not in document:
            return False
        document = document[part]
    return True


def timing_columns(run_dir: Path) -> list[str]:
    """The header of timings.csv ([] without the file: the raw-file checks name it)."""
    path = run_dir / TIMINGS
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return next(csv.reader(handle), [])


def required_problems(
    run_dir: Path, plan: dict[str, Any], provenance: dict[str, Any], contract: WriterContract
) -> list[str]:
    """Every file and key `contract` requires, present: one named line per missing one."""
    problems = []
    columns = timing_columns(run_dir)
    for requirement in requirements(contract):
        problems += [f"{name} is missing" for name in requirement.files if not (run_dir / name).is_file()]
        problems += [f"plan.json has no `{key}`" for key in requirement.plan_keys if key not in plan]
        problems += [
            f"provenance.json has no `{key}`" for key in requirement.provenance_keys if not _dotted(provenance, key)
        ]
        problems += [f"{TIMINGS} has no `{c}` column" for c in requirement.timing_columns if c not in columns]
    return [f"{p} (a run of {contract} writes it)" for p in problems]


def writer_contract(files: Mapping[str, bytes]) -> WriterContract:
    """The contract a package source writes ({path relative to the package: bytes}): its runner's
    CHECKS_VERSION (none before timed checks) and whether its plan has the host stage."""
    runner = [data for path, data in files.items() if path.startswith(RUNNER_PACKAGE)]
    checks = next((int(m.group(1)) for data in runner if (m := CHECKS_CONSTANT.search(data))), 0)
    host, sandbox, roundtrip, floor_rule = (
        any(key.search(data) for data in runner) for key in (HOST_KEY, SANDBOX_KEY, ROUNDTRIP_KEY, FLOOR_RULE_KEY)
    )
    return WriterContract(checks, host, sandbox, roundtrip, floor_rule)


def _code_witnesses(run_dir: Path, provenance: dict[str, Any]) -> list[Witness]:
    """The runner that ran: in source.tar.gz, and at the recorded commit when the run says it ran that tree."""
    found = []
    try:
        if (run_dir / SOURCE_ARCHIVE).is_file():
            found.append(Witness(writer_contract(integrity.archive_members(run_dir / SOURCE_ARCHIVE)), SOURCE_ARCHIVE))
    except integrity.ArchiveError:
        pass  # the source archive check names it
    git = provenance.get("git") if isinstance(provenance.get("git"), dict) else {}
    commit, claimed = git.get("commit"), git.get("source_sha256")
    if isinstance(commit, str) and commit and git.get("dirty") is not True:
        tree = package_at(commit)
        if tree.files is not None and claimed in (None, integrity.package_digest(tree.files)):
            found.append(Witness(writer_contract(tree.files), f"the runner at commit {commit} (git history)"))
    return found


def _row_witnesses(
    run_dir: Path,
    plan: dict[str, Any],
    provenance: dict[str, Any],
    correctness: list[dict[str, Any]],
    ceiling_kinds: set[str],
) -> list[Witness]:
    """Traces in the raw files that only a writer of a contract leaves."""
    timed = WriterContract(1, False)
    found = [
        Witness(timed, f"{name} is present")
        for name in (TIMED_CHECKS, MANIFEST, SOURCE_ARCHIVE)
        if (run_dir / name).is_file()
    ]
    if (run_dir / HOST).is_file():
        found.append(Witness(WriterContract(0, True), f"{HOST} is present"))
    if (run_dir / ROUNDTRIP).is_file():
        found.append(Witness(WriterContract(CHECKS_ISOLATED, False, roundtrip=True), f"{ROUNDTRIP} is present"))
    keys = [key for key in ("exact", "plausibility", "frozen_at") if key in plan]
    if keys:
        found.append(Witness(timed, f"plan.json has {keys}"))
    if any("ulp_hist" in row for row in correctness):
        found.append(Witness(timed, "correctness rows have ulp_hist"))
    if "launch" in ceiling_kinds:
        found.append(Witness(timed, "ceilings.csv has launch rows"))
    # the Triton launch floor (d763e9b) and size-matched copies (887c470) came after the host stage
    newer = sorted(ceiling_kinds & {TRITON_LAUNCH, COPY_MATCHED})
    if newer:
        found.append(Witness(WriterContract(2, True), f"ceilings.csv has {newer} rows"))
    if (run_dir / TIMED_CHECKS).is_file() and any("checked_call" in row for row in read_jsonl(run_dir / TIMED_CHECKS)):
        found.append(Witness(WriterContract(2, False), "timed checks record checked_call"))
    return found + _isolation_witnesses(run_dir, plan, provenance)


def _isolation_witnesses(run_dir: Path, plan: dict[str, Any], provenance: dict[str, Any]) -> list[Witness]:
    """The traces only a writer of contract 3 (isolated arms) leaves."""
    isolated = WriterContract(CHECKS_ISOLATED, False)
    found = [
        Witness(isolated, f"{name} has `{key}`")
        for name, doc, key in (
            ("plan.json", plan, "isolated"),
            ("provenance.json", provenance, "isolation"),
        )
        if key in doc
    ]
    if "wall_ns" in timing_columns(run_dir):
        found.append(Witness(isolated, f"{TIMINGS} has a wall_ns column"))
    return found


def writer_floor(
    run_dir: Path,
    plan: dict[str, Any],
    provenance: dict[str, Any],
    correctness: list[dict[str, Any]],
    ceiling_kinds: set[str],
) -> tuple[WriterContract, list[Witness]]:
    """The least contract every witness allows, and the witnesses."""
    witnesses = _code_witnesses(run_dir, provenance) + _row_witnesses(
        run_dir, plan, provenance, correctness, ceiling_kinds
    )
    floor = WriterContract(
        max((w.least.checks for w in witnesses), default=0),
        any(w.least.host for w in witnesses),
        any(w.least.sandbox for w in witnesses),
        any(w.least.roundtrip for w in witnesses),
        any(w.least.floor_rule for w in witnesses),
    )
    return floor, witnesses


def downgrade_problems(contract: WriterContract, witnesses: list[Witness]) -> list[str]:
    """A declaration below what a witness shows the run was written under, one line per witness."""
    problems = []
    for w in witnesses:
        if contract.covers(w.least):
            continue
        differs = (
            w.least.sandbox and not contract.sandbox,
            w.least.roundtrip and not contract.roundtrip,
            w.least.floor_rule and not contract.floor_rule,
        )
        problems.append(
            f"plan.json declares {contract.named(*differs)}, but {w.what} shows a run "
            f"written under {w.least.named(*differs)}: "
            "a run directory is verified under the contract that wrote it (restore the deleted files and keys)"
        )
    return problems
