"""The host-cost stage (issue 16) on the CPU: host.csv rows for every timed arm and case, resume
without duplicates, summary/5 figures that verify recomputes, and tampering verify catches."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from kerneltrial.kernel.report import write_report
from kerneltrial.kernel.summary import write_summary
from kerneltrial.kernel.summary_schemas import SCHEMA
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.summary_doc import read_summary
from kerneltrial.trial.runner import run_trial
from kerneltrial.trial.timing import CPU_HOST_CALLS
from tests.conftest import REPO
from tests.kt import write_protocol

PROTOCOL = """
name = "host-cost"
op = "rmsnorm"
candidates = ["packed_r4_w4", "user:wrong_rmsnorm"]
impl_modules = ["{module}"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
host_samples = 3
[[cases]]
shape = [4, 64]
[[cases]]
shape = [3, 200]
layout = "row_strided"
"""
TIMED = {"control", "packed_r4_w4"}  # the wrong kernel fails correctness: never timed, no host cost


def run(tmp_path: Path) -> Path:
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL, module=REPO / "tests" / "fixtures" / "wrong_rmsnorm.py")
    return run_trial(protocol, tmp_path / "run")


def host_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "host.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def failed_checks(run_dir: Path) -> dict[str, str]:
    return {c.name: c.detail for c in verify_run_dir(run_dir).failures}


def test_host_stage_measures_every_timed_arm_and_case_and_verifies(tmp_path):
    out = run(tmp_path)
    rows = host_rows(out)
    cases = {c["case"] for c in json.loads((out / "plan.json").read_text())["cases"]}
    keys = [(r["case"], r["arm"], int(r["sample"])) for r in rows]
    assert sorted(keys) == sorted((c, a, s) for c in cases for a in TIMED for s in range(3))
    assert all(int(r["calls"]) == CPU_HOST_CALLS and int(r["ns"]) > 0 and r["behind"] == "0" for r in rows)
    summary = read_summary(out)
    assert summary.schema_ == SCHEMA and summary.host is not None and summary.host.rows == len(rows)
    for case in summary.cases:
        for name, entry in case.arms.items():
            assert (entry.host_ns_per_call is not None) == (name in TIMED)
            assert entry.host_samples == (3 if name in TIMED else 0) and entry.host_behind == 0
    assert verify_run_dir(out).ok, failed_checks(out)
    text = write_report(out).read_text()
    assert "host µs" in text and "NOT GPU performance" in text


def test_resume_after_an_interrupted_host_stage_adds_only_the_missing_rows(tmp_path):
    out = run(tmp_path)
    complete = host_rows(out)
    # as if killed inside the host stage: three rows and half a fourth on disk, nothing after
    lines = (out / "host.csv").read_text().splitlines(keepends=True)
    (out / "host.csv").write_text("".join(lines[:4]) + lines[4][:5])
    for name in ("summary.json", "manifest.json"):
        (out / name).unlink()
    record = json.loads((out / "provenance.json").read_text())
    record["finished_at"] = None
    (out / "provenance.json").write_text(json.dumps(record))
    run_trial(tmp_path / "p.toml", out, resume=True)
    rows = host_rows(out)
    keys = [(r["case"], r["arm"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(complete)
    assert rows[:3] == complete[:3]  # kept, not measured again
    assert verify_run_dir(out).ok, failed_checks(out)


def test_tampered_host_cost_fails_verify(tmp_path):
    out = run(tmp_path)

    def planted(name: str) -> Path:
        copy = tmp_path / name
        shutil.copytree(out, copy)
        return copy

    # host times edited after the summary: the hash and the recomputed medians disagree
    edited = planted("edited")
    rows = [r | {"ns": str(int(r["ns"]) * 50)} for r in host_rows(edited)]
    with (edited / "host.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    failures = failed_checks(edited)
    assert "host.csv" in failures["raw files unchanged since summary"] and "host_ns_per_call" in failures["host cost"]

    # a sample dropped and the summary rewritten to match: the coverage check still misses it
    dropped = planted("dropped")
    lines = (dropped / "host.csv").read_text().splitlines(keepends=True)
    (dropped / "host.csv").write_text("".join(lines[:-1]))
    write_summary(dropped, overwrite=True)
    assert "1 host sample(s) missing" in failed_checks(dropped)["host cost"]

    # a summary figure edited: recomputed from the rows, it differs
    figure = planted("figure")
    summary = json.loads((figure / "summary.json").read_text())
    summary["cases"][0]["arms"]["packed_r4_w4"]["host_ns_per_call"] /= 2
    (figure / "summary.json").write_text(json.dumps(summary))
    assert "packed_r4_w4 host_ns_per_call" in failed_checks(figure)["host cost"]

    # plan.json host settings other than the protocol's
    plan_edit = planted("plan")
    plan = json.loads((plan_edit / "plan.json").read_text())
    plan["host"]["samples"] = 2
    (plan_edit / "plan.json").write_text(json.dumps(plan))
    assert "host.samples: plan.json has 2" in failed_checks(plan_edit)["plan matches protocol"]
