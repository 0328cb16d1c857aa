"""Derive a shape dispatcher's rule from exploratory run directories (`kerneltrial dispatch derive`).

The method is SELECTION, POOLING and REDUCTION below; the rule file carries the same text.
Every branch cites its cases, the runs (path relative to the rule file, sha256 of
summary.json) and per run the chosen arm's speedup with its CI: the rule's predicted speedup
for that case. Pure functions over typed records; reading run directories is `read_run`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.hashing import sha256_file

RULE_SCHEMA = "kerneltrial.dispatch-rule/1"  # the dispatcher module checks the same string
ANY_LAYOUT = "*"
ENTRY_POINT = "kerneltrial"
DISPATCHABLE_KINDS = ("control", "candidate")
SELECTION = (
    "Per case, the dispatchable arms are the control and the candidates that are concrete geometries: every "
    "control or candidate arm of the plan except the exported entry point `kerneltrial` (what the rule is for); "
    "peers, user and calibration arms are not. An arm is eligible in a case when it was timed there (status "
    "`timed`: it passed the correctness gate, every timed check and the plausibility check)."
)
POOLING = (
    "An arm's speedup in a case is the run's speedup against the control (1 for the control); over several runs it "
    "is the geometric mean of its speedups in the runs that have the case, over the arms eligible in all of them. "
    "The arms within the tie band of the best pooled speedup (pooled >= best / (1 + tie_band)) are the case's "
    "acceptable arms. When the runs name different fastest arms for a case, the case's `note` says so; the pooled "
    "figure decides."
)
REDUCTION = (
    "Per width, cases are ordered by rows; consecutive row counts whose acceptable sets intersect share one branch "
    "(greedy from the fewest rows: the fewest branches), and the branch's arm is the one of that intersection with "
    "the best geometric-mean pooled speedup over its cases. A branch applies from its min_rows (the first from 0) "
    "up to the next branch's. Layouts share branches (layout '*') unless at some row count no arm is acceptable in "
    "every layout; then that width has branches per layout. Widths no case measured take `default`: the arm "
    "acceptable in the most cases (then the best geometric-mean pooled speedup)."
)
FEATURES = "rows = product of all but the last dimension; width = the last dimension; layout = the case's layout"


class DeriveError(ValueError):
    """Runs a rule cannot be derived from; the message names the run and the fix."""


@dataclass(frozen=True)
class ArmFigure:
    """One eligible arm in one case of one run."""

    arm: str
    speedup: float  # against the run's control; 1.0 for the control itself
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class CaseFigures:
    case: str
    rows: int
    width: int
    layout: str
    arms: dict[str, ArmFigure]  # the eligible dispatchable arms

    @property
    def fastest(self) -> str:
        return max(self.arms.values(), key=lambda a: (a.speedup, a.arm)).arm


@dataclass(frozen=True)
class RunFigures:
    path: str  # as the rule cites it
    summary_sha256: str
    op: str
    device: str
    seeds: tuple[int, ...]
    tie_band: float
    cases: tuple[CaseFigures, ...]
    excluded: tuple[str, ...]  # "case: reason" for cases with no eligible arm


@dataclass(frozen=True)
class Citation:
    """The chosen arm's figure in one run: the predicted speedup for the case."""

    run: str
    speedup: float
    ci_low: float | None
    ci_high: float | None
    fastest: str
    fastest_speedup: float


@dataclass(frozen=True)
class CaseEvidence:
    case: str
    rows: int
    layout: str
    pooled: dict[str, float]  # arm -> pooled speedup (arms eligible in every run with the case)
    acceptable: frozenset[str]
    fastest_by_run: dict[str, str]
    figures_by_run: dict[str, CaseFigures]

    @property
    def note(self) -> str:
        if len(set(self.fastest_by_run.values())) <= 1:
            return ""
        named = ", ".join(f"{arm} in {run}" for run, arm in self.fastest_by_run.items())
        return f"runs disagree on the fastest arm ({named}); chosen by the pooled (geometric mean) speedup"

    def cite(self, arm: str) -> list[Citation]:
        out = []
        for run, figures in self.figures_by_run.items():
            mine, best = figures.arms[arm], figures.arms[figures.fastest]
            out.append(Citation(run, mine.speedup, mine.ci_low, mine.ci_high, best.arm, best.speedup))
        return out


@dataclass(frozen=True)
class Branch:
    width: int
    layout: str
    min_rows: int
    arm: str
    cases: tuple[CaseEvidence, ...]


@dataclass(frozen=True)
class DerivedRule:
    op: str
    device: str
    tie_band: float
    default: str
    default_reason: str
    runs: tuple[RunFigures, ...]
    branches: tuple[Branch, ...]


# ---- reading ------------------------------------------------------------------------------


def superseded_by(run_dir: Path) -> str | None:
    """The successor an ERRATA.md names (`Superseded by: RUN`), or None."""
    errata = run_dir / "ERRATA.md"
    if not errata.is_file():
        return None
    found = re.search(r"^Superseded by:\s*`?([^`\s]+)`?", errata.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def _json(run_dir: Path, name: str) -> Any:
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir}: missing {name}; derive reads finished kernel run directories")
    return json.loads(path.read_text())


def read_run(run_dir: Path, cite_as: str) -> RunFigures:
    """The eligible dispatchable arms of every case of a finished exploratory run."""
    successor = superseded_by(run_dir)
    if successor:
        raise DeriveError(f"{run_dir} is superseded by {successor} (its ERRATA.md); derive from the successor")
    plan, summary = _json(run_dir, "plan.json"), _json(run_dir, "summary.json")
    provenance = _json(run_dir, "provenance.json")
    if (run_dir / "protocol.toml").is_file() and 'phase = "confirmation"' in (run_dir / "protocol.toml").read_text():
        raise DeriveError(f"{run_dir} is a confirmation run; a rule is derived from exploratory runs only")
    kinds = {a["name"]: a["kind"] for a in plan["arms"]}
    dispatchable = {name for name, kind in kinds.items() if kind in DISPATCHABLE_KINDS and name != ENTRY_POINT}
    control = summary["control"]
    cases, excluded = [], []
    for entry in summary["cases"]:
        control_figures = entry["arms"].get(control, {})
        if control_figures.get("status") != "timed":
            excluded.append(f"{entry['case']}: the control was not timed ({control_figures.get('status')})")
            continue
        arms = {
            name: ArmFigure(
                name,
                1.0 if name == control else float(figures["speedup"]),
                figures.get("ci_low"),
                figures.get("ci_high"),
            )
            for name, figures in entry["arms"].items()
            if name in dispatchable and figures.get("status") == "timed" and (name == control or figures.get("speedup"))
        }
        shape = [int(n) for n in entry["shape"]]
        cases.append(CaseFigures(entry["case"], math.prod(shape[:-1]), shape[-1], entry["layout"], arms))
    return RunFigures(
        path=cite_as,
        summary_sha256=sha256_file(run_dir / "summary.json"),
        op=summary["op"],
        device=(provenance.get("device") or {}).get("gpu") or "cpu",
        seeds=tuple(int(s) for s in plan["seeds"]),
        tie_band=float(summary["tie_band"]),
        cases=tuple(cases),
        excluded=tuple(excluded),
    )


# ---- deriving -----------------------------------------------------------------------------


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def pool(runs: tuple[RunFigures, ...], tie_band: float) -> list[CaseEvidence]:
    """Per case (in first-seen order), the pooled speedups and acceptable arms over the runs."""
    by_case: dict[str, dict[str, CaseFigures]] = {}
    for run in runs:
        for figures in run.cases:
            by_case.setdefault(figures.case, {})[run.path] = figures
    evidence = []
    for case, per_run in by_case.items():
        common = set.intersection(*(set(f.arms) for f in per_run.values()))
        if not common:
            continue
        pooled = {arm: _geomean([f.arms[arm].speedup for f in per_run.values()]) for arm in sorted(common)}
        best = max(pooled.values())
        first = next(iter(per_run.values()))
        evidence.append(
            CaseEvidence(
                case=case,
                rows=first.rows,
                layout=first.layout,
                pooled=pooled,
                acceptable=frozenset(a for a, s in pooled.items() if s >= best / (1 + tie_band)),
                fastest_by_run={run: f.fastest for run, f in per_run.items()},
                figures_by_run=per_run,
            )
        )
    return evidence


def _pick(arms: set[str] | frozenset[str], cases: list[CaseEvidence]) -> str:
    """The arm of `arms` with the best geometric-mean pooled speedup over `cases` (then by name)."""
    return max(sorted(arms), key=lambda a: _geomean([c.pooled[a] for c in cases]))


def segment(points: list[tuple[int, list[CaseEvidence]]]) -> list[tuple[int, str, list[CaseEvidence]]]:
    """Greedy row-count segments over `points` (rows ascending, cases at that row count):
    (min_rows, arm, cases) with consecutive points sharing a branch while an arm stays acceptable."""
    segments: list[tuple[int, set[str], list[CaseEvidence]]] = []
    for rows, cases in points:
        here = set.intersection(*(set(c.acceptable) for c in cases))
        if segments and segments[-1][1] & here:
            start, arms, members = segments[-1]
            segments[-1] = (start, arms & here, members + cases)
        else:
            segments.append((0 if not segments else rows, here, list(cases)))
    return [(start, _pick(arms, members), members) for start, arms, members in segments]


def derive(runs: tuple[RunFigures, ...]) -> DerivedRule:
    """The rule (see the module docstring) from runs of one operator on one device."""
    if not runs:
        raise DeriveError("name at least one exploratory run directory")
    ops, devices = {r.op for r in runs}, {r.device for r in runs}
    if len(ops) > 1 or len(devices) > 1:
        raise DeriveError(
            f"the runs cover operators {sorted(ops)} on devices {sorted(devices)}; a rule is for one operator on one device"
        )
    tie_band = max(r.tie_band for r in runs)
    evidence = pool(runs, tie_band)
    if not evidence:
        raise DeriveError("no case has an eligible dispatchable arm timed in every run that has it")
    branches: list[Branch] = []
    for width in sorted({c.width for r in runs for c in r.cases}):
        mine = [e for e in evidence if next(iter(e.figures_by_run.values())).width == width]
        rows = sorted({e.rows for e in mine})
        merged = [(n, [e for e in mine if e.rows == n]) for n in rows]
        shared = all(set.intersection(*(set(e.acceptable) for e in cases)) for _, cases in merged)
        groups = (
            {ANY_LAYOUT: merged}
            if shared
            else {
                layout: [(n, [e for e in mine if e.rows == n and e.layout == layout]) for n in rows]
                for layout in sorted({e.layout for e in mine})
            }
        )
        for layout, points in groups.items():
            for start, arm, cases in segment([(n, cases) for n, cases in points if cases]):
                branches.append(Branch(width, layout, start, arm, tuple(cases)))
    counts = {arm: sum(arm in e.acceptable for e in evidence) for arm in {a for e in evidence for a in e.pooled}}
    most = max(counts.values())
    tied = {a for a, n in counts.items() if n == most}
    default = _pick(tied, [e for e in evidence if tied <= set(e.pooled)] or evidence)
    return DerivedRule(
        op=runs[0].op,
        device=runs[0].device,
        tie_band=tie_band,
        default=default,
        default_reason=f"acceptable in {most} of {len(evidence)} cases; applies to widths no case measured (an extrapolation)",
        runs=runs,
        branches=tuple(branches),
    )


# ---- writing ------------------------------------------------------------------------------


def _no_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def to_toml(rule: DerivedRule) -> str:
    """The rule file: dispatch fields first (schema, default, branches' width/layout/min_rows/arm),
    then the evidence each branch cites."""
    data: dict[str, Any] = {
        "schema": RULE_SCHEMA,
        "op": rule.op,
        "device": rule.device,
        "derived_by": "kerneltrial dispatch derive",
        "features": FEATURES,
        "selection": SELECTION,
        "pooling": POOLING,
        "reduction": REDUCTION,
        "tie_band": rule.tie_band,
        "default": rule.default,
        "default_reason": rule.default_reason,
        "runs": [
            {"path": r.path, "summary_sha256": r.summary_sha256, "seeds": list(r.seeds)}
            | ({"excluded": list(r.excluded)} if r.excluded else {})
            for r in rule.runs
        ],
        "branches": [
            {
                "width": b.width,
                "layout": b.layout,
                "min_rows": b.min_rows,
                "arm": b.arm,
                "cases": [
                    {"case": c.case, "rows": c.rows, "pooled_speedup": round(c.pooled[b.arm], 4)}
                    | ({"note": c.note} if c.note else {})
                    | {
                        "runs": [
                            _no_none(
                                {
                                    "run": cite.run,
                                    "speedup": round(cite.speedup, 4),
                                    "ci_low": None if cite.ci_low is None else round(cite.ci_low, 4),
                                    "ci_high": None if cite.ci_high is None else round(cite.ci_high, 4),
                                    "fastest": cite.fastest,
                                    "fastest_speedup": round(cite.fastest_speedup, 4),
                                }
                            )
                            for cite in c.cite(b.arm)
                        ]
                    }
                    for c in b.cases
                ],
            }
            for b in rule.branches
        ],
    }
    return tomli_w.dumps(data)


def derive_rule(run_dirs: list[Path], out: Path) -> DerivedRule:
    """Read `run_dirs`, derive the rule and write it to `out` (never over an existing file);
    runs are cited by their path relative to `out`'s folder."""
    if out.exists():
        raise DeriveError(f"{out} exists; a rule is never overwritten: choose another --out or remove it")
    runs = tuple(read_run(d, Path(os.path.relpath(d.resolve(), out.resolve().parent)).as_posix()) for d in run_dirs)
    rule = derive(runs)
    out.write_text(to_toml(rule))
    return rule
