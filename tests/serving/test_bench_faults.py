"""Benchmark-stage faults with the real `vllm bench serve` client against the fake server."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from kerneltrial.serving.launcher import group_alive
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import cli_argv, run_cli

from .conftest import REPO

pytestmark = [pytest.mark.serving, pytest.mark.slow]


def test_bench_against_fake_server_and_verify(tmp_path, port, fake_argv, vllm_client, vllm_server_cmd):
    _, _, model = vllm_server_cmd
    out = tmp_path / "run"
    r = run_cli(
        "serve",
        "bench",
        "--launch",
        "--quiet",
        "--vllm",
        vllm_client,
        "--tokenizer",
        model,
        "--model-id",
        "tiny",
        "--cases",
        "[[32, 8, 2, 4]]",
        "-r",
        "2",
        "--out",
        str(out),
        "--",
        *fake_argv(port),
    )
    assert r.exit_code == 0, r.output
    assert verify_serving_run(out).problems == []
    assert run_cli("verify", str(out)).exit_code == 0  # the main verify dispatches on kind
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["total_output_tokens"] == 32 for r in rows)
    # tampering is caught
    s = json.loads((out / "summary.json").read_text())
    s["results"]["server"]["in32-out8-c2-n4"]["total_token_throughput"] *= 1.01
    (out / "summary.json").write_text(json.dumps(s))
    assert any("total_token_throughput" in p for p in verify_serving_run(out).problems)
    assert run_cli("verify", str(out)).exit_code == 1
    (out / "protocol.toml").write_text((out / "protocol.toml").read_text() + "\n# edited\n")
    assert any("protocol_sha256" in p for p in verify_serving_run(out).problems)


def test_server_killed_mid_benchmark(tmp_path, port, fake_argv, vllm_client, vllm_server_cmd):
    _, _, model = vllm_server_cmd
    out = tmp_path / "run"
    pidfile = tmp_path / "pid"
    r = run_cli(
        "serve",
        "bench",
        "--launch",
        "--quiet",
        "--vllm",
        vllm_client,
        "--tokenizer",
        model,
        "--model-id",
        "tiny",
        "--cases",
        "[[32, 64, 2, 12]]",
        "-r",
        "2",
        "--out",
        str(out),
        "--",
        *fake_argv(port, "--die-after", "6", "--token-delay", "0.01", "--spawn-child", "--pidfile", str(pidfile)),
    )
    assert r.exit_code == 1, r.output
    assert "server exited with code 9 during the benchmark" in r.output
    assert not group_alive(int(pidfile.read_text()))
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert rows[-1]["status"] == "FAILED"
    assert (out / "launches" / "00-server" / "server.log").read_text().count("dying at request") == 1
    assert (out / "raw" / "00-server" / "in32-out64-c2-n12" / "run0.log").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failures"]


def test_incomplete_run_fails_the_case(tmp_path, port, fake_argv, vllm_client, vllm_server_cmd):
    """A server that dies only after the client wrote its JSON: completed != num_requests."""
    from kerneltrial.serving import bench, metrics

    raw = {
        "duration": 1.0,
        "input_lens": [1, 1],
        "output_lens": [2, 0],
        "ttfts": [0.1, 0.0],
        "itls": [[0.1], []],
        "latencies": [0.2, 0.0],
        "errors": ["", "Internal Server Error"],
    }
    m = metrics.run_metrics(raw)
    assert m["completed"] == 1 and m["failed"] == 1
    assert [r["success"] for r in bench.request_rows(raw)] == [True, False]


def test_bad_vllm_path_is_one_line_error(tmp_path, port, fake_argv):
    r = run_cli(
        "serve",
        "bench",
        "--launch",
        "--vllm",
        "/nonexistent/vllm",
        "--model-id",
        "tiny",
        "--cases",
        "[[8,8,1,1]]",
        "--out",
        str(tmp_path / "r"),
        "--",
        *fake_argv(port),
    )
    assert r.exit_code == 2 and "vllm executable '/nonexistent/vllm' not found" in r.output
    assert "Traceback" not in r.output


def test_sigint_during_bench_keeps_raw_and_stops_server(tmp_path, port, fake_argv, vllm_client, vllm_server_cmd):
    _, _, model = vllm_server_cmd
    out = tmp_path / "run"
    pidfile = tmp_path / "pid"
    cmd = cli_argv(
        "serve",
        "bench",
        "--launch",
        "--quiet",
        "--vllm",
        vllm_client,
        "--tokenizer",
        model,
        "--model-id",
        "tiny",
        "--cases",
        "[[32, 16, 2, 8]]",
        "-r",
        "50",
        "--out",
        str(out),
        "--",
        *fake_argv(port, "--spawn-child", "--pidfile", str(pidfile)),
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 180
        runs = out / "runs.jsonl"
        while time.monotonic() < end and not (runs.is_file() and runs.read_text().strip()):
            time.sleep(0.3)
        assert runs.is_file(), "no run finished in time"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and str(out) in err.replace("\n", "")
    assert not group_alive(int(pidfile.read_text()))
    assert (out / "raw" / "00-server" / "in32-out16-c2-n8" / "run0.json").is_file()
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["status"] == "interrupted" and prov["finished_at"]
    assert not (out / "summary.json").exists()
