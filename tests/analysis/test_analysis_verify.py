"""analysis.verify: passes on a good run directory, fails and names the problem on tampered ones."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import time
import types
from pathlib import Path

import pytest
from rundir_factory import RunSpec, write_run_dir

import kerneltrial.analysis.verify as verify_module
from kerneltrial.analysis.errors import RunDirError
from kerneltrial.analysis.summary import write_summary
from kerneltrial.analysis.verify import verify_run_dir


def _failed(run_dir: Path) -> dict[str, str]:
    return {check.name: check.detail for check in verify_run_dir(run_dir).failures}


def _edit_timings(run_dir: Path, edit) -> None:
    path = run_dir / "timings.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")


def test_good_run_passes(run_dir: Path) -> None:
    result = verify_run_dir(run_dir)
    assert result.ok, result.failures
    names = [check.name for check in result.checks]
    assert "timing rows" in names and "figures case=c2 arm=fast" in names and "aggregates arm=slow" in names


def test_changed_timing_value_fails(run_dir: Path) -> None:
    # fast in c1 takes 780..820 ns/call, median 800; tripling one 800 moves the median to 805.
    def slow_down(lines: list[str]) -> list[str]:
        row = next(i for i, line in enumerate(lines) if line.startswith("c1,") and line.endswith(",fast,10,8000.0"))
        lines[row] = lines[row].replace(",8000.0", ",24000.0")
        return lines

    _edit_timings(run_dir, slow_down)
    failed = _failed(run_dir)
    assert "timings.csv hashes to" in failed["raw files unchanged since summary"]
    assert "median_ns_per_call: summary 800.0 != recomputed 805.0" in failed["figures case=c1 arm=fast"]


def test_figures_are_recomputed_not_only_hashed(run_dir: Path) -> None:
    # A summary rewritten to match edited raw files passes the hash check but not the figures.
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    _edit_timings(run_dir, lambda lines: [line.replace(",fast,10,8000.0", ",fast,10,24000.0") for line in lines])
    summary["inputs_sha256"]["timings.csv"] = hashlib.sha256((run_dir / "timings.csv").read_bytes()).hexdigest()
    path.write_text(json.dumps(summary))
    failed = _failed(run_dir)
    assert "raw files unchanged since summary" not in failed
    assert "figures case=c1 arm=fast" in failed


def test_deleted_row_fails(run_dir: Path) -> None:
    _edit_timings(run_dir, lambda lines: lines[:5] + lines[6:])
    failed = _failed(run_dir)
    assert "missing (case, seed, round, arm) rows: 1" in failed["timing rows"]
    assert any("n_samples: summary 10 != recomputed 9" in detail for detail in failed.values())


def test_duplicated_row_fails(run_dir: Path) -> None:
    _edit_timings(run_dir, lambda lines: lines + [lines[3]])
    assert "duplicated (case, seed, round, arm) rows: 1" in _failed(run_dir)["timing rows"]


def test_edited_summary_figure_fails(run_dir: Path) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["cases"][1]["arms"]["fast"]["speedup"] = 1.2500001
    summary["aggregates"]["fast"]["wins"] = 1
    path.write_text(json.dumps(summary))
    failed = _failed(run_dir)
    assert "speedup: summary 1.2500001 != recomputed 1.25" in failed["figures case=c2 arm=fast"]
    assert "wins" in failed["aggregates arm=fast"]


def test_changed_protocol_fails(run_dir: Path) -> None:
    (run_dir / "protocol.toml").write_text('op = "rmsnorm"\ntie_band = 0.05\n')
    failed = _failed(run_dir)
    assert {"protocol hash in provenance.json", "protocol hash in plan.json", "protocol hash in summary.json"} <= set(failed)


def test_timed_arm_that_failed_correctness_fails(run_dir: Path) -> None:
    _edit_timings(run_dir, lambda lines: lines + ["c2,0,0,9,slow,10,9000.0"])
    failed = _failed(run_dir)
    assert "slow failed correctness in case c2" in failed["correctness consistency"]
    assert "unexpected" in failed["timing rows"]


def test_timed_arm_without_a_correctness_check_fails(run_dir: Path) -> None:
    path = run_dir / "correctness.jsonl"
    rows = [line for line in path.read_text().splitlines() if '"arm": "fast"' not in line or '"case": "c1"' not in line]
    path.write_text("\n".join(rows) + "\n")
    assert "case c1 arm fast: no correctness check" in _failed(run_dir)["correctness coverage"]


def test_not_a_run_dir_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="not a directory"):
        verify_run_dir(tmp_path / "nowhere")
    with pytest.raises(RunDirError, match="missing provenance.json"):
        verify_run_dir(tmp_path)


def test_serving_runs_are_delegated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "provenance.json").write_text(json.dumps({"kind": "serving"}))
    fake = types.ModuleType("kerneltrial.serving.verify")
    fake.verify_serving_run = lambda path: [] if path == tmp_path else ["wrong path"]
    monkeypatch.setitem(sys.modules, "kerneltrial.serving.verify", fake)
    assert verify_run_dir(tmp_path).ok
    fake.verify_serving_run = lambda path: ["ttft p50 differs", "row 3 missing"]
    result = verify_run_dir(tmp_path)
    assert not result.ok and "ttft p50 differs" in result.failures[0].detail


def test_verify_is_independent_of_stats_and_summary() -> None:
    tree = ast.parse(Path(verify_module.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
    assert not [name for name in imported if "stats" in name or "summary" in name or "pandas" in name]


def test_verify_2000_rows_is_fast(tmp_path: Path) -> None:
    spec = RunSpec(cases=["c1", "c2", "c3", "c4"], seeds=[0, 1, 2, 3], rounds=25, resamples=10_000,
                   failures=set())  # 4 cases x 5 timed arms x 4 seeds x 25 rounds = 2,000 rows
    spec.arms = spec.arms[:3] + [{"name": f"cand{i}", "kind": "candidate", "available": True, "reason": None}
                                 for i in range(2)]
    path = write_run_dir(tmp_path / "run", spec)
    assert len((path / "timings.csv").read_text().splitlines()) == 2001
    write_summary(path)
    start = time.perf_counter()
    result = verify_run_dir(path)
    elapsed = time.perf_counter() - start
    assert result.ok, result.failures
    assert elapsed < 1.5, f"verify of 2,000 rows took {elapsed:.2f} s (budget 2 s; ~0.25 s on an idle core)"


def test_flipped_gate_verdict_fails(run_dir: Path) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["gate"]["arms"]["slow"]["passed"] = True
    summary["gate"]["passed_arms"] = ["fast", "slow"]
    path.write_text(json.dumps(summary))
    failed = _failed(run_dir)
    assert "arm slow gate: summary True != recomputed False" in failed["aggregates arm=slow"]
    assert "gate" in failed
