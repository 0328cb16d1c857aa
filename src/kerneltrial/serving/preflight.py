"""The inputs of a serving run, checked before anything is written or launched (issue 14: a
missing data file used to surface after the first launch's whole throughput phase).

Model and tokenizer: a local path must exist; a value that is not path-like (`name` or
`org/name`) is a Hugging Face hub id, allowed unless HF_HUB_OFFLINE is set and the id is not in
the local hub cache (the server could then neither find nor download it). The server sees the
environment plus its arm's env; the benchmark client (whose tokenizer is server.tokenizer, else
server.model) runs with HF_HUB_OFFLINE=1 unless the environment sets it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kerneltrial.serving.accuracy import PROTOCOL_KEYS, load_problems
from kerneltrial.serving.lifecycle import PortTaken, wait_for_port
from kerneltrial.serving.protocol import Protocol

HF_OFFLINE_ENV = "HF_HUB_OFFLINE"


class PreflightError(ValueError):
    """An input of a serving run is unusable (exit 2); the message names the value and the fix."""


def _looks_like_path(value: str) -> bool:
    """A hub id is `name` or `org/name`; anything else with a slash, or starting like a path, is a path."""
    return value.startswith(("/", ".", "~")) or value.count("/") > 1


def _offline(env: dict[str, str]) -> bool:
    return env.get(HF_OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _in_hub_cache(repo_id: str) -> bool:
    cache = os.environ.get("HF_HUB_CACHE") or str(
        Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
    )
    return (Path(cache) / f"models--{repo_id.replace('/', '--')}").is_dir()


def check_model_ref(key: str, value: str, env: dict[str, str], fix: str) -> None:
    """A local path must exist; a hub id needs the hub: HF_HUB_OFFLINE unset, or the id in the local cache."""
    if Path(value).expanduser().exists():
        return
    if _looks_like_path(value):
        raise PreflightError(f"{key} {value} does not exist; {fix}")
    if _offline(env) and not _in_hub_cache(value):
        raise PreflightError(
            f"{key} {value!r} is not a local path and not in the Hugging Face cache, and {HF_OFFLINE_ENV} is set "
            f"(nothing may be downloaded); {fix}, or set {HF_OFFLINE_ENV}=0 to allow the download"
        )


def check_executable(what: str, exe: str, fix: str) -> None:
    if shutil.which(exe) is None:
        raise PreflightError(f"{what} {exe!r} not found (not on PATH, not an executable file); {fix}")


def check_inputs(proto: Protocol, vllm: str) -> None:
    """Every input of a serving run, before anything is written or launched: the MATH-500 file,
    the server executables, the benchmark client, the model and tokenizer, and the port (waited
    for up to server.port_wait_s). PreflightError (exit 2) names the bad value and the fix."""
    if proto.accuracy is not None:  # a missing or malformed data file, not an hour later
        load_problems(proto.accuracy.data, proto.accuracy.level, proto.accuracy.limit, PROTOCOL_KEYS)
    launched = [a for a in proto.arms if not a.external]
    for arm in launched:
        check_executable(
            f"server executable of arm {arm.name}", proto.expand(arm)[0], "fix arms.argv[0] or install the server"
        )
    check_executable("vllm benchmark client", vllm, "pass --vllm /path/to/venv/bin/vllm or set KERNELTRIAL_VLLM")
    s = proto.server
    server_env = {**os.environ, **(launched[0].env if launched else {})}
    if s.model:
        check_model_ref("server.model", s.model, server_env, "fix server.model or pass --model PATH")
    tokenizer = s.effective_tokenizer
    if tokenizer:  # the benchmark client runs offline unless told otherwise (bench.run_bench)
        key = "server.tokenizer" if s.tokenizer else "server.model (the benchmark client's tokenizer)"
        fix = "fix server.tokenizer" if s.tokenizer else "set server.tokenizer to a local path"
        check_model_ref(key, tokenizer, {HF_OFFLINE_ENV: "1", **os.environ}, fix)
    if launched:
        try:
            wait_for_port(s.host, s.port, s.port_wait_s)
        except PortTaken as e:
            raise PreflightError(str(e)) from None
