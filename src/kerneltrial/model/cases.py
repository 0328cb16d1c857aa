"""One (case, mode) of a model trial: its static state, every arm's call, the rounds on fresh
inputs, the timed checks and the attribution.

Every call, eager or graph, copies its inputs into the case's static buffers (token ids, and
in decode the cache position) and then runs: eager mode the model's Python forward, graph
mode the arm's captured graph (model/graphs.py). A decode case's KV cache holds `context`
tokens written once by the model's own code; a sample's calls decode at distinct positions
in decreasing order and the cache is restored after the sample (outside the timed
interval), so every call reads the same prefix and its reference can be recomputed.

Timed checks (issue 24, item 6): after each round, warm-up rounds included, one call index
is drawn from the operating system's randomness (not seeded: an arm cannot compute it) and
every arm's output of that call is compared with the float32 model's on the same inputs.
The rule is the gate's: an arm's distance (max |arm - float32| / max |float32|) at most
`oracle_factor` times the largest distance eager's Python forward showed on the case's
checked calls (in graph mode computed beside the rounds, so eager's own graph is checked
too). An arm that returns stale results (a cache keyed on its inputs' shapes or buffers)
fails it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kerneltrial.model.attribution import attribute_eager, attribute_graph, synchronize
from kerneltrial.model.build import (
    OPS,
    Router,
    cache_tensors,
    expected_calls,
    position_tensor,
    prefill_call,
    restore,
    static_cache,
    step,
)
from kerneltrial.model.gate import Oracle, relative_error
from kerneltrial.model.graphs import Captured, CaptureFailed, capture, new_pool
from kerneltrial.model.inputs import RoundInputs, draw, round_seed
from kerneltrial.model.layout import PROFILES
from kerneltrial.model.spec import BASELINE, Decode, Mode, Prefill, Protocol, case_id

Case = Prefill | Decode
WRONG = "wrong result while timed: "
Row = list[object]


@dataclass
class Records:
    """The appenders of the run's raw files (rows as lists for csv, dicts for jsonl)."""

    timing: Callable[[Row], None]
    attribution: Callable[[Row], None]
    kernels: Callable[[Row], None]
    inputs: Callable[[Row], None]
    captures: Callable[[dict[str, Any]], None]
    checks: Callable[[dict[str, Any]], None]


@dataclass
class ModelTrial:
    """What every case of a run shares."""

    model: torch.nn.Module
    oracle: Oracle
    router: Router
    p: Protocol
    device: torch.device
    out: Path
    records: Records
    origin: int  # perf_counter_ns of the run's first sample: start_ns counts from it
    say: Callable[[str], None]


def round_order(seed: int, case_index: int, round_index: int, arms: list[str]) -> list[str]:
    """The arms of one round in a seeded random order (verify recomputes it)."""
    order = list(arms)
    random.Random(f"{seed}/{case_index}/{round_index}").shuffle(order)
    return order


def context_ids(vocab: int, shape: tuple[int, int], seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=generator).to(device)


@dataclass
class Static:
    """A (case, mode)'s static state: input buffers, the KV caches (the model's and the float32
    model's, decode only) and copies of them to restore."""

    case: Case
    mode: Mode
    index: int
    ids: torch.Tensor
    position: torch.Tensor | None = None
    cache: Any = None
    saved: list[torch.Tensor] | None = None
    exact_cache: Any = None
    exact_saved: list[torch.Tensor] | None = None

    @property
    def cid(self) -> str:
        return case_id(self.case, self.mode)

    def load(self, inputs: DeviceInputs, k: int) -> None:
        self.ids.copy_(inputs.ids[k])
        if self.position is not None and inputs.positions is not None:
            self.position.copy_(inputs.positions[k])

    def restore(self) -> None:
        if self.cache is not None and self.saved is not None:
            restore(self.cache, self.saved)


def prepare(t: ModelTrial, case: Case, mode: Mode, index: int) -> Static:
    """The static buffers, and for decode both caches filled with the case's context (the same
    tokens for every arm, written by the model's own code)."""
    if isinstance(case, Prefill):
        return Static(case, mode, index, ids=torch.zeros(case.batch, case.tokens, dtype=torch.int64, device=t.device))
    vocab = int(t.model.config.vocab_size)
    # the same context in both modes of a case: seeded by the case's place in the protocol
    prefix = context_ids(vocab, (case.batch, case.context), t.p.seed + 1000 + t.p.cases.index(case), t.device)
    caches = []
    for model in (t.model, t.oracle.model):
        cache = static_cache(model, case.context + 1)
        t.router.arm = BASELINE
        step(model, cache, prefix, 0)
        caches.append(cache)
    return Static(
        case,
        mode,
        index,
        ids=torch.zeros(case.batch, 1, dtype=torch.int64, device=t.device),
        position=position_tensor(case.context, t.device),
        cache=caches[0],
        saved=[x.clone() for x in cache_tensors(caches[0])],
        exact_cache=caches[1],
        exact_saved=[x.clone() for x in cache_tensors(caches[1])],
    )


def body(t: ModelTrial, s: Static) -> Callable[[], torch.Tensor]:
    """The model's call on the static buffers (what a graph captures)."""
    if s.cache is None:
        return lambda: prefill_call(t.model, s.ids)
    return lambda: step(t.model, s.cache, s.ids, s.position)


@dataclass(frozen=True)
class DeviceInputs:
    ids: list[torch.Tensor]
    positions: list[torch.Tensor] | None


def on_device(inputs: RoundInputs, device: torch.device) -> DeviceInputs:
    ids = [torch.from_numpy(a).to(device) for a in inputs.ids]
    positions = None if inputs.positions is None else [position_tensor(q, device) for q in inputs.positions]
    return DeviceInputs(ids, positions)


@dataclass
class ArmCall:
    """One arm's call in a (case, mode): load call k's inputs, run; `static`: the logits are a
    graph's output buffer, overwritten by the next replay."""

    static: Static
    run: Callable[[], torch.Tensor]
    is_static_output: bool

    def __call__(self, inputs: DeviceInputs, k: int) -> torch.Tensor:
        self.static.load(inputs, k)
        return self.run()


def eager_calls(t: ModelTrial, s: Static, arms: list[str]) -> dict[str, ArmCall]:
    run = body(t, s)
    return {arm: ArmCall(s, run, is_static_output=False) for arm in arms}


def graph_calls(t: ModelTrial, s: Static, arms: list[str]) -> tuple[dict[str, ArmCall], dict[str, Captured]]:
    """Each arm's call captured (captures.jsonl: one row per arm); those that fail are left out."""
    pool = new_pool(t.device)
    run = body(t, s)
    calls: dict[str, ArmCall] = {}
    graphs: dict[str, Captured] = {}
    layers = int(t.model.config.num_hidden_layers)
    for arm in arms:
        t.router.arm = arm
        t.router.counts.clear()
        row: dict[str, Any] = {
            "case": s.cid,
            "arm": arm,
            "expected_calls_per_forward": expected_calls(layers, arm == BASELINE),
        }
        try:
            captured = capture(run, t.device, pool)
        except CaptureFailed as exc:
            t.records.captures(row | {"captured": False, "calls_per_forward": None, "reason": str(exc)})
            t.say(f"{s.cid} {arm}: {exc}")
            pool = new_pool(t.device)  # the failed capture spent its pool
            continue
        finally:
            s.restore()
        counts = {op: t.router.counts[op] // captured.calls for op in OPS}
        if counts != row["expected_calls_per_forward"]:
            reason = (
                f"the captured call routed {counts} per forward, the model needs {row['expected_calls_per_forward']}"
            )
            t.records.captures(row | {"captured": False, "calls_per_forward": counts, "reason": reason})
            continue
        t.records.captures(row | {"captured": True, "calls_per_forward": counts, "reason": ""})
        graphs[arm] = captured
        calls[arm] = ArmCall(s, _replay(captured), is_static_output=True)
    return calls, graphs


def _replay(captured: Captured) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        captured.graph.replay()
        return captured.output

    return run


def sample(call: ArmCall, inputs: DeviceInputs, calls: int, device: torch.device) -> tuple[int, list[torch.Tensor]]:
    """One timed sample: `calls` calls between two device synchronisations, and each call's
    logits (a graph's static output copied, inside the interval but for the last call)."""
    outputs: list[torch.Tensor] = []
    synchronize(device)
    start = time.perf_counter_ns()
    for k in range(calls):
        out = call(inputs, k)
        outputs.append(out.clone() if call.is_static_output and k + 1 < calls else out)
    synchronize(device)
    ns = time.perf_counter_ns() - start
    if call.is_static_output:
        outputs[-1] = outputs[-1].clone()
    call.static.restore()
    return ns, outputs


def rounds_of(p: Protocol) -> Iterator[int]:
    """Warm-up rounds (-1, -2, ...), then the timed ones (0, 1, ...)."""
    yield from range(-1, -1 - p.warmup, -1)
    yield from range(p.rounds)


def run_case(t: ModelTrial, s: Static, calls: dict[str, ArmCall]) -> None:
    """Every round of the case (warm-up ones untimed), the timed checks, then the attribution."""
    vocab = int(t.model.config.vocab_size)
    tokens = s.case.tokens if isinstance(s.case, Prefill) else 1
    context = s.case.context if isinstance(s.case, Decode) else None
    checked: dict[int, Checked] = {}
    last: DeviceInputs | None = None
    for r in rounds_of(t.p):
        drawn = draw(round_seed(t.p.seed, s.cid, r), vocab, s.case.batch, tokens, t.p.calls_per_sample, context)
        for row in drawn.rows(s.cid, r):
            t.records.inputs(row)
        last = on_device(drawn, t.device)
        outputs = {}
        for position, arm in enumerate(round_order(t.p.seed, s.index, r, list(calls))):
            t.router.arm = arm
            start = time.perf_counter_ns() - t.origin
            ns, outputs[arm] = sample(calls[arm], last, t.p.calls_per_sample, t.device)
            if r >= 0:
                t.records.timing([s.cid, r, position, arm, t.p.calls_per_sample, ns, start])
        k = random.SystemRandom().randrange(t.p.calls_per_sample)
        want = expected(t, s, last, k)
        scale = outputs[BASELINE][k] if s.mode == "eager" else eager_output(t, s, last, k)
        distances = {arm: relative_error(outs[k], want) for arm, outs in outputs.items()}
        checked[r] = Checked(k, relative_error(scale, want), distances)
        if r >= 0:
            t.say(f"{s.cid}: round {r + 1}/{t.p.rounds}")
    write_checks(t, s.cid, checked)
    if t.p.attribution and last is not None:
        for arm, call in calls.items():
            attribute(t, s, arm, call, last)


def expected(t: ModelTrial, s: Static, inputs: DeviceInputs, k: int) -> torch.Tensor:
    """The float32 model's logits for call k's inputs (its cache restored after)."""
    if s.exact_cache is None or inputs.positions is None:
        return prefill_call(t.oracle.model, inputs.ids[k])
    out = step(t.oracle.model, s.exact_cache, inputs.ids[k], inputs.positions[k])
    assert s.exact_saved is not None
    restore(s.exact_cache, s.exact_saved)
    return out


def eager_output(t: ModelTrial, s: Static, inputs: DeviceInputs, k: int) -> torch.Tensor:
    """The eager arm's logits for call k's inputs from the model's Python forward (graph mode's
    scale: eager's replayed graph is checked against it like every other arm)."""
    t.router.arm = BASELINE
    s.load(inputs, k)
    out = body(t, s)().clone()
    s.restore()
    return out


@dataclass(frozen=True)
class Checked:
    """One round's checked call: its index, eager's distance from the float32 model there when
    run by the Python forward (the scale) and every arm's distance."""

    call: int
    scale: float
    distances: dict[str, float]


def write_checks(t: ModelTrial, cid: str, checked: dict[int, Checked]) -> None:
    """timed_checks.jsonl: one row per round and arm; the limit is `oracle_factor` x the largest
    scale on the case's checked calls (eager-mode eager: in eager mode its own timed output)."""
    factor = t.p.correctness.oracle_factor
    largest = max(c.scale for c in checked.values())
    limit = factor * largest
    for r, c in checked.items():
        for arm, distance in c.distances.items():
            passed = distance <= limit
            message = (
                ""
                if passed
                else f"{WRONG}{cid} round {r} call {c.call}: logits {distance:.3g} of their max from the float32 "
                f"model, more than {factor} x eager's largest {largest:.3g} on this case's checked calls"
            )
            row = {"case": cid, "round": r, "call": c.call, "arm": arm, "distance": distance, "scale": c.scale}
            t.records.checks(row | {"limit": limit, "passed": passed, "message": message})
            if not passed:
                t.say(message)


def attribute(t: ModelTrial, s: Static, arm: str, call: ArmCall, inputs: DeviceInputs) -> None:
    """attribution.csv and kernels.csv rows of one profiled call of the arm (call 0's inputs)."""
    t.router.arm = arm
    table = t.out / PROFILES / f"{s.cid}-{arm.replace(':', '_').replace('/', '_')}.txt"
    replay = lambda: call(inputs, 0)  # noqa: E731
    if s.mode == "graph":
        run = body(t, s)
        eager = lambda: (s.load(inputs, 0), run())  # noqa: E731
        regions, kernels = attribute_graph(t.router, eager, replay, t.device, table)
    else:
        regions, kernels = attribute_eager(t.router, replay, t.device, table)
    s.restore()
    for region, (ns, n) in regions.items():
        t.records.attribution([s.cid, arm, region, ns, n])
    for region, named in kernels.items():
        for name, (ns, count) in sorted(named.items()):
            t.records.kernels([s.cid, arm, region, name, ns, count])
