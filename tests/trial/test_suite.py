"""`kerneltrial suite`: every protocol of a directory run into one suite directory under a tag;
`verify` checks every run and that every listed protocol ran (planted: a tampered run, a
missing run, a run of another protocol, an unlisted run); `report` writes one short report;
an interrupted suite resumes without measuring its finished runs again; the committed
MiniCPM5-2B protocols are runnable as shipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.cli.analysis import verify_one
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import kind_of
from kerneltrial.suite.record import read_suite, suite_problems
from kerneltrial.trial.suite import protocol_dir, protocol_files
from tests.conftest import REPO
from tests.kt import cli_argv, run_cli

# one xdist worker for the whole module: its module-scoped fixture (finished) is built once,
# not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("trial/test_suite")

FIXTURE = REPO / "tests" / "fixtures" / "suite"
RUNS = ["rmsnorm", "silu_and_mul"]
MINICPM = REPO / "protocols" / "minicpm5-2b"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A finished suite over the two fixture protocols, and its --json document."""
    out = tmp_path_factory.mktemp("suite") / "E0"
    result = run_cli("suite", FIXTURE, "--tag", "E0", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)  # stdout is the document alone (runs print on stderr)


@pytest.fixture
def suite_dir(finished: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    """A copy of the finished suite for one test to change."""
    copy = tmp_path / "E0"
    shutil.copytree(finished[0], copy)
    return copy


def gate_exit(run_dir: Path) -> int:
    """`run`'s exit: 0 when an arm passed the gate, 1 when none did (either is a finished run;
    interpreter timings are too noisy to fix which)."""
    return 0 if json.loads((run_dir / "summary.json").read_text())["gate"]["passed_arms"] else 1


def failed_checks(root: Path) -> dict[str, str]:
    return {c.name: c.detail for c in verify_one(root).failures}


@pytest.mark.slow
def test_a_suite_runs_every_protocol_and_verifies_and_reports(suite_dir):
    suite = read_suite(suite_dir)
    assert (suite.name, suite.tag, suite.protocols_dir) == ("suite", "E0", str(FIXTURE))
    assert suite.description == (FIXTURE / "README.md").read_text()
    assert [(r.protocol, r.run, r.status, r.exit_code) for r in suite.runs] == [
        (f"{name}.toml", name, "finished", gate_exit(suite_dir / name)) for name in RUNS
    ]
    assert [r.sha256 for r in suite.runs] == [sha256_file(FIXTURE / f"{name}.toml") for name in RUNS]
    assert suite.started_at <= suite.runs[0].started_at <= suite.runs[1].finished_at <= suite.finished_at
    assert suite.git.source_sha256 and kind_of(suite_dir) == "suite"
    for name in RUNS:
        assert kind_of(suite_dir / name) == "kernel"
        assert (suite_dir / name / "protocol.toml").read_bytes() == (FIXTURE / f"{name}.toml").read_bytes()

    result = run_cli("verify", str(suite_dir))
    assert result.exit_code == 0, result.output
    names = [c.name for c in verify_one(suite_dir).checks]
    assert (
        "rmsnorm: manifest" in names
        and "silu_and_mul: timing rows" in names
        and names[-3:] == ["suite runs", "report.md", "ERRATA.md"]
    )

    result = run_cli("report", str(suite_dir))
    assert result.exit_code == 0, result.output
    report = (suite_dir / "report.md").read_text()
    assert report.startswith("# Suite `suite`, tag `E0`")
    assert "[`rmsnorm`](rmsnorm/report.md)" in report and "[`silu_and_mul`](silu_and_mul/report.md)" in report
    assert "| `2x64/contiguous/bfloat16` |" in report and "`torch_compile` (torch.compile peers run on a GPU" in report
    assert all((suite_dir / name / "report.md").is_file() for name in RUNS)
    assert verify_one(suite_dir).ok  # reports are not part of the evidence


@pytest.mark.slow
def test_suite_json_names_each_run_and_its_status(finished):
    out, document = finished
    assert document == {
        "schema": "kerneltrial.suite-result/1",
        "suite_dir": str(out),
        "name": "suite",
        "tag": "E0",
        "complete": True,
        "runs": [
            {
                "protocol": f"{name}.toml",
                "run_dir": str(out / name),
                "status": "finished",
                "exit_code": gate_exit(out / name),
            }
            for name in RUNS
        ],
    }


@pytest.mark.slow
def test_a_tampered_run_fails_the_suite(suite_dir):
    timings = suite_dir / "silu_and_mul" / "timings.csv"
    rows = timings.read_text().splitlines()
    last = rows[-1].split(",")
    last[6] = str(float(last[6]) * 2)  # planted: one sample twice as slow
    timings.write_text("\n".join([*rows[:-1], ",".join(last)]) + "\n")
    failed = failed_checks(suite_dir)
    assert failed and all(name.startswith("silu_and_mul: ") for name in failed), failed
    result = run_cli("verify", str(suite_dir))
    assert result.exit_code == 1 and "VERIFY FAILED" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["missing run", "another protocol's run", "unlisted run", "unfinished"])
def test_the_suite_record_must_match_its_runs(suite_dir, plant):
    record = json.loads((suite_dir / "suite.json").read_text())
    if plant == "missing run":
        shutil.rmtree(suite_dir / "silu_and_mul")
        expected = "silu_and_mul.toml has no run: silu_and_mul/protocol.toml is missing"
    elif plant == "another protocol's run":  # a verified run, but not of the listed protocol
        shutil.rmtree(suite_dir / "silu_and_mul")
        shutil.copytree(suite_dir / "rmsnorm", suite_dir / "silu_and_mul")
        expected = "silu_and_mul/protocol.toml is not the protocol silu_and_mul.toml the suite ran"
    elif plant == "unlisted run":  # the record rewritten to leave a run out
        record["runs"] = record["runs"][:1]
        (suite_dir / "suite.json").write_text(json.dumps(record))
        expected = "run directories not in suite.json: silu_and_mul"
    else:
        record["runs"][1]["status"] = "running"
        record["finished_at"] = None
        (suite_dir / "suite.json").write_text(json.dumps(record))
        expected = f"silu_and_mul.toml did not finish (status running, exit {record['runs'][1]['exit_code']})"
    failed = failed_checks(suite_dir)
    assert "suite runs" in failed and expected in failed["suite runs"], failed
    assert all(not name.startswith("rmsnorm: ") for name in failed), failed


@pytest.mark.slow
def test_a_run_of_other_code_fails_the_suite(suite_dir):
    record = json.loads((suite_dir / "suite.json").read_text())
    record["git"]["source_sha256"] = "0" * 64  # planted: the suite claims other code than its runs ran
    (suite_dir / "suite.json").write_text(json.dumps(record))
    problems = suite_problems(suite_dir)
    assert sum("ran other code" in p for p in problems) == 2, problems


@pytest.mark.slow
def test_an_interrupted_suite_resumes_without_measuring_finished_runs(tmp_path):
    """Ctrl-C while the second protocol runs: exit 130, the first run finished, the second left
    `running`; `--resume` finishes the second and leaves every byte of the first as it was."""
    out = tmp_path / "E1"
    argv = cli_argv("suite", FIXTURE, "--tag", "E1", "--out", out)
    proc = subprocess.Popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (out / "silu_and_mul" / "correctness.jsonl").exists():  # the second run is measuring
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.decode().splitlines()[-1] == "interrupted", err.decode()[-2000:]
    record = read_suite(out)
    assert [r.status for r in record.runs] == ["finished", "running"] and record.finished_at is None
    assert not (out / "silu_and_mul" / "summary.json").exists()
    assert "suite runs" in failed_checks(out)
    first = {p.relative_to(out): p.read_bytes() for p in (out / "rmsnorm").rglob("*") if p.is_file()}

    result = run_cli("suite", str(FIXTURE), "--tag", "E1", "--out", str(out))
    assert result.exit_code == 2 and "holds a suite; continue it with --resume" in result.output
    result = run_cli("suite", str(FIXTURE), "--tag", "E1", "--out", str(out), "--resume")
    assert result.exit_code == 0, result.output
    assert {p.relative_to(out): p.read_bytes() for p in (out / "rmsnorm").rglob("*") if p.is_file()} == first
    record = read_suite(out)
    assert [r.status for r in record.runs] == ["finished", "finished"] and record.finished_at is not None
    assert verify_one(out).ok, failed_checks(out)


@pytest.mark.slow
def test_resume_records_a_run_that_ended_after_the_suite_stopped_recording(suite_dir):
    """Killed between a run's end and the record's update: --resume takes the ended run as it
    is (`run --resume` would refuse a finished run directory) and runs nothing."""
    record = json.loads((suite_dir / "suite.json").read_text())
    record["runs"][1].update(status="running", exit_code=None, finished_at=None)
    record["finished_at"] = None
    (suite_dir / "suite.json").write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in suite_dir.rglob("*") if p.is_file() and p.name != "suite.json"}
    result = run_cli("suite", str(FIXTURE), "--tag", "E0", "--out", str(suite_dir), "--resume")
    assert result.exit_code == 0, result.output
    assert {p: p.read_bytes() for p in suite_dir.rglob("*") if p.is_file() and p.name != "suite.json"} == before
    suite = read_suite(suite_dir)
    assert [(r.status, r.exit_code) for r in suite.runs] == [
        ("finished", gate_exit(suite_dir / RUNS[0])),
        ("finished", None),
    ]
    assert suite.finished_at is not None and verify_one(suite_dir).ok


def test_suite_refuses_a_tag_that_is_not_a_word(tmp_path):
    result = run_cli("suite", str(FIXTURE), "--tag", "E 0", "--out", str(tmp_path / "s"))
    assert result.exit_code == 2 and "tag 'E 0' is not one word" in result.output
    assert not (tmp_path / "s").exists()


def test_suite_refuses_a_missing_directory_and_a_bad_protocol_before_any_run(tmp_path):
    result = run_cli("suite", "no-such-suite", "--tag", "E0", "--out", str(tmp_path / "s"))
    assert result.exit_code == 2 and "no protocol directory 'no-such-suite'" in result.output
    protocols = tmp_path / "p"
    shutil.copytree(FIXTURE, protocols)
    text = (protocols / "silu_and_mul.toml").read_text()
    (protocols / "silu_and_mul.toml").write_text(text.replace('"kerneltrial"', '"no_such_arm"'))
    result = run_cli("suite", str(protocols), "--tag", "E0", "--out", str(tmp_path / "s"))
    assert result.exit_code == 2 and "no_such_arm" in result.output
    assert not (tmp_path / "s").exists()  # the first protocol did not run either


def test_resume_refuses_other_protocols_or_another_tag(tmp_path):
    """A suite record from another protocol set: --resume refuses before running anything."""
    protocols = tmp_path / "suite"
    shutil.copytree(FIXTURE, protocols)
    out = tmp_path / "out"
    out.mkdir()
    record = {
        "schema": "kerneltrial.suite/1",
        "name": "suite",
        "tag": "E0",
        "protocols_dir": str(protocols),
        "description": None,
        "git": {"commit": None, "dirty": None, "source_sha256": "0" * 64},
        "started_at": "2026-01-01T00:00:00.000+00:00",
        "finished_at": None,
        "runs": [{"protocol": "rmsnorm.toml", "sha256": "0" * 64, "run": "rmsnorm", "status": "pending"}],
    }
    (out / "suite.json").write_text(json.dumps(record))
    result = run_cli("suite", str(protocols), "--tag", "E9", "--out", str(out), "--resume")
    assert result.exit_code == 2 and "holds suite 'suite' tag 'E0', not 'suite' tag 'E9'" in result.output
    result = run_cli("suite", str(protocols), "--tag", "E0", "--out", str(out), "--resume")
    assert result.exit_code == 2 and "was started with other protocols" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["suite.json"]


def test_the_minicpm5_2b_suite_is_runnable_as_shipped():
    """Every protocol of protocols/minicpm5-2b parses, names existing arms and valid cases: the
    operators MiniCPM5-2B runs that we ship, at its widths and the suite's token counts."""
    files = protocol_files(protocol_dir(str(MINICPM)))
    protocols = {f.stem: tomllib.loads(f.read_text()) for f in files}
    widths = {"rmsnorm": 2048, "fused_add_rmsnorm": 2048, "silu_and_mul": 2 * 6144, "softcap_row_argmax": 130560}
    assert {p["op"] for p in protocols.values()} == set(widths) == set(protocols)
    for stem, p in protocols.items():
        assert [c["shape"] for c in p["cases"]] == [[t, widths[stem]] for t in (1, 8, 64, 256, 4096, 16384)]
        assert all((c["layout"], c["dtype"]) == ("contiguous", "bfloat16") for c in p["cases"])
        assert p["l2"] == "cold" and p.get("control", "control") == "control"
        assert {"kerneltrial", "torch_compile"} <= set(p["candidates"])
    for stem in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul"):
        assert {"liger", "flaggems"} <= set(protocols[stem]["candidates"])
    assert "Q/K RMSNorm" in (MINICPM / "README.md").read_text()  # left out, and said why
