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

from kerneltrial.serving import vllm_platform
from kerneltrial.serving.launcher import Server, stop_group
from kerneltrial.serving.metrics import DEFAULT_PERCENTILES, percentile_word

VLLM_ENV = "KERNELTRIAL_VLLM"


class BenchError(RuntimeError):
    """The benchmark client failed; the message names the cause and the log."""


@dataclass(frozen=True)
class Case:
    input_len: int
    output_len: int
    concurrency: int
    num_requests: int

    @property
    def id(self) -> str:
        return f"in{self.input_len}-out{self.output_len}-c{self.concurrency}-n{self.num_requests}"

    def as_list(self) -> list[int]:
        return [self.input_len, self.output_len, self.concurrency, self.num_requests]


def parse_cases(value: Any) -> list[Case]:
    """[[input_len, output_len, concurrency, num_requests], ...] (JSON text or a list)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"cases are not valid JSON ({e.msg}); write them as [[4096,1024,64,256], ...]") from None
    if not isinstance(value, list) or not value:
        raise ValueError("cases must be a non-empty list like [[4096,1024,64,256]]")
    cases: list[Case] = []
    for item in value:
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
) -> list[str]:
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
    return argv


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
                        f"benchmark client still running after {timeout_s:.0f} s; raise --bench-timeout or see {log_path}"
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
