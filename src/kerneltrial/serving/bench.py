"""One throughput run: `vllm bench serve` on the random dataset, read back from its JSON.

kerneltrial never parses vLLM's stdout: it passes `--save-result --save-detailed` and reads
the per-request arrays from the file (the stdout goes to a log next to it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kerneltrial.serving import flagos_chat, official, vllm_platform
from kerneltrial.serving.launcher import Server, stop_group
from kerneltrial.serving.metrics import DEFAULT_PERCENTILES, percentile_word

VLLM_ENV = "KERNELTRIAL_VLLM"
# the benchmark clients: kerneltrial's, the organisers' script's (serving/official.py) and a fork's
# chat script's (serving/flagos_chat.py)
CLIENTS = ("completions", "official", "flagos-chat")


class BenchError(RuntimeError):
    """The benchmark client failed; the message names the cause and the log."""


@dataclass(frozen=True)
class Case:
    input_len: int
    output_len: int
    concurrency: int
    num_requests: int
    label: str = ""  # the built-in set it comes from (CASE_SETS: "seed 1", "official 1024_1024_c64")
    request_rate: float | None = None  # `vllm bench serve --request-rate` (req/s); None: inf, all sent at once
    burstiness: float | None = None  # `--burstiness` (gamma shape of the arrival gaps; 1: Poisson); needs a rate

    @property
    def id(self) -> str:
        base = f"in{self.input_len}-out{self.output_len}-c{self.concurrency}-n{self.num_requests}"
        rate = "" if self.request_rate is None else f"-r{self.request_rate:g}"
        return base + rate + ("" if self.burstiness is None else f"-b{self.burstiness:g}")

    def as_list(self) -> list[int]:
        return [self.input_len, self.output_len, self.concurrency, self.num_requests]

    def as_toml(self) -> list[int] | dict[str, Any]:
        """How a protocol writes it: the 4-list, or a table when it has a rate."""
        if self.request_rate is None:
            return self.as_list()
        table: dict[str, Any] = dict(zip(CASE_KEYS, self.as_list(), strict=True)) | {"request_rate": self.request_rate}
        return table | ({} if self.burstiness is None else {"burstiness": self.burstiness})

    def load_argv(self) -> list[str]:
        """The client's options for the case's arrival process (none: all requests at once)."""
        rate = [] if self.request_rate is None else ["--request-rate", f"{self.request_rate:g}"]
        return rate + ([] if self.burstiness is None else ["--burstiness", f"{self.burstiness:g}"])


CASE_KEYS = ("input_len", "output_len", "concurrency", "num_requests")
CASE_TABLE_KEYS = (*CASE_KEYS, "request_rate", "burstiness")
SEED_CASES = (
    (4096, 1024, 64, 256),
    (16384, 1024, 64, 128),
)  # the Track 2 seed's (protocols/serving/minicpm5-2b-t2.toml)


def _script_cases(name: str, cases: tuple[tuple[int, int, int, int], ...]) -> tuple[Case, ...]:
    """The organisers' script's cases, each labelled with the set and the script's case name."""
    return tuple(Case(i, o, c, n, label=f"{name} {i}_{o}_c{c}") for i, o, c, n in cases)


# The built-in case sets a protocol's `cases` (or --cases) may name, each case labelled with its set
CASE_SETS: dict[str, tuple[Case, ...]] = {
    "official": _script_cases("official", official.DEFAULT_CASES),  # the script's DEFAULT_TEST_CASES
    "official-all": _script_cases("official-all", official.ALL_CASES),  # its ALL_TEST_CASES (--enable-all)
    "seed": tuple(Case(*c, label=f"seed {i + 1}") for i, c in enumerate(SEED_CASES)),
    # the fork's SCENARIOS, --num-prompts = concurrency as it sends them
    "flagos-chat": tuple(
        Case(i, o, c, c, label=f"flagos-chat {name}") for name, i, o, c in flagos_chat.SCRIPT_SCENARIOS
    ),
}


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _case_table(item: dict[str, Any]) -> list[Case]:
    """A case table: the four sizes (concurrency may be a list: a sweep, one case each), and an
    optional request_rate (req/s) and burstiness."""
    unknown = sorted(set(item) - set(CASE_TABLE_KEYS))
    if unknown or any(k not in item for k in CASE_KEYS):
        raise ValueError(f"case {item!r} needs keys {', '.join(CASE_KEYS)} (and optionally request_rate, burstiness)")
    sweep = item["concurrency"] if isinstance(item["concurrency"], list) else [item["concurrency"]]
    sizes = [item["input_len"], item["output_len"], *sweep, item["num_requests"]]
    if not sweep or not all(_positive_int(x) for x in sizes):
        raise ValueError(f"case {item!r}: the lengths, each concurrency and num_requests must be positive integers")
    rate, burst = item.get("request_rate"), item.get("burstiness")
    for name, v in (("request_rate", rate), ("burstiness", burst)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not v > 0):
            raise ValueError(f"case {item!r}: {name} must be a positive number, got {v!r}")
    if burst is not None and rate is None:
        raise ValueError(f"case {item!r}: burstiness shapes the gaps of a request_rate; set request_rate too")
    return [
        Case(
            item["input_len"],
            item["output_len"],
            c,
            item["num_requests"],
            request_rate=None if rate is None else float(rate),
            burstiness=None if burst is None else float(burst),
        )
        for c in sweep
    ]


def parse_cases(value: Any) -> list[Case]:
    """[[input_len, output_len, concurrency, num_requests], ...] (JSON text or a list); an item may
    be a table with those keys, request_rate and burstiness, and a list of concurrencies (a sweep)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"cases are not valid JSON ({e.msg}); write them as [[4096,1024,64,256], ...]") from None
    if not isinstance(value, list) or not value:
        raise ValueError("cases must be a non-empty list like [[4096,1024,64,256]]")
    cases: list[Case] = []
    for item in value:
        if isinstance(item, Case):
            cases.append(item)
            continue
        if isinstance(item, dict):
            cases += _case_table(item)
            continue
        if (
            not isinstance(item, list | tuple)
            or len(item) != 4
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in item)
        ):
            raise ValueError(
                f"case {item!r} must be 4 positive integers [input_len, output_len, concurrency, num_requests]"
            )
        cases.append(Case(*item))
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("cases repeat; list each [input_len, output_len, concurrency, num_requests] once")
    return cases


def resolve_vllm(option: str | None) -> str:
    """The `vllm` executable: --vllm, else $KERNELTRIAL_VLLM, else `vllm` on PATH."""
    exe = option or os.environ.get(VLLM_ENV) or "vllm"
    found = shutil.which(exe)
    if not found:
        raise BenchError(f"vllm executable {exe!r} not found; pass --vllm /path/to/venv/bin/vllm or set {VLLM_ENV}")
    return found


def bench_argv(
    vllm: str,
    base_url: str,
    model_id: str,
    tokenizer: str | None,
    case: Case,
    result_dir: Path,
    result_file: str,
    seed: int,
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
    served_name: str | None = None,
    client: str = "completions",
    goodput: dict[str, float] | None = None,
) -> list[str]:
    """The client's argv; `served_name` (a launch's nonce) is the model name every request sends.
    client "official": the organisers' script's argv (serving/official.py), "flagos-chat": a fork's
    chat script's (serving/flagos_chat.py); neither passes --seed. The case's request rate and
    burstiness and the goodput SLOs (ms) follow the request path."""
    load = case.load_argv() + goodput_argv(goodput)
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    if client == "official":
        site = [] if tokenizer in (None, model_id) else ["--tokenizer", str(tokenizer)]
        argv = official_argv(vllm, host, port, model_id, case) + site
        return argv + load + recording(result_dir, result_file, percentiles, served_name)
    if client == "flagos-chat":
        argv = flagos_chat_argv(vllm, host, port, model_id, tokenizer or model_id, case)
        return argv + load + recording(result_dir, result_file, percentiles, served_name)
    if client != "completions":
        raise ValueError(f"client {client!r} is not one of {', '.join(CLIENTS)}")
    argv = [
        vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model_id,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(case.input_len),
        "--random-output-len",
        str(case.output_len),
        "--ignore-eos",
        "--max-concurrency",
        str(case.concurrency),
        "--num-prompts",
        str(case.num_requests),
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        ",".join(percentile_word(p) for p in percentiles),
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_file,
        "--disable-tqdm",
    ]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if served_name:
        argv += ["--served-model-name", served_name]
    return argv + load


def goodput_argv(goodput: dict[str, float] | None) -> list[str]:
    """`--goodput ttft:MS tpot:MS e2el:MS`: the SLOs a request must meet to count as good."""
    return ["--goodput", *(f"{k}:{v:g}" for k, v in goodput.items())] if goodput else []


# what vLLM's client records for a request the server answered with HTTP 404 (response.reason,
# vllm/benchmarks/lib/endpoint_request_func.py): the model name it sent is unknown to that server
NOT_FOUND = "Not Found"


def foreign_answers(raw: dict[str, Any]) -> int:
    """Requests of a run answered 404: with a launch's nonce as the model name, a server that does
    not serve it (another server on the same port) answered them."""
    return sum(1 for e in raw.get("errors") or [] if str(e).strip() == NOT_FOUND)


def official_argv(vllm: str, host: str, port: int, model_id: str, case: Case) -> list[str]:
    """The organisers' script's `vllm bench serve` argv for one case (serving/official.py:
    COMMON_ARGS, then run_once's options), in its order, with the site's model id, host and port."""
    # fmt: off
    return [
        vllm, "bench", "serve",
        "--backend", official.BACKEND,
        "--model", model_id,
        "--endpoint", official.ENDPOINT,
        "--host", host,
        "--port", str(port),
        "--dataset-name", "random",
        "--ignore-eos",
        "--random-input-len", str(case.input_len),
        "--random-output-len", str(case.output_len),
        "--max-concurrency", str(case.concurrency),
        "--num-prompts", str(case.num_requests),
    ]
    # fmt: on


def flagos_chat_argv(vllm: str, host: str, port: int, model_id: str, tokenizer: str, case: Case) -> list[str]:
    """The fork's chat script's `vllm bench serve` argv for one case (serving/flagos_chat.py), in
    its order, with the site's values."""
    # fmt: off
    return [
        vllm, "bench", "serve",
        "--host", host,
        "--port", str(port),
        "--backend", flagos_chat.BACKEND,
        "--model", model_id,
        "--tokenizer", tokenizer,
        "--dataset-name", "random",
        "--endpoint", flagos_chat.ENDPOINT,
        "--ignore-eos",
        "--trust-remote-code",
        "--random-input-len", str(case.input_len),
        "--random-output-len", str(case.output_len),
        "--num-prompts", str(case.num_requests),
        "--max-concurrency", str(case.concurrency),
    ]
    # fmt: on


def recording(result_dir: Path, result_file: str, percentiles: tuple[float, ...], served_name: str | None) -> list[str]:
    """What kerneltrial appends to a script's argv: where and what the client records, and the
    launch's nonce as the requests' model name. None of it changes the prompts or the load."""
    out = [
        *("--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", result_file),
        *("--percentile-metrics", "ttft,tpot,itl,e2el"),
        *("--metric-percentiles", ",".join(percentile_word(p) for p in percentiles), "--disable-tqdm"),
    ]
    return [*out, "--served-model-name", served_name] if served_name else out


def run_bench(
    argv: list[str],
    json_path: Path,
    log_path: Path,
    timeout_s: float,
    server: Server | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the client in its own process group; return the parsed result JSON.

    Raises BenchError when it exits non-zero, times out or writes no JSON, and LaunchError
    (from server.check_alive) when the launched server dies meanwhile.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    full_env, choice = vllm_platform.process_env(argv[0], {"HF_HUB_OFFLINE": "1", **os.environ, **(env or {})})
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.write(f"# platform: {choice.reason}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        server_died = False
        try:
            while proc.poll() is None:
                if server is not None and not server_died and not server.alive:
                    # let the client finish its failing requests and write its JSON (kept raw)
                    server_died = True
                    deadline = min(deadline, time.monotonic() + 30.0)
                if time.monotonic() > deadline:
                    stop_group(proc, grace_s=5)
                    if server_died:
                        break
                    raise BenchError(
                        f"benchmark client still running after {timeout_s:.0f} s; raise bench.timeout_s (--bench-timeout) "
                        f"or see {log_path}"
                    )
                time.sleep(0.2)
        except BaseException:
            stop_group(proc, grace_s=5)
            raise
    if server is not None:
        server.check_alive("the benchmark")
    if proc.returncode != 0:
        raise BenchError(f"`vllm bench serve` exited with code {proc.returncode}; see {log_path}")
    if not json_path.is_file():
        raise BenchError(f"`vllm bench serve` wrote no result file {json_path.name}; see {log_path}")
    try:
        raw: dict[str, Any] = json.loads(json_path.read_text())
    except ValueError as e:
        raise BenchError(f"result file {json_path} is not JSON ({e}); see {log_path}") from None
    return raw


def request_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-request records of one run (times in seconds), for requests.csv."""
    rows = []
    n = len(raw.get("input_lens") or [])
    for i in range(n):
        itl = raw["itls"][i] if i < len(raw.get("itls", [])) else []
        err = raw["errors"][i] if i < len(raw.get("errors", [])) else ""
        lat = float(raw["latencies"][i])
        n_out = int(raw["output_lens"][i])
        ttft = float(raw["ttfts"][i])
        ok = (not err) and lat > 0
        rows.append(
            {
                "request": i,
                "success": ok,
                "input_len": int(raw["input_lens"][i]),
                "output_len": n_out,
                "ttft_s": ttft,
                "e2el_s": lat,
                "tpot_s": (lat - ttft) / (n_out - 1) if ok and n_out > 1 else None,
                "n_itl": len(itl),
                "itl_mean_s": sum(itl) / len(itl) if itl else None,
                "start_time": raw.get("start_times", [None] * n)[i],
                "error": re.sub(r"\s+", " ", str(err))[:300],
            }
        )
    return rows


def case_dict(case: Case) -> dict[str, Any]:
    return {"case": case.id, **asdict(case)}
