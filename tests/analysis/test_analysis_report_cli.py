"""report.md + figures, PERFORMANCE.md, compare, and the analysis CLI commands."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from rundir_factory import C1, C2, C3, RunSpec, default_per_call, write_checked_run, write_run_dir

from kerneltrial.analysis.compare import compare_runs, comparison
from kerneltrial.analysis.performance import write_performance_md
from kerneltrial.analysis.performance_overview import RUNS_FILE
from kerneltrial.kernel.report import CEILING_PNG, ERRATA_HEADING, SPEEDUP_PNG, VERDICTS_PNG, write_report
from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.errors import RunDirError
from tests.kt import run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_renders_figures_and_every_case_and_arm(run_dir: Path) -> None:
    report = write_report(run_dir).read_text()
    for name in (SPEEDUP_PNG, VERDICTS_PNG, CEILING_PNG):
        data = (run_dir / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert f"]({name})" in report
    for case in (C1, C2):
        assert f"`{case}`" in report
    for arm in ("ctrl", "fast", "slow", "peer"):
        assert f"`{arm}`" in report
    assert "**host clock, Triton interpreter: NOT GPU performance**" in report
    assert f"| `{C1}` | `slow` | 1.10 | 0.909 [0.908, 0.910] | loss |" in report  # the regression is shown
    assert "**failed correctness**: max_rel 0.25 > rtol 0.016 at seed 0" in report
    assert "unavailable: liger_kernel not installed" in report
    assert "passed by `fast`" in report


def per_run_tables(runs: list[Path], tmp_path: Path) -> str:
    """The per-run tables `write_performance_md` writes beside PERFORMANCE.md (RUNS_FILE)."""
    write_performance_md(runs, tmp_path / "PERFORMANCE.md")
    return (tmp_path / RUNS_FILE).read_text()


def test_performance_md_covers_each_run(tmp_path: Path) -> None:
    first = write_run_dir(tmp_path / "run_a")
    second = write_run_dir(tmp_path / "run_b", RunSpec(gate="no_loss"))
    for path in (first, second):
        write_summary(path)
    text = per_run_tables([first, second], tmp_path)
    assert "## rmsnorm: `run_a`" in text and "## rmsnorm: `run_b`" in text
    assert "gate `no_loss`: passed by `fast`" in text
    assert "device: gpu None, cpu x86_64" in text and "versions: python 3.11" in text
    assert text.count(f"| `{C2}` | `fast` | 1.60 | 1.250 [") == 2


def test_compare_shows_both_runs(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a")
    b = write_run_dir(
        tmp_path / "b",
        RunSpec(cases=[C1, C3], per_call=lambda case, arm, seed, rnd: 2000.0 if arm == "ctrl" else 500.0),
    )
    for path in (a, b):
        write_summary(path)
    text = compare_runs(a, b)
    assert f"| `{C1}` | `ctrl` | 1.000 | 2.000 | 2.000 |" in text
    assert f"| `{C1}` | `fast` | 0.800 | 0.500 | 0.625 | FAST | 1.600 [" in text  # the change, with its CI
    assert "| 1.250 [" in text  # each run's speedup over its control, with its CI
    assert f"Only in A: case `{C2}`" in text and f"Only in B: case `{C3}`" in text


def changed(case: str, arm: str, seed: int, rnd: int) -> float:
    """Run B of the change test: fast 40% faster, slow 30% slower, ctrl 2% slower (at the band's
    edge), the same wobble as run A's."""
    factor = {"fast": 1 / 1.4, "slow": 1.3, "ctrl": 1.02}[arm]
    return default_per_call(case, arm, seed, rnd) * factor


def test_compare_calls_each_change_from_both_runs_samples(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", RunSpec(failures=set()))
    b = write_run_dir(tmp_path / "b", RunSpec(failures=set(), per_call=changed))
    # the same samples under a 5% band: the unpaired interval of a few percent's wobble lies inside it
    wide, same = (write_run_dir(tmp_path / n, RunSpec(failures=set(), tie_band=0.05)) for n in ("wide", "same"))
    for path in (a, b, wide, same):
        write_summary(path)
    calls = {(r.case, r.arm): r.change for r in comparison(a, b).rows}
    assert {arm: calls[(C1, arm)].call for arm in ("fast", "slow", "ctrl")} == {
        "fast": "FAST",
        "slow": "SLOW",
        "ctrl": "UNSURE",  # 2% slower against a 2% band: its interval straddles the edge
    }
    fast = calls[(C1, "fast")]
    assert fast.ci_low <= fast.speedup <= fast.ci_high and fast.speedup == pytest.approx(1.4, rel=0.01)
    assert comparison(a, b).changes() == {"FAST": 2, "SLOW": 2, "SAME": 0, "UNSURE": 2}
    assert {r.change.call for r in comparison(wide, same).rows if r.change} == {"SAME"}
    text = compare_runs(a, b)
    assert "B against A: 2 FAST, 2 SLOW, 0 SAME, 2 UNSURE (unpaired bootstrap of median(A) / median(B), 2000" in text
    assert f"| `{C1}` | `fast` | 0.800 | 0.571 | 0.714 | FAST | 1.400 [" in text


def test_compare_says_which_settings_differ_and_which_it_uses(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a")
    b = write_run_dir(tmp_path / "b", RunSpec(resamples=500, calls=20, tie_band=0.05))
    for path in (a, b):
        write_summary(path)
    notes = comparison(a, b).notes
    assert "Note: the tie bands differ (0.02, 0.05); the wider calls a change." in notes
    assert (
        "Note: the bootstrap settings differ (A: 2000 resamples, seed 7, 95%; B: 500 resamples, seed 7, 95%); "
        "the change column uses A's, each run's own speedup interval its own."
    ) in notes
    assert f"Note: calls per timed sample differ in `{C1}` (10, 20), `{C2}` (10, 20): a per-call median" in " ".join(
        notes
    )
    same = write_run_dir(tmp_path / "same")
    write_summary(same)
    assert comparison(a, same).notes == []


def test_compare_json_counts_the_changes(tmp_path: Path) -> None:
    a = write_checked_run(tmp_path / "a", RunSpec(failures=set()))
    b = write_checked_run(tmp_path / "b", RunSpec(failures=set(), per_call=changed))
    done = run_cli("compare", str(a), str(b), "--json")
    assert done.exit_code == 0, done.output
    document = json.loads(done.stdout)
    assert document["changes"] == {"FAST": 2, "SLOW": 2, "SAME": 0, "UNSURE": 2}
    row = next(r for r in document["rows"] if (r["case"], r["arm"]) == (C1, "slow"))
    assert row["change"]["call"] == "SLOW" and row["change"]["ci_high"] < 0.98
    assert "tie band ±2%" in document["noise_rule"]


def test_export_csv_has_a_row_per_case_and_arm_with_the_summary_figures(tmp_path: Path) -> None:
    run = write_checked_run(tmp_path / "run")
    done = run_cli("export", str(run), "--csv")
    assert done.exit_code == 0, done.output
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    summary = json.loads((run / "summary.json").read_text())
    assert len(rows) == sum(len(c["arms"]) for c in summary["cases"])
    by = {(r["case"], r["arm"]): r for r in rows}
    fast = summary["cases"][0]["arms"]["fast"]
    assert float(by[(C1, "fast")]["median_ns_per_call"]) == fast["median_ns_per_call"]
    assert by[(C1, "fast")]["verdict"] == fast["verdict"] and by[(C2, "slow")]["status"] == "failed correctness"
    assert by[(C2, "slow")]["speedup"] == "" and "NOT GPU performance" in by[(C1, "fast")]["timing"]
    (run / "timings.csv").write_text((run / "timings.csv").read_text().replace(",800", ",700", 1))  # planted edit
    refused = run_cli("export", str(run), "--csv")
    assert refused.exit_code == 1 and "timings" in refused.output


def test_plot_draws_each_timed_arm_against_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_checked_run(tmp_path / "run")
    drawn: list = []
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", lambda self, path, **_: drawn.append((self, path)))
    done = run_cli("plot", str(run), "--out", str(tmp_path / "size.png"))
    assert done.exit_code == 0, done.output
    assert f"wrote {tmp_path / 'size.png'}" in done.output
    ((fig, path),) = drawn
    time_ax, rate_ax = fig.axes
    lines = {line.get_label(): line for line in time_ax.get_lines()}
    assert set(lines) == {"ctrl", "fast", "slow"}  # the unavailable peer has no figures
    assert list(lines["fast"].get_xdata()) == [4_000_000, 4_000_000]  # C1, then C2 (same bytes per call)
    assert len(lines["slow"].get_xdata()) == 1  # failed correctness in C2: not drawn there
    assert time_ax.get_xscale() == rate_ax.get_yscale() == "log"


def test_plot_into_the_run_directory_leaves_it_verifying(tmp_path: Path) -> None:
    """The default --out is size.png beside the raw files: verify allows it as it allows the report's PNGs."""
    run = write_checked_run(tmp_path / "run")
    assert run_cli("plot", str(run)).exit_code == 0 and (run / "size.png").is_file()
    assert run_cli("verify", str(run)).exit_code == 0
    (run / "other.png").write_bytes(b"")  # a file no command writes is still refused
    refused = run_cli("verify", str(run))
    assert refused.exit_code == 1 and "['other.png'] not in manifest.json" in " ".join(refused.output.split())


def test_compare_refuses_runs_of_two_operators(tmp_path: Path) -> None:
    a, b = write_run_dir(tmp_path / "a"), write_run_dir(tmp_path / "b")
    for path in (a, b):
        write_summary(path)
    summary = json.loads((b / "summary.json").read_text())
    summary["op"] = "silu_and_mul"
    (b / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RunDirError, match="compare two runs of the same operator"):
        compare_runs(a, b)


def test_cli_verify_ok_and_failure(run_dir: Path) -> None:
    ok = run_cli("verify", str(run_dir))
    assert ok.exit_code == 0, ok.output
    assert ok.output.splitlines()[-1].startswith("verified: all")
    assert "ok   timing rows:" in ok.output

    summary = json.loads((run_dir / "summary.json").read_text())
    summary["ceilings"]["copy_gbps"] *= 1.01
    (run_dir / "summary.json").write_text(json.dumps(summary))
    bad = run_cli("verify", str(run_dir))
    assert bad.exit_code == 1
    assert "FAIL ceilings: ceilings copy_gbps" in bad.output
    assert bad.output.splitlines()[-1].startswith("VERIFY FAILED: 1 of")


@pytest.mark.parametrize("command", [["verify"], ["report"], ["compare", "."], ["performance"]])
def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path, command: list[str]) -> None:
    missing = str(tmp_path / "missing")
    args = [command[0], missing, *command[1:]] if command[0] != "compare" else ["compare", missing, str(tmp_path)]
    result = run_cli(*args)
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "error:" in result.output and "missing" in result.output
    assert "Traceback" not in result.output


def test_cli_not_a_run_dir(tmp_path: Path) -> None:
    result = run_cli("verify", str(tmp_path))
    assert result.exit_code == 2 and "missing provenance.json" in result.output


def test_cli_report_compare_performance(run_dir: Path, tmp_path: Path) -> None:
    assert run_cli("report", str(run_dir)).exit_code == 0
    assert (run_dir / "report.md").is_file()
    compared = run_cli("compare", str(run_dir), str(run_dir))
    assert compared.exit_code == 0 and f"| `{C1}` | `fast` | 0.800 | 0.800 | 1.000 |" in compared.output
    out = tmp_path / "PERFORMANCE.md"
    runs_out = tmp_path / "runs.md"
    args = ["performance", str(run_dir), "--out", str(out), "--runs-out", str(runs_out)]
    assert run_cli(*args).exit_code == 0
    assert "# Performance" in out.read_text() and "](runs.md)" in out.read_text()
    assert "## rmsnorm: `run`" in runs_out.read_text() and "](PERFORMANCE.md)" in runs_out.read_text()


# ---------------------------------------------------------------- scope sentence and errata

SCOPE = (
    "Confidence intervals cover noise within this session (machine state, clocks) only; "
    "a re-run on another machine may differ by more."
)
PEER_ARMS = [
    {"name": "ctrl", "kind": "control", "available": True, "reason": None},
    {"name": "kerneltrial", "kind": "candidate", "available": True, "reason": None},
    {"name": "peer", "kind": "peer", "available": True, "reason": None},
]


def test_every_run_section_states_what_the_cis_cover(run_dir: Path, tmp_path: Path) -> None:
    assert SCOPE in write_report(run_dir).read_text()
    other = write_run_dir(tmp_path / "other")
    write_summary(other)
    text = per_run_tables([run_dir, other], tmp_path)
    assert text.count(SCOPE) == 2


def _two_peer_runs(tmp_path: Path, first: str, second: str) -> tuple[Path, Path]:
    spec = RunSpec(arms=PEER_ARMS, failures=set())
    runs = write_run_dir(tmp_path / first, spec), write_run_dir(tmp_path / second, spec)
    for path in runs:
        write_summary(path)
    return runs


def test_errata_follow_the_timing_line_and_mark_the_overview(tmp_path: Path) -> None:
    fixed, plain = _two_peer_runs(tmp_path, "fixed", "plain")
    (fixed / "ERRATA.md").write_text("The peer arm ran with a stale build; its medians are not comparable.\n")
    report = write_report(fixed).read_text().splitlines()
    timing = next(i for i, line in enumerate(report) if line.startswith("Timing: "))
    assert report[timing + 1 : timing + 6] == [
        "",
        f"## {ERRATA_HEADING}",
        "",
        "> The peer arm ran with a stale build; its medians are not comparable.",  # quoted: not a figure
        "",
    ]
    assert "## Errata" not in write_report(plain).read_text()
    text = per_run_tables([fixed, plain], tmp_path)
    # overview: both runs listed (kerneltrial and the peer both time 1000 ns per call), only `fixed` marked
    assert "| `rmsnorm` (`fixed`) (errata) | `contiguous` | small | 2 |" in text
    assert "| `rmsnorm` (`plain`) | `contiguous` | small | 2 |" in text
    assert f"### {ERRATA_HEADING}" in text and text.count("stale build") == 1
    assert verify_run_dir(fixed).ok  # ERRATA.md is not a raw file: the run still verifies


def test_superseded_runs_leave_the_overview_for_the_earlier_runs_table(tmp_path: Path) -> None:
    old, new = _two_peer_runs(tmp_path, "old", "new")
    (old / "ERRATA.md").write_text("Superseded by: `new`\nReason: measured with the old timer.\n")
    text = per_run_tables([old, new], tmp_path)
    assert "| `rmsnorm` (`new`) | `contiguous` | small | 2 |" in text
    assert "(`old`)" not in text.split("## Earlier runs")[0]
    assert "## rmsnorm: `new`" in text and "## rmsnorm: `old`" not in text
    assert "| `old` | `rmsnorm` | `new` | measured with the old timer. |" in text
    with pytest.raises(RunDirError, match="superseded by 'new', which is not among"):
        write_performance_md([old], tmp_path / "P2.md")
    (new / "ERRATA.md").write_text("Superseded by: `old`\n")  # a cycle would drop both runs
    with pytest.raises(RunDirError, match="cycle"):
        write_performance_md([old, new], tmp_path / "P3.md")
