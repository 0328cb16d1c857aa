"""PERFORMANCE.md's replication section (analysis/replication.py): runs of one frozen protocol
compared verdict by verdict, flips listed with their size."""

from __future__ import annotations

import json
from pathlib import Path

from kerneltrial.analysis import replication
from kerneltrial.rundir.summary_doc import Summary, read_summary

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "results" / "h200" / "sigmoid_gate_mul-panel-frozen"  # a frozen panel with peers


def with_verdict(summary: Summary, case: str, arm: str, verdict: str, speedup: float) -> Summary:
    cases = [
        c.model_copy(
            update={"arms": c.arms | {arm: c.arms[arm].model_copy(update={"verdict": verdict, "speedup": speedup})}}
        )
        if c.case == case
        else c
        for c in summary.cases
    ]
    return summary.model_copy(update={"cases": cases})


def test_a_changed_verdict_is_the_one_flip_with_its_size() -> None:
    summary = read_summary(RUN)
    case = summary.cases[0]
    arm = next(a for a, e in case.arms.items() if a != summary.control and e.status == "timed")
    before = case.arms[arm]
    other = "loss" if before.verdict != "loss" else "win"
    group = replication.compare_runs([("a", summary), ("b", with_verdict(summary, case.case, arm, other, 0.5))])
    pairs = sum(a != summary.control for c in summary.cases for a in c.arms)
    assert group.runs == ("a", "b") and group.compared == pairs
    (flip,) = group.flips
    assert (flip.case, flip.arm, flip.verdicts) == (case.case, arm, (before.verdict, other))
    assert flip.size == before.speedup / 0.5
    assert replication.compare_runs([("a", summary), ("b", summary)]).flips == ()


def test_only_runs_of_one_frozen_protocol_are_grouped(tmp_path: Path) -> None:
    data = json.loads((RUN / "summary.json").read_text())
    for name, update in (("r1", {}), ("r2", {}), ("other", {"protocol_sha256": "0" * 64}),
                         ("unfrozen", {"protocol_sha256": "1" * 64, "frozen_at": None})):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(data | update))
    groups, single = replication.replicate_groups(sorted(tmp_path.iterdir()))
    assert [g.runs for g in groups] == [("r1", "r2")] and single == ["other"]
    page = "\n".join(replication.replication_section(sorted(tmp_path.iterdir())))
    assert "| `r1`, `r2` | " in page and "| none |" in page and "Not replicated (one frozen run): `other`." in page
