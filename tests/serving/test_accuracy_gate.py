"""The accuracy gate's sample size in a trial (issue 14): two correct answers from a two-problem
file do not pass a gate that needs the full Level 3 set, and verify recomputes that rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kerneltrial.serving import trial
from kerneltrial.serving.crossgrade import GraderSource, evalscope_grader
from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.verify import verify_serving_run

from .conftest import FAKE
from .test_serving_report import fake_bench


def two_problem_trial(
    tmp_path: Path,
    monkeypatch,
    name: str,
    accuracy: str = "",
    cross_grader: GraderSource = evalscope_grader,
    server_args: tuple[str, ...] = (),
) -> tuple[Path, dict]:
    """A trial (fake servers, fake bench) whose accuracy data is two problems; `accuracy`: more
    [accuracy] keys; `cross_grader`: the cross-grade's grader; `server_args`: more options of the
    fake server. Its run directory and summary."""
    data = tmp_path / "two.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"p{i}", "answer": "42", "level": 3, "unique_id": f"u{i}"}) + "\n" for i in (0, 1)
        )
    )
    argv = json.dumps([sys.executable, str(FAKE), "--port", "{port}", *server_args])
    arms = "".join(
        f'[[arms]]\nname = "{n}"\nrole = "{r}"\nargv = {argv}\n' for n, r in (("E0", "baseline"), ("E1", "candidate"))
    )
    text = (
        f'name = "{name}"\nrepeats = 2\n[server]\nmodel_id = "tiny"\nport = {free_port()}\nready_timeout_s = 30\n'
        f'stop_grace_s = 5\n[bench]\ncases = [[8, 4, 1, 2]]\n[accuracy]\ndata = "{data}"\n{accuracy}concurrency = 2\n{arms}'
    )
    monkeypatch.setattr(trial, "run_bench", fake_bench)
    out = tmp_path / "run"
    proto = parse_protocol(text)
    summary = trial.run_protocol(proto, text.encode(), out, sys.executable, argv=["test"], cross_grader=cross_grader)
    return out, summary.as_json()


def test_a_gate_on_two_problems_fails_and_verify_holds_it(tmp_path: Path, monkeypatch) -> None:
    out, summary = two_problem_trial(tmp_path, monkeypatch, "n-gate")
    acc = summary["accuracy"]["E1"]
    assert (acc["n"], acc["correct"], acc["required_n"]) == (2, 2, 105) and not acc["passed"]
    assert verify_serving_run(out).problems == []
    written = json.loads((out / "summary.json").read_text())
    written["accuracy"]["E1"]["passed"] = True  # planted: the gate called passed on 2 of 105
    (out / "summary.json").write_text(json.dumps(written))
    assert any("accuracy E1: passed" in p for p in verify_serving_run(out).problems)
