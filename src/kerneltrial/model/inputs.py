"""Fresh inputs for every timed call of a model trial (issue 24, item 6).

A memoising arm would hit its cache on every timed call if every call saw the same prompt,
so each round of a case draws its own inputs, one set per call of a sample, from a seed
derived from the protocol's seed, the case and the round (`round_seed`); warm-up rounds
draw theirs too (rounds -1, -2, ...). Every arm of a round times the same inputs (the
ratios pair arms within a round). A prefill call gets `batch` fresh prompts; a decode call
fresh tokens at a fresh cache position, drawn without replacement from the upper half of
the context and taken in decreasing order within a sample, so no call reads a position an
earlier call of its sample wrote (the runner restores the cache after every sample).

The draws use numpy's PCG64 (the same bits on every platform), so verify rebuilds each
call's inputs from inputs.csv's seed and compares their digest, without torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from kerneltrial.model.spec import position_span


def round_seed(seed: int, case: str, round_index: int) -> int:
    """The seed of one round's inputs of one case (a 64-bit integer)."""
    text = f"kerneltrial.model-inputs/{seed}/{case}/{round_index}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def ids_sha256(ids: np.ndarray) -> str:
    """The digest of one call's token ids (little-endian int64, row-major)."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest()


@dataclass(frozen=True)
class RoundInputs:
    """One round's inputs: per call the token ids [batch, tokens] and, in decode, the cache position."""

    seed: int
    ids: list[np.ndarray]
    positions: list[int] | None

    def rows(self, case: str, round_index: int) -> list[list[object]]:
        """inputs.csv rows (layout.INPUT_COLUMNS), one per call."""
        return [
            [case, round_index, k, self.seed, -1 if self.positions is None else self.positions[k], ids_sha256(ids)]
            for k, ids in enumerate(self.ids)
        ]


def draw(seed: int, vocab: int, batch: int, tokens: int, calls: int, context: int | None) -> RoundInputs:
    """The round's inputs from its seed: `calls` id arrays of [batch, tokens] (decode: tokens 1),
    then, in decode (`context` given), one position per call, distinct, in decreasing order."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, vocab, size=(batch, tokens), dtype=np.int64) for _ in range(calls)]
    if context is None:
        return RoundInputs(seed, ids, None)
    span = position_span(context, calls)
    low = context - span + 1
    chosen = rng.choice(span, size=calls, replace=False) + low
    return RoundInputs(seed, ids, sorted((int(q) for q in chosen), reverse=True))
