"""The model-trial protocol: which model, which arms, which prefill and decode cases.

A protocol is a TOML file read into frozen pydantic records (`load_protocol`); every key is
in docs/PROTOCOL_KEYS.md. The model is a built-in preset (a Llama-style config written out
here) or a local Hugging Face config directory; weights are random (seeded) unless a
checkpoint directory is given.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kerneltrial.model_fields import describe

_CONFIG = ConfigDict(extra="forbid", frozen=True)

# MiniCPM5-2B as a Llama-style decoder (issue 15): 42 layers, hidden 2048, intermediate 6144,
# 16 query and 2 KV heads of dimension 128, vocabulary 130560, RMSNorm eps 1e-6, untied head.
PRESETS: dict[str, dict[str, Any]] = {
    "minicpm5-2b": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 130560,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
        "hidden_act": "silu",
    },
    # A few small layers for CPU tests through the Triton interpreter.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
    },
}

BASELINE = "eager"  # the Hugging Face code: the reference of every check and ratio
_ARM = re.compile(r"^(eager|torch_eager|kerneltrial|liger|torch_compile|flaggems|E1|E2|E3|user:[A-Za-z0-9_.\-/]+\.py)$")


class ProtocolError(ValueError):
    """A model protocol that cannot run; the message names the key and the fix."""


class Prefill(BaseModel):
    """One forward pass over `batch` prompts of `tokens` tokens, no cache (last-token logits)."""

    model_config = _CONFIG
    batch: int = Field(ge=1, description="prompts per forward pass")
    tokens: int = Field(ge=1, description="tokens of each prompt")

    @property
    def id(self) -> str:
        return f"prefill-b{self.batch}-t{self.tokens}"


class Decode(BaseModel):
    """One decode step of `batch` sequences after `context` cached tokens (static KV cache)."""

    model_config = _CONFIG
    batch: int = Field(ge=1, description="sequences decoded together")
    context: int = Field(
        ge=1,
        description="tokens already in the cache; each call decodes at a fresh position in the context's upper half",
    )

    @property
    def id(self) -> str:
        return f"decode-b{self.batch}-c{self.context}"


class Correctness(BaseModel):
    """The model-level gate every arm passes before it is timed (teacher-forced).

    Every arm computes the logits of one token sequence: the prompts, then `steps` tokens the
    float32 copy of the model (the oracle, as operator trials compare with float64) chooses
    greedily; each step's logits come from the same prefix in every arm, so one near-tie
    cannot cascade into a divergence (the free-running greedy rule failed an honest
    torch_compile arm that way: results/h200/minicpm5-2b-model, a flip at step 6 where eager's
    top-two margin was 1.4%). An arm passes when its distance to the float32 logits,
    max |arm - oracle| / max |oracle| over every step, is at most `oracle_factor` times
    eager's own, and its top-1 agreement with the float32 model's tokens is at least eager's
    minus `top1_margin`."""

    model_config = _CONFIG
    prompts: int = Field(default=2, ge=1, description="prompts of the teacher-forced sequence (drawn from the seed)")
    prompt_tokens: int = Field(default=32, ge=1, description="tokens of each prompt")
    steps: int = Field(
        default=16,
        ge=1,
        description="steps whose logits are compared: the prompt's last position, then one decode step per "
        "float32-chosen token",
    )
    oracle_factor: float = Field(
        default=2.0,
        ge=1,
        description="an arm's logits may be at most this many times as far from the float32 model as eager's "
        "(42 bf16 layers amplify one extra rounding per norm: results/archive/h200/minicpm5-2b-model-r1 read "
        "2.5-3.7% from eager for three correct arms); the same rule checks the calls timed",
    )
    top1_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="an arm's top-1 agreement with the float32 model's tokens may be this much below eager's "
        "(a fraction of prompts x steps: 0.05 of the committed 4 x 16 allows 3 flips, near-ties on random "
        "weights)",
    )


MODES = ("eager", "graph")
Mode = Literal["eager", "graph"]


class Protocol(BaseModel):
    """A whole-model trial (`kerneltrial model`): which model, which arms, which cases."""

    model_config = _CONFIG
    name: str = Field(description="the trial's name")
    model: str = Field(description="a preset (minicpm5-2b, tiny) or a local Hugging Face config directory")
    checkpoint: str | None = Field(default=None, description="a local checkpoint directory; random weights when absent")
    dtype: str = Field(default="bfloat16", description="bfloat16, float16 or float32: the weights and activations")
    seed: int = Field(default=0, description="draws the weights, the gate's prompts and every round's inputs")
    rounds: int = Field(default=5, ge=1, description="timed rounds per case: every arm once per round")
    warmup: int = Field(
        default=2, ge=0, description="untimed rounds (every arm once, seeded order) before a case's rounds"
    )
    calls_per_sample: int = Field(default=1, ge=1, description="calls between two device synchronisations, one sample")
    tie_band: float = Field(default=0.02, ge=0, description="a ratio whose interval lies within 1 +- tie_band is a tie")
    arms: tuple[str, ...] = Field(
        description="eager (the Hugging Face code, required: every check's and ratio's reference), torch_eager, "
        "kerneltrial, liger, torch_compile, flaggems, the Track 2 arms E1 (kerneltrial's RMSNorm and residual-add + "
        "RMSNorm, torch formulas elsewhere), E2 (kerneltrial's SiLU-and-mul only), E3 (both: the kerneltrial arm's "
        "kernels; E0 is eager), user:PATH.py"
    )
    prefill: tuple[Prefill, ...] = Field(default=(), description="prefill cases: one forward pass, no cache")
    decode: tuple[Decode, ...] = Field(default=(), description="decode cases: one step on a static KV cache")
    correctness: Correctness = Field(
        default=Correctness(),
        description="the teacher-forced gate before timing (its oracle_factor checks timed calls too)",
    )
    modes: tuple[Mode, ...] = Field(
        default=("eager",),
        min_length=1,
        description="how every case's calls run, each mode a case of its own: eager (the Python dispatch of every "
        "launch) and/or graph (each arm's call captured once per case in a CUDA graph on the static KV cache and "
        "replayed, as vLLM serves decode; case ids end in -graph)",
    )
    graph_prefill: bool = Field(
        default=True,
        description="graph mode captures the prefill cases too (their shapes are static; transformers materialises the "
        "causal mask while a stream captures, so a captured prefill runs SDPA with an explicit mask); false: prefill "
        "runs eager only",
    )
    attribution: bool = Field(default=True, description="profile one call per arm and case after the rounds")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="confidence of every speedup's interval")

    @field_validator("arms")
    @classmethod
    def _arms(cls, arms: tuple[str, ...]) -> tuple[str, ...]:
        for arm in arms:
            if not _ARM.match(arm):
                raise ValueError(
                    f"unknown arm {arm!r}: use eager, torch_eager, kerneltrial, liger, torch_compile, flaggems "
                    "or user:PATH.py (a module defining rmsnorm, fused_add_rmsnorm and/or silu_and_mul)"
                )
        if BASELINE not in arms:
            raise ValueError(f"arms must include {BASELINE!r}, the Hugging Face code every arm is checked against")
        if len(set(arms)) != len(arms):
            raise ValueError(f"arms repeat a name: {list(arms)}")
        return arms

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, dtype: str) -> str:
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype {dtype!r}: use bfloat16, float16 or float32")
        return dtype

    @model_validator(mode="after")
    def _checkpoint_is_the_model(self) -> Protocol:
        if self.checkpoint and self.model in PRESETS:
            raise ValueError(
                f"checkpoint {self.checkpoint!r} brings its own config: set model to the checkpoint directory, "
                f"not the preset {self.model!r} (whose config would be ignored)"
            )
        return self

    @model_validator(mode="after")
    def _some_case(self) -> Protocol:
        if not self.prefill and not self.decode:
            raise ValueError("no cases: add [[prefill]] (batch, tokens) and/or [[decode]] (batch, context) tables")
        return self

    @model_validator(mode="after")
    def _modes(self) -> Protocol:
        if len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes repeat a mode: {list(self.modes)}; list each of {', '.join(MODES)} once")
        return self

    @model_validator(mode="after")
    def _fresh_positions(self) -> Protocol:
        for case in self.decode:
            if case.context < self.calls_per_sample:
                raise ValueError(
                    f"decode context {case.context} leaves fewer cache positions than calls_per_sample "
                    f"{self.calls_per_sample}: every call of a sample decodes at its own position; raise the context"
                )
        return self

    @property
    def cases(self) -> list[Prefill | Decode]:
        return [*self.prefill, *self.decode]

    def runs(self) -> list[tuple[Prefill | Decode, Mode]]:
        """Every (case, mode) the trial times, in order: the cases of each mode, eager first."""
        order = [m for m in MODES if m in self.modes]
        return [
            (c, m) for m in order for c in self.cases if m == "eager" or self.graph_prefill or isinstance(c, Decode)
        ]


def case_id(case: Prefill | Decode, mode: Mode) -> str:
    """A (case, mode)'s id: the case's own in eager mode (as runs before graph mode named it), `-graph` after it."""
    return case.id if mode == "eager" else f"{case.id}-graph"


def position_span(context: int, calls: int) -> int:
    """How many cache positions a decode case's calls draw from: the upper half of the context
    (positions context - span + 1 .. context), and at least one per call of a sample, within the context."""
    return min(context, max(calls, (context + 1) // 2))


def parse_protocol(text: str) -> Protocol:
    try:
        return Protocol.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ProtocolError(f"not valid TOML: {exc}") from None
    except ValidationError as exc:
        raise ProtocolError(describe(exc, Protocol)) from None


def load_protocol(path: Path) -> tuple[Protocol, bytes]:
    """The protocol and its bytes (the run directory keeps an exact copy)."""
    if not path.is_file():
        raise ProtocolError(f"{path}: no such protocol file")
    data = path.read_bytes()
    try:
        return parse_protocol(data.decode()), data
    except ProtocolError as exc:
        raise ProtocolError(f"{path}: {exc}") from None
