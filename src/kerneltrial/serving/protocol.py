"""Serving protocol (TOML): arms are server configurations; cases, repeats, acceptance.

    name = "minicpm5-2b-flaggems"
    seed = 0            # launch order and bench seeds
    rounds = 2          # launches per arm, interleaved A B / B A ... in a seeded order
    repeats = 4         # runs of each case per launch; the first is the warm-up, dropped
    [server]
    model_id = "minicpm5-2b"   # must be listed by /v1/models
    model = "/path/to/model"   # fills {model} in argv; default tokenizer
    host = "127.0.0.1"
    port = 8000                # fills {port} in argv
    ready_timeout_s = 900
    [bench]
    cases = [[4096, 1024, 64, 256], [16384, 1024, 64, 128]]
    timeout_s = 3600
    [acceptance]
    noise_band = 0.01          # candidate total tok/s must gain more than this, every case
    ttft_ratio_max = 1.01      # candidate mean TTFT <= baseline x this, every case
    [accuracy]                 # optional: MATH-500 gate on the candidate (every arm is measured)
    data = "../shared/data/math500/test.jsonl"
    level = "Level 3"
    max_tokens = 4096
    gate = 0.95
    [[arms]]
    name = "baseline"
    role = "baseline"
    argv = ["vllm", "serve", "{model}", "--port", "{port}", "--served-model-name", "minicpm5-2b"]
    env = { VLLM_PLUGINS = "" }
    [[arms]]
    name = "flaggems"
    role = "candidate"
    argv = [...]
    env = { USE_FLAGGEMS = "1", VLLM_FL_OPS = "rms_norm" }

An arm without argv benchmarks an already running server at `server.base_url`.
Relative paths in [accuracy].data and server.model are taken from the protocol's folder.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltrial.serving.accuracy import AccuracySpec
from kerneltrial.serving.bench import Case, parse_cases
from kerneltrial.serving.metrics import DEFAULT_PERCENTILES


class ProtocolError(ValueError):
    """The protocol is malformed; the message names the field and the fix."""


@dataclass
class Arm:
    name: str
    role: str = "arm"  # baseline | candidate | arm
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def external(self) -> bool:
        return not self.argv


@dataclass
class Protocol:
    name: str
    arms: list[Arm]
    cases: list[Case]
    model_id: str
    model: str | None = None
    tokenizer: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    base_url: str | None = None
    ready_timeout_s: float = 900.0
    stop_grace_s: float = 30.0
    seed: int = 0
    rounds: int = 1
    repeats: int = 4
    bench_timeout_s: float = 3600.0
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    noise_band: float = 0.01
    ttft_ratio_max: float = 1.01
    accuracy: AccuracySpec | None = None

    def arm(self, role: str) -> Arm | None:
        return next((a for a in self.arms if a.role == role), None)

    def url(self) -> str:
        return self.base_url or f"http://{self.host}:{self.port}"

    def expand(self, arm: Arm) -> list[str]:
        subs = {"{port}": str(self.port), "{host}": self.host, "{model}": self.model or "", "{model_id}": self.model_id}
        out = []
        for a in arm.argv:
            for k, v in subs.items():
                a = a.replace(k, v)
            out.append(a)
        return out


def _get(table: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    if key not in table:
        return default
    val = table[key]
    if not isinstance(val, typ) or isinstance(val, bool) and typ is not bool:
        names = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ProtocolError(f"{where}.{key} must be {names}, got {val!r}")
    return val


def parse_protocol(text: str, base_dir: Path | None = None) -> Protocol:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProtocolError(f"protocol is not valid TOML ({e}); fix the syntax") from None
    base = base_dir or Path(".")
    server = _get(doc, "server", dict, "protocol", {})
    bench = _get(doc, "bench", dict, "protocol", {})
    acc = _get(doc, "acceptance", dict, "protocol", {})
    model_id = _get(server, "model_id", str, "server")
    if not model_id:
        raise ProtocolError("server.model_id is missing; set it to the id /v1/models must list")
    try:
        cases = parse_cases(_get(bench, "cases", list, "bench"))
    except ValueError as e:
        raise ProtocolError(f"bench.cases: {e}") from None
    arms_raw = _get(doc, "arms", list, "protocol", [])
    if not arms_raw:
        raise ProtocolError("no [[arms]]; add at least one arm with name and argv")
    arms: list[Arm] = []
    for i, a in enumerate(arms_raw):
        where = f"arms[{i}]"
        if not isinstance(a, dict):
            raise ProtocolError(f"{where} must be a table")
        name = _get(a, "name", str, where)
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ProtocolError(f"{where}.name must be a non-empty word (letters, digits, - and _)")
        role = _get(a, "role", str, where, "arm")
        if role not in ("baseline", "candidate", "arm"):
            raise ProtocolError(f"{where}.role must be baseline, candidate or arm, got {role!r}")
        argv = _get(a, "argv", list, where, [])
        if not all(isinstance(x, str) for x in argv):
            raise ProtocolError(f"{where}.argv must be a list of strings (an argv list, never a shell string)")
        env = _get(a, "env", dict, where, {})
        arms.append(Arm(name, role, list(argv), {str(k): str(v) for k, v in env.items()}))
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ProtocolError("arm names repeat; give each arm its own name")
    for role in ("baseline", "candidate"):
        if sum(a.role == role for a in arms) > 1:
            raise ProtocolError(f"more than one arm has role {role}; keep one")
    p = Protocol(
        name=_get(doc, "name", str, "protocol", "serving-trial"),
        arms=arms,
        cases=cases,
        model_id=model_id,
        model=_get(server, "model", str, "server"),
        tokenizer=_get(server, "tokenizer", str, "server"),
        host=_get(server, "host", str, "server", "127.0.0.1"),
        port=_get(server, "port", int, "server", 8000),
        base_url=_get(server, "base_url", str, "server"),
        ready_timeout_s=float(_get(server, "ready_timeout_s", (int, float), "server", 900.0)),
        stop_grace_s=float(_get(server, "stop_grace_s", (int, float), "server", 30.0)),
        seed=_get(doc, "seed", int, "protocol", 0),
        rounds=_get(doc, "rounds", int, "protocol", 1),
        repeats=_get(doc, "repeats", int, "protocol", 4),
        bench_timeout_s=float(_get(bench, "timeout_s", (int, float), "bench", 3600.0)),
        percentiles=tuple(float(x) for x in _get(bench, "percentiles", list, "bench", list(DEFAULT_PERCENTILES))),
        noise_band=float(_get(acc, "noise_band", (int, float), "acceptance", 0.01)),
        ttft_ratio_max=float(_get(acc, "ttft_ratio_max", (int, float), "acceptance", 1.01)),
    )
    if p.repeats < 2:
        raise ProtocolError("repeats must be >= 2: the first run of each case is the warm-up and is dropped")
    if p.rounds < 1:
        raise ProtocolError("rounds must be >= 1")
    if any(a.external for a in arms) and len(arms) > 1:
        raise ProtocolError("an arm without argv (running server) is only allowed alone; give every arm an argv")
    if p.model and not Path(p.model).is_absolute() and (base / p.model).exists():
        p.model = str((base / p.model).resolve())
    if p.tokenizer is None:
        p.tokenizer = p.model
    if "accuracy" in doc:
        a = _get(doc, "accuracy", dict, "protocol")
        data = _get(a, "data", str, "accuracy")
        if not data:
            raise ProtocolError("accuracy.data is missing; point it at MATH-500 test.jsonl")
        if not data.startswith("hf:") and not Path(data).is_absolute():
            data = str((base / data).resolve())
        spec = AccuracySpec(data=data)
        for key in ("level", "api"):
            if key in a:
                setattr(spec, key, str(a[key]))
        for key in ("limit", "max_tokens", "concurrency", "seed"):
            if key in a:
                setattr(spec, key, _get(a, key, int, "accuracy"))
        for key in ("temperature", "top_p", "gate", "confidence", "request_timeout_s"):
            if key in a:
                setattr(spec, key, float(_get(a, key, (int, float), "accuracy")))
        if spec.api not in ("chat", "completions"):
            raise ProtocolError("accuracy.api must be 'chat' or 'completions'")
        p.accuracy = spec
    return p


def load_protocol(path: Path) -> tuple[Protocol, bytes]:
    if not path.is_file():
        raise ProtocolError(f"protocol file {path} not found; pass the path of a .toml protocol")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{path} is not UTF-8 text") from None
    return parse_protocol(text, path.parent), raw
