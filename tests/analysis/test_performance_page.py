"""PERFORMANCE.md's first page (analysis/performance_overview.py): the run each figure comes
from, the speed-of-light and same-size copy columns, the one row against the best peer and the
same-size copy + its margin, and the two files `write_performance_md` writes."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from rundir_factory import C1, C2, RunSpec, write_checked_run

from kerneltrial.analysis import performance_overview as page
from kerneltrial.analysis.peer_rows import MET, MISSED
from kerneltrial.analysis.performance import write_performance_md
from kerneltrial.rundir.summary_doc import read_summary

ARMS = [
    {"name": "ctrl", "kind": "control", "available": True, "reason": None},
    {"name": "kerneltrial", "kind": "candidate", "available": True, "reason": None},
    {"name": "peer", "kind": "peer", "available": True, "reason": None},
]
BYTES = 1_000_000  # small regime; at ~1000 ns per call, 1000 GB/s: plausible against the factory's copy
TRITON = [3000.0, 3100.0, 2900.0, 3050.0, 2950.0]  # median 3000 ns
GPU = RunSpec(arms=ARMS, failures=set(), bytes_per_call=BYTES, is_gpu=True, backend="cuda-events",
              triton_launch_ns=TRITON)  # fmt: skip


def ns_per_call(ours: float) -> object:
    def per_call(case: str, arm: str, seed: int, rnd: int) -> float:
        return {"ctrl": 1000.0, "kerneltrial": ours, "peer": 900.0}[arm] + (seed + rnd) % 3

    return per_call


def gpu_run(path: Path, ours: float = 1000.0, **changes: object) -> Path:
    return write_checked_run(path, replace(GPU, per_call=ns_per_call(ours), **changes))


def started(path: Path, when: str) -> None:
    record = json.loads((path / "provenance.json").read_text())
    record["started_at"] = when
    (path / "provenance.json").write_text(json.dumps(record))


def test_a_figure_comes_from_the_latest_run_and_equal_times_from_the_last_name(tmp_path: Path) -> None:
    runs = {name: gpu_run(tmp_path / name) for name in ("a-old", "b-new", "c-tie")}
    started(runs["a-old"], "2025-01-01T00:00:00")
    started(runs["b-new"], "2025-06-01T00:00:00")
    started(runs["c-tie"], "2025-06-01T00:00:00")
    current = page.current_runs(list(runs.values()))
    picked = page.pick_run(current, "rmsnorm", "small")
    assert picked is not None and picked.name == "c-tie"  # b-new and c-tie started together: the last name
    started(runs["c-tie"], "2025-05-01T00:00:00")
    picked = page.pick_run(page.current_runs(list(runs.values())), "rmsnorm", "small")
    assert picked is not None and picked.name == "b-new"
    assert page.pick_run(current, "rmsnorm", "large") is None  # no large case anywhere


def test_the_regime_row_gives_the_peer_ratio_and_the_floor_fraction(tmp_path: Path) -> None:
    path = gpu_run(tmp_path / "run", matched_copy_ns=[500.0, 520.0, 480.0, 510.0, 490.0])
    run = page.current_runs([path])[0]
    row = page.regime_row(run, "small")
    assert row[:4] == ["`rmsnorm`", "small", "`run`", "2"]
    assert row[4].startswith("0.90") and row[6] == "0 / 2"  # the peer (900 ns) beats ours (1000 ns) in both cases
    assert row[7:9] == ["–", "–"]  # the factory's runs have no host stage (host figures: test_performance_overview)
    copy = statistics.median(8_000_000 / (4000 + 100 * i) for i in range(5))  # the factory's 1 GiB copy rows
    ours = read_summary(path).cases[0].arms["kerneltrial"].median_ns_per_call
    floor = 3000.0 + BYTES / copy
    assert row[9].startswith(f"{100 * floor / ours:.1f}, worst ")
    assert row[10].startswith(f"{100 * (BYTES / ours) / (BYTES / 500.0):.1f}, worst ")  # our rate / the copy rate


def test_a_hot_l2_run_has_no_floor_or_copy_column(tmp_path: Path) -> None:
    run = page.current_runs([gpu_run(tmp_path / "run", l2="hot")])[0]
    assert page.regime_row(run, "small")[9:] == ["–", "–"]


def test_the_one_row_is_judged_against_the_same_size_copy_plus_the_margin(tmp_path: Path) -> None:
    copy_ns = [800.0] * 5  # ours (~1000 ns) is 1.25x the copy: missed; at 900 ns, 1.125x: met
    slow = page.current_runs([gpu_run(tmp_path / "slow", matched_copy_ns=copy_ns)])[0]
    row = page.one_row("`rmsnorm` (`slow`)", slow)
    assert row is not None and row[1] == f"`{C1}`" and row[5] == "0.80" and row[6] == "1.25" and row[7] == MISSED
    assert row[3] == "0.90 (`peer`)" and row[4].startswith("0.90")
    fast = page.current_runs([gpu_run(tmp_path / "fast", ours=900.0, matched_copy_ns=copy_ns)])[0]
    row = page.one_row("`rmsnorm` (`fast`)", fast)
    assert row is not None and row[6] == "1.13" and row[7] == MET
    assert page.ONE_ROW_MARGIN == 0.15


def test_performance_md_is_one_page_and_links_the_per_run_tables(tmp_path: Path) -> None:
    run = gpu_run(tmp_path / "run", frozen_at=None)
    out = write_performance_md([run], tmp_path / "PERFORMANCE.md")
    text = out.read_text()
    assert "## Overview: per operator and regime" in text
    assert "[results/PERFORMANCE-runs.md](results/PERFORMANCE-runs.md)" in text
    assert text.count("`run`") == 3  # the small-regime row, the one row, the not-frozen note: once each
    assert "1 of the runs above were not frozen (settings not preregistered): see Preregistration." in text
    assert f"`{C2}`" not in text and "## rmsnorm: `run`" not in text  # per-case tables live in the runs file
    runs = (tmp_path / page.RUNS_FILE).read_text()
    assert "## rmsnorm: `run`" in runs and "### Speed-of-light floor" in runs
    assert "### One row against the best peer and the same-size copy" in runs
    assert "[PERFORMANCE.md](../PERFORMANCE.md)" in runs
