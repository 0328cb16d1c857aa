"""Launch lifecycle against a real vLLM CPU server (issue 14): three launches back to back on
one port, and the server gone after `kill -9` of kerneltrial. Needs `bash .ci/serving-setup.sh`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from kerneltrial.serving.launcher import Server, ServerSpec, free_port
from kerneltrial.serving.lifecycle import group_alive, port_is_free
from tests.kt import cli_argv

from .conftest import REPO

pytestmark = [pytest.mark.serving, pytest.mark.slow]


def test_two_launches_back_to_back_on_one_port(vllm_server_cmd, tmp_path: Path) -> None:
    """Each: start, ready, one request (which leaves a connection that vLLM closes), stop. The
    second start on the same port must not be refused (a trial used to abort at its second launch;
    a third launch, once here, is a cold start the suite cannot afford)."""
    make, env, _ = vllm_server_cmd
    port = free_port()
    for k in range(2):
        srv = Server(ServerSpec(make(port), "tiny", port=port, env=env, ready_timeout_s=300), tmp_path / f"{k}.log")
        with srv:
            r = httpx.post(
                f"{srv.spec.base_url}/v1/completions",
                json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
                timeout=120,
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        assert srv.record["group_gone"] and not group_alive(srv.proc.pid)


def test_kill_9_of_kerneltrial_takes_the_vllm_server_with_it(vllm_server_cmd, tmp_path: Path) -> None:
    make, env, _ = vllm_server_cmd
    port = free_port()
    out = tmp_path / "run"
    cmd = cli_argv("serve", "launch", "--hold", "600", "--out", out)
    cmd += ["--model-id", "tiny", "--ready-timeout", "300", "--", *make(port)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    record = Path(os.environ["XDG_STATE_HOME"]) / "kerneltrial" / "servers" / f"port-{port}.json"
    pgid = None
    try:
        end = time.monotonic() + 330
        while time.monotonic() < end and proc.poll() is None:
            if record.is_file() and pgid is None:
                pgid = int(json.loads(record.read_text())["pid"])
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert pgid is not None and group_alive(pgid), proc.stderr.read() if proc.poll() is not None else ""
        proc.kill()
        proc.wait(timeout=10)
        end = time.monotonic() + 90  # the supervisor's SIGINT grace (30 s) + SIGTERM (10 s) + slack
        while time.monotonic() < end and (group_alive(pgid) or not port_is_free("127.0.0.1", port)):
            time.sleep(0.5)
        survived = group_alive(pgid)
        if survived:
            os.killpg(pgid, signal.SIGKILL)
        assert not survived, "the vLLM server group outlived kerneltrial"
        assert port_is_free("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
