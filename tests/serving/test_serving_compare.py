"""`kerneltrial compare` on two serving run directories: the same arm and case measured twice,
throughput and TTFT over launches with their interval, and the ratio B/A."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.kt import run_cli

from .test_verify_evidence import _forge_runs, clean_run  # noqa: F401 (the fixture)


@pytest.fixture
def slower_a(clean_run: Path, tmp_path: Path) -> Path:  # noqa: F811
    """The run again, arm A's every time 25% longer (start times too: a slower day, not a forgery)."""
    run = Path(shutil.copytree(clean_run, tmp_path / "again"))

    def slower(raw: dict[str, Any]) -> None:
        t0 = min(raw["start_times"])
        raw["start_times"] = [t0 + (s - t0) * 1.25 for s in raw["start_times"]]
        raw["duration"] *= 1.25
        raw["latencies"] = [x * 1.25 for x in raw["latencies"]]
        raw["ttfts"] = [x * 1.25 for x in raw["ttfts"]]
        raw["itls"] = [[x * 1.25 for x in itl] for itl in raw["itls"]]

    _forge_runs(run, "A", slower)
    return run


def test_compare_shows_each_arm_and_case_of_two_serving_runs(clean_run: Path, slower_a: Path) -> None:  # noqa: F811
    r = run_cli("compare", str(clean_run), str(slower_a))
    assert r.exit_code == 0, r.output
    a = next(line for line in r.output.splitlines() if line.startswith("| A | in16-out8-c2-n6 |"))
    b = next(line for line in r.output.splitlines() if line.startswith("| B | in16-out8-c2-n6 |"))
    assert a.split(" | ")[4] == "0.8000" and a.rstrip(" |").endswith("1.2500")  # throughput B/A, TTFT B/A
    assert b.split(" | ")[4] == "1.0000" and b.rstrip(" |").endswith("1.0000")
    assert "[" in a.split(" | ")[2]  # an interval across the two launches

    j = run_cli("compare", "--json", str(clean_run), str(slower_a))
    assert j.exit_code == 0, j.output
    doc = json.loads(j.stdout)
    assert doc["schema"] == "kerneltrial.serving-compare-result/1" and doc["only_in_a"] == doc["only_in_b"] == []
    row = next(x for x in doc["rows"] if x["arm"] == "A")
    assert row["throughput_ratio_b_over_a"] == pytest.approx(0.8) and row["total_token_throughput_a"]["launches"] == 2


def test_a_serving_run_and_a_kernel_run_are_not_compared(clean_run: Path, tmp_path: Path) -> None:  # noqa: F811
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    (kernel / "provenance.json").write_text(json.dumps({"kind": "kernel"}))
    r = run_cli("compare", str(clean_run), str(kernel))
    assert r.exit_code == 2 and "is a serving run" in r.output and "compare two runs of one kind" in r.output


def test_compare_and_report_refuse_a_serving_run_whose_summary_was_edited(
    clean_run: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Publication verifies (issue 24): an edited figure keeps the run from being shown, unless
    --unverified, which puts UNVERIFIED in every title."""
    from kerneltrial.publication import UNVERIFIED

    run = Path(shutil.copytree(clean_run, tmp_path / "edited"))
    summary = json.loads((run / "summary.json").read_text())
    summary["results"]["B"]["in16-out8-c2-n6"]["launches"][0]["total_token_throughput"] *= 3
    (run / "summary.json").write_text(json.dumps(summary))
    for command in (["compare", str(clean_run), str(run)], ["report", str(run)]):
        refused = run_cli(*command)
        assert refused.exit_code == 1 and f"{run} fails verification" in refused.output, refused.output
        assert "summary figures (" in refused.output  # the failed check, named
    marked = run_cli("compare", str(clean_run), str(run), "--unverified")
    assert marked.exit_code == 0 and marked.stdout.splitlines()[0] == f"# Serving runs compared ({UNVERIFIED}: " + (
        "rendered with --unverified: `kerneltrial verify` was not required to pass)"
    )
    assert run_cli("report", str(run), "--unverified").exit_code == 0
    assert (run / "report.md").read_text().startswith(f"# Serving trial {run.name} ({UNVERIFIED}: ")
