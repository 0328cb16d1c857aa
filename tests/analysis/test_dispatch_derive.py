"""`dispatch derive`: a rule from synthetic run directories: thresholds, citations, pooling, refusals."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest
from rundir_factory import RunSpec, write_checked_run

from kerneltrial.analysis.dispatch import DeriveError, derive_rule

CASES = [f"{rows}x64/contiguous/bfloat16" for rows in (1, 2, 3, 4)]
ARMS = [
    {"name": "control", "kind": "control", "available": True, "reason": None},
    {"name": "small", "kind": "candidate", "available": True, "reason": None},
    {"name": "big", "kind": "candidate", "available": True, "reason": None},
    {"name": "kerneltrial", "kind": "candidate", "available": True, "reason": None},
    {"name": "torch_eager", "kind": "peer", "available": True, "reason": None},
]


def times(big_at_two: float = 950.0):
    """Per-call ns: `small` fastest up to 2 rows, `big` from 3 rows on; the entry point and the
    peer are faster everywhere (not dispatchable: the rule must not name them)."""

    def per_call(case: str, arm: str, seed: int, rnd: int) -> float:
        rows = int(case.split("x")[0])
        base = {
            "control": 1000.0,
            "small": 700.0 if rows <= 2 else 950.0,
            "big": (900.0 if rows == 1 else big_at_two) if rows <= 2 else 600.0,
            "kerneltrial": 500.0,
            "torch_eager": 400.0,
        }[arm]
        return base + ((seed * 7 + rnd * 3) % 5 - 2) * 2.0

    return per_call


def run(path: Path, seeds: list[int], big_at_two: float = 950.0) -> Path:
    spec = RunSpec(cases=CASES, arms=ARMS, seeds=seeds, failures=set(), per_call=times(big_at_two), gate="no_loss")
    return write_checked_run(path, spec)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rule_has_row_thresholds_citing_cases_runs_and_speedups(tmp_path):
    explore = run(tmp_path / "runs" / "explore", [0, 1])
    out = tmp_path / "rules" / "op.rule.toml"
    out.parent.mkdir()
    derive_rule([explore], out)
    rule = tomllib.loads(out.read_text())

    assert rule["schema"] == "kerneltrial.dispatch-rule/1"
    assert rule["runs"] == [
        {"path": "../runs/explore", "summary_sha256": sha(explore / "summary.json"), "seeds": [0, 1]}
    ]
    branches = [(b["width"], b["layout"], b["min_rows"], b["arm"]) for b in rule["branches"]]
    assert branches == [(64, "*", 0, "small"), (64, "*", 3, "big")]
    assert [c["case"] for c in rule["branches"][0]["cases"]] == CASES[:2]
    assert [c["case"] for c in rule["branches"][1]["cases"]] == CASES[2:]
    cited = rule["branches"][1]["cases"][0]["runs"][0]
    assert cited["run"] == "../runs/explore" and cited["fastest"] == "big"
    assert cited["ci_low"] <= cited["speedup"] <= cited["ci_high"]
    assert cited["speedup"] == pytest.approx(1000 / 600, rel=0.02)
    assert rule["default"] in ("small", "big")
    names = {b["arm"] for b in rule["branches"]} | {rule["default"]}
    assert not names & {"kerneltrial", "torch_eager"}


def test_runs_that_disagree_are_pooled_and_the_rule_says_so(tmp_path):
    """Run A: `small` fastest at 2 rows by far; run B: `big` slightly faster there. Pooled
    (geometric mean), `small` stays; the case's note names both runs."""
    a = run(tmp_path / "a", [0, 1])
    b = run(tmp_path / "b", [2, 3], big_at_two=680.0)
    out = tmp_path / "rule.toml"
    derive_rule([a, b], out)
    rule = tomllib.loads(out.read_text())
    first = rule["branches"][0]
    assert (first["min_rows"], first["arm"]) == (0, "small")
    two = next(c for c in first["cases"] if c["case"] == CASES[1])
    assert "runs disagree on the fastest arm (small in a, big in b)" in two["note"]
    assert [r["run"] for r in two["runs"]] == ["a", "b"]
    assert [r["summary_sha256"] for r in rule["runs"]] == [sha(a / "summary.json"), sha(b / "summary.json")]


def test_layouts_that_disagree_get_their_own_branches(tmp_path):
    cases = ["2x64/contiguous/bfloat16", "2x64/strided/bfloat16"]

    def per_call(case: str, arm: str, seed: int, rnd: int) -> float:
        fast = "small" if "contiguous" in case else "big"
        return {"control": 1000.0, fast: 600.0}.get(arm, 900.0) + seed

    spec = RunSpec(cases=cases, arms=ARMS[:3], seeds=[0, 1], failures=set(), per_call=per_call, gate="no_loss")
    explore = write_checked_run(tmp_path / "explore", spec)
    out = tmp_path / "rule.toml"
    derive_rule([explore], out)
    branches = [(b["layout"], b["arm"]) for b in tomllib.loads(out.read_text())["branches"]]
    assert branches == [("contiguous", "small"), ("strided", "big")]


def test_superseded_runs_and_existing_rules_are_refused(tmp_path):
    explore = run(tmp_path / "explore", [0, 1])
    out = tmp_path / "rule.toml"
    out.write_text("")
    with pytest.raises(DeriveError, match="never overwritten"):
        derive_rule([explore], out)
    (explore / "ERRATA.md").write_text("Superseded by: `explore-2`\n")
    with pytest.raises(DeriveError, match="superseded by explore-2"):
        derive_rule([explore], tmp_path / "other.toml")
