"""What a new user reads (issue 25): `compare` of runs with nothing in common exits 1 and says so,
`report` of an interrupted run says `run --resume`, PERFORMANCE.md says once per run whether its
protocol was frozen, and the figures are readable (a log speedup axis, titles that fit, integer
case counts, legends beside the axes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from rundir_factory import C1, C2, C3, C4, RunSpec, write_checked_run, write_run_dir

from kerneltrial.analysis.performance import write_performance_md
from kerneltrial.kernel import plots, report
from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.summary_schemas import UNFROZEN_WARNING
from kerneltrial.rundir.summary_doc import read_summary
from tests.kt import run_cli


def test_compare_with_no_common_case_exits_1_and_says_so(tmp_path: Path) -> None:
    a, b = write_run_dir(tmp_path / "a"), write_run_dir(tmp_path / "b", RunSpec(cases=[C3, C4]))
    for path in (a, b):
        write_summary(path)
    for extra in ([], ["--json"]):
        done = run_cli("compare", str(a), str(b), *extra)
        assert done.exit_code == 1, done.output
        assert f"error: {a} and {b} have no case and arm in common, so there is nothing to compare" in done.output
        assert f"only in A: case `{C1}`, case `{C2}`; only in B: case `{C3}`, case `{C4}`" in done.output


def test_report_of_an_interrupted_run_says_run_resume(run_dir: Path) -> None:
    (run_dir / "summary.json").unlink()
    provenance = json.loads((run_dir / "provenance.json").read_text())
    (run_dir / "provenance.json").write_text(json.dumps(provenance | {"finished_at": None}))
    done = run_cli("report", str(run_dir))
    assert done.exit_code == 2
    assert "the run did not finish (interrupted or still running): continue it with" in done.output
    assert f"`kerneltrial run PROTOCOL --out {run_dir} --resume`" in done.output


def test_performance_md_says_once_per_run_whether_it_was_frozen(tmp_path: Path) -> None:
    frozen = write_checked_run(tmp_path / "frozen-run")
    unfrozen = write_checked_run(tmp_path / "unfrozen-run", RunSpec(frozen_at=None))
    assert UNFROZEN_WARNING in read_summary(unfrozen).warnings
    text = write_performance_md([frozen, unfrozen], tmp_path / "PERFORMANCE.md").read_text()
    assert "1 of 2 current kernel runs had their protocol frozen" in text
    assert "| `frozen-run` | `rmsnorm` | frozen at 2025-01-01T00:00:00+00:00 |" in text
    assert "| `unfrozen-run` | `rmsnorm` | **not frozen** |" in text
    assert text.count("not frozen") == 1 and "NOT FROZEN" not in text and UNFROZEN_WARNING not in text
    assert "- **NOT FROZEN**" in report.write_report(unfrozen).read_text()  # a run's own report still says it


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the report draws, kept instead of saved."""
    figures: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *_, **__: figures.append(self))
    return figures


def test_figures_read_well(run_dir: Path, drawn: list[Figure]) -> None:
    summary = read_summary(run_dir)  # a CPU run: the long timing label is in every title
    plots.plot_speedups(summary, run_dir / "s.png")
    plots.plot_verdicts(summary, run_dir / "v.png")
    speedup, verdicts = (fig.axes[0] for fig in drawn)
    assert speedup.get_yscale() == "log" and "log scale" in speedup.get_ylabel()
    assert all(label.get_text() and "10^" not in label.get_text() for label in speedup.get_yticklabels())
    assert isinstance(verdicts.yaxis.get_major_locator(), MaxNLocator)
    assert all(float(t).is_integer() for t in verdicts.get_yticks())
    for fig, ax in zip(drawn, (speedup, verdicts), strict=True):
        width = int(fig.get_figwidth() * plots.TITLE_CHARS_PER_INCH)
        assert summary.label in ax.get_title().replace("\n", " ")
        assert all(len(line) <= width for line in ax.get_title().splitlines())
        anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
        assert anchor.x0 >= 1.0  # the legend starts right of the axes: never over a bar


def test_a_narrow_speedup_range_still_has_labelled_ticks(drawn: list[Figure]) -> None:
    ax = Figure().subplots()
    plots._log_speedup_axis(ax, [0.97, 1.04])
    ax.set_ylim(0.97, 1.04)
    labels = [ax.yaxis.get_major_formatter()(t) for t in ax.get_yticks() if 0.97 <= t <= 1.04]
    assert len(labels) >= 3 and all(labels)
