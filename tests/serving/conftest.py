"""Fixtures for the serving tests: paths, the vLLM CPU venv, the tiny model, a fake server, and
one real two-launch trial that several tests read."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kerneltrial.serving.launcher import free_port
from tests.kt import run_cli, write_protocol

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAKE = HERE / "fake_server.py"


def start_times(n: int, duration: float, latency: float) -> list[float]:
    """Per-request start times (perf_counter seconds) of n requests of one latency, one after
    another, the last ending when the run's duration does: what `--save-detailed` records and
    verify checks the duration against (serving/verify_evidence.py)."""
    return [100.0 + i * (duration - latency) / max(n - 1, 1) for i in range(n)]


def answer_as_served(server: Any, n: int) -> None:
    """What a real client's run leaves in the server's own ledger (serving/served.py): `n`
    completions, sent to the launch's server. The fake clients call it before they write their
    synthetic raw file (none for an external server: there is no ledger)."""
    if server is None or getattr(server, "ledger", None) is None:
        return
    for _ in range(n):
        body = {"model": server.served_name, "prompt": "x", "max_tokens": 1}
        httpx.post(f"{server.spec.base_url}/v1/completions", json=body, timeout=10.0)  # whoever answers


def vllm_venv() -> Path:
    return Path(os.environ.get("KERNELTRIAL_VLLM_VENV", REPO / ".vllm-venv"))


def tiny_model() -> Path:
    return Path(os.environ.get("KERNELTRIAL_TINY_MODEL", REPO / ".cache" / "tiny-llama"))


def shared() -> Path:
    """The shared data and vendored sources next to the checkout (../shared), or $KERNELTRIAL_SHARED
    (a worktree elsewhere points it at the checkout's)."""
    return Path(os.environ.get("KERNELTRIAL_SHARED") or REPO.parent / "shared")


def math500() -> Path:
    return shared() / "data" / "math500" / "test.jsonl"


def official_script() -> Path:
    """The organisers' throughput script, upstream vllm-plugin-FL's benchmark_throughput_serve.py, vendored
    byte-exact (../shared/vendor/README.md): what `--client official` runs."""
    return shared() / "vendor" / "flagos-benchmarks" / "benchmark_throughput_serve.py"


def flagos_chat_script() -> Path:
    """The fork's chat throughput script in the vendored vllm-plugin-FL snapshot: `--client flagos-chat`."""
    return shared() / "vendor" / "vllm-plugin-FL" / "benchmarks" / "benchmark_throughput_flagos.py"


@pytest.fixture(scope="session", autouse=True)
def typed_argv() -> Any:
    """An in-process `run_cli` (typer's CliRunner) records the command line a user would have typed:
    serving runs keep sys.argv in provenance.json `argv`, and verify derives plan.json `effective`
    from it (serving/effective.py); under CliRunner sys.argv would be pytest's own."""
    invoke = CliRunner.invoke

    def typed(self: CliRunner, cli: Any, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", ["kerneltrial", *map(str, args or [])])
            return invoke(self, cli, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CliRunner, "invoke", typed)
        yield


@pytest.fixture(autouse=True)
def server_records(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Launched servers' port records (serving/lifecycle.py) go to a folder of the test's own, not
    the user's state folder; subprocesses inherit it."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state / "kerneltrial" / "servers"


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fake_argv():
    def make(port: int, *extra: str) -> list[str]:
        return [sys.executable, str(FAKE), "--port", str(port), *extra]

    return make


@pytest.fixture(scope="session")
def math500_path() -> Path:
    p = math500()
    if not p.is_file():
        pytest.skip(f"MATH-500 not found at {p} (expected at ../shared/data/math500/test.jsonl)")
    return p


@pytest.fixture(scope="session")
def vllm_client() -> str:
    """The `vllm` CLI of the CPU venv (the kt-vllm shim written by .ci/serving-setup.sh)."""
    exe = vllm_venv() / "bin" / "kt-vllm"
    if not exe.is_file():
        pytest.skip(f"no vLLM venv at {vllm_venv()} (run bash .ci/serving-setup.sh)")
    return str(exe)


@pytest.fixture(scope="session")
def vllm_server_cmd(vllm_client: str):
    """Builder of the real vLLM CPU server argv and env for the tiny model."""
    venv = vllm_venv()
    model = tiny_model()
    if not (model / "config.json").is_file():
        pytest.skip(f"no tiny model at {model} (run bash .ci/serving-setup.sh)")
    env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)

    def make(port: int | str) -> list[str]:
        """--enforce-eager: no torch.compile warm-up, a cold start in 27 s instead of 52 s on 2 loaded
        cores (measured 2026-12-02, vllm-cpu 0.32.0; the organisers' script serves with it too).
        Without the warm-up's forward passes a server answering one request may stop before its
        dispatch records flush (seen once): the dispatch-proof test sends a trial's requests."""
        return [
            str(venv / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--load-format",
            "dummy",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "8",
            "--enforce-eager",
        ]

    return make, env, str(model)


@dataclass(frozen=True)
class RealTrial:
    """A finished `serve trial` of real vLLM CPU launches: its protocol, run directory, and the CLI's
    exit code and output."""

    protocol: Path
    out: Path
    exit_code: int
    output: str


def e0_e1_protocol(make: Callable[[int | str], list[str]], env: dict[str, str], model: str) -> str:
    """E0 (baseline: the plugin records dispatch, swaps nothing) and E1 (candidate: kerneltrial's
    RMSNorm swapped in through the plugin), both through the Triton interpreter so that they differ
    in operator selection only; with the accuracy gate when MATH-500 is there."""
    base = {**env, "TRITON_INTERPRET": "1"}  # VLLM_DISABLE_COMPILE_CACHE=1: the trial sets it
    lines = [
        'name = "tiny-e0-e1"',
        "seed = 7",
        "rounds = 1",
        "repeats = 2",
        "[server]",
        'model_id = "tiny"',
        f"port = {free_port()}",
        f"tokenizer = {json.dumps(model)}",
        "ready_timeout_s = 600",
        "[bench]",
        "cases = [[32, 4, 2, 2]]",
        "[acceptance]",
        "noise_band = 0.01",
        "ttft_ratio_max = 1.01",
    ]
    if math500().is_file():
        lines += ["[accuracy]", f"data = {json.dumps(str(math500()))}", "limit = 2", "max_tokens = 16"]
    for name, role, extra in (("E0", "baseline", {}), ("E1", "candidate", {"KERNELTRIAL_VLLM_OPS": "rms_norm"})):
        lines += [
            "[[arms]]",
            f'name = "{name}"',
            f'role = "{role}"',
            f"argv = {json.dumps(make('{port}'))}",
            "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in {**base, **extra}.items()) + " }",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def e0_e1_trial(vllm_server_cmd: Any, vllm_client: str, tmp_path_factory: pytest.TempPathFactory) -> RealTrial:
    """One real `serve trial` of E0 and E1 (e0_e1_protocol), read, never written, by the tests of the
    A/B verdict (test_real_vllm.py), the proof of dispatch (test_vllm_plugin.py) and the vLLM files
    the servers imported (test_dist_imports.py). Each launch is a cold start (30-60 s on CI's two
    cores): two launches for the three, where two trials of their own and a server took five."""
    make, env, model = vllm_server_cmd
    root = tmp_path_factory.mktemp("e0-e1")
    proto = write_protocol(root / "e0-e1.toml", e0_e1_protocol(make, env, model))
    out = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(root / "state"))  # the port records: not the user's (server_records)
        r = run_cli("serve", "trial", str(proto), "--vllm", vllm_client, "--quiet", "--out", str(out))
    return RealTrial(proto, out, r.exit_code, r.output)
