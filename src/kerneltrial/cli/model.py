"""`kerneltrial model`: a whole-model trial (verify and report pick it by the directory's kind).

Errors follow cli_support: the library's errors (bad protocol, unavailable arm, a model the
patcher cannot route) are one `error:` line and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def model(
    protocol: Annotated[
        Path, typer.Argument(help="A model-trial protocol (TOML; see protocols/model/minicpm5-2b.toml).")
    ],
    out: Annotated[Path, typer.Option("--out", help="A new run directory.")],
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress lines.")] = False,
) -> None:
    """Time a causal LM whose RMSNorm, residual-add + RMSNorm and SiLU-and-mul run each arm's
    implementation, after a model-level correctness gate (teacher-forced logits against the
    float32 model, call counts), on fresh inputs every call, eagerly and/or replayed from CUDA
    graphs (the protocol's `modes`).

    Arms: eager (the Hugging Face code), torch_eager, kerneltrial, liger,
    torch_compile, flaggems, user:PATH.py. Then `kerneltrial verify OUT` and `kerneltrial report OUT`.

    The protocol's `model`: a built-in preset, `minicpm5-2b` (MiniCPM5-2B's shapes, 42 layers:
    a GPU) or `tiny` (2 layers, hidden 64, vocabulary 512, random weights: minutes on a CPU
    through the Triton interpreter, for a first try), or a local Hugging Face config directory.
    """
    from kerneltrial.model.runner import run_model_trial  # here: `--help` stays fast

    run_model_trial(protocol, out, None if quiet else lambda line: typer.echo(line, err=True))
    typer.echo(f"wrote {out}; next: kerneltrial verify {out} && kerneltrial report {out}")


def mount(app: typer.Typer) -> None:
    app.command("model")(model)
