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
