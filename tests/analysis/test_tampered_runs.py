"""Planted tampered run directories (issue 24, items 4 and 5), each built from a real CPU run
(conftest `cpu_run`, or a committed H200 run where the hole needs a GPU's figures) and each
caught by `kerneltrial verify` with its named message: a downgrade to a contract without timed
checks, a file or key the declared contract requires, provenance edits (GPU name, commit) with
the manifest rehashed, an edited or stale report.md, malformed ERRATA.md lines."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rundir_factory import seal

from kerneltrial.kernel.git_history import package_at
from kerneltrial.kernel.report import write_report
from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.verify import CHECKED_RUN_CHECKS, verify_run_dir
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # the session's CPU run takes about 20 s once
CPU_CASE = "4x64/contiguous/bfloat16"
TIMED_CHECK_FILES = ("timed_checks.jsonl", "manifest.json", "source.tar.gz", "host.csv")
H200_RUN = REPO / "results" / "h200" / "rmsnorm_fp32-wide-rows-t2"  # checks 2, no host stage: 280 KB


def failed(run: Path) -> dict[str, str]:
    return {check.name: check.detail for check in verify_run_dir(run).failures}


def edit_json(path: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document, indent=2))


def rewrite_rows(path: Path, keep: Callable[[dict[str, str]], bool], change: Callable[[dict[str, str]], None]) -> None:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames or [], list(reader)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for row in rows:
            if keep(row):
                change(row)
                writer.writerow(row)


def drop_column(path: Path, name: str) -> None:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = [f for f in reader.fieldnames or [] if f != name], list(reader)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def scrub_isolation(run: Path) -> None:
    """The traces of contract 3 (isolated arms) removed: plan `isolated` and `roundtrip`, provenance
    `isolation`, wall_ns, roundtrip.csv."""
    edit_json(run / "plan.json", lambda plan: [plan.pop(k) for k in ("isolated", "roundtrip")])
    (run / "roundtrip.csv").unlink()
    edit_json(run / "provenance.json", lambda provenance: provenance.pop("isolation"))
    drop_column(run / "timings.csv", "wall_ns")


def downgrade(run: Path) -> None:
    """The issue's forgery: the timed-check contract's plan keys and files deleted (and the
    isolation traces), the candidate's timings cut to a third, the summary recomputed from the
    edited rows (an older schema)."""
    edit_json(
        run / "plan.json", lambda plan: [plan.pop(k) for k in ("checks", "exact", "plausibility", "frozen_at", "host")]
    )
    scrub_isolation(run)
    for name in TIMED_CHECK_FILES:
        (run / name).unlink()

    def faster(row: dict[str, str]) -> None:
        if row["arm"] == "packed_r4_w4":
            row["ns"] = str(int(row["ns"]) // 3)

    rewrite_rows(run / "timings.csv", lambda _: True, faster)
    write_summary(run, overwrite=True)


def committed_commit() -> str:
    """A commit that wrote a committed run of the current contract, if this checkout's history has it."""
    commit = json.loads((REPO / "results" / "h200" / "rmsnorm-panel" / "provenance.json").read_text())["git"]["commit"]
    if package_at(commit).files is None:
        pytest.skip(f"this checkout has no git history with commit {commit}")
    return commit


def test_the_untampered_run_verifies_with_the_new_checks(cpu_run: Path) -> None:
    result = verify_run_dir(cpu_run)
    assert result.ok, result.failures
    names = {c.name: c for c in result.checks}
    assert names["required files"].detail == "every file and key a run of checks 3 with a host stage writes is present"
    assert "timed checks record checked_call" in names["no downgrade"].detail
    assert "timings.csv has a wall_ns column" in names["no downgrade"].detail
    assert names["device"].detail == "a CPU run (plan.json and the interpreter flag agree)"


def test_a_downgrade_to_a_run_before_timed_checks_is_caught(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("downgraded")
    downgrade(run)
    failures = failed(run)
    detail = failures["no downgrade"]
    # "without a round trip" where the runner at the run's commit is read from git history (a clean clone)
    assert re.match(r"plan\.json declares checks 0( without a round trip)?, but ", detail), detail
    for witness in (
        "correctness rows have ulp_hist shows a run written under checks 1",
        "ceilings.csv has launch rows shows a run written under checks 1",
        "ceilings.csv has ['copy_matched', 'triton_launch'] rows shows a run written under checks 2 with a host stage",
    ):
        assert witness in detail
    assert "restore the deleted files and keys" in detail
    for name in (*CHECKED_RUN_CHECKS, "host cost"):  # failed, no longer listed as not applicable
        assert failures[name].startswith("not checked: plan.json has no `"), name


def test_a_downgrade_that_scrubs_every_row_trace_is_caught_by_the_commit_that_ran(
    copy_of: Callable[[str], Path],
) -> None:
    commit = committed_commit()
    run = copy_of("scrubbed")
    downgrade(run)
    lines = [json.loads(line) for line in (run / "correctness.jsonl").read_text().splitlines()]
    (run / "correctness.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "ulp_hist"}) + "\n" for r in lines)
    )
    rewrite_rows(run / "ceilings.csv", lambda row: row["kind"] in ("copy", "read"), lambda _: None)
    edit_json(run / "provenance.json", lambda p: p.update(git={"commit": commit, "dirty": False}))
    write_summary(run, overwrite=True)
    assert failed(run)["no downgrade"] == (
        f"plan.json declares checks 0, but the runner at commit {commit} (git history) shows a run written under "
        "checks 2 with a host stage: a run directory is verified under the contract that wrote it (restore the "
        "deleted files and keys)"
    )


def test_a_file_or_key_of_the_declared_contract_missing_is_named(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("missing")
    (run / "source.tar.gz").unlink()
    (run / "host.csv").unlink()
    edit_json(run / "provenance.json", lambda p: p["git"].pop("source_sha256"))
    seal(run)
    assert failed(run)["required files"] == (
        "source.tar.gz is missing (a run of checks 3 with a host stage writes it); "
        "provenance.json has no `git.source_sha256` (a run of checks 3 with a host stage writes it); "
        "host.csv is missing (a run of checks 3 with a host stage writes it)"
    )
    assert failed(run)["host cost"].startswith("host.csv is missing: a plan with `host` measures")


def test_a_run_of_checks_3_without_its_isolation_keys_is_named(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("no-isolation-keys")
    scrub_isolation(run)
    seal(run)
    assert failed(run)["required files"] == (
        "plan.json has no `isolated` (a run of checks 3 with a host stage writes it); "
        "provenance.json has no `isolation` (a run of checks 3 with a host stage writes it); "
        "timings.csv has no `wall_ns` column (a run of checks 3 with a host stage writes it)"
    )


def test_a_run_of_checks_3_relabelled_2_is_caught_by_its_isolation_traces(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("relabelled-2")
    edit_json(run / "plan.json", lambda plan: plan.update(checks=2))
    write_summary(run, overwrite=True)
    seal(run)
    detail = failed(run)["no downgrade"]
    for witness in ("plan.json has `isolated`", "provenance.json has `isolation`", "timings.csv has a wall_ns column"):
        assert (
            f"plan.json declares checks 2 with a host stage, but {witness} shows a run written under checks 3" in detail
        )


def test_a_gpu_name_written_into_a_cpu_run_is_caught(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("renamed")
    edit_json(run / "provenance.json", lambda p: p["device"].update(gpu="NVIDIA H200"))
    seal(run)  # the manifest rehashed, as a forger would
    assert failed(run) == {
        "device": "provenance device.gpu 'NVIDIA H200' but plan.json is_gpu False; device.gpu 'NVIDIA H200' but the "
        "Triton interpreter ran (triton_interpreter true): a CPU run"
    }


def test_an_h200_run_renamed_to_another_gpu_is_caught_by_its_ceilings_and_clocks(tmp_path: Path) -> None:
    """Every device field rewritten to an A100's: the copy and read ceilings and the SM clock
    measured in the run still say H200."""
    run = Path(shutil.copytree(H200_RUN, tmp_path / "a100"))
    a100 = {"gpu": "NVIDIA A100-SXM4-80GB", "sm_count": 108, "capability": "8.0", "l2_bytes": 40 << 20}
    edit_json(run / "provenance.json", lambda p: p["device"].update(a100, memory_bytes=85_000_000_000))
    seal(run)
    detail = failed(run)["device"]
    assert detail.startswith("plan.json clocks.max_sm_mhz 1980, the GPU's maximum is 1410 MHz; ")
    assert "timings.csv clock reading(s) above 1410 MHz (max 1980)" in detail
    assert "the copy ceiling measured 4260 GB/s, above a NVIDIA A100-SXM4-80GB's 2039 GB/s" in detail
    assert "the read ceiling measured" in detail


def test_a_recorded_commit_that_is_not_the_code_that_ran_is_caught(copy_of: Callable[[str], Path]) -> None:
    commit = committed_commit()
    run = copy_of("other-commit")
    edit_json(run / "provenance.json", lambda p: p.update(git={**p["git"], "commit": commit, "dirty": False}))
    seal(run)
    detail = failed(run)["source commit"]
    assert detail.startswith(f"the package at commit {commit} digests to ")
    assert detail.endswith(f"commit {commit} is not the code that ran (provenance.json edited?)")


def test_an_edited_report_fails_and_a_stale_one_is_named(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("report")
    report = write_report(run)
    assert verify_run_dir(run).ok
    text = report.read_text()
    report.write_text(text.replace("| win |", "| loss |", 1))
    assert "| win |" in text
    detail = failed(run)["report.md"]
    assert detail.startswith("report.md is not what `kerneltrial report` renders from this directory (line ")
    assert "render it again with `kerneltrial report" in detail
    write_report(run, unverified=True)  # a page that says UNVERIFIED claims less: accepted
    assert verify_run_dir(run).ok
    (run / "ERRATA.md").write_text("The candidate ran with a debug build.\n")  # added after the report
    assert "(line 5 reads 'Confidence intervals" in failed(run)["report.md"]  # the rendering has the errata there


def test_errata_lines_that_tools_read_must_be_well_formed(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("errata")
    (run / "ERRATA.md").write_text("Superseded by: `../elsewhere`\nReason: a forged retirement.\nReason: twice.\n")
    assert failed(run) == {
        "ERRATA.md": "ERRATA.md `Superseded by: ../elsewhere` must name another run directory by its name (no path, "
        "not itself); ERRATA.md: one `Reason:` line, and only beside a `Superseded by:` line (the reason it retires)"
    }


def test_a_document_naming_another_schema_is_named(copy_of: Callable[[str], Path]) -> None:
    run = copy_of("schemas")
    assert json.loads((run / "plan.json").read_text())["schema"] == "kerneltrial.plan/1"
    edit_json(run / "plan.json", lambda plan: plan.update(schema="kerneltrial.plan/9"))
    edit_json(run / "provenance.json", lambda provenance: provenance.update(schema="kerneltrial.provenance/0"))
    detail = failed(run)["document schemas"]
    assert "plan.json names schema 'kerneltrial.plan/9'; kerneltrial writes 'kerneltrial.plan/1'" in detail
    assert "provenance.json names schema 'kerneltrial.provenance/0'" in detail
