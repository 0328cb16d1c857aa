"""A trial whose inputs are wrong stops before it writes or launches anything (issue 14): a
missing MATH-500 file used to surface after the first launch's whole throughput phase. Every
input has its case: data file, server executable, benchmark client, model, tokenizer, port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltrial.serving.accuracy import AccuracyError
from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.lifecycle import record_server
from kerneltrial.serving.preflight import PreflightError, check_inputs, check_model_ref
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.trial import run_protocol
from tests.kt import run_cli, write_protocol


def protocol_text(
    marker: Path, data: str | None = None, server: str = "", exe: str = sys.executable, port: int | None = None
) -> str:
    """Two arms whose 'server' only leaves `marker` behind: it exists if anything was launched."""
    argv = json.dumps([exe, "-c", f"open({str(marker)!r}, 'w').close()"])
    arms = "".join(
        f'[[arms]]\nname = "{n}"\nrole = "{r}"\nargv = {argv}\n' for n, r in (("a", "baseline"), ("b", "candidate"))
    )
    accuracy = f'[accuracy]\ndata = "{data}"\n' if data else ""
    return (
        f'name = "fail-early"\n[server]\nmodel_id = "tiny"\nport = {port or free_port()}\nport_wait_s = 1\n{server}'
        f"[bench]\ncases = [[8, 4, 1, 2]]\n{accuracy}{arms}"
    )


def test_a_missing_accuracy_file_stops_the_trial_before_anything_runs(tmp_path: Path) -> None:
    marker, out = tmp_path / "launched", tmp_path / "run"
    text = protocol_text(marker, str(tmp_path / "no-such-math500.jsonl"))
    with pytest.raises(AccuracyError, match="no-such-math500.jsonl not found"):
        run_protocol(parse_protocol(text), text.encode(), out, sys.executable, argv=["test"])
    assert not out.exists() and not marker.exists()


def test_the_cli_refuses_it_with_exit_2_and_one_line(tmp_path: Path) -> None:
    marker, out = tmp_path / "launched", tmp_path / "run"
    protocol = write_protocol(
        tmp_path / "p.toml", protocol_text(marker, "no-such-math500.jsonl")
    )  # relative: the protocol's folder
    result = run_cli("serve", "trial", protocol, "--out", out, "--quiet", "--vllm", sys.executable)
    assert result.exit_code == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: MATH-500 file") and "no-such-math500.jsonl not found" in line
    # the fix `serve trial` can take: the protocol's key (it has no --data option; issue 26)
    assert line.endswith("set [accuracy] data (relative to the protocol's folder) to the path of a test.jsonl")
    assert "--data" not in line
    assert not out.exists() and not marker.exists()


def refused(tmp_path: Path, text: str, vllm: str = sys.executable) -> str:
    """The PreflightError of run_protocol on `text`, after checking nothing was written or launched."""
    marker, out = tmp_path / "launched", tmp_path / "run"
    with pytest.raises(PreflightError) as e:
        run_protocol(parse_protocol(text, tmp_path), text.encode(), out, vllm, argv=["test"])
    assert not out.exists() and not marker.exists()
    return str(e.value)


def test_a_missing_server_executable(tmp_path: Path) -> None:
    msg = refused(tmp_path, protocol_text(tmp_path / "launched", exe="/opt/nowhere/bin/vllm"))
    assert msg.startswith("server executable of arm a '/opt/nowhere/bin/vllm' not found") and "fix arms.argv[0]" in msg


def test_a_server_executable_that_is_not_executable(tmp_path: Path) -> None:
    plain = tmp_path / "vllm"
    plain.write_text("#!/bin/sh\n")  # no x bit
    assert "not an executable file" in refused(tmp_path, protocol_text(tmp_path / "launched", exe=str(plain)))


def test_a_missing_benchmark_client(tmp_path: Path) -> None:
    msg = refused(tmp_path, protocol_text(tmp_path / "launched"), vllm="/opt/nowhere/bin/vllm")
    assert msg.startswith("vllm benchmark client '/opt/nowhere/bin/vllm' not found") and "--vllm" in msg


def test_a_missing_model_path(tmp_path: Path) -> None:
    text = protocol_text(tmp_path / "launched", server='model = "/models/no-such-model"\n')
    assert refused(tmp_path, text) == (
        "server.model /models/no-such-model does not exist; fix server.model or pass --model PATH"
    )


def test_a_missing_tokenizer_path(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    text = protocol_text(tmp_path / "launched", server=f'model = "{tmp_path / "model"}"\ntokenizer = "./tok/none"\n')
    assert refused(tmp_path, text) == "server.tokenizer ./tok/none does not exist; fix server.tokenizer"


def test_a_hub_id_needs_the_hub_or_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    online: dict[str, str] = {}
    check_model_ref("server.model", "org/model", online, "fix it")  # may be downloaded: allowed
    with pytest.raises(PreflightError, match=r"'org/model' is not a local path .* HF_HUB_OFFLINE is set"):
        check_model_ref("server.model", "org/model", {"HF_HUB_OFFLINE": "1"}, "fix it")
    (tmp_path / "hub" / "models--org--model").mkdir(parents=True)
    check_model_ref("server.model", "org/model", {"HF_HUB_OFFLINE": "1"}, "fix it")  # cached: allowed offline


def test_the_server_sees_its_arms_env_and_the_client_runs_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    (tmp_path / "tok").mkdir()
    hub = 'model = "org/model"\n'
    local_tokenizer = protocol_text(tmp_path / "launched", server=f'{hub}tokenizer = "{tmp_path / "tok"}"\n')
    check_inputs(parse_protocol(local_tokenizer), sys.executable)  # the server may download org/model
    offline_arms = local_tokenizer.replace("argv = ", 'env = { HF_HUB_OFFLINE = "1" }\nargv = ')
    assert refused(tmp_path, offline_arms).startswith("server.model 'org/model' is not a local path")
    # no tokenizer: the benchmark client loads org/model's tokenizer, offline (bench.run_bench)
    msg = refused(tmp_path, protocol_text(tmp_path / "launched", server=hub))
    assert msg.startswith("server.model (the benchmark client's tokenizer) 'org/model' is not a local path")
    assert msg.endswith("set server.tokenizer to a local path, or set HF_HUB_OFFLINE=0 to allow the download")


def _listener(port: int) -> subprocess.Popen[str]:
    code = f"import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\nprint('up', flush=True)\ntime.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def test_a_port_held_by_a_stale_server_is_named_with_exit_2(tmp_path: Path) -> None:
    """A server left by a killed run (planted: a listener and its port record) is named, with the fix."""
    port = free_port()
    stale = _listener(port)
    try:
        record_server(port, "127.0.0.1", stale.pid, tmp_path / "killed-run", ["vllm", "serve", "m"])
        protocol = write_protocol(tmp_path / "p.toml", protocol_text(tmp_path / "launched", port=port))
        result = run_cli("serve", "trial", protocol, "--out", tmp_path / "run", "--quiet", "--vllm", sys.executable)
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()
    assert result.exit_code == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: a server from run {tmp_path / 'killed-run'} (pid {stale.pid}, started at ")
    assert line.endswith(f"holds port {port}, bound or not; stop it with `kill -- -{stale.pid}`")
    assert not (tmp_path / "run").exists() and not (tmp_path / "launched").exists()


def test_a_port_held_by_anything_else_is_refused_after_the_wait(tmp_path: Path) -> None:
    port = free_port()
    holder = _listener(port)
    try:
        msg = refused(tmp_path, protocol_text(tmp_path / "launched", port=port))
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert msg.startswith(f"port {port} on 127.0.0.1 is already taken after waiting 1 s: pid {holder.pid} (")
