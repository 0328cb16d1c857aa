"""Every committed run directory under results/ verifies from its raw rows (as `kerneltrial verify` does)."""

from __future__ import annotations

import pytest

from kerneltrial.analysis.verify import verify_run_dir
from tests.conftest import REPO

RUNS = sorted(p.parent for p in (REPO / "results").rglob("provenance.json"))


def test_there_is_committed_evidence():
    assert RUNS, "results/ holds no run directory"


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(REPO)) for r in RUNS])
def test_committed_run_verifies(run):
    result = verify_run_dir(run)
    assert result.ok, [c for c in result.checks if not c.ok]


def test_performance_md_is_what_the_committed_runs_generate(tmp_path):
    """PERFORMANCE.md is never edited by hand: regenerate it with
    `kerneltrial performance $(dirname results/h200/*/summary.json) --out PERFORMANCE.md`."""
    from kerneltrial.analysis.report import write_performance_md

    runs = sorted(p for p in (REPO / "results" / "h200").iterdir() if (p / "summary.json").is_file())
    generated = write_performance_md(runs, tmp_path / "PERFORMANCE.md").read_text()
    assert generated == (REPO / "PERFORMANCE.md").read_text()
