"""Serving protocol (TOML): arms are server configurations; cases, repeats, acceptance.

    name = "minicpm5-2b-flaggems"
    seed = 0            # launch order
    rounds = 2          # launches per arm, interleaved A B / B A ... in a seeded order
    repeats = 4         # runs of each case per launch; the first is the warm-up, dropped
    [server]
    model_id = "minicpm5-2b"   # must be listed by /v1/models
    model = "/path/to/model"   # fills {model} in argv; default tokenizer
    port = 8000                # fills {port} in argv
    [bench]
    cases = [[4096, 1024, 64, 256], [16384, 1024, 64, 128]]
    seeding = "official"       # every run of a case: prompt seed bench.seed (default 0, vLLM's)
    [acceptance]
    noise_band = 0.01          # lower bound of the candidate's tok/s gain above this, every case
    ttft_ratio_max = 1.01      # upper bound of its mean TTFT ratio at most this, every case
    confidence = 0.95          # of the intervals across launches (serving/acceptance.py)
    [accuracy]                 # optional: MATH-500 gate on the candidate (every arm is measured)
    data = "../shared/data/math500/test.jsonl"
    [[arms]]
    name = "baseline"
    role = "baseline"
    argv = ["vllm", "serve", "{model}", "--port", "{port}", "--served-model-name", "minicpm5-2b"]
    env = { VLLM_PLUGINS = "" }

Arms may differ only in operator selection: their argv must be identical, and their env may
differ only in OPERATOR_SELECTION_ENV (the variables kerneltrial's plugins and vllm-plugin-FL
read to choose implementations); any other difference (model, dtype, max-model-len, scheduler
settings, quantisation, speculative decoding, another variable) is refused, naming the arm, the
field and both values, so that a measured difference is the operators' (issue 13).

An arm without argv benchmarks an already running server at `server.base_url`. Relative
paths in [accuracy].data and server.model are taken from the protocol's folder. Every key,
its type, default and meaning: docs/PROTOCOL_KEYS.md (generated from these models).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from kerneltrial.model_fields import describe
from kerneltrial.plugins import KERNELS_ENV, OPS_ENV
from kerneltrial.serving import official
from kerneltrial.serving.accuracy import AccuracySpec
from kerneltrial.serving.bench import CASE_SETS, Case, parse_cases
from kerneltrial.serving.fl_policy import FILE_ENVS, PER_OP_ENV, Platform, selection
from kerneltrial.serving.lifecycle import PORT_WAIT_S
from kerneltrial.serving.metrics import DEFAULT_PERCENTILES, GOODPUT_KEYS

# `vllm bench serve`'s default --seed (vllm/benchmarks/datasets/datasets.py, add_dataset_parser,
# vLLM 0.32.0): the seed of every run of the organisers' throughput script and of the fork's chat
# script, which pass none (serving/official.py, serving/flagos_chat.py).
VLLM_BENCH_DEFAULT_SEED = 0

PLACEHOLDERS = ("{port}", "{host}", "{model}", "{model_id}")
_PLACEHOLDER = re.compile(r"\{\w+\}")  # `{word}` only: a JSON argument such as '{"level": 3}' is left alone


# The variables that choose operator implementations, and nothing else: kerneltrial's plugins
# (kerneltrial/plugins/__init__.py) and vllm-plugin-FL's dispatch policy and FlagGems switches, as
# its source reads them (vllm_fl/dispatch/policy.py, dispatch/config/utils.py, dispatch/discovery.py,
# dispatch/manager.py, utils.py, envs.py; tests/serving/test_protocol.py checks the names against
# the source snapshot). Logging, IO dumps and platform overrides are not here: they must be equal.
OPERATOR_SELECTION_ENV = frozenset(
    {
        OPS_ENV,
        KERNELS_ENV,
        "VLLM_FL_PER_OP",
        "VLLM_FL_PREFER",
        "VLLM_FL_PREFER_ENABLED",
        "VLLM_FL_STRICT",
        "VLLM_FL_ALLOW_VENDORS",
        "VLLM_FL_DENY_VENDORS",
        "VLLM_FL_CONFIG",
        "VLLM_FL_OP_CONFIG",
        "VLLM_FL_PLUGIN_MODULES",
        "VLLM_FL_FLAGOS_WHITELIST",
        "VLLM_FL_FLAGOS_BLACKLIST",
        "VLLM_FL_OOT_ENABLED",
        "VLLM_FL_OOT_WHITELIST",
        "VLLM_FL_OOT_BLACKLIST",
        "USE_FLAGGEMS",
    }
)


class ProtocolError(ValueError):
    """The protocol is malformed; the message names the field and the fix."""


# strict: TOML values are typed, so a string where a number belongs (or true for 1) is a mistake to name,
# not to coerce (an int is still accepted for a float).
_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True)


class Arm(BaseModel):
    model_config = _CONFIG

    name: str = Field(description="Arm name: letters, digits, - and _; unique in the protocol.")
    role: Literal["baseline", "candidate", "arm"] = Field(
        default="arm",
        description="baseline and candidate (at most one each) are compared by [acceptance]; arm is measured only.",
    )
    argv: list[str] = Field(
        default=[],
        description="Server command as an argv list (never a shell string); {port}, {host}, {model} and "
        "{model_id} are filled in. Empty: benchmark the running server at server.base_url.",
    )
    env: dict[str, str] = Field(default={}, description="Environment variables added for this arm's server.")

    @field_validator("name")
    @classmethod
    def _word(cls, name: str) -> str:
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"must be a non-empty word (letters, digits, - and _), got {name!r}")
        return name

    @field_validator("argv", mode="before")
    @classmethod
    def _not_a_shell_string(cls, argv: Any) -> Any:
        if isinstance(argv, str):
            raise ValueError(f'must be an argv list such as ["vllm", "serve", ...], never a shell string, got {argv!r}')
        return argv

    @field_validator("argv")
    @classmethod
    def _known_placeholders(cls, argv: list[str]) -> list[str]:
        for a in argv:
            for ph in _PLACEHOLDER.findall(a):
                if ph not in PLACEHOLDERS:
                    raise ValueError(f"unknown placeholder {ph} in {a!r}; use one of {', '.join(PLACEHOLDERS)}")
        return argv

    @property
    def external(self) -> bool:
        return not self.argv

    @property
    def selection(self) -> dict[str, str]:
        """The arm's operator-selection variables (OPERATOR_SELECTION_ENV), the only env it may differ in."""
        return {k: v for k, v in self.env.items() if k in OPERATOR_SELECTION_ENV}


def _is_option(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1].isdigit() and token[1] != "."


def _argv_fields(argv: list[str]) -> dict[str, list[str]]:
    """argv as field -> values: "argv" for the leading words, "argv --opt" for each option
    (`--opt=v` and `--opt v` alike; a repeated option collects its values; a bare flag is "set")."""
    fields: dict[str, list[str]] = {"argv": [""]}
    key = "argv"
    for token in argv:
        if _is_option(token):
            name, _, value = token.partition("=")
            key = f"argv {name}"
            fields.setdefault(key, []).append(value)
        else:
            fields[key][-1] = f"{fields[key][-1]} {token}".lstrip()
    return {k: [v or "set" for v in vs] if k != "argv" else vs for k, vs in fields.items()}


def non_operator_difference(ref: Arm, arm: Arm) -> str | None:
    """The first difference of `arm` from `ref` outside operator selection, as one line naming the
    arm, the field and both values; None when they differ only in OPERATOR_SELECTION_ENV."""

    def shown(values: list[str] | str | None) -> str:
        if values is None:
            return "absent"
        return repr(values if isinstance(values, str) else "; ".join(values))

    a, b = _argv_fields(arm.argv), _argv_fields(ref.argv)
    diffs = [(f, a.get(f), b.get(f)) for f in dict.fromkeys([*b, *a]) if a.get(f) != b.get(f)]
    if not diffs and arm.argv != ref.argv:
        diffs = [("argv order", " ".join(arm.argv), " ".join(ref.argv))]
    env_keys = sorted((set(arm.env) | set(ref.env)) - OPERATOR_SELECTION_ENV)
    diffs += [(f"env {k}", arm.env.get(k), ref.env.get(k)) for k in env_keys if arm.env.get(k) != ref.env.get(k)]
    if not diffs:
        return None
    field, mine, theirs = diffs[0]
    return (
        f"arm {arm.name} differs from arm {ref.name} in {field}: {shown(mine)} in {arm.name}, {shown(theirs)} in "
        f"{ref.name}; arms may differ only in operator-selection variables ({', '.join(sorted(OPERATOR_SELECTION_ENV))})"
    )


def per_op_confound(ref: Arm, arm: Arm, platform: Platform | None) -> str | None:
    """Why `arm`'s VLLM_FL_PER_OP would change an operator other than the ones it names, compared
    with `ref` (the baseline), with the value that would not; None when it changes only those.
    VLLM_FL_PER_OP replaces the platform's whole table (fl_policy.py), so an op it does not name falls
    to the default order: on Ascend an E1 naming only rms_norm also changes attention and rotary."""
    if arm.env.get(PER_OP_ENV, "") == ref.env.get(PER_OP_ENV, ""):
        return None
    if any(arm.env.get(v) or ref.env.get(v) for v in FILE_ENVS):
        return None  # a selection file replaces the table for every op: the dispatch proof reads it
    mine, theirs = selection(arm.env, platform, {}), selection(ref.env, platform, {})
    ops = sorted(set(mine.per_op) | set(theirs.per_op) | set(platform.op_backends if platform else ()))
    own = set(mine.per_op)  # the ops the arm names: its deliberate changes
    changed = []
    for op in ops:
        (a, _), (b, _) = mine.order(op), theirs.order(op)
        if op not in own and (a is None or b is None or a != b):
            changed.append((op, a, b))
    if not changed and (mine.complete and theirs.complete):
        return None
    if platform is None:  # an op neither names gets the unstated platform order in one arm, the default in the other
        return (
            f"arm {arm.name} sets {PER_OP_ENV}, which replaces vllm-plugin-FL's whole per-operator table: without that "
            f"table the loader cannot tell whether it changes operators other than {', '.join(sorted(own)) or 'its own'}; "
            "state it in [server.fl_platform] (name and op_backends from vllm_fl/dispatch/config/PLATFORM.yaml of the "
            "server's vllm-plugin-FL)"
        )
    shown = "; ".join(
        f"{op} ({'|'.join(b or ())} in {ref.name}, {'|'.join(a or ())} in {arm.name})" for op, a, b in changed
    )
    fixed = ";".join(
        [f"{op}={'|'.join(order)}" for op, order in mine.per_op.items()]
        + [f"{op}={'|'.join(b or ())}" for op, _, b in changed]
    )
    return (
        f"arm {arm.name}: {PER_OP_ENV} replaces the {platform.name} platform's whole per-operator table, so it would "
        f"also change {shown}; name them as {ref.name} has them: {PER_OP_ENV} = {fixed!r}"
    )


class FlPlatform(BaseModel):
    model_config = _CONFIG

    name: str = Field(min_length=1, description="The platform (vllm-plugin-FL's vendor name: nvidia, ascend, ...).")
    op_backends: dict[str, list[str]] = Field(
        description="Its table `op_backends` (vllm_fl/dispatch/config/PLATFORM.yaml of the server's "
        "vllm-plugin-FL): op -> backend tokens in order.",
    )
    prefer: Literal["flagos", "vendor", "reference"] = Field(default="flagos", description="Its table's `prefer`.")
    allow_vendors: list[str] | None = Field(default=None, description="Its table's `allow_vendors`, if set.")
    deny_vendors: list[str] = Field(default=[], description="Its table's `deny_vendors`, if set.")
    source: str = Field(default="", description="Where the table was copied from (file, commit).")

    @property
    def table(self) -> Platform:
        allow = frozenset(self.allow_vendors) if self.allow_vendors is not None else None
        ops = {op: tuple(order) for op, order in self.op_backends.items()}
        return Platform(self.name, ops, self.prefer, allow, frozenset(self.deny_vendors))


class Server(BaseModel):
    model_config = _CONFIG

    model_id: str = Field(
        min_length=1, description="Model id the server serves: /v1/models must list it before any load is sent."
    )
    model: str | None = Field(
        default=None,
        description="Model path or hub id: fills {model} in argv, default tokenizer; a relative path that exists "
        "is taken from the protocol's folder; `serve trial --model` overrides it.",
    )
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer for `vllm bench serve`; unset: server.model; a relative path that exists is taken from "
        "the protocol's folder, as server.model is.",
    )
    host: str = Field(default="127.0.0.1", description="Address of the launched server; fills {host} in argv.")
    port: int = Field(
        default=8000, ge=1, le=65535, description="Port of the launched server (must be free); fills {port} in argv."
    )
    base_url: str | None = Field(
        default=None, description="URL of an already running server (an arm without argv); unset: http://host:port."
    )
    ready_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds a launched server has to list model_id at /v1/models."
    )
    stop_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="Seconds the server's process group has to exit after SIGINT before SIGTERM (then SIGKILL).",
    )
    port_wait_s: float = Field(
        default=PORT_WAIT_S,
        ge=0,
        description="Seconds a launch waits for a taken port to be released before it fails, naming what holds it.",
    )
    fl_platform: FlPlatform | None = Field(
        default=None,
        description="vllm-plugin-FL's platform table for the server's hardware. VLLM_FL_PER_OP replaces that whole "
        "table: with it stated, the loader refuses an arm whose VLLM_FL_PER_OP would change operators other than the "
        "ones it names, and the dispatch proof knows every op's order.",
    )
    nonce: bool = Field(
        default=True,
        description="Add a per-launch nonce to the server's --served-model-name (vLLM serves every name listed) and "
        "send it as the model name of every request, so only this launch's server can answer; and start it with "
        "kerneltrial's ledger middleware (--middleware kerneltrial.plugins.ledger.Ledger), so that every answer is "
        "in the server's own ledger; false for a server that does not take vLLM's --served-model-name and "
        "--middleware (who answers is then not checked, and the launch records so).",
    )

    @field_validator("model", "tokenizer")
    @classmethod
    def _from_protocol_folder(cls, path: str | None, info: ValidationInfo) -> str | None:
        """A relative path that exists in the protocol's folder, resolved there (the tokenizer as the
        model: one equal to it stays equal, so it follows `serve trial --model`)."""
        base: Path | None = (info.context or {}).get("base_dir")
        if path and base is not None and not Path(path).is_absolute() and (base / path).exists():
            return str((base / path).resolve())
        return path

    @property
    def effective_tokenizer(self) -> str | None:
        return self.tokenizer or self.model


class Bench(BaseModel):
    model_config = _CONFIG

    cases: list[Case] = Field(
        description="Throughput cases, each [input_len, output_len, concurrency, num_requests] of positive integers; "
        "or a built-in set, each case labelled with it: \"official\" (the organisers' script's DEFAULT_TEST_CASES), "
        '"official-all" (its ALL_TEST_CASES), "seed" (the Track 2 seed\'s two cases) or "flagos-chat" (the fork\'s '
        "chat script's SCENARIOS, num_requests = concurrency); bench.CASE_SETS.",
        json_schema_extra={
            "toml_type": 'list of [int, int, int, int] or tables, or "official", "official-all", "seed" or "flagos-chat"'
        },
    )
    goodput: dict[str, float] | None = Field(
        default=None,
        description="Goodput SLOs in ms, passed as `vllm bench serve --goodput KEY:MS`: keys ttft, tpot, e2el; a "
        "request is good when it meets every one; request_goodput (good requests / duration) is recorded and "
        "verified. A case may be a table {input_len, output_len, concurrency, num_requests, request_rate, "
        "burstiness}: request_rate (req/s) and burstiness pass through, and a list of concurrencies is a sweep.",
    )
    client: Literal["completions", "official", "flagos-chat"] = Field(
        default="completions",
        description="The benchmark client's request path: completions = kerneltrial's `--backend vllm --endpoint "
        "/v1/completions --seed S`; official = the organisers' script's argv (benchmark_throughput_serve.py: "
        "`--backend vllm --endpoint /v1/completions --dataset-name random --ignore-eos`, no --seed; repeats must be "
        "its RUNS = 4); flagos-chat = a fork's chat script's (benchmark_throughput_flagos.py: `--backend openai-chat "
        "--endpoint /v1/chat/completions --trust-remote-code`, no --seed); both plus kerneltrial's recording options.",
    )
    timeout_s: float = Field(
        default=3600.0, gt=0, description="Seconds one `vllm bench serve` run may take before it is stopped."
    )
    percentiles: tuple[float, ...] = Field(
        default=DEFAULT_PERCENTILES,
        min_length=1,
        description="Percentiles (0-100) of TTFT, TPOT, ITL and end-to-end latency recorded per run.",
    )
    seeding: Literal["official", "per_run"] = Field(
        default="official",
        description="Prompt seeds of the random dataset: official = every run of a case uses bench.seed, as the "
        "official throughput script does (it repeats `vllm bench serve` without --seed, so the later runs meet "
        "prompts the prefix cache has seen); per_run = run k uses bench.seed + k (fresh prompts every run).",
    )
    seed: int = Field(
        default=VLLM_BENCH_DEFAULT_SEED,
        description="Prompt seed passed to `vllm bench serve --seed`; default 0, the client's own default.",
    )

    def run_seed(self, run: int) -> int:
        """The --seed of run `run` (0-based) of every case, by the seeding mode."""
        return self.seed if self.seeding == "official" else self.seed + run

    @field_validator("cases", mode="before")
    @classmethod
    def _cases(cls, value: Any) -> list[Case]:
        if isinstance(value, str) and value in CASE_SETS:
            return list(CASE_SETS[value])
        return parse_cases(value)

    @field_validator("goodput")
    @classmethod
    def _slos(cls, goodput: dict[str, float] | None) -> dict[str, float] | None:
        for key, ms in (goodput or {}).items():
            if key not in GOODPUT_KEYS or not ms > 0:
                raise ValueError(f"{key} = {ms}: SLOs are ttft, tpot or e2el with a positive number of ms")
        return goodput

    @model_validator(mode="after")
    def _script_seeds(self) -> Bench:
        if self.client != "completions" and (self.seeding, self.seed) != ("official", VLLM_BENCH_DEFAULT_SEED):
            raise ValueError(
                f"client {self.client} sends no --seed, as its script does (every run: the client's default "
                f"{VLLM_BENCH_DEFAULT_SEED}); remove seeding = {self.seeding!r} and seed = {self.seed}, or use "
                'client = "completions"'
            )
        return self

    @field_validator("percentiles", mode="before")
    @classmethod
    def _as_tuple(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @field_validator("percentiles")
    @classmethod
    def _in_range(cls, pcts: tuple[float, ...]) -> tuple[float, ...]:
        bad = [p for p in pcts if not 0 <= p <= 100]
        if bad:
            raise ValueError(f"percentiles are between 0 and 100, got {bad[0]}")
        return pcts


class Acceptance(BaseModel):
    model_config = _CONFIG

    noise_band: float = Field(
        default=0.01,
        ge=0,
        description="The lower bound of the candidate's total tok/s gain must exceed this fraction, in every case.",
    )
    ttft_ratio_max: float = Field(
        default=1.01,
        gt=0,
        description="The upper bound of the candidate's mean TTFT ratio to the baseline must be at most this, in "
        "every case.",
    )
    confidence: float = Field(
        default=0.95,
        gt=0,
        lt=1,
        description="Confidence of the two-sided intervals across launches (paired Student t on per-round log "
        "ratios); each bound is a one-sided test at (1 - confidence) / 2.",
    )
    calibration: str | None = Field(
        default=None,
        description="A `serve calibrate` run directory (relative paths from the protocol's folder) that must have "
        "passed (power and false acceptance, for this protocol's rounds) with the same model, server argv (apart from "
        "operator selection), cases and acceptance rule before the first launch.",
    )
    max_false_acceptance_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Largest false-acceptance rate (A/A trials of this protocol's rounds the rule accepts) a "
        "calibration may show; `serve calibrate` also needs at least 1 / this many A/A comparisons to estimate it.",
    )


class PluginPin(BaseModel):
    model_config = _CONFIG

    commit: str = Field(min_length=7, description="vllm-plugin-FL commit (a prefix of 7 or more hex digits).")
    branch: str | None = Field(default=None, description="Its branch, checked when the install records one.")


class Pins(BaseModel):
    model_config = _CONFIG

    vllm_plugin_fl: PluginPin | None = Field(default=None, description="vllm-plugin-FL's commit and branch.")
    flag_gems: str | None = Field(default=None, description="FlagGems version (e.g. 5.3.5).")
    vllm: str | None = Field(default=None, description="vLLM version (a local part such as +cpu is ignored).")

    def flat(self) -> dict[str, str | None]:
        """As serving/pins.py compares them."""
        fl = self.vllm_plugin_fl
        return {
            "vllm": self.vllm,
            "flag_gems": self.flag_gems,
            "vllm_plugin_fl_commit": fl.commit if fl else None,
            "vllm_plugin_fl_branch": fl.branch if fl else None,
        }


class Protocol(BaseModel):
    model_config = _CONFIG

    name: str = Field(default="serving-trial", min_length=1, description="Trial name, recorded in the run directory.")
    seed: int = Field(default=0, description="Seeds the launch order (prompt seeds: bench.seed and bench.seeding).")
    rounds: int = Field(
        default=1, ge=1, description="Launches per arm: each round launches every arm once, fresh, in a seeded order."
    )
    repeats: int = Field(
        default=4, description="Runs of each case per launch; the first is the warm-up and is dropped (>= 2)."
    )
    server: Server = Field(description="How the server is reached, started and stopped.")
    bench: Bench = Field(description="The throughput cases and how each run is measured.")
    acceptance: Acceptance = Field(
        default=Acceptance(), description="Preregistered acceptance of the candidate against the baseline."
    )
    accuracy: AccuracySpec | None = Field(
        default=None,
        description="Optional MATH-500 gate: every arm is measured once, the candidate must pass.",
    )
    pins: Pins = Field(
        default=Pins(),
        description="The server environment's vllm-plugin-FL commit (and branch), FlagGems and vLLM versions: a "
        "launch whose server interpreter has others is refused unless the run passes --override-pins (recorded).",
    )
    arms: list[Arm] = Field(description="Server configurations, each launched fresh in every round.")

    @field_validator("repeats")
    @classmethod
    def _warmup(cls, repeats: int) -> int:
        if repeats < 2:
            raise ValueError(f"must be >= 2, got {repeats}: the first run of each case is the warm-up and is dropped")
        return repeats

    @field_validator("arms")
    @classmethod
    def _arm_rules(cls, arms: list[Arm]) -> list[Arm]:
        if not arms:
            raise ValueError("no [[arms]]; add at least one arm with name and argv")
        names = [a.name for a in arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names repeat in {names}; give each arm its own name")
        for role in ("baseline", "candidate"):
            if sum(a.role == role for a in arms) > 1:
                raise ValueError(f"more than one arm has role {role}; keep one")
        if any(a.external for a in arms) and len(arms) > 1:
            raise ValueError("an arm without argv (running server) is only allowed alone; give every arm an argv")
        ref = next((a for a in arms if a.role == "baseline"), arms[0])
        for arm in arms:
            if (diff := non_operator_difference(ref, arm)) is not None:
                raise ValueError(diff)
        return arms

    @model_validator(mode="after")
    def _official_runs(self) -> Protocol:
        if self.bench.client == "official" and self.repeats != official.RUNS:
            raise ValueError(
                f"repeats = {self.repeats}: client official runs each case RUNS = {official.RUNS} times, the first "
                f"{official.SKIP_FIRST} dropped, as {official.SCRIPT} does; set repeats = {official.RUNS} or use "
                'client = "completions"'
            )
        return self

    @model_validator(mode="after")
    def _per_op_changes_only_the_arms_ops(self) -> Protocol:
        ref = next((a for a in self.arms if a.role == "baseline"), self.arms[0])
        platform = self.server.fl_platform.table if self.server.fl_platform else None
        for arm in self.arms:
            if arm is not ref and (problem := per_op_confound(ref, arm, platform)) is not None:
                raise ValueError(problem)
        return self

    def arm(self, role: str) -> Arm | None:
        return next((a for a in self.arms if a.role == role), None)

    def url(self) -> str:
        return self.server.base_url or f"http://{self.server.host}:{self.server.port}"

    def expand(self, arm: Arm) -> list[str]:
        s = self.server
        subs = {"{port}": str(s.port), "{host}": s.host, "{model}": s.model or "", "{model_id}": s.model_id}
        out = []
        for a in arm.argv:
            for k, v in subs.items():
                a = a.replace(k, v)
            out.append(a)
        return out

    def with_client(self, client: str) -> Protocol:
        """This protocol with bench.client replaced (`serve trial --client`), validated again."""
        data = self.model_dump()
        data["bench"] |= {"client": client, "cases": self.bench.cases}
        try:
            return Protocol.model_validate(data)
        except ValidationError as e:
            raise ProtocolError(f"--client {client}: {describe(e, Protocol)}") from None

    def with_model(self, model: str) -> Protocol:
        """This protocol with server.model replaced (`serve trial --model`); a tokenizer that followed the
        model (unset or equal to it) follows the new one."""
        s = self.server
        tokenizer = None if s.tokenizer in (None, s.model) else s.tokenizer
        return self.model_copy(update={"server": s.model_copy(update={"model": model, "tokenizer": tokenizer})})


def parse_protocol(text: str, base_dir: Path | None = None) -> Protocol:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProtocolError(f"protocol is not valid TOML ({e}); fix the syntax") from None
    try:
        return Protocol.model_validate(doc, context={"base_dir": base_dir or Path(".")})
    except ValidationError as e:
        raise ProtocolError(describe(e, Protocol)) from None


def load_protocol(path: Path) -> tuple[Protocol, bytes]:
    if not path.is_file():
        raise ProtocolError(f"protocol file {path} not found; pass the path of a .toml protocol")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{path} is not UTF-8 text") from None
    return parse_protocol(text, path.parent), raw
