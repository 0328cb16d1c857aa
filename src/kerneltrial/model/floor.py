"""The weight-read floor of a model call (issue 27, item 1): the least time a call can take if
it only streamed the bytes it must read, at the copy rate measured in the same run.

Bytes a call must read (`floor_bytes`): every weight once (the parameters, less the input
embedding table unless the head shares it), the embedding rows of its tokens, and in decode
the static KV cache's keys and values (Hugging Face's attention reads the whole static
cache, masked: context + 1 positions). Writes are left out, so the floor is low. The rate:
a device-to-device copy of COPY_BYTES, COPY_SAMPLES samples, counting bytes read and written
(as the operator trials' copy ceiling does: an H200 moves about 4.3 TB/s counted that way). floor_ns =
bytes / the copies' median rate. Decode at small batch should approach it under CUDA graphs;
prefill is compute-bound and lies far above it (its floor is a bound, not a target).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

COPY_BYTES = {"cuda": 1 << 30, "cpu": 16 << 20}  # 1 GiB on a GPU (as the operator trials' copy ceiling)
COPY_SAMPLES = 11


@dataclass(frozen=True)
class FloorBytes:
    """What one call must read, by kind (plan.json's `floor_bytes` of a case)."""

    weights: int
    embedding_rows: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.embedding_rows + self.kv_cache

    def record(self) -> dict[str, int]:
        return asdict(self)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter a forward reads in full: all, less the input embedding table
    (a call reads only its tokens' rows) unless the output head is the same tensor."""
    params = {id(p): p for p in model.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    return total


def kv_cache_bytes(config: object, batch: int, length: int, element_size: int) -> int:
    """Keys and values of every layer for `length` positions of `batch` sequences."""
    heads = int(config.num_key_value_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return 2 * int(config.num_hidden_layers) * batch * heads * head_dim * length * element_size


def floor_bytes(model: torch.nn.Module, tokens: int, batch: int, cache_length: int) -> FloorBytes:
    """The bytes a call of `tokens` tokens reads; `cache_length` 0 when it uses no cache (prefill)."""
    size = next(model.parameters()).element_size()
    config = model.config
    return FloorBytes(
        weights=weight_bytes(model),
        embedding_rows=tokens * int(config.hidden_size) * size,
        kv_cache=kv_cache_bytes(config, batch, cache_length, size) if cache_length else 0,
    )


def copy_samples(device: torch.device) -> list[list[int]]:
    """copies.csv rows (layout.COPY_COLUMNS): COPY_SAMPLES timed copies of COPY_BYTES after one untimed, each timed by
    CUDA events on a GPU (device time) and the host clock on a CPU."""
    n = COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    rows = []
    for sample in range(COPY_SAMPLES):
        rows.append([sample, 2 * n, _time_copy(dst, src, device)])
    return rows


def _time_copy(dst: torch.Tensor, src: torch.Tensor, device: torch.device) -> int:
    if device.type != "cuda":
        start = time.perf_counter_ns()
        dst.copy_(src)
        return time.perf_counter_ns() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    dst.copy_(src)
    end.record()
    end.synchronize()
    return round(begin.elapsed_time(end) * 1e6)
