"""Records and reports (issue 26, item 6): a launch refused before it spawned is recorded as such,
not as a valid baseline; a failed run verifies as the record of its failure and `verify` says
so; a call count beyond what the launch's requests can produce fails verify. Fake server,
synthetic benchmark client (test_acceptance)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli

from .test_acceptance import run_trial, synthetic_bench, trial_text


def plant_live_claim(port: int, holder: int) -> None:
    """Another kerneltrial (pid `holder`, alive) claims the port: the next launch on it is refused."""
    path = Path(os.environ["XDG_STATE_HOME"]) / "kerneltrial" / "servers" / f"port-{port}.json"
    claim = {"port": port, "host": "127.0.0.1", "pid": None, "start_ticks": None, "kerneltrial_pid": holder}
    claim |= {"run_dir": "run-other", "argv": ["vllm"], "started_at": "t", "kerneltrial_ticks": None}
    path.write_text(json.dumps(claim))


def test_a_launch_refused_before_it_spawned_is_recorded_as_refused_not_as_a_baseline(tmp_path, monkeypatch):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    base = synthetic_bench(lambda arm, L: (1.0, 1.0))

    def bench(argv, json_path, log_path, timeout_s, server=None):
        plant_live_claim(server.spec.port, sleeper.pid)  # while launch 0 runs: launch 1 will be refused
        return base(argv, json_path, log_path, timeout_s, server)

    try:
        code, output, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=1), bench)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert code == 1 and f"claimed by kerneltrial pid {sleeper.pid}" in output, output
    first, second = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert first["status"] == "ok" and first["spawned"] and first["dispatch"]["valid"]
    assert second["status"] == "refused" and second["spawned"] is False and "dispatch" not in second
    assert "pid" not in second and "claimed by kerneltrial" in second["error"]
    summary = json.loads((out / "summary.json").read_text())
    refused = summary["dispatch"][second["arm"]]
    assert refused["valid"] is False and refused["reason"] == "launch 1 was refused before it started: it ran nothing"
    assert summary["status"] == "failed" and "refused before it started" in summary["failures"][0]
    assert verify_serving_run(out).problems == []  # the record of what happened verifies
    r = run_cli("verify", str(out))
    assert r.exit_code == 0, r.output
    assert "ok   run finished: provenance.json records the end of a FAILED run (" in r.output
    assert "it is no evidence for any arm" in r.output
    # tampering: the refused launch given a valid baseline verdict, as before issue 26
    rows = [first, second | {"status": "ok", "dispatch": first["dispatch"] | {"launch": 1}}]
    (out / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert any(
        "never spawned, but records status 'ok' and a dispatch verdict" in p for p in verify_serving_run(out).problems
    )


def test_verify_of_a_finished_run_says_nothing_of_failure(tmp_path, monkeypatch):
    code, _, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=1), synthetic_bench(lambda a, L: (1, 1)))
    r = run_cli("verify", str(out))
    assert r.exit_code == 0 and "ok   run finished: provenance.json records the end of the run\n" in r.output, r.output


def test_a_forged_call_count_beyond_what_the_requests_allow_fails_verify(tmp_path, monkeypatch):
    """A consistent rewrite (record, its sha256, the launch's and the summary's counts) claiming 10^9
    calls for the launch's few requests: only the plausibility bound catches it."""
    text = trial_text(rounds=1).replace(
        'role = "candidate"\n', 'role = "candidate"\nenv = { KERNELTRIAL_VLLM_OPS = "rms_norm" }\n'
    )
    text = text.replace('role = "baseline"\n', 'role = "baseline"\nenv = {}\n')
    code, output, out = run_trial(tmp_path, monkeypatch, text, synthetic_bench(lambda a, L: (1, 1)))
    assert verify_serving_run(out).problems == [], output
    rows = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    b = next(x for x in rows if x["arm"] == "B")
    [rec] = (out / b["dispatch"]["dir"]).glob("dispatch-*.json")
    doc = json.loads(rec.read_text())
    for c in doc["counts"]:
        c["calls"] = 10**9
    rec.write_text(json.dumps(doc))
    b["dispatch"]["files"] = {rec.name: sha256_file(rec)}
    for c in b["dispatch"]["counts"]:
        c["calls"] = 10**9
    (out / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    summary = json.loads((out / "summary.json").read_text())
    for c in summary["dispatch"]["B"]["counts"]:
        c["calls"] = 10**9
    (out / "summary.json").write_text(json.dumps(summary))
    problems = verify_serving_run(out).problems
    assert problems and all("more than the launch's requests can produce" in p for p in problems), problems
    assert f"launch {b['launch']} (B): 1000000000 calls of fused_add_rms_norm by kerneltrial" in problems[0]


def test_a_deleted_proof_of_dispatch_fails_verify(tmp_path, monkeypatch):
    """No downgrade: deleting `dispatch` from plan.json, summary.json and every launch row of a run
    that records a launch nonce does not turn the proof into "not applicable"."""
    code, output, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=1), synthetic_bench(lambda a, L: (1, 1)))
    assert verify_serving_run(out).problems == [], output
    for name in ("plan.json", "summary.json"):
        doc = json.loads((out / name).read_text())
        doc.pop("dispatch")
        (out / name).write_text(json.dumps(doc))
    rows = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    (out / "launches.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in x.items() if k != "dispatch"}) + "\n" for x in rows)
    )
    problems = verify_serving_run(out).problems
    assert any("no proof of dispatch in plan.json, summary.json or launches.jsonl" in p for p in problems), problems
