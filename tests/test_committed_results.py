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


REPLICATES = sorted(p.parent for p in (REPO / "results").rglob("replicates.json"))
SUBMISSIONS = sorted((REPO / "submissions").glob("*.zip"))


@pytest.mark.parametrize("reps", REPLICATES, ids=[str(r.relative_to(REPO)) for r in REPLICATES])
def test_committed_replicates_verify(reps):
    """Each replicate run verifies and the cross-run table is what those runs give."""
    result = verify_run_dir(reps)
    assert result.ok, [c for c in result.checks if not c.ok]


def test_there_is_a_committed_submission():
    assert SUBMISSIONS, "submissions/ holds no archive"


@pytest.mark.parametrize("archive", SUBMISSIONS, ids=[a.name for a in SUBMISSIONS])
def test_committed_submission_is_the_confirmed_code(archive):
    """The archive passes `inspect` against its receipt; its module is, byte for byte, the
    module every run in the receipt recorded (provenance impl_modules) and the one the
    repository ships, and those runs' manifests are the ones the receipt names."""
    import hashlib
    import json
    import zipfile

    from kerneltrial.ops.registry import all_ops
    from kerneltrial.submission.archive import inspect_archive
    from kerneltrial.submission.receipt import Receipt, receipt_path

    receipt = Receipt.read(receipt_path(archive))
    signatures = {o.name: o.signature for o in all_ops()}
    assert inspect_archive(archive.read_bytes(), archive.name, signatures, receipt.op, receipt).op == receipt.op
    with zipfile.ZipFile(archive) as z:
        archived = {name: z.read(name) for name in z.namelist()}
    for name, data in archived.items():
        assert data == (REPO / "src" / "kerneltrial" / "ops" / name).read_bytes(), (
            f"{name} differs from the shipped file"
        )
    module_sha = hashlib.sha256(archived[receipt.module]).hexdigest()
    assert receipt.tested_in, "the receipt names no run that tested the module"
    for run in receipt.tested_in:
        run_dir = (archive.parent / run.run_dir).resolve()
        recorded = json.loads((run_dir / "provenance.json").read_text())["impl_modules"]
        assert module_sha in recorded.values(), f"{run.run_dir} did not test these bytes"
        assert run.manifest_sha256 == hashlib.sha256((run_dir / "manifest.json").read_bytes()).hexdigest()
        assert verify_run_dir(run_dir).ok
