"""The size-matched copy (issue 16, item 2): ceilings.csv `copy_matched` rows, a copy of each
case's traffic, optional. A run with them has every case's matched_copy_gbps in summary.json,
recomputed by verify; tampered rows, a missing size and a claim without rows are caught."""

from __future__ import annotations

import json
from pathlib import Path

from rundir_factory import RunSpec, rewrite_ceilings, seal, write_checked_run

from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.summary_doc import read_summary

COPIES = [2000.0, 2100.0, 1900.0, 2050.0, 1950.0]  # median 2000 ns for 4 MB: 2000 GB/s


def _check(path: Path) -> tuple[bool, bool, str]:
    (check,) = [c for c in verify_run_dir(path).checks if c.name == "size-matched copies"]
    return check.ok, check.applicable, check.detail


def test_without_matched_copies_the_check_is_not_applicable(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    assert _check(path)[:2] == (True, False)
    assert all(case.matched_copy_gbps is None for case in read_summary(path).cases)


def test_matched_copies_are_summarised_per_case_and_verified(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run", RunSpec(matched_copy_ns=COPIES))
    assert [case.matched_copy_gbps for case in read_summary(path).cases] == [2000.0, 2000.0]
    ok, applicable, detail = _check(path)
    assert ok and applicable and "1 sizes, 5 samples" in detail
    # every other check passes; `no downgrade` sees copy_matched rows in a run that declares checks 1,
    # which only runners with checks 2 and the host stage write (the factory has no host stage), and
    # the host cost that such a run measures is then missing
    assert [c.name for c in verify_run_dir(path).failures] == ["no downgrade", "host cost"]


def test_a_tampered_matched_copy_row_is_caught(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run", RunSpec(matched_copy_ns=COPIES))
    rewrite_ceilings(path, "copy_matched,0,4000000,2000.0", "copy_matched,0,4000000,1000.0", rebuild=False)
    ok, _, detail = _check(path)
    assert not ok and "matched_copy_gbps: summary 2000.0 != recomputed" in detail


def test_copies_of_the_wrong_size_are_caught_even_with_a_rebuilt_summary(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run", RunSpec(matched_copy_ns=COPIES))
    text = (path / "ceilings.csv").read_text()
    rewrite_ceilings(
        path, text[text.index("copy_matched") :], text[text.index("copy_matched") :].replace(",4000000,", ",400,"), True
    )
    ok, _, detail = _check(path)
    assert not ok and "copy_matched sizes [400] are not the cases' traffic [4000000]" in detail


def test_a_claim_without_rows_is_caught(tmp_path: Path) -> None:
    path = write_checked_run(tmp_path / "run")
    summary = json.loads((path / "summary.json").read_text())
    summary["cases"][0]["matched_copy_gbps"] = 3000.0
    (path / "summary.json").write_text(json.dumps(summary))
    seal(path)
    ok, _, detail = _check(path)
    assert not ok and "have matched_copy_gbps but ceilings.csv has no copy_matched rows" in detail


def test_malformed_matched_copy_rows_are_caught_without_a_crash(tmp_path: Path) -> None:
    for bad in ("0.0", "inf", "-5.0"):
        path = write_checked_run(tmp_path / f"run-{bad}", RunSpec(matched_copy_ns=COPIES))
        rewrite_ceilings(path, "copy_matched,1,4000000,2100.0", f"copy_matched,1,4000000,{bad}", rebuild=False)
        ok, _, detail = _check(path)
        assert not ok and "copy_matched sample 1 of 4000000 bytes: ns" in detail and "must be finite and > 0" in detail


def test_odd_sizes_and_cherry_picked_samples_are_caught(tmp_path: Path) -> None:
    odd = write_checked_run(tmp_path / "odd", RunSpec(matched_copy_ns=COPIES))
    text = (odd / "ceilings.csv").read_text()
    block = text[text.index("copy_matched") :]
    rewrite_ceilings(odd, block, block.replace(",4000000,", ",4000001,"), rebuild=True)
    assert "copy_matched sample(s) of 4000001 bytes: must be even and > 0" in _check(odd)[2]

    picked = write_checked_run(tmp_path / "picked", RunSpec(matched_copy_ns=COPIES))
    # the fastest sample dropped (it would raise the median), the summary rebuilt: caught by the sample numbers
    rewrite_ceilings(picked, "copy_matched,2,4000000,1900.0\n", "", rebuild=True)
    ok, _, detail = _check(picked)
    assert not ok and "copy_matched samples of 4000000 bytes are ['0', '1', '3', '4'], not 0..4" in detail
