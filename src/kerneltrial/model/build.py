"""Build a causal LM and route its replaceable operators to one arm at a time.

One model serves every arm: its weights are built once, and the modules that compute the
operators kerneltrial replaces are patched, once, with routers. A router calls the active
arm's implementation (`Router.arm`), counts the call (`Router.counts`: proof that every
operator call reached the arm's implementation; what that implementation launched is in
the profiled kernels of each region, attribution.csv's `kernels`) and, when asked, names the
call for the profiler (`Router.annotate`), so switching arms between timed calls costs one
attribute write and no memory. Every routed call, eager's too, pays the same wrapper (a
Python call and a context manager).

What is patched (found by structure, not by class, so remote-code Llama variants match):
- every RMSNorm module (class name ending in "RMSNorm", with `weight` and an eps): `rmsnorm`;
- every MLP with gate_proj, up_proj and down_proj: the gate and up projections are written
  by two GEMMs into the two halves of one [tokens, 2 x intermediate] buffer (the same GEMMs
  as the Hugging Face module, into adjacent memory), then `silu_and_mul`, then down_proj;
- every decoder layer with input_layernorm, self_attn, post_attention_layernorm and mlp:
  the residual add after attention and the post-attention norm become `fused_add_rmsnorm`
  (in place, vLLM's contract). The input norm stays a plain `rmsnorm` and the add after the
  MLP stays a torch add: fusing those needs the next layer (vLLM carries the residual across
  layers), which changes the model's structure, not only its operators.

The `eager` arm runs the Hugging Face code: the norms' and decoder layers' own forwards, and
LlamaMLP's forward restated line for line so that act(gate) * up sits inside a region (the
same kernels). Every other arm runs the patched structure; the
`torch_eager` arm runs it with torch formulas, so eager vs torch_eager measures the patch
structure itself, and torch_eager vs a kernel arm measures only the kernels.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kerneltrial.model.spec import BASELINE, PRESETS, Protocol

OPS = ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul")
REGION = "kt::"  # profiler label prefix of a routed operator call


class ModelError(RuntimeError):
    """The model cannot be built or patched; the message names the fix."""


@dataclass(frozen=True)
class OpTable:
    """One arm's implementations of the three operators (registry calling convention)."""

    rmsnorm: Callable[..., torch.Tensor]
    fused_add_rmsnorm: Callable[..., None]
    silu_and_mul: Callable[..., torch.Tensor]
    sources: dict[str, str]  # op -> the registry implementation (or module) it came from


@dataclass
class Router:
    """The active arm, its tables, and the counts of routed calls since the last reset."""

    tables: dict[str, OpTable]
    arm: str = BASELINE
    annotate: bool = False
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def eager(self) -> bool:
        return self.arm == BASELINE

    def table(self) -> OpTable:
        return self.tables[self.arm]

    @contextlib.contextmanager
    def region(self, op: str) -> Iterator[None]:
        self.counts[op] += 1
        if self.annotate:
            with torch.profiler.record_function(REGION + op):
                yield
        else:
            yield


@dataclass(frozen=True)
class Patched:
    """What the patcher found: how many modules of each kind it routed."""

    norms: int
    mlps: int
    layers: int


def expected_calls(layers: int, eager: bool) -> dict[str, int]:
    """Routed calls per forward pass of a decoder with `layers` layers (from the model's
    config, not from what the patcher found: a module it missed shows as a missing call)."""
    if eager:
        return {"rmsnorm": 2 * layers + 1, "fused_add_rmsnorm": 0, "silu_and_mul": layers}
    return {"rmsnorm": layers + 1, "fused_add_rmsnorm": layers, "silu_and_mul": layers}


def hf_config(p: Protocol) -> Any:
    """A transformers config: the preset's Llama config, or the directory's own."""
    try:
        from transformers import AutoConfig, LlamaConfig
    except ImportError as exc:
        raise ModelError("model trials need transformers: pip install 'kerneltrial[model]'") from exc
    if p.model in PRESETS:
        return LlamaConfig(**PRESETS[p.model])
    path = Path(p.model)
    if not (path / "config.json").is_file():
        raise ModelError(
            f"model {p.model!r} is neither a preset ({', '.join(PRESETS)}) nor a directory with config.json"
        )
    return AutoConfig.from_pretrained(path, trust_remote_code=True)


def build_model(p: Protocol, device: torch.device) -> torch.nn.Module:
    """The causal LM in eval mode on `device`: the checkpoint's weights, or random ones drawn
    from `p.seed` (the same weights for every arm, since every arm shares this model)."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, p.dtype)
    if p.checkpoint:
        if not Path(p.checkpoint).is_dir():
            raise ModelError(f"checkpoint {p.checkpoint!r} is not a directory; give a local checkpoint or omit it")
        model = AutoModelForCausalLM.from_pretrained(p.checkpoint, dtype=dtype, trust_remote_code=True)
    else:
        torch.manual_seed(p.seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config(p), trust_remote_code=True)
            spread_norm_weights(model, p.seed)
        model = model.to(dtype)
    act = getattr(model.config, "hidden_act", "silu")
    if act != "silu":
        raise ModelError(
            f"the model's hidden_act is {act!r}; the routed MLP computes SiLU-and-mul only (use a SiLU model)"
        )
    return model.to(device).eval()


NORM_WEIGHT_SPREAD = 0.2  # random norm weights ~ 1 + 0.2 N(0, 1)


def spread_norm_weights(model: torch.nn.Module, seed: int) -> None:
    """Draw every norm weight around 1. Hugging Face initialises them to exactly 1.0, and then
    an arm that ignores the weight computes the same model and passes the gate (a reviewer's
    planted arm did, before this)."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if _is_norm(module):
                noise = torch.randn(
                    module.weight.shape, generator=generator, device="cpu"
                )  # the same draw on any device
                module.weight.copy_(1 + NORM_WEIGHT_SPREAD * noise)


def _norm_eps(module: torch.nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _is_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "weight") and _norm_eps(module) is not None


def _is_mlp(module: torch.nn.Module) -> bool:
    return all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj"))


def _is_layer(module: torch.nn.Module) -> bool:
    return all(hasattr(module, n) for n in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))


def rows(x: torch.Tensor) -> torch.Tensor:
    """x as [tokens, width]: a view (an in-place operator writes through it), never a copy."""
    return x.view(-1, x.shape[-1])


def _patch_norm(module: torch.nn.Module, router: Router) -> None:
    original = module.forward
    eps = _norm_eps(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        with router.region("rmsnorm"):
            if router.eager:
                return original(x)
            return router.table().rmsnorm(rows(x), module.weight, eps).view(x.shape)

    module.forward = forward


def gate_up(x: torch.Tensor, mlp: torch.nn.Module) -> torch.Tensor:
    """[tokens, 2 x intermediate]: gate_proj(x) in the first half, up_proj(x) in the second,
    each written by its own GEMM straight into its half (no copy, no merged weight)."""
    for proj in (mlp.gate_proj, mlp.up_proj):
        if getattr(proj, "bias", None) is not None:
            raise ModelError("an MLP projection with a bias is not supported by the patched structure")
    x2 = rows(x)
    width = mlp.gate_proj.weight.shape[0]
    out = x2.new_empty(x2.shape[0], 2 * width)
    torch.mm(x2, mlp.gate_proj.weight.t(), out=out[:, :width])
    torch.mm(x2, mlp.up_proj.weight.t(), out=out[:, width:])
    return out


def _patch_mlp(module: torch.nn.Module, router: Router) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if router.eager:  # LlamaMLP.forward's own code, its act(gate) * up inside a region
            gate, up = module.gate_proj(x), module.up_proj(x)
            with router.region("silu_and_mul"):
                act = module.act_fn(gate) * up
            return module.down_proj(act)
        both = gate_up(x, module)
        with router.region("silu_and_mul"):
            act = router.table().silu_and_mul(both)
        return module.down_proj(act.view(*x.shape[:-1], act.shape[-1]))

    module.forward = forward


def _patch_layer(layer: torch.nn.Module, router: Router) -> None:
    original = layer.forward
    post = layer.post_attention_layernorm
    eps = _norm_eps(post)

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if router.eager:
            return original(hidden_states, *args, **kwargs)
        if args:
            raise ModelError(
                "a decoder layer was called with positional arguments after hidden_states; this transformers "
                "version's calling convention is not supported by the patched structure"
            )
        residual = hidden_states
        attn = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
        h = attn[0] if isinstance(attn, tuple) else attn
        with router.region("fused_add_rmsnorm"):
            router.table().fused_add_rmsnorm(rows(h), rows(residual), post.weight, eps)
        return residual + layer.mlp(h)

    layer.forward = forward


def patch(model: torch.nn.Module, router: Router) -> Patched:
    """Route every norm, MLP and decoder layer of `model` through `router`."""
    norms = [m for m in model.modules() if _is_norm(m)]
    mlps = [m for m in model.modules() if _is_mlp(m)]
    layers = [m for m in model.modules() if _is_layer(m)]
    for m in norms:
        _patch_norm(m, router)
    for m in mlps:
        _patch_mlp(m, router)
    for m in layers:
        _patch_layer(m, router)
    return Patched(norms=len(norms), mlps=len(mlps), layers=len(layers))


# --- calls: prefill and one decode step on a static KV cache ---------------------------


def _cache_keyword(model: torch.nn.Module) -> str:
    """transformers 5.x renamed `past_key_values` to `cache` in later releases."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def static_cache(model: torch.nn.Module, length: int) -> Any:
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def rewind(model: torch.nn.Module, cache: Any, position: torch.Tensor, n: int) -> dict[str, Any]:
    """The forward keywords that make the next call write `n` tokens into the cache from
    `position` (a 0-d int64 tensor on the model's device), so a decode step can be repeated on
    one cache. Device tensors only: the same code is captured in a CUDA graph and replayed
    with another position in the buffer."""
    if "cache_position" in inspect.signature(model.forward).parameters:
        return {"cache_position": position + torch.arange(n, device=position.device)}
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(getattr(layer, "cumulative_length", None), torch.Tensor) for layer in layers):
        raise ModelError(
            "this transformers version's StaticCache exposes neither cache_position nor a cumulative_length tensor; "
            "decode steps cannot be repeated on one cache (use transformers 5.x)"
        )
    for layer in layers:
        layer.cumulative_length.copy_(position)
    return {}


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The static cache's key and value tensors, every layer (allocated by its first update)."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def restore(cache: Any, saved: list[torch.Tensor]) -> None:
    """Write `saved` (a copy of `cache_tensors`) back: the positions the last calls wrote are undone."""
    with torch.inference_mode():  # the cache's tensors were made in inference mode
        for tensor, copy in zip(cache_tensors(cache), saved, strict=True):
            tensor.copy_(copy)


def position_tensor(position: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(position, dtype=torch.int64, device=device)


def prefill_call(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Last-position logits of one forward pass over `ids` [batch, tokens], no cache."""
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]


def step(model: torch.nn.Module, cache: Any, ids: torch.Tensor, position: torch.Tensor | int) -> torch.Tensor:
    """Logits of `ids` [batch, n] (the last position's) written at cache positions
    position..position+n-1; `position` an int or a 0-d device tensor (a graph's static buffer)."""
    batch, n = ids.shape
    if not isinstance(position, torch.Tensor):
        position = position_tensor(position, ids.device)
    positions = (position + torch.arange(n, device=ids.device)).expand(batch, n)
    with torch.inference_mode():
        extra = rewind(model, cache, position, n)
        out = model(
            input_ids=ids,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{_cache_keyword(model): cache},
            **extra,
        )
    return out.logits[:, -1]


def greedy(model: torch.nn.Module, prompts: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding: the tokens [prompts, steps] and the logits [prompts, steps, vocab]
    that chose them (the prompt's last position first)."""
    cache = static_cache(model, prompts.shape[1] + steps)
    logits = step(model, cache, prompts, 0)
    chosen: list[torch.Tensor] = []
    seen = [logits]
    for k in range(steps):
        token = logits.argmax(-1, keepdim=True)
        chosen.append(token)
        if k + 1 < steps:
            logits = step(model, cache, token, prompts.shape[1] + k)
            seen.append(logits)
    return torch.cat(chosen, dim=1), torch.stack(seen, dim=1)


def teacher_forced(model: torch.nn.Module, prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [prompts, steps, vocab] of the sequence prompts + tokens, one decode step per
    token: step 0 at the prompt's last position, step k after tokens[:, :k], whatever the
    model would have chosen (so every arm's step k has the same prefix)."""
    steps = tokens.shape[1]
    cache = static_cache(model, prompts.shape[1] + steps)
    seen = [step(model, cache, prompts, 0)]
    for k in range(steps - 1):
        seen.append(step(model, cache, tokens[:, k : k + 1], prompts.shape[1] + k))
    return torch.stack(seen, dim=1)
