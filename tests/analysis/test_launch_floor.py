"""The Triton launch floor (issue 16, item 3): ceilings.csv `triton_launch` rows, optional.

Runs from before it (every committed run) verify without it; a run with it has its floor in
summary.json, recomputed by verify from ceilings.csv; a tampered row is caught.
"""

from __future__ import annotations

import json
from pathlib import Path

from rundir_factory import RunSpec, rewrite_ceilings, seal, write_checked_run

from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.summary_doc import read_summary

FLOOR = [5000.0, 5200.0, 4800.0, 5100.0, 4900.0]  # median 5000 ns


def _checks(path: Path) -> dict[str, tuple[bool, bool, str]]:
    return {c.name: (c.ok, c.applicable, c.detail) for c in verify_run_dir(path).checks}


def test_a_run_without_the_triton_floor_verifies_and_reads_as_not_measured(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    assert "triton_launch_floor_ns" not in json.loads((path / "summary.json").read_text())["ceilings"]
    checks = _checks(path)
    assert all(ok for ok, _, _ in checks.values())
    assert checks["triton launch floor"][:2] == (True, False)  # not applicable
    ceilings = read_summary(path).ceilings
    assert ceilings.triton_launch_floor_ns is None and ceilings.triton_launch_samples == 0


def test_the_triton_floor_is_summarised_and_verified(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run", RunSpec(triton_launch_ns=FLOOR))
    ceilings = read_summary(path).ceilings
    assert ceilings.triton_launch_floor_ns == 5000.0 and ceilings.triton_launch_samples == 5
    assert ceilings.launch_floor_ns == 400.0  # torch's floor, which plausibility judges against, is unchanged
    ok, applicable, detail = _checks(path)["triton launch floor"]
    assert ok and applicable and "5000.0 ns, the median of 5" in detail


def test_a_tampered_triton_launch_row_is_caught(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run", RunSpec(triton_launch_ns=FLOOR))
    rewrite_ceilings(path, "triton_launch,0,0,5000.0", "triton_launch,0,0,9000.0")
    ok, _, detail = _checks(path)["triton launch floor"]
    assert not ok and "ceilings triton_launch_floor_ns: summary 5000.0 != recomputed 5100.0" in detail


def test_a_malformed_triton_launch_row_is_caught_even_when_the_summary_is_rebuilt(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run", RunSpec(triton_launch_ns=FLOOR))
    rewrite_ceilings(path, "triton_launch,1,0,5200.0", "triton_launch,1,64,-5200.0", rebuild=True)
    ok, _, detail = _checks(path)["triton launch floor"]
    assert not ok and "triton_launch sample 1 of 64 bytes: ns -5200 (must be finite and > 0)" in detail
    assert "triton_launch sample(s) of 64 bytes: must be 0" in detail


def test_a_summary_claiming_a_floor_the_raw_rows_lack_is_caught(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    summary = json.loads((path / "summary.json").read_text())
    summary["ceilings"]["triton_launch_floor_ns"] = 3000.0
    (path / "summary.json").write_text(json.dumps(summary))
    seal(path)
    ok, _, detail = _checks(path)["triton launch floor"]
    assert not ok and "ceilings.csv has no triton_launch rows" in detail


def test_an_old_contract_run_with_the_triton_floor_verifies(tmp_path: Path) -> None:
    """The floor does not depend on the timed-check contract: a run without `checks` carries it too."""
    from rundir_factory import write_run_dir

    path = write_run_dir(tmp_path / "run", RunSpec(triton_launch_ns=FLOOR))
    write_summary(path)
    checks = _checks(path)
    assert checks["triton launch floor"][:2] == (True, True)
    assert read_summary(path).ceilings.triton_launch_floor_ns == 5000.0


def test_the_report_states_the_triton_floor(tmp_path: Path) -> None:
    from kerneltrial.kernel.report import write_report

    path = write_checked_run(tmp_path / "run", RunSpec(triton_launch_ns=FLOOR))
    assert "Triton launch floor 5,000 ns (median of 5 one-element Triton launches)" in write_report(path).read_text()
