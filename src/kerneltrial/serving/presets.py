"""Built-in serving set-ups. The model path is always supplied by the user."""

from __future__ import annotations

from dataclasses import dataclass, field

from kerneltrial.serving.bench import Case


@dataclass(frozen=True)
class Preset:
    name: str
    model_id: str
    description: str
    cases: tuple[Case, ...]
    serve_args: tuple[str, ...]  # after `vllm serve MODEL`; {port} and {model_id} are filled in
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, vllm: str, model: str, port: int) -> list[str]:
        tail = [a.replace("{port}", str(port)).replace("{model_id}", self.model_id) for a in self.serve_args]
        return [vllm, "serve", model, *tail]


PRESETS: dict[str, Preset] = {
    "minicpm5-2b": Preset(
        name="minicpm5-2b",
        model_id="minicpm5-2b",
        description="MiniCPM5-2B reference: cases 4096/1024 (256 requests) and 16384/1024 (128 requests) at concurrency 64",
        cases=(Case(4096, 1024, 64, 256), Case(16384, 1024, 64, 128)),
        serve_args=(
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--served-model-name",
            "{model_id}",
            "--trust-remote-code",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "18432",  # 16384 + 1024 + headroom for special tokens
            "--max-num-seqs",
            "64",
            "--gpu-memory-utilization",
            "0.9",
        ),
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
