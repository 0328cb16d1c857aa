"""The model-trial runner: protocol in, run directory out.

Stages, each writing raw rows as it goes:
1. build the model once (every arm shares its weights), keep a float32 copy of it (the
   oracle of every check) and patch the model's routers;
2. correctness, every arm before any timing (model/gate.py): teacher-forced logits against
   the float32 model and eager's distance to it, top-1 agreement, the routed call counts
   per forward pass (the proof that the arm's kernels ran); an arm that fails is not timed;
3. the copy rate of this device (copies.csv): the weight-read floor's denominator;
4. per case and mode (model/cases.py): graph mode captures every arm's call first
   (captures.jsonl); untimed warm-up rounds, then in each round every arm once, in a seeded
   random order, on the round's fresh inputs (inputs.csv); one sample is `calls_per_sample`
   calls between two device synchronisations, timed by the host clock (what a caller waits
   for: host and GPU); one call of every round checked against the float32 model
   (timed_checks.jsonl); one profiled call per arm (attribution.csv, kernels.csv);
5. summary.json (model/summary.py), provenance's end, manifest.json.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kerneltrial.model import summary as model_summary
from kerneltrial.model.arms import ArmUnavailable, op_table
from kerneltrial.model.build import ModelError, OpTable, Patched, Router, build_model, patch
from kerneltrial.model.cases import (
    ArmCall,
    ModelTrial,
    Records,
    context_ids,
    eager_calls,
    graph_calls,
    prepare,
    run_case,
)
from kerneltrial.model.floor import copy_samples, floor_bytes
from kerneltrial.model.gate import check_arm, oracle_of
from kerneltrial.model.layout import (
    ATTRIBUTION_COLUMNS,
    CAPTURES,
    COPIES,
    COPY_COLUMNS,
    GRAPH_CUDA,
    GRAPH_IDENTITY,
    INPUT_COLUMNS,
    INPUTS,
    KERNEL_COLUMNS,
    KERNELS,
    PROFILES,
    TIMED_CHECKS,
    TIMING_COLUMNS,
    TIMING_LABEL_CPU,
    TIMING_LABEL_GPU,
)
from kerneltrial.model.spec import BASELINE, Decode, Prefill, Protocol, ProtocolError, case_id, load_protocol
from kerneltrial.rundir import provenance as source_provenance
from kerneltrial.rundir.documents import write_document
from kerneltrial.rundir.files import csv_appender, jsonl_appender, now, read_json, write_json
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.rundir.layout import ATTRIBUTION, CORRECTNESS, MANIFEST, PLAN, PROTOCOL, PROVENANCE, SUMMARY, TIMINGS
from kerneltrial.trial import provenance
from kerneltrial.trial.protocol import freeze_record

Progress = Callable[[str], None]
Case = Prefill | Decode


class ModelRunError(RuntimeError):
    """The model trial cannot start; the message says why and what to do."""


def tokens_per_call(case: Case) -> int:
    return case.batch * case.tokens if isinstance(case, Prefill) else case.batch


# --- the run -----------------------------------------------------------------------------


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError as exc:
        raise ModelRunError("model trials need transformers: pip install 'kerneltrial[model]'") from exc
    return transformers.__version__


def new_run_dir(out: Path, data: bytes) -> None:
    if out.exists() and any(out.iterdir()):
        raise ModelRunError(f"{out} is not empty; a run directory is never overwritten: choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / PROTOCOL).write_bytes(data)


def resolve_arms(p: Protocol, base_dir: Path) -> tuple[dict[str, OpTable], dict[str, str]]:
    """Each arm's implementations, and the peers that cannot run here with their reason."""
    tables: dict[str, OpTable] = {}
    unavailable: dict[str, str] = {}
    for arm in p.arms:
        if arm == BASELINE:
            continue
        try:
            tables[arm] = op_table(arm, base_dir)
        except ArmUnavailable as exc:
            if arm.startswith("user:"):  # a peer may be absent; the user's own arm must run
                raise
            unavailable[arm] = str(exc)
    return tables, unavailable


def run_model_trial(protocol_path: Path, out: Path, progress: Progress | None = None) -> Path:
    """Run the protocol into `out` (a new directory); returns `out`."""
    say = progress or (lambda _: None)
    p, data = load_protocol(protocol_path)
    freeze = frozen(protocol_path, data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tables, unavailable = resolve_arms(p, protocol_path.parent)
    new_run_dir(out, data)
    record = provenance.collect(sha256_bytes(data), source_provenance.source_files()) | {
        "kind": "model",
        "freeze": freeze,
    }
    record["versions"]["transformers"] = _transformers_version()
    write_json(out / PROVENANCE, record)

    say(f"building {p.model} ({p.dtype}, {'checkpoint' if p.checkpoint else 'random weights'}) on {device}")
    model = build_model(p, device)
    vocab = int(model.config.vocab_size)
    prompts = context_ids(vocab, (p.correctness.prompts, p.correctness.prompt_tokens), p.seed, device)
    oracle = oracle_of(model, prompts, p.correctness.steps)
    router = Router(tables=tables)
    patched = patch(model, router)
    if not patched.norms or not patched.mlps or not patched.layers:
        raise ModelError(f"found {patched} in the model: nothing to route; is it a Llama-style decoder?")
    passed = run_gate(model, router, p, oracle, prompts, out, say, list(tables))
    if BASELINE not in passed:
        raise ModelRunError(
            f"the eager arm's routed calls differ from the model's ({patched} routed for "
            f"{model.config.num_hidden_layers} layers): a norm, MLP or layer class the patcher does not recognise "
            "would run unpatched in every arm (src/kerneltrial/model/build.py says what it matches)"
        )
    with csv_appender(out / COPIES, COPY_COLUMNS) as append:
        for row in copy_samples(device):
            append(row)
    write_json(
        out / PLAN,
        plan_of(p, model, device, patched, tables, unavailable, passed)
        | {"protocol_sha256": sha256_bytes(data), "frozen_at": freeze["frozen_at"] if freeze else None},
    )
    (out / PROFILES).mkdir()
    with records(out) as rec:
        trial = ModelTrial(model, oracle, router, p, device, out, rec, time.perf_counter_ns(), say)
        for index, (case, mode) in enumerate(p.runs()):
            run_one(trial, case, mode, index, passed)
    write_document(out / SUMMARY, model_summary.build(out))
    write_json(out / PROVENANCE, read_json(out / PROVENANCE) | {"finished_at": now()})
    write_manifest(out)
    return out


def frozen(path: Path, data: bytes) -> dict[str, str] | None:
    """The protocol's freeze record (`kerneltrial protocol freeze`), or None; a protocol edited
    after it was frozen is refused."""
    record = freeze_record(path)
    if record is not None and record["sha256"] != sha256_bytes(data):
        raise ProtocolError(
            f"{path} changed after it was frozen at {record['frozen_at']} (sha256 {record['sha256'][:12]}...); "
            "restore it or write a new protocol"
        )
    return record


def run_gate(
    model: torch.nn.Module,
    router: Router,
    p: Protocol,
    oracle: Any,
    prompts: torch.Tensor,
    out: Path,
    say: Progress,
    arms: list[str],
) -> list[str]:
    """correctness.jsonl, eager first (its result is every other arm's scale); the arms that passed."""
    passed: list[str] = []
    with jsonl_appender(out / CORRECTNESS) as append:
        reference = None
        for arm in [BASELINE, *arms]:
            row, result = check_arm(model, router, arm, p.correctness, oracle, reference, prompts)
            if arm == BASELINE:
                reference = result
            append(row)
            say(f"correctness {arm}: {'pass' if row['passed'] else 'FAIL: ' + row['message']}")
            if row["passed"]:
                passed.append(arm)
    return passed


@contextlib.contextmanager
def records(out: Path) -> Any:
    with (
        csv_appender(out / TIMINGS, TIMING_COLUMNS) as timing,
        csv_appender(out / ATTRIBUTION, ATTRIBUTION_COLUMNS) as attr,
        csv_appender(out / KERNELS, KERNEL_COLUMNS) as kernels,
        csv_appender(out / INPUTS, INPUT_COLUMNS) as inputs,
        jsonl_appender(out / CAPTURES) as captures,
        jsonl_appender(out / TIMED_CHECKS) as checks,
    ):
        yield Records(timing, attr, kernels, inputs, captures, checks)


def run_one(t: ModelTrial, case: Case, mode: str, index: int, passed: list[str]) -> None:
    """One (case, mode): its state, its arms' calls (captured in graph mode), its rounds."""
    s = prepare(t, case, mode, index)  # type: ignore[arg-type]
    calls: dict[str, ArmCall]
    if mode == "graph":
        calls, graphs = graph_calls(t, s, passed)
        if BASELINE not in calls:
            t.say(f"{s.cid}: eager cannot be captured; the case is not timed")
            calls = {}
    else:
        calls, graphs = eager_calls(t, s, passed), {}
    if calls:
        run_case(t, s, calls)
    del calls, graphs, s
    if t.device.type == "cuda":
        torch.cuda.empty_cache()


def plan_of(
    p: Protocol,
    model: torch.nn.Module,
    device: torch.device,
    patched: Patched,
    tables: dict[str, OpTable],
    unavailable: dict[str, str],
    passed: list[str],
) -> dict[str, Any]:
    """plan.json (schema 3): what the run does, written before the first timed sample."""
    return {
        "model": p.model,
        "config": model.config.to_dict() if hasattr(model.config, "to_dict") else {},
        "dtype": p.dtype,
        "device": str(device),
        "is_gpu": device.type == "cuda",
        "timing_label": TIMING_LABEL_GPU if device.type == "cuda" else TIMING_LABEL_CPU,
        "graph_label": GRAPH_CUDA if device.type == "cuda" else GRAPH_IDENTITY,
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
        "cases": [case_record(model, c, mode) for c, mode in p.runs()],
        "seed": p.seed,
        "rounds": p.rounds,
        "warmup": p.warmup,
        "calls_per_sample": p.calls_per_sample,
        "tie_band": p.tie_band,
        "confidence": p.confidence,
        "attribution": p.attribution,
        "correctness": p.correctness.model_dump(),
        "modes": list(p.modes),
        "graph_prefill": p.graph_prefill,
    }


def case_record(model: torch.nn.Module, c: Case, mode: str) -> dict[str, Any]:
    prefill = isinstance(c, Prefill)
    cache = 0 if prefill else c.context + 1
    return {
        "case": case_id(c, mode),  # type: ignore[arg-type]
        "mode": mode,
        "phase": "prefill" if prefill else "decode",
        "batch": c.batch,
        "tokens_per_call": tokens_per_call(c),
        **({"tokens": c.tokens} if prefill else {"context": c.context}),
        "floor_bytes": floor_bytes(model, tokens_per_call(c), c.batch, cache).record(),
    }


def write_manifest(out: Path) -> None:
    files = sorted(f for f in out.rglob("*") if f.is_file() and f.name != MANIFEST)
    write_json(out / MANIFEST, {str(f.relative_to(out)): sha256_file(f) for f in files})
