"""A confirmation's links: the rule it confirms and the runs that rule was derived from.

A link is a path and the sha256 it had when the confirmation was written. It resolves when
the file (rule) or run directory (summary.json, manifest.json when recorded) exists and
hashes as recorded. Seeds are fresh when none draws the inputs of a seed a linked run's
plan.json lists (rundir/streams.py: the derived streams are compared, not the numbers); that
plan.json must hash as the run's (linked) summary.json records it.
`run` checks the protocol's links before any work (paths relative to the protocol's folder);
the run records them in provenance.json `confirmation` (paths relative to the run directory)
and `verify` checks them again from there. Imports neither trial/ nor ops/ (verify uses it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltrial.rundir import streams
from kerneltrial.rundir.documents import Link, RunLink
from kerneltrial.rundir.hashing import sha256_file


@dataclass(frozen=True)
class Links:
    rule: Link
    runs: tuple[RunLink, ...]

    @staticmethod
    def from_record(record: dict[str, Any]) -> Links:
        """From provenance.json `confirmation` (or the protocol's `rule` / `derived_from`)."""
        rule = record["rule"]
        runs = tuple(
            RunLink(path=r["path"], summary_sha256=r["summary_sha256"], manifest_sha256=r.get("manifest_sha256"))
            for r in record["derived_from"]
        )
        return Links(Link(path=rule["path"], sha256=rule["sha256"]), runs)

    def record(self) -> dict[str, Any]:
        return {
            "rule": {"path": self.rule.path, "sha256": self.rule.sha256},
            "derived_from": [
                {"path": r.path, "summary_sha256": r.summary_sha256}
                | ({"manifest_sha256": r.manifest_sha256} if r.manifest_sha256 else {})
                for r in self.runs
            ],
        }

    def rebased(self, old: Path, new: Path) -> Links:
        """The same links with paths relative to `new` instead of `old` (both folders)."""

        def move(path: str) -> str:
            return Path(os.path.relpath((old / path).resolve(), new.resolve())).as_posix()

        return Links(
            self.rule.model_copy(update={"path": move(self.rule.path)}),
            tuple(r.model_copy(update={"path": move(r.path)}) for r in self.runs),
        )


def _digest_problem(what: str, path: Path, recorded: str) -> str | None:
    if not path.is_file():
        return f"{what} {path} does not exist"
    actual = sha256_file(path)
    if actual != recorded:
        return f"{what} {path} hashes to {actual[:12]}..., the link records {recorded[:12]}... (changed since)"
    return None


def link_problems(links: Links, base: Path) -> list[str]:
    """Every link that does not resolve to what it recorded, one message each."""
    problems = [_digest_problem("rule", base / links.rule.path, links.rule.sha256)]
    for run in links.runs:
        root = base / run.path
        problems.append(_digest_problem("run summary", root / "summary.json", run.summary_sha256))
        if run.manifest_sha256:
            problems.append(_digest_problem("run manifest", root / "manifest.json", run.manifest_sha256))
    return [p for p in problems if p]


def _plan_of(root: Path, link_path: str) -> tuple[dict[str, Any] | None, str]:
    """`root`/plan.json, or None and why its seeds cannot be trusted. plan.json is not
    linked itself: it must hash as the run's summary.json (which the link hashes) records it in
    `inputs_sha256`, so an edited plan cannot hide a reused seed."""
    plan = root / "plan.json"
    if not plan.is_file():
        return None, f"the linked run {link_path} has no plan.json; its seeds cannot be checked"
    summary = root / "summary.json"
    recorded = json.loads(summary.read_text()).get("inputs_sha256", {}).get("plan.json") if summary.is_file() else None
    if recorded is None:
        return (
            None,
            f"the linked run {link_path}: summary.json records no plan.json sha256; its seeds cannot be checked",
        )
    actual = sha256_file(plan)
    if actual != recorded:
        return None, (
            f"the linked run {link_path}: plan.json hashes to {actual[:12]}..., its summary.json records "
            f"{recorded[:12]}... (edited since the run)"
        )
    return json.loads(plan.read_text()), ""


def seed_problems(links: Links, base: Path, seeds: list[int], bounds: streams.Bounds) -> list[str]:
    """A message per linked run whose plan.json's seeds draw the inputs one of `seeds` draws (a
    run within `bounds`; streams.shared_stream), is missing, or does not hash as its
    summary.json records (both `run` and `verify` refuse those)."""
    problems = []
    for run in links.runs:
        plan, problem = _plan_of(base / run.path, run.path)
        if plan is None:
            problems.append(problem)
            continue
        used = [int(s) for s in plan.get("seeds", [])]
        for seed, how in streams.shared_streams(seeds, used, bounds.wider(streams.plan_bounds(plan))):
            problems.append(
                f"seed {seed} draws inputs the linked run {run.path} drew ({how}); a confirmation takes fresh seeds"
            )
    return problems
