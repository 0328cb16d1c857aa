"""Every serving run writes the organisers' raw_runs and summary CSVs (issue 36, item 7): the columns,
status values, file names, rounding and skip rule of the vendored benchmark_throughput_serve.py (parsed,
never run), checked against ours; planted failures the summary must leave out; and the committed
real-vLLM trial's CSVs (tests/fixtures/serving/official-tiny) held to the script's format."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from statistics import mean

import pytest

from kerneltrial.serving import official, script_csv
from kerneltrial.serving.bench import Case
from kerneltrial.serving.metrics import run_metrics
from kerneltrial.serving.script_csv import FIGURES, ScriptRun, summarise
from kerneltrial.serving.verify import verify_serving_run

from .conftest import REPO, official_script, start_times
from .scripts_ast import Upstream
from .test_acceptance import run_trial, synthetic_bench, trial_text

FIXTURE = REPO / "tests" / "fixtures" / "serving" / "official-tiny"
CASE = Case(8, 4, 1, 2)


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    return Upstream.read(official_script())


def test_our_csvs_have_the_scripts_columns_statuses_and_rules(upstream: Upstream):
    c = upstream.constants
    assert tuple(c["RAW_CSV_COLUMNS"]) == official.RAW_COLUMNS
    assert tuple(c["SUMMARY_CSV_COLUMNS"]) == official.SUMMARY_COLUMNS
    assert upstream.statuses == (official.SUCCESS, official.FAILED) == ("SUCCESS", "FAILED")
    assert upstream.counted_from == "SKIP_FIRST" and upstream.skips_failed
    assert upstream.digits == script_csv.DIGITS
    assert upstream.stamp_format == script_csv.STAMP_FORMAT
    assert upstream.files == (script_csv.RAW_FILE, script_csv.SUMMARY_FILE)
    assert upstream.output_dir == script_csv.RESULTS_DIR
    assert set(upstream.format_keys) == set(official.METRIC_COLUMNS)  # each metric column read from the printout
    # the metric columns format_result fills are ours, in its order
    assert (
        upstream.format_columns
        == (*official.CASE_COLUMNS, *official.METRIC_COLUMNS)
        == (*official.CASE_COLUMNS, *FIGURES)
    )


def test_every_figure_a_column_reads_is_one_a_run_has():
    n = 3
    raw = {
        "duration": 1.5,
        "input_lens": [8] * n,
        "output_lens": [4] * n,
        "errors": [""] * n,
        "ttfts": [0.1] * n,
        "latencies": [0.4] * n,
        "itls": [[0.1] * 3] * n,
        "start_times": start_times(n, 1.5, 0.4),
    }
    figures = run_metrics(raw, (50, 90, 99))
    assert [k for k in FIGURES.values() if k not in figures] == []
    assert "completed" in figures


def run(status: str, tok_s: float, case: Case = CASE) -> ScriptRun:
    figures = tuple(tok_s if col == "Total tok/s" else 1.0 for col in official.METRIC_COLUMNS)
    return ScriptRun(case, 2.0, status, figures)


def test_the_summary_leaves_out_a_case_whose_counted_run_failed():
    """The script's rule: runs after SKIP_FIRST count; one FAILED among them leaves the case out; a FAILED
    warm-up run does not. The mean is over the counted runs, rounded to 2 decimals."""
    ok, bad = official.SUCCESS, official.FAILED
    assert summarise(CASE, [run(ok, 9), run(ok, 1), run(bad, 2), run(ok, 3)], 4) is None
    assert summarise(CASE, [run(ok, 9), run(ok, 1), run(ok, 2), run(bad, 3)], 4) is None
    kept = summarise(CASE, [run(bad, 9), run(ok, 1), run(ok, 2), run(ok, 4)], 4)
    assert kept is not None
    assert kept.figures[official.METRIC_COLUMNS.index("Total tok/s")] == round(7 / 3, 2) == 2.33
    assert kept.cells()[:4] == [8, 4, 1, 2]
    # a case the trial stopped in (fewer runs than repeats) has no summary row
    assert summarise(CASE, [run(ok, 9), run(ok, 1)], 4) is None


def failing(*runs: tuple[str, str]):
    """synthetic_bench, with one request failed (vLLM's record of it) in each (run, case id) of `runs`."""
    base = synthetic_bench(lambda arm, L: (1.0, 1.0))

    def bench(argv, json_path, log_path, timeout_s, server=None):
        raw = base(argv, json_path, log_path, timeout_s, server)
        if (json_path.stem, json_path.parent.name) in runs:
            raw["errors"][0], raw["latencies"][0], raw["output_lens"][0], raw["completed"] = "boom", 0.0, 0, 1
            json_path.write_text(json.dumps(raw))
        return raw

    return bench


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_a_trial_writes_the_csvs_per_launch_and_leaves_out_a_failed_case(tmp_path, monkeypatch):
    """Planted: in a two-case trial, run 2 (counted) of the first case loses a request: its raw row is FAILED
    and its case is left out of the summary; run 0 (the warm-up) of the second case loses one: FAILED in the
    raw table, the case kept, as the script does."""
    text = trial_text(rounds=1, names=("A", "B")).replace("repeats = 2", "repeats = 4")
    text = text.replace("cases = [[8, 4, 1, 2]]", "cases = [[8, 4, 1, 2], [16, 4, 1, 2]]")
    bench = failing(("run2", "in8-out4-c1-n2"), ("run0", "in16-out4-c1-n2"))
    code, output, out = run_trial(tmp_path, monkeypatch, text, bench)
    assert code == 1, output  # a run failed
    folders = sorted(p.name for p in (out / script_csv.RESULTS_DIR).iterdir())
    assert folders == sorted(p.name for p in (out / "raw").iterdir()) and len(folders) == 2  # NN-ARM of each launch
    for folder in (out / script_csv.RESULTS_DIR).iterdir():
        [raw_file] = folder.glob("raw_runs_*.csv")
        [summary_file] = folder.glob("summary_*.csv")
        assert re.fullmatch(r"raw_runs_\d{8}_\d{6}\.csv", raw_file.name)
        assert summary_file.name == raw_file.name.replace("raw_runs_", "summary_")
        header, rows = read_csv(raw_file)
        assert tuple(header) == official.RAW_COLUMNS and len(rows) == 8
        status = [(r["Prefill"], r["Run Status"], r["Successful Requests"]) for r in rows]
        assert status[2] == ("8", "FAILED", "1.0") and status[4] == ("16", "FAILED", "1.0")
        assert sum(s == "SUCCESS" for _, s, _ in status) == 6
        header, rows = read_csv(summary_file)
        assert tuple(header) == official.SUMMARY_COLUMNS and [r["Prefill"] for r in rows] == ["16"]
        assert float(rows[0]["Total Input Tokens"]) == 32.0  # 2 requests of 16 tokens, as vLLM prints it


def test_a_run_with_every_case_ok_summarises_every_case_and_verifies(tmp_path, monkeypatch):
    text = trial_text(rounds=1).replace("repeats = 2", "repeats = 4")
    code, output, out = run_trial(tmp_path, monkeypatch, text, synthetic_bench(lambda arm, L: (1.0, 1.0)))
    assert code == 1 and "INCONCLUSIVE" in output, output  # one launch per arm: no interval
    for folder in (out / script_csv.RESULTS_DIR).iterdir():
        [summary_file] = folder.glob("summary_*.csv")
        _, rows = read_csv(summary_file)
        assert [(r["Prefill"], r["Decode"], r["Conc"], r["Num Prompts"]) for r in rows] == [("8", "4", "1", "2")]
        assert float(rows[0]["Benchmark Duration (s)"]) == 2.0
    assert verify_serving_run(out).problems == []
    # planted: one cell of a raw_runs CSV edited (a faster run), a summary deleted, a stray CSV added
    first, second = sorted((out / script_csv.RESULTS_DIR).iterdir())
    [raw_file] = first.glob("raw_runs_*.csv")
    lines = raw_file.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b",2.0,", b",1.5,", 1)
    raw_file.write_bytes(b"\n".join(lines))
    [summary_file] = second.glob("summary_*.csv")
    summary_file.rename(second / "summary_20200101_000000.csv")
    problems = verify_serving_run(out).problems
    stamps = sorted([raw_file.name.removeprefix("raw_runs_").removesuffix(".csv"), "20200101_000000"])
    assert problems == [f"{script_csv.RESULTS_DIR}/ names 2 timestamps ({stamps}), not the run's one"], problems
    (second / "summary_20200101_000000.csv").rename(summary_file)
    (second / "notes.csv").write_text("x\n")
    summary_file.write_text(summary_file.read_text())  # the script's \r\n line ends become \n
    (first / summary_file.name).unlink()
    base = script_csv.RESULTS_DIR
    assert verify_serving_run(out).problems == [
        f"{base}/{first.name}/{raw_file.name}: line 3 is not what runs.jsonl gives",
        f"{base}/{first.name}/{summary_file.name}: missing (runs.jsonl calls for it)",
        f"{base}/{second.name}/notes.csv: not a file runs.jsonl calls for",
        f"{base}/{second.name}/{summary_file.name}: line 1 is not what runs.jsonl gives",
    ]


def fixture_files() -> tuple[Path, Path]:
    raws = sorted(FIXTURE.glob("raw_runs_*.csv"))
    assert len(raws) == 1, f"expected one raw_runs_<timestamp>.csv in {FIXTURE}"
    return raws[0], raws[0].with_name(raws[0].name.replace("raw_runs_", "summary_"))


def test_the_real_vllm_trials_csvs_are_in_the_scripts_format(upstream: Upstream):
    """tests/fixtures/serving/official-tiny: one `serve trial --client official` against the real vLLM CPU
    server (the tests' tiny model; its protocol.toml and runs.jsonl beside them). Its CSVs have the
    script's columns and statuses, and its summary is the script's rule applied to its raw rows."""
    raw_file, summary_file = fixture_files()
    stamp = raw_file.name.removeprefix("raw_runs_").removesuffix(".csv")
    assert upstream.files[0].format(timestamp=stamp) == raw_file.name and summary_file.is_file()
    header, rows = read_csv(raw_file)
    assert header == list(upstream.constants["RAW_CSV_COLUMNS"])
    runs = upstream.constants["RUNS"]
    assert {r["Run Status"] for r in rows} <= set(upstream.statuses) and len(rows) % runs == 0
    cases = [rows[i : i + runs] for i in range(0, len(rows), runs)]
    header, summary = read_csv(summary_file)
    assert header == list(upstream.constants["SUMMARY_CSV_COLUMNS"])
    skip = upstream.constants[upstream.counted_from]
    kept = [c for c in cases if all(r["Run Status"] == "SUCCESS" for r in c[skip:])]
    assert [r["Prefill"] for r in summary] == [c[0]["Prefill"] for c in kept] and kept
    for case_rows, row in zip(kept, summary, strict=True):
        for col in official.METRIC_COLUMNS:
            values = [float(r[col]) for r in case_rows[skip:] if r[col] != ""]
            assert row[col] == ("" if not values else str(round(mean(values), upstream.digits))), col
    # each raw row is what the script reads from that run's client output (logs/CASE/runK.log): its
    # PATTERNS applied as it applies them (re.search, IGNORECASE), to the last printed digit
    for rec, row in zip((json.loads(x) for x in (FIXTURE / "runs.jsonl").read_text().splitlines()), rows, strict=True):
        log = (FIXTURE / "logs" / rec["case"] / f"run{rec['run']}.log").read_text()
        for col, key in upstream.format_keys.items():
            found = re.search(upstream.constants["PATTERNS"][key], log, re.IGNORECASE)
            assert found is not None and row[col] != "", (rec["case"], rec["run"], col)
            assert float(row[col]) == pytest.approx(float(found.group(1)), abs=0.0100001), (rec["case"], col)
        successful = re.search(upstream.constants["PATTERNS"]["successful_requests"], log, re.IGNORECASE)
        assert successful is not None and float(row["Successful Requests"]) == float(successful.group(1))
    # and the trial's own figures (runs.jsonl beside the CSVs)
    recorded = [json.loads(x) for x in (FIXTURE / "runs.jsonl").read_text().splitlines()]
    assert len(recorded) == len(rows)
    for rec, row in zip(recorded, rows, strict=True):
        assert row["Run Status"] == ("SUCCESS" if rec["status"] == "ok" else "FAILED")
        assert float(row["Successful Requests"]) == rec["completed"] == int(row["Num Prompts"])
        assert float(row["Total tok/s"]) == round(rec["total_token_throughput"], 2)
