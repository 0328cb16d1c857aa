"""Publication verifies (issue 24, item 4): `report`, `compare` and `performance` refuse a run whose
summary was edited (exit 1, the failed checks named) and, with `--unverified`, render it with
UNVERIFIED in every title. The planted runs are copies of the session's real CPU run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneltrial.analysis.performance_overview import RUNS_FILE
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.publication import UNVERIFIED, UNVERIFIED_NOTE, titled
from kerneltrial.replicates.record import ArmRow, ReplicateTable, to_markdown, verify_replicates
from tests.conftest import REPO
from tests.kt import run_cli

pytestmark = pytest.mark.slow  # the session's CPU run takes about 20 s once
CANDIDATE = "packed_r4_w4"
MARK = f"({UNVERIFIED}: {UNVERIFIED_NOTE})"
EDITED_FIGURES = f"figures case=4x64/contiguous/bfloat16 arm={CANDIDATE}"


def edit_speedup(run: Path, fields: tuple[str, ...]) -> Path:
    """The candidate's `fields` (of speedup, ci_low, ci_high) tripled in summary.json."""
    summary = json.loads((run / "summary.json").read_text())
    entry = summary["cases"][0]["arms"][CANDIDATE]
    assert entry["verdict"] == "win"
    for name in fields:
        entry[name] *= 3
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return run


@pytest.fixture
def edited(copy_of: Callable[[str], Path]) -> Path:
    """The run with its candidate's win tripled in summary.json (the speedup and its interval)."""
    return edit_speedup(copy_of("edited"), ("speedup", "ci_low", "ci_high"))


def test_report_refuses_an_edited_run_and_marks_it_when_asked(edited: Path) -> None:
    refused = run_cli("report", edited)
    assert refused.exit_code == 1
    assert f"error: {edited} fails verification, so it is not rendered: " in refused.output
    assert EDITED_FIGURES in refused.output and "--unverified renders it" in refused.output
    assert not (edited / "report.md").exists()
    marked = run_cli("report", edited, "--unverified")
    assert marked.exit_code == 0, marked.output
    assert "not verified (--unverified)" in marked.output
    assert (edited / "report.md").read_text().splitlines()[0] == f"# rmsnorm: `edited` {MARK}"


def test_compare_refuses_a_run_edited_outside_its_own_interval(cpu_run: Path, copy_of: Callable[[str], Path]) -> None:
    edited = edit_speedup(copy_of("edited"), ("speedup",))
    refused = run_cli("compare", cpu_run, edited)
    assert refused.exit_code == 1 and f"{edited} fails verification" in refused.output
    assert EDITED_FIGURES in refused.output
    marked = run_cli("compare", cpu_run, edited, "--unverified")
    assert marked.exit_code == 0 and marked.stdout.startswith(f"# Kernel runs compared {MARK}\n")
    document = json.loads(run_cli("compare", cpu_run, edited, "--unverified", "--json").stdout)
    assert document["notes"][0] == f"{UNVERIFIED}: {UNVERIFIED_NOTE}"  # --json has no title


def test_performance_refuses_an_edited_win_before_writing(cpu_run: Path, edited: Path, tmp_path: Path) -> None:
    out = tmp_path / "PERFORMANCE.md"
    refused = run_cli("performance", cpu_run, edited, "--out", out)
    assert refused.exit_code == 1 and f"{edited} fails verification" in refused.output and not out.exists()
    assert run_cli("performance", cpu_run, edited, "--out", out, "--unverified").exit_code == 0
    assert out.read_text().startswith(f"# Performance {MARK}\n")
    runs = (tmp_path / RUNS_FILE).read_text()  # every run's section is on the second page
    assert runs.startswith(f"# Performance: every run {MARK}\n")
    assert f"## rmsnorm: `edited` {MARK}" in runs and f"## rmsnorm: `run` {MARK}" in runs


def test_a_verified_run_is_rendered_without_the_mark(copy_of: Callable[[str], Path], tmp_path: Path) -> None:
    run = copy_of("verified")
    assert run_cli("report", run).exit_code == 0
    assert UNVERIFIED not in (run / "report.md").read_text()
    assert run_cli("compare", run, run).stdout.startswith("# Kernel runs compared\n")
    out = tmp_path / "P.md"
    assert run_cli("performance", run, "--out", out).exit_code == 0 and UNVERIFIED not in out.read_text()


def test_an_edited_report_does_not_block_its_own_rendering(copy_of: Callable[[str], Path]) -> None:
    """report.md fails verify when edited (a derived page), but no command renders from it:
    `report` writes it again, saying so, and the run verifies."""
    run = copy_of("stale")
    assert run_cli("report", run).exit_code == 0
    (run / "report.md").write_text("# rmsnorm: a forged page\n")
    assert [c.name for c in verify_run_dir(run).failures] == ["report.md"]
    again = run_cli("report", run)
    assert again.exit_code == 0 and "report.md is not the rendering of its directory" in again.output
    assert verify_run_dir(run).ok


def test_the_replicate_table_page_is_marked_too() -> None:
    table = ReplicateTable("0" * 64, 2, ["run-1", "run-2"], [1, 2], [], [ArmRow("fast", [True, True], False)])
    assert to_markdown(table, unverified=True).splitlines()[0] == titled(
        "# Replicates: 2 runs of protocol 000000000000...", True
    )
    assert UNVERIFIED not in to_markdown(table)


def test_report_of_a_committed_replicate_directory_renders_each_run_and_the_same_table(tmp_path: Path) -> None:
    """`report` on a replicate directory: verified first, then each run's report.md and replicates.md,
    which is what the committed one says (a derived page). The confirmation runs' links are relative:
    the copy keeps their neighbours where the links point."""
    results = REPO / "results" / "h200"
    for name in ("zimage_qk_rmsnorm-confirm-replicates", "zimage_qk_rmsnorm-t2"):
        shutil.copytree(results / name, tmp_path / "results" / "h200" / name)
    rule = Path("src") / "kerneltrial" / "ops" / "zimage_qk_rmsnorm.rule.toml"
    (tmp_path / rule).parent.mkdir(parents=True)
    shutil.copy(REPO / rule, tmp_path / rule)
    replicates = tmp_path / "results" / "h200" / "zimage_qk_rmsnorm-confirm-replicates"
    done = run_cli("report", replicates)
    assert done.exit_code == 0, done.output
    assert (replicates / "replicates.md").read_bytes() == (results / replicates.name / "replicates.md").read_bytes()
    assert all(UNVERIFIED not in (replicates / f"run-{i}" / "report.md").read_text() for i in (1, 2, 3))
    result = verify_replicates(replicates)
    assert result.ok and {c.name: c.applicable for c in result.checks}["run-1: report.md"], result.failures
