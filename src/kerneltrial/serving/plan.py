"""plan.json of a serving run: what the run will do, written before its first launch, and what
verify derives again from the run's protocol.toml (serving/verify_plan.py). Beside protocol.toml it
rests on what the command line and the machine fixed (`effective`: the model path as the run
resolved it, or --model; the client, or --client; the tokenizer the client loaded: serving/effective.py) and on the model's config.json (its layer count,
where the model is a local folder)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kerneltrial.plugins import LOG_ENV
from kerneltrial.rundir import layout
from kerneltrial.serving.bench import case_dict
from kerneltrial.serving.effective import effective
from kerneltrial.serving.order import PlannedLaunch
from kerneltrial.serving.protocol import Protocol


def plan_doc(
    proto: Protocol, sha: str, order: list[PlannedLaunch], copies: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    """plan.json: everything the run will do, written before the first launch."""
    return {
        "protocol_sha256": sha,
        "arms": [
            a.model_dump() | {"argv_expanded": proto.expand(a), "selection_files": copies[a.name]} for a in proto.arms
        ],
        "fl_platform": proto.server.fl_platform.model_dump() if proto.server.fl_platform else None,
        "cases": [case_dict(c) for c in proto.bench.cases],
        "rounds": proto.rounds,
        "repeats": proto.repeats,
        "seed": proto.seed,
        "client": proto.bench.client,  # the request path: completions (kerneltrial's), official, flagos-chat
        "goodput": proto.bench.goodput,  # SLOs (ms) of --goodput; each case's request_rate/burstiness is in cases
        "seeding": proto.bench.seeding,  # official: one prompt seed for every run of a case (docs/serving.md)
        "bench_seeds": [proto.bench.run_seed(k) for k in range(proto.repeats)],
        "launches": [asdict(x) for x in order],
        "warmup": {"drop_first": 1},
        "percentiles": list(proto.bench.percentiles),
        "model_id": proto.server.model_id,
        "nonce": proto.server.nonce,  # each launch's nonce is in launches.jsonl, its runs send it (issue 26)
        "ledger": proto.server.nonce,  # each spawned launch keeps its server's served.jsonl (issue 36, served.py)
        "model_layers": model_layers(proto.server.model),
        "tokenizer": proto.server.effective_tokenizer,
        "base_url": proto.url(),
        "accuracy": proto.accuracy.model_dump() if proto.accuracy else None,
        "acceptance": proto.acceptance.model_dump(),
        "dispatch": {"records": f"{layout.LAUNCH_DIR}/NN-ARM/{layout.DISPATCH_DIR}", "env": LOG_ENV},
        # each process's imported files (plugins/imports.py), checked into launches.jsonl pins.imported
        "imported_files": f"{layout.LAUNCH_DIR}/NN-ARM/{layout.DISPATCH_DIR}/imports-PID.json",
        "effective": effective(proto).record(),  # serving/effective.py
    }


def model_layers(model: str | None) -> int | None:
    """num_hidden_layers of a local model's config.json (also under text_config), else None: the
    bound on plausible kernel calls per request that verify applies (verify_dispatch.py)."""
    config = Path(model or "") / "config.json"
    if not model or not config.is_file():
        return None
    try:
        doc = json.loads(config.read_text())
    except ValueError:
        return None
    layers = doc.get("num_hidden_layers") or (doc.get("text_config") or {}).get("num_hidden_layers")
    return int(layers) if isinstance(layers, int) else None
