"""Synthetic kernel run directories written to the contract in docs/DESIGN.md.

The default run: cases C1, C2 (case ids as the runner writes them: shape/layout/dtype); arms `ctrl` (control), `fast` (candidate, ~20% faster),
`slow` (candidate, ~10% slower in c1; fails correctness in c2), `peer` (unavailable);
2 seeds x 5 rounds; 10 calls per sample; host clock (not a GPU).

Optional newer raw fields (absent by default, so the default run is an old-format run):
`sm_mhz` (a function giving each sample's SM clock, None for unknown) adds the `sm_mhz` and
`mem_mhz` columns; `clocks`, `noise_rule` and `calibration` go into plan.json as given;
`case_rounds` gives a case its own `rounds`; `injected_delay_ns` a case's injected delay;
`order_seed` goes into plan.json and then orders every round as the runner does.
protocol.toml is written to agree with plan.json (verify compares them); `protocol_edit`
edits its fields before it is written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tomli_w

C1, C2, C3, C4 = (f"{rows}x64/contiguous/bfloat16" for rows in (1, 2, 3, 4))

BASE_NS = {"ctrl": 1000.0, "fast": 800.0, "slow": 1100.0}


def default_per_call(case: str, arm: str, seed: int, rnd: int) -> float:
    """Per-call ns: the arm's base time plus a deterministic wobble of a few percent."""
    wobble = ((seed * 7 + rnd * 3 + len(arm)) % 5 - 2) * 10.0
    return BASE_NS.get(arm, 1000.0) * (2.0 if case == C2 else 1.0) + wobble


@dataclass
class RunSpec:
    cases: list[str] = field(default_factory=lambda: [C1, C2])
    arms: list[dict] = field(
        default_factory=lambda: [
            {"name": "ctrl", "kind": "control", "available": True, "reason": None},
            {"name": "fast", "kind": "candidate", "available": True, "reason": None},
            {"name": "slow", "kind": "candidate", "available": True, "reason": None},
            {"name": "peer", "kind": "peer", "available": False, "reason": "liger_kernel not installed"},
        ]
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    rounds: int = 5
    calls: int = 10
    bytes_per_call: int = 4_000_000
    failures: set[tuple[str, str]] = field(default_factory=lambda: {(C2, "slow")})
    per_call: Callable[[str, str, int, int], float] = default_per_call
    tie_band: float = 0.02
    gate: str = "no_loss and geomean>=1.02"
    resamples: int = 2000
    sm_mhz: Callable[[str, str, int, int], int | None] | None = None
    clocks: dict | None = None
    noise_rule: dict | None = None
    calibration: dict | None = None
    case_rounds: dict[str, int] = field(default_factory=dict)
    injected_delay_ns: dict[str, float] = field(default_factory=dict)
    order_seed: int | None = None
    protocol_edit: Callable[[dict], None] | None = None

    def rounds_of(self, case: str) -> int:
        return self.case_rounds.get(case, self.rounds)


def write_run_dir(path: Path, spec: RunSpec | None = None) -> Path:
    """Write protocol.toml, provenance.json, plan.json, correctness.jsonl, timings.csv, ceilings.csv."""
    spec = spec or RunSpec()
    path.mkdir(parents=True, exist_ok=True)
    protocol_bytes = tomli_w.dumps(protocol_of(spec)).encode()
    (path / "protocol.toml").write_bytes(protocol_bytes)
    sha = hashlib.sha256(protocol_bytes).hexdigest()
    provenance = {"kind": "kernel", "protocol_sha256": sha, "device": "cpu", "versions": {"python": "3.11"},
                  "git": {"commit": "abc123", "dirty": False}, "argv": ["kerneltrial", "run"],
                  "started_at": "2025-01-01T00:00:00Z", "finished_at": "2025-01-01T00:01:00Z"}
    (path / "provenance.json").write_text(json.dumps(provenance))
    cases = []
    for c in spec.cases:
        shape, layout, dtype = _parts(c)
        case = {"case": c, "shape": shape, "layout": layout, "dtype": dtype,
                "bytes": spec.bytes_per_call, "calls": spec.calls}
        if c in spec.case_rounds:
            case["rounds"] = spec.case_rounds[c]
        if c in spec.injected_delay_ns:
            case["injected_delay_ns"] = spec.injected_delay_ns[c]
        cases.append(case)
    plan = {
        "protocol_sha256": sha, "op": "rmsnorm", "backend": "host-clock", "is_gpu": False, "l2": "cold", "arms": spec.arms,
        "cases": cases,
        "seeds": spec.seeds, "rounds": spec.rounds, "tie_band": spec.tie_band, "gate": spec.gate,
        "bootstrap": {"resamples": spec.resamples, "seed": 7, "confidence": 0.95},
    }
    if spec.order_seed is not None:
        plan["order_seed"] = spec.order_seed
    for key in ("clocks", "noise_rule", "calibration"):
        if getattr(spec, key) is not None:
            plan[key] = getattr(spec, key)
    (path / "plan.json").write_text(json.dumps(plan))
    available = [a["name"] for a in spec.arms if a["available"]]
    header = "case,seed,round,position,arm,calls,ns" + (",sm_mhz,mem_mhz" if spec.sm_mhz else "")
    correctness, timings = [], [header]
    order_rng = np.random.default_rng(0)
    for case in spec.cases:
        for seed in spec.seeds:
            for arm in available:
                ok = (case, arm) not in spec.failures
                correctness.append({"case": case, "seed": seed, "arm": arm, "passed": ok, "max_abs": 0.0 if ok else 0.5,
                                    "max_rel": 0.0 if ok else 0.25, "ulp": 0 if ok else 900,
                                    "message": "" if ok else f"max_rel 0.25 > rtol 0.016 at seed {seed}"})
        timed = [a for a in available if (case, a) not in spec.failures]
        for seed in spec.seeds:
            for rnd in range(spec.rounds_of(case)):
                if spec.order_seed is None:
                    order = list(order_rng.permutation(timed))
                else:  # the runner's rule (docs/DESIGN.md)
                    rng = np.random.default_rng([spec.order_seed, spec.cases.index(case), seed, rnd])
                    order = [timed[i] for i in rng.permutation(len(timed))]
                for position, arm in enumerate(order):
                    ns = spec.per_call(case, str(arm), seed, rnd) * spec.calls
                    row = f"{case},{seed},{rnd},{position},{arm},{spec.calls},{ns!r}"
                    if spec.sm_mhz:
                        sm = spec.sm_mhz(case, str(arm), seed, rnd)
                        row += ",," if sm is None else f",{sm},2619"
                    timings.append(row)
    (path / "correctness.jsonl").write_text("".join(json.dumps(r) + "\n" for r in correctness))
    (path / "timings.csv").write_text("\n".join(timings) + "\n")
    ceilings = ["kind,sample,bytes,ns"]
    ceilings += [f"copy,{i},8000000,{4000 + 100 * i}" for i in range(5)]  # 2000, 1951.2, 1904.8, ... GB/s
    ceilings += [f"read,{i},4000000,{1000 + 50 * i}" for i in range(4)]
    (path / "ceilings.csv").write_text("\n".join(ceilings) + "\n")
    return path


def _parts(case_id: str) -> tuple[list[int], str, str]:
    """Shape, layout and dtype of a case id `AxB/layout/dtype`."""
    shape, layout, dtype = case_id.split("/")
    return [int(n) for n in shape.split("x")], layout, dtype


def protocol_of(spec: RunSpec) -> dict:
    """The protocol.toml fields that plan.json copies, agreeing with the plan the factory writes."""
    control = next(a["name"] for a in spec.arms if a["kind"] == "control")
    protocol: dict = {
        "name": "synthetic", "op": "rmsnorm", "control": control,
        "candidates": [a["name"] for a in spec.arms if a["name"] != control],
        "seeds": spec.seeds, "rounds": spec.rounds, "tie_band": spec.tie_band, "gate": spec.gate,
        "bootstrap_resamples": spec.resamples, "bootstrap_seed": 7, "l2": "cold",
    }
    if spec.order_seed is not None:
        protocol["order_seed"] = spec.order_seed
    for section in (spec.clocks, spec.noise_rule, spec.calibration):
        protocol.update({k: v for k, v in (section or {}).items() if k != "max_sm_mhz" and v is not None})
    protocol["cases"] = [dict(zip(("shape", "layout", "dtype"), _parts(c))) for c in spec.cases]
    if spec.protocol_edit:
        spec.protocol_edit(protocol)
    return protocol
