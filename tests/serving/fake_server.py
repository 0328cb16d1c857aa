"""A tiny OpenAI-compatible server for fault tests (stdlib only, loopback only).

  python fake_server.py --port P [--model-id tiny] [--served-model-name NAME ...] [--mode ok|503|exit]
                        [--die-after N] [--ignore-sigint] [--spawn-child] [--pidfile F] [--answer TEXT]
                        [--reuse-port] [--bind-delay S] [--show-seed]

/v1/models lists the --served-model-name names (as vLLM does), else --model-id (mode ok),
answers 503 (mode 503); mode exit quits at once with code 3. A request naming another model
gets 404, as from vLLM. --reuse-port binds with SO_REUSEPORT (as vLLM does: a second server may
share the port); --bind-delay S waits S seconds before binding (vLLM binds after its start-up). /v1/completions streams max_tokens chunks like vLLM (and a usage chunk);
/v1/chat/completions answers --answer (--show-seed: followed by " seed=N", the request's seed,
for a protocol's argv, which takes no braces). --die-after N: the process exits (code 9) when the
N-th completion request arrives. --spawn-child starts a sleeping child in the same process
group (to check that the whole group is stopped). With KERNELTRIAL_DISPATCH_LOG set (the
trial sets it) it writes the call record kerneltrial's vLLM plugin would write for the ops
KERNELTRIAL_VLLM_OPS selects; with `--middleware kerneltrial.plugins.ledger.Ledger` (as the
launcher asks of vLLM) it writes kerneltrial's served ledger, one line per answered request, with
that module's own writer (the only imports outside the standard library).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ARGS: argparse.Namespace
LEDGER = None  # kerneltrial's ledger middleware (plugins/ledger.py), with --middleware naming it
LEDGER_RECORD = None
COUNT = 0
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *a: object) -> None:
        sys.stdout.write(f"{self.address_string()} {fmt % a}\n")
        sys.stdout.flush()

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        super().send_response(code, message)

    def handle_one_request(self) -> None:
        """As the base class; then, with kerneltrial's ledger middleware asked for, its line (plugins/ledger.py)."""
        t0, self.status, self.last_byte = time.monotonic(), 0, None
        super().handle_one_request()
        if LEDGER is not None and self.status:
            t1 = self.last_byte or time.monotonic()  # as the middleware: read before the last byte leaves
            LEDGER.write(LEDGER_RECORD(self.path.split("?")[0], self.status, t0, t1))

    def _json(self, code: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.last_byte = time.monotonic()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/v1/models"):
            if ARGS.mode == "503":
                self._json(503, {"error": "loading"})
            else:
                self._json(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names()]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        global COUNT
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        if body.get("model") and body["model"] not in names():
            self._json(404, {"error": f"The model `{body['model']}` does not exist."})
            return
        with LOCK:
            COUNT += 1
            if ARGS.die_after and COUNT >= ARGS.die_after:
                sys.stdout.write(f"dying at request {COUNT}\n")
                sys.stdout.flush()
                os._exit(9)
        if self.path.startswith("/v1/chat/completions"):
            self._json(
                200,
                {
                    "choices": [
                        {
                            # an --answer with {seed} in it shows the request's seed (the accuracy samples' tests)
                            "message": {
                                "role": "assistant",
                                "content": ARGS.answer.replace("{seed}", str(body.get("seed")))
                                + (f" seed={body.get('seed')}" if ARGS.show_seed else ""),
                            },
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"completion_tokens": 5},
                },
            )
            return
        if not self.path.startswith("/v1/completions"):
            self._json(404, {"error": "not found"})
            return
        max_tokens = int(body.get("max_tokens") or 16)
        if not body.get("stream"):
            self._json(
                200, {"choices": [{"text": ARGS.answer, "finish_reason": "stop"}], "usage": {"completion_tokens": 5}}
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for _ in range(max_tokens):
            self.wfile.write(b'data: {"choices": [{"text": "a", "index": 0}]}\n\n')
            self.wfile.flush()
            time.sleep(ARGS.token_delay)
        usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": max_tokens}}
        self.last_byte = time.monotonic()
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def names() -> list[str]:
    return ARGS.served_model_name or [ARGS.model_id]


class ReusePortServer(ThreadingHTTPServer):
    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


def write_dispatch_record() -> None:
    """What a server with kerneltrial's vLLM plugin leaves in KERNELTRIAL_DISPATCH_LOG: the
    plugin loaded for the operators the arm selects (KERNELTRIAL_VLLM_OPS), each of their
    kernels served by ours. Nothing when the arm selects none (a baseline)."""
    from kerneltrial.plugins import DISPATCH_OPS, LOG_ENV, OPS_ENV, OUR_KERNELS, OURS, parse_ops
    from kerneltrial.plugins.records import OpCount, PluginLoad, ProcessRecord

    ops = parse_ops(os.environ.get(OPS_ENV, ""))
    if not ops or not os.environ.get(LOG_ENV):
        return
    counts = tuple(OpCount(k, OURS, 8, 0) for op in ops for k in DISPATCH_OPS[op])
    record = ProcessRecord(os.getpid(), time.time(), (PluginLoad("vllm_oot", OUR_KERNELS, ops),), counts)
    directory = Path(os.environ[LOG_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"dispatch-{os.getpid()}.json").write_text(record.to_json())


def load_ledger() -> None:
    """kerneltrial's ledger middleware, where --middleware names it, as vLLM would load it."""
    global LEDGER, LEDGER_RECORD
    from kerneltrial.plugins import ledger

    if ledger.MIDDLEWARE in ARGS.middleware:
        LEDGER, LEDGER_RECORD = ledger.Ledger(app=None), ledger.record  # type: ignore[arg-type]


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-id", default="tiny")
    ap.add_argument("--served-model-name", nargs="+")
    ap.add_argument("--reuse-port", action="store_true")
    ap.add_argument("--bind-delay", type=float, default=0.0)
    ap.add_argument("--mode", default="ok", choices=["ok", "503", "exit"])
    ap.add_argument("--die-after", type=int, default=0)
    ap.add_argument("--token-delay", type=float, default=0.002)
    ap.add_argument("--ignore-sigint", action="store_true")
    ap.add_argument("--spawn-child", action="store_true")
    ap.add_argument("--pidfile")
    ap.add_argument("--answer", default="The answer is \\boxed{42}.")
    ap.add_argument("--show-seed", action="store_true")
    ap.add_argument("--middleware", action="append", default=[])  # vLLM's option: the ledger's, as vLLM loads it
    ARGS = ap.parse_args()
    if ARGS.pidfile:
        with open(ARGS.pidfile, "w") as f:
            f.write(str(os.getpid()))
    if ARGS.mode == "exit":
        print("fake server: bad argument, exiting", flush=True)
        sys.exit(3)
    if ARGS.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_dispatch_record()
    load_ledger()
    if ARGS.spawn_child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    time.sleep(ARGS.bind_delay)
    srv = (ReusePortServer if ARGS.reuse_port else ThreadingHTTPServer)(("127.0.0.1", ARGS.port), Handler)
    srv.daemon_threads = True
    print(f"fake server on 127.0.0.1:{ARGS.port} serving {names()}", flush=True)
    try:
        srv.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        print("fake server: SIGINT, shutting down", flush=True)


if __name__ == "__main__":
    main()
