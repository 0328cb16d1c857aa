"""The model-trial runner: protocol in, run directory out.

Stages, each writing raw rows as it goes:
1. build the model once (every arm shares its weights) and patch its routers;
2. correctness, every arm before any timing: last-position logits on fixed prompts against
   the eager arm, greedy tokens for the stated steps, and the routed call counts per
   forward pass (the proof that the arm's kernels ran); an arm that fails is not timed;
3. rounds per case: untimed warm-up calls of every timed arm, then in each round every timed
   arm once, in a seeded random order; one sample is `calls_per_sample` calls between two
   device synchronisations, timed by the host clock (what a caller waits for: host and GPU);
4. attribution: one profiled call per arm and case, the time inside each routed operator
   and the total (the share the replaceable operators hold bounds any gain from them);
5. summary.json (model/summary.py), provenance's end, manifest.json.
"""

from __future__ import annotations

import bisect
import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kerneltrial.model import summary as model_summary
from kerneltrial.model.arms import ArmUnavailable, op_table
from kerneltrial.model.build import (
    OPS,
    REGION,
    ModelError,
    Router,
    build_model,
    expected_calls,
    greedy,
    patch,
    prefill_call,
    static_cache,
    step,
)
from kerneltrial.model.spec import BASELINE, Decode, Prefill, Protocol, load_protocol
from kerneltrial.rundir import provenance as source_provenance
from kerneltrial.rundir.files import csv_appender, jsonl_appender, now, read_json, write_json
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.rundir.layout import ATTRIBUTION, CORRECTNESS, MANIFEST, PLAN, PROTOCOL, PROVENANCE, SUMMARY, TIMINGS
from kerneltrial.trial import provenance

TIMING_COLUMNS = ["case", "round", "position", "arm", "calls", "ns", "start_ns"]  # start_ns: since the first sample
ATTRIBUTION_COLUMNS = ["case", "arm", "region", "ns", "calls"]
KERNELS = "kernels.csv"  # on a GPU: the kernels each routed region launched in the profiled call
KERNEL_COLUMNS = ["case", "arm", "region", "kernel", "ns", "count"]
Regions = dict[str, tuple[int, int]]
Kernels = dict[str, dict[str, tuple[int, int]]]  # region -> kernel name -> (ns, count)
TIMING_LABEL_GPU = "host clock between device synchronisations: what a caller waits for (host and GPU)"
TIMING_LABEL_CPU = "host clock, Triton interpreter on a CPU: NOT GPU performance"
PROFILES = "profiles"  # the profiler's table of each attributed call
Progress = Callable[[str], None]
Case = Prefill | Decode


class ModelRunError(RuntimeError):
    """The model trial cannot start; the message says why and what to do."""


def tokens_per_call(case: Case) -> int:
    return case.batch * case.tokens if isinstance(case, Prefill) else case.batch


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ids(vocab: int, shape: tuple[int, int], seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=generator).to(device)


# --- correctness -----------------------------------------------------------------------


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| over all prompts' last-position logits."""
    return float((got.float() - want.float()).abs().max()) / max(float(want.float().abs().max()), 1e-30)


@dataclass(frozen=True)
class Oracle:
    """A float32 copy of the (unpatched) model: the prompts' last-position logits and its
    greedy tokens."""

    logits: torch.Tensor
    tokens: torch.Tensor


def oracle_of(model: torch.nn.Module, prompts: torch.Tensor, steps: int) -> Oracle:
    exact = copy.deepcopy(model).float()
    try:
        return Oracle(logits=prefill_call(exact, prompts).float(), tokens=greedy(exact, prompts, steps)[0])
    finally:
        del exact
        if prompts.device.type == "cuda":
            torch.cuda.empty_cache()


@dataclass(frozen=True)
class Reference:
    """What every arm is checked against: eager's greedy tokens and logits, and eager's
    distance to the float32 logits."""

    tokens: torch.Tensor
    logits: list[torch.Tensor]
    eager_error: float


def check_arm(
    model: torch.nn.Module,
    router: Router,
    arm: str,
    p: Protocol,
    oracle: Oracle,
    reference: Reference | None,
    prompts: torch.Tensor,
) -> tuple[dict[str, Any], Reference]:
    """The arm's correctness row, and the reference its result makes (eager's is used)."""
    router.arm = arm
    router.counts.clear()
    prefill_call(model, prompts)
    counts = {op: router.counts[op] for op in OPS}
    expected = expected_calls(int(model.config.num_hidden_layers), eager=(arm == BASELINE))
    tokens, logits = greedy(model, prompts, p.correctness.greedy_steps)
    error = relative_error(logits[0], oracle.logits)
    row: dict[str, Any] = {
        "arm": arm,
        "calls_per_forward": counts,
        "expected_calls_per_forward": expected,
        "oracle_rel_error": error,
        "greedy_tokens": tokens.tolist(),
        "passed": True,
        "message": "",
    }
    if reference is None:
        row["float32_tokens"] = oracle.tokens.tolist()
    problems = []
    if counts != expected:
        problems.append(
            f"routed calls per forward {counts} differ from the model's {expected}: the arm's operators did not all run"
        )
    if reference is not None:
        limit = p.correctness.oracle_factor * reference.eager_error
        row |= {"logits_rel_diff": relative_error(logits[0], reference.logits[0]), "oracle_rel_error_limit": limit}
        if error > limit:
            problems.append(
                f"last-position logits are {error:.3g} of their max from the float32 model, more than "
                f"{p.correctness.oracle_factor} x eager's {reference.eager_error:.3g}"
            )
        row |= greedy_agreement(tokens, reference.tokens, reference.logits, p.correctness.near_tie, oracle.tokens)
        d = row["first_divergence"]
        if d is not None and not (d["near_tie"] or d["agrees_with_float32"]):
            problems.append(
                f"greedy tokens diverge from eager at step {d['step']} (prompt {d['prompt']}: {d['token']} vs {d['reference']}) "
                f"where eager's top-two margin {d['margin']:.3g} is not a near-tie and the float32 model chose "
                f"{d['float32_token']}"
            )
    if problems:
        row["passed"] = False
        row["message"] = "; ".join(problems)
    return row, Reference(tokens=tokens, logits=logits, eager_error=error)


def greedy_agreement(
    tokens: torch.Tensor, ref_tokens: torch.Tensor, ref_logits: list[torch.Tensor], tol: float, exact: torch.Tensor
) -> dict[str, Any]:
    """Steps of identical greedy tokens and the first divergence, with eager's top-two margin
    there (relative to its max logit: within `tol` it is a near-tie) and whether the arm's
    token is the float32 model's (`exact`) after the same prefix: then eager, not the arm,
    left the exact model's path."""
    steps = ref_tokens.shape[1]
    for k in range(steps):
        differ = (tokens[:, k] != ref_tokens[:, k]).nonzero()
        if differ.numel():
            prompt = int(differ[0, 0])
            top = ref_logits[k][prompt].float().topk(2).values
            margin = float(top[0] - top[1]) / max(float(ref_logits[k][prompt].float().abs().max()), 1e-30)
            return {
                "greedy_identical_steps": k,
                "first_divergence": {
                    "step": k,
                    "prompt": prompt,
                    "token": int(tokens[prompt, k]),
                    "reference": int(ref_tokens[prompt, k]),
                    "margin": margin,
                    "near_tie": margin <= tol,
                    "float32_token": int(exact[prompt, k]),
                    "agrees_with_float32": bool(
                        torch.equal(ref_tokens[prompt, :k], exact[prompt, :k]) and tokens[prompt, k] == exact[prompt, k]
                    ),
                },
            }
    return {"greedy_identical_steps": steps, "first_divergence": None}


# --- timing ------------------------------------------------------------------------------


def case_call(
    model: torch.nn.Module, case: Case, p: Protocol, index: int, device: torch.device
) -> Callable[[], object]:
    """The timed call of a case: a prefill forward, or one decode step on a filled cache."""
    vocab = int(model.config.vocab_size)
    if isinstance(case, Prefill):
        ids = _ids(vocab, (case.batch, case.tokens), p.seed + 1000 + index, device)
        return lambda: prefill_call(model, ids)
    cache = static_cache(model, case.context + 1)
    step(model, cache, _ids(vocab, (case.batch, case.context), p.seed + 1000 + index, device), 0)
    token = _ids(vocab, (case.batch, 1), p.seed + 2000 + index, device)
    return lambda: step(model, cache, token, case.context)


def sample_ns(call: Callable[[], object], calls: int, device: torch.device) -> int:
    _synchronize(device)
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    _synchronize(device)
    return time.perf_counter_ns() - start


def round_order(seed: int, case_index: int, round_index: int, arms: list[str]) -> list[str]:
    """The arms of one round in a seeded random order (verify recomputes it)."""
    order = list(arms)
    random.Random(f"{seed}/{case_index}/{round_index}").shuffle(order)
    return order


def attribute(
    model: torch.nn.Module, router: Router, call: Callable[[], object], device: torch.device, table: Path
) -> tuple[Regions, Kernels]:
    """region -> (ns, calls) of one profiled call: each routed operator, `total` (the device
    time of all kernels of the call on a GPU; its host time on a CPU) and `wall` (the call's
    host time, synchronised); and on a GPU the kernels each region launched (what an arm's
    implementation really ran). The profiler's own table of the call goes to `table`, for a
    reader who asks where the rest of the time went."""
    from torch.profiler import ProfilerActivity, profile

    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    router.annotate = True
    try:
        call()
        _synchronize(device)
        with profile(activities=activities) as prof:
            wall = sample_ns(call, 1, device)
    finally:
        router.annotate = False
    sort = "self_device_time_total" if gpu else "self_cpu_time_total"
    table.write_text(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=80) + "\n")
    found, device_us, kernels = (device_regions if gpu else host_regions)(prof.events())
    found["total"] = (round(device_us * 1000) if gpu else wall, 1)
    found["wall"] = (wall, 1)
    return found, kernels


def host_regions(events: list[Any]) -> tuple[Regions, float, Kernels]:
    """On a CPU: each region's host time (its record_function ranges); no device time, no kernels."""
    found: Regions = {}
    for e in events:
        if e.name.startswith(REGION):
            ns, calls = found.get(e.name.removeprefix(REGION), (0, 0))
            found[e.name.removeprefix(REGION)] = (ns + round(e.cpu_time_total * 1000), calls + 1)
    return found, 0.0, {}


def device_regions(events: list[Any]) -> tuple[Regions, float, Kernels]:
    """On a GPU: each region's kernel time and all kernels' time (us), on the device timeline.

    A record_function leaves a device-side range spanning the kernels launched inside it; a
    kernel belongs to the region whose range holds its start. Counted on the device because
    the host-side tree misses kernels launched outside ATen (Triton's launcher): the first
    H200 runs attributed no time to our kernels (results/archive/h200/minicpm5-2b-model-r2)."""
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    ranges = sorted(
        (e.time_range.start, e.time_range.end, e.name.removeprefix(REGION)) for e in device if e.name.startswith(REGION)
    )
    starts = [r[0] for r in ranges]
    kernels = [e for e in device if not e.name.startswith(REGION) and not getattr(e, "is_user_annotation", False)]
    found: Regions = {}
    names: Kernels = {}
    for _, _, name in ranges:
        ns, calls = found.get(name, (0, 0))
        found[name] = (ns, calls + 1)
        names.setdefault(name, {})
    for k in kernels:
        i = bisect.bisect_right(starts, k.time_range.start) - 1
        if i >= 0 and k.time_range.start < ranges[i][1]:
            region = ranges[i][2]
            k_ns = round(k.time_range.elapsed_us() * 1000)
            ns, calls = found[region]
            found[region] = (ns + k_ns, calls)
            ns, count = names[region].get(k.name, (0, 0))
            names[region][k.name] = (ns + k_ns, count + 1)
    return found, float(sum(k.time_range.elapsed_us() for k in kernels)), names


# --- the run -----------------------------------------------------------------------------


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError as exc:
        raise ModelRunError("model trials need transformers: pip install 'kerneltrial[model]'") from exc
    return transformers.__version__


def prepare(out: Path, data: bytes) -> None:
    if out.exists() and any(out.iterdir()):
        raise ModelRunError(f"{out} is not empty; a run directory is never overwritten: choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / PROTOCOL).write_bytes(data)


def run_model_trial(protocol_path: Path, out: Path, progress: Progress | None = None) -> Path:
    """Run the protocol into `out` (a new directory); returns `out`."""
    say = progress or (lambda _: None)
    p, data = load_protocol(protocol_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tables = {}
    unavailable = {}
    for arm in p.arms:
        if arm == BASELINE:
            continue
        try:
            tables[arm] = op_table(arm, protocol_path.parent)
        except ArmUnavailable as exc:
            if arm.startswith("user:"):  # a peer may be absent; the user's own arm must run
                raise
            unavailable[arm] = str(exc)
    prepare(out, data)
    digest = sha256_bytes(data)
    source = source_provenance.source_files()
    record = provenance.collect(digest, source) | {"kind": "model"}
    record["versions"]["transformers"] = _transformers_version()
    write_json(out / PROVENANCE, record)

    say(f"building {p.model} ({p.dtype}, {'checkpoint' if p.checkpoint else 'random weights'}) on {device}")
    model = build_model(p, device)
    prompts = _ids(int(model.config.vocab_size), (p.correctness.prompts, p.correctness.prompt_tokens), p.seed, device)
    oracle = oracle_of(model, prompts, p.correctness.greedy_steps)
    router = Router(tables=tables)
    patched = patch(model, router)
    if not patched.norms or not patched.mlps or not patched.layers:
        raise ModelError(f"found {patched} in the model: nothing to route; is it a Llama-style decoder?")

    passed: list[str] = []
    with jsonl_appender(out / CORRECTNESS) as append:
        reference = None
        for arm in [BASELINE, *tables]:
            row, result = check_arm(model, router, arm, p, oracle, reference, prompts)
            if arm == BASELINE:
                reference = result
            append(row)
            say(f"correctness {arm}: {'pass' if row['passed'] else 'FAIL: ' + row['message']}")
            if row["passed"]:
                passed.append(arm)
    if BASELINE not in passed:
        raise ModelRunError(
            f"the eager arm's routed calls differ from the model's ({patched} routed for "
            f"{model.config.num_hidden_layers} layers): a norm, MLP or layer class the patcher does not recognise "
            "would run unpatched in every arm (src/kerneltrial/model/build.py says what it matches)"
        )

    plan = {
        "protocol_sha256": digest,
        "model": p.model,
        "config": model.config.to_dict() if hasattr(model.config, "to_dict") else {},
        "dtype": p.dtype,
        "device": str(device),
        "is_gpu": device.type == "cuda",
        "timing_label": TIMING_LABEL_GPU if device.type == "cuda" else TIMING_LABEL_CPU,
        "patched": {"norms": patched.norms, "mlps": patched.mlps, "layers": patched.layers},
        "arms": [
            {
                "name": arm,
                "sources": tables[arm].sources if arm in tables else {},
                "available": arm not in unavailable,
                "reason": unavailable.get(arm, ""),
                "timed": arm in passed,
            }
            for arm in p.arms
        ],
        "cases": [
            {
                "case": c.id,
                "phase": "prefill" if isinstance(c, Prefill) else "decode",
                "batch": c.batch,
                "tokens_per_call": tokens_per_call(c),
                **({"tokens": c.tokens} if isinstance(c, Prefill) else {"context": c.context}),
            }
            for c in p.cases
        ],
        "seed": p.seed,
        "rounds": p.rounds,
        "warmup": p.warmup,
        "calls_per_sample": p.calls_per_sample,
        "tie_band": p.tie_band,
        "confidence": p.confidence,
        "attribution": p.attribution,
        "correctness": p.correctness.model_dump(),
    }
    write_json(out / PLAN, plan)

    (out / PROFILES).mkdir()
    origin = time.perf_counter_ns()
    with (
        csv_appender(out / TIMINGS, TIMING_COLUMNS) as timing,
        csv_appender(out / ATTRIBUTION, ATTRIBUTION_COLUMNS) as attr,
        csv_appender(out / KERNELS, KERNEL_COLUMNS) as kernel_row,
    ):
        for index, case in enumerate(p.cases):
            router.arm = BASELINE  # a decode case's cache prefix is filled by the model's own code
            call = case_call(model, case, p, index, device)
            for w in range(p.warmup):  # untimed rounds, interleaved as the timed ones are
                for arm in round_order(p.seed, index, -1 - w, passed):
                    router.arm = arm
                    call()
            _synchronize(device)
            for r in range(p.rounds):
                for position, arm in enumerate(round_order(p.seed, index, r, passed)):
                    router.arm = arm
                    start = time.perf_counter_ns() - origin
                    ns = sample_ns(call, p.calls_per_sample, device)
                    timing([case.id, r, position, arm, p.calls_per_sample, ns, start])
                say(f"{case.id}: round {r + 1}/{p.rounds}")
            if p.attribution:
                for arm in passed:
                    router.arm = arm
                    table = out / PROFILES / f"{case.id}-{arm.replace(':', '_').replace('/', '_')}.txt"
                    regions, kernels = attribute(model, router, call, device, table)
                    for region, (ns, calls) in regions.items():
                        attr([case.id, arm, region, ns, calls])
                    for region, named in kernels.items():
                        for name, (ns, count) in sorted(named.items()):
                            kernel_row([case.id, arm, region, name, ns, count])
            del call
            if device.type == "cuda":
                torch.cuda.empty_cache()

    write_json(out / SUMMARY, model_summary.build(out))
    record = read_json(out / PROVENANCE) | {"finished_at": now()}
    write_json(out / PROVENANCE, record)
    write_manifest(out)
    return out


def write_manifest(out: Path) -> None:
    files = sorted(f for f in out.rglob("*") if f.is_file() and f.name != MANIFEST)
    write_json(out / MANIFEST, {str(f.relative_to(out)): sha256_file(f) for f in files})
