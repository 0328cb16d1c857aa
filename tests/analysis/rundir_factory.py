"""Synthetic kernel run directories written to the contract in docs/VERIFY.md (files: docs/RUNDIR.md).

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

`checks=1` writes a run of the timed-check contract (issue 10, docs/VERIFY.md, "Timed checks"): plan.json
`checks`, `exact`, `plausibility`, `frozen_at` and `order_seed` (0 unless given); a
timed_checks.jsonl row per timing sample; `ulp_hist` in every correctness row; `launch` rows
in ceilings.csv (`triton_launch_ns` adds `triton_launch` rows under any contract); source.tar.gz
with provenance `git.source_sha256` its digest, and the freeze
record. `timed_failures` {(case, arm, seed, round): message} fails those samples' checks (the
sample is still timed); `raises` {(case, arm): (seed, round)} makes the arm raise there (no
timing row) and drops it from the later units of the case. `seal(path)` then writes
manifest.json over every file, as the runner does last; `write_checked_run` does all of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import tomli_w

from kerneltrial.kernel.summary import write_summary
from kerneltrial.rundir.provenance import source_digest

C1, C2, C3, C4 = (f"{rows}x64/contiguous/bfloat16" for rows in (1, 2, 3, 4))

BASE_NS = {"ctrl": 1000.0, "fast": 800.0, "slow": 1100.0}


def default_per_call(case: str, arm: str, seed: int, rnd: int) -> float:
    """Per-call ns: the arm's base time plus a deterministic wobble of a few percent."""
    wobble = ((seed * 7 + rnd * 3 + len(arm)) % 5 - 2) * 10.0
    return BASE_NS.get(arm, 1000.0) * (2.0 if case == C2 else 1.0) + wobble


@dataclass
class RunSpec:
    op: str = "rmsnorm"
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
    # the timed-check contract (checks=1); ignored otherwise
    checks: int | None = None
    backend: str = "host-clock"
    is_gpu: bool = False
    l2: str = "cold"
    exact: bool = False
    plausibility: dict = field(default_factory=lambda: {"bandwidth_margin": 0.15, "launch_floor_fraction": 0.5})
    frozen_at: str | None = "2025-01-01T00:00:00+00:00"
    launch_ns: list[float] = field(default_factory=lambda: [400.0, 420.0, 380.0, 410.0, 390.0])  # floor 400 ns
    # `triton_launch` rows of ceilings.csv, any contract (the Triton launch floor, issue 16); none by default
    triton_launch_ns: list[float] = field(default_factory=list)
    # `copy_matched` rows: a copy of the cases' traffic (bytes_per_call), any contract; none by default
    matched_copy_ns: list[float] = field(default_factory=list)
    timed_failures: dict[tuple[str, str, int, int], str] = field(default_factory=dict)
    raises: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    source: dict[str, bytes] = field(default_factory=lambda: dict(SOURCE))

    def rounds_of(self, case: str) -> int:
        return self.case_rounds.get(case, self.rounds)

    def unit_order(self, seed: int, rnd: int) -> tuple[int, int, int]:
        """When a (seed, round) unit ran: the planned rounds seed by seed, then each added round across seeds."""
        return (0, self.seeds.index(seed), rnd) if rnd < self.rounds else (1, rnd, self.seeds.index(seed))

    def dropped(self, case: str, arm: str, seed: int, rnd: int) -> bool:
        """The arm raised in an earlier unit of the case and is no longer timed there."""
        raised = self.raises.get((case, arm))
        return raised is not None and self.unit_order(*raised) < self.unit_order(seed, rnd)


# a small stand-in for the kerneltrial package's .py files, archived in source.tar.gz
SOURCE = {"__init__.py": b"", "stats.py": b"MEDIAN = 'numpy'\n", "trial/runner.py": b"print('ran')\n"}
PASSED_ULP_HIST = [900, 100, 20, 4, 0, 0]  # 1024 output elements
FAILED_ULP_HIST = [0, 0, 0, 0, 24, 1000]


def write_run_dir(path: Path, spec: RunSpec | None = None) -> Path:
    """Write protocol.toml, provenance.json, plan.json, correctness.jsonl, timings.csv, ceilings.csv."""
    spec = spec or RunSpec()
    path.mkdir(parents=True, exist_ok=True)
    checked = spec.checks is not None
    if checked and spec.order_seed is None:
        spec = replace(spec, order_seed=0)  # the runner always writes it
    protocol_bytes = tomli_w.dumps(protocol_of(spec)).encode()
    (path / "protocol.toml").write_bytes(protocol_bytes)
    sha = hashlib.sha256(protocol_bytes).hexdigest()
    (path / "provenance.json").write_text(json.dumps(_provenance(path, spec, sha)))
    (path / "plan.json").write_text(json.dumps(_plan(spec, sha)))
    available = [a["name"] for a in spec.arms if a["available"]]
    correctness = [row for case in spec.cases for row in _correctness(spec, case, available)]
    header = "case,seed,round,position,arm,calls,ns" + (",sm_mhz,mem_mhz" if spec.sm_mhz else "")
    timings, timed_checks = [header], []
    order_rng = np.random.default_rng(0)
    for case in spec.cases:
        _time_case(spec, case, available, order_rng, timings, timed_checks)
    (path / "correctness.jsonl").write_text("".join(json.dumps(r) + "\n" for r in correctness))
    (path / "timings.csv").write_text("\n".join(timings) + "\n")
    if checked:
        (path / "timed_checks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timed_checks))
    (path / "ceilings.csv").write_text("\n".join(_ceilings(spec)) + "\n")
    return path


def _provenance(path: Path, spec: RunSpec, sha: str) -> dict:
    provenance = {
        "kind": "kernel",
        "protocol_sha256": sha,
        "versions": {"python": "3.11"},
        "device": {"gpu": None, "cpu": "x86_64"},
        "triton_interpreter": True,
        "clocks_at_start": None,
        "hostname": "factory",
        "git": {"commit": "abc123", "dirty": False},
        "argv": ["kerneltrial", "run"],
        "started_at": "2025-01-01T00:00:00Z",
        "finished_at": "2025-01-01T00:01:00Z",
    }
    if spec.checks is not None:
        provenance.update(
            device={"gpu": "NVIDIA H200"} if spec.is_gpu else {"gpu": None, "cpu": "x86_64"},
            triton_interpreter=not spec.is_gpu,  # verify's device check: the interpreter runs only on a CPU
            versions={"python": "3.11.7", "torch": "2.13.0", "triton": "3.6.0"},
            freeze=None if spec.frozen_at is None else {"sha256": sha, "frozen_at": spec.frozen_at},
            impl_modules={},
        )
        provenance["git"]["source_sha256"] = write_source_archive(path / "source.tar.gz", spec.source)
    return provenance


def _plan_case(spec: RunSpec, c: str) -> dict:
    shape, layout, dtype = _parts(c)
    case = {
        "case": c,
        "shape": shape,
        "layout": layout,
        "dtype": dtype,
        "bytes": spec.bytes_per_call,
        "calls": spec.calls,
    }
    if c in spec.case_rounds:
        case["rounds"] = spec.case_rounds[c]
    if c in spec.injected_delay_ns:
        case["injected_delay_ns"] = spec.injected_delay_ns[c]
    return case


def _plan(spec: RunSpec, sha: str) -> dict:
    plan = {
        "protocol_sha256": sha,
        "op": spec.op,
        "backend": spec.backend,
        "is_gpu": spec.is_gpu,
        "l2": spec.l2,
        "arms": spec.arms,
        "cases": [_plan_case(spec, c) for c in spec.cases],
        "seeds": spec.seeds,
        "rounds": spec.rounds,
        "tie_band": spec.tie_band,
        "gate": spec.gate,
        "bootstrap": {"resamples": spec.resamples, "seed": 7, "confidence": 0.95},
    }
    if spec.checks is not None:
        plan.update(checks=spec.checks, exact=spec.exact, plausibility=spec.plausibility, frozen_at=spec.frozen_at)
    if spec.order_seed is not None:
        plan["order_seed"] = spec.order_seed
    for key in ("clocks", "noise_rule", "calibration"):
        if getattr(spec, key) is not None:
            plan[key] = getattr(spec, key)
    return plan


def _correctness(spec: RunSpec, case: str, available: list[str]) -> list[dict]:
    rows = []
    for seed in spec.seeds:
        for arm in available:
            ok = (case, arm) not in spec.failures
            row = {
                "case": case,
                "seed": seed,
                "arm": arm,
                "passed": ok,
                "max_abs": 0.0 if ok else 0.5,
                "max_rel": 0.0 if ok else 0.25,
                "ulp": 0 if ok else 900,
                "message": "" if ok else f"max_rel 0.25 > rtol 0.016 at seed {seed}",
            }
            if spec.checks is not None:
                row["ulp_hist"] = PASSED_ULP_HIST if ok else FAILED_ULP_HIST
            rows.append(row)
    return rows


def _round_order(spec: RunSpec, case: str, seed: int, rnd: int, present: list[str], order_rng) -> list[str]:
    if spec.order_seed is None:
        return [str(a) for a in order_rng.permutation(present)]
    # the runner's rule (docs/VERIFY.md, "Timing units and the round order")
    rng = np.random.default_rng([spec.order_seed, spec.cases.index(case), seed, rnd])
    return [present[i] for i in rng.permutation(len(present))]


def _time_case(
    spec: RunSpec, case: str, available: list[str], order_rng, timings: list[str], checks: list[dict]
) -> None:
    """Append the case's timing rows (and timed-check rows) to `timings` (and `checks`)."""
    timed = [a for a in available if (case, a) not in spec.failures]
    for seed in spec.seeds:
        for rnd in range(spec.rounds_of(case)):
            present = [a for a in timed if not spec.dropped(case, a, seed, rnd)]
            for position, arm in enumerate(_round_order(spec, case, seed, rnd, present, order_rng)):
                raised = spec.raises.get((case, arm)) == (seed, rnd)
                if spec.checks is not None:
                    checks.append(_timed_check(spec, case, arm, seed, rnd, raised))
                if raised:
                    continue
                ns = spec.per_call(case, arm, seed, rnd) * spec.calls
                row = f"{case},{seed},{rnd},{position},{arm},{spec.calls},{ns!r}"
                if spec.sm_mhz:
                    sm = spec.sm_mhz(case, arm, seed, rnd)
                    row += ",," if sm is None else f",{sm},2619"
                timings.append(row)


def _ceilings(spec: RunSpec) -> list[str]:
    ceilings = ["kind,sample,bytes,ns"]
    ceilings += [f"copy,{i},8000000,{4000 + 100 * i}" for i in range(5)]  # 2000, 1951.2, 1904.8, ... GB/s
    ceilings += [f"read,{i},4000000,{1000 + 50 * i}" for i in range(4)]
    if spec.checks is not None:
        ceilings += [f"launch,{i},0,{ns!r}" for i, ns in enumerate(spec.launch_ns)]
    ceilings += [f"triton_launch,{i},0,{ns!r}" for i, ns in enumerate(spec.triton_launch_ns)]
    ceilings += [f"copy_matched,{i},{spec.bytes_per_call},{ns!r}" for i, ns in enumerate(spec.matched_copy_ns)]
    return ceilings


def _timed_check(spec: RunSpec, case: str, arm: str, seed: int, rnd: int, raised: bool) -> dict:
    """The timed_checks.jsonl row of one sample: passed, failed with a planted message, or raised."""
    message = (
        "raised while timed: RuntimeError: CUDA error: an illegal memory access"
        if raised
        else spec.timed_failures.get((case, arm, seed, rnd), "")
    )
    return {
        "case": case,
        "seed": seed,
        "round": rnd,
        "arm": arm,
        "values_seed": 1000 * seed + rnd,
        "passed": not message,
        "max_abs": 0.5 if message else 0.0,
        "max_rel": 0.25 if message else 0.0,
        "ulp": 900.0 if message else 0.0,
        "message": message,
    }


def write_source_archive(path: Path, files: dict[str, bytes]) -> str:
    """source.tar.gz as the runner writes it (members `kerneltrial/<relpath>`, sorted, mtime 0);
    returns the package digest of those files, computed by `provenance.source_digest` itself."""
    with tempfile.TemporaryDirectory() as root:
        for rel, data in files.items():
            (Path(root) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(root) / rel).write_bytes(data)
        digest = source_digest(Path(root))
    with tarfile.open(path, "w:gz") as archive:
        for rel in sorted(files):
            info = tarfile.TarInfo(f"kerneltrial/{rel}")
            info.size, info.mtime = len(files[rel]), 0
            archive.addfile(info, io.BytesIO(files[rel]))
    return digest


def seal(path: Path) -> Path:
    """Write manifest.json over every file of the run directory, as the runner does last."""
    files = {
        f.relative_to(path).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name != "manifest.json"
    }
    (path / "manifest.json").write_text(json.dumps({"schema": "kerneltrial.manifest/1", "files": files}, indent=1))
    return path


def write_checked_run(path: Path, spec: RunSpec | None = None) -> Path:
    """A finished run of the timed-check contract: raw files, summary.json, then manifest.json."""
    spec = spec or RunSpec()
    write_run_dir(path, replace(spec, checks=1 if spec.checks is None else spec.checks))
    write_summary(path)
    return seal(path)


def _parts(case_id: str) -> tuple[list[int], str, str]:
    """Shape, layout and dtype of a case id `AxB/layout/dtype`."""
    shape, layout, dtype = case_id.split("/")
    return [int(n) for n in shape.split("x")], layout, dtype


def protocol_of(spec: RunSpec) -> dict:
    """The protocol.toml fields that plan.json copies, agreeing with the plan the factory writes."""
    control = next(a["name"] for a in spec.arms if a["kind"] == "control")
    protocol: dict = {
        "name": "synthetic",
        "op": spec.op,
        "control": control,
        "candidates": [a["name"] for a in spec.arms if a["name"] != control],
        "seeds": spec.seeds,
        "rounds": spec.rounds,
        "tie_band": spec.tie_band,
        "gate": spec.gate,
        "bootstrap_resamples": spec.resamples,
        "bootstrap_seed": 7,
        "l2": spec.l2,
    }
    if spec.checks is not None and spec.exact:
        protocol["exact"] = True
    if spec.order_seed is not None:
        protocol["order_seed"] = spec.order_seed
    for section in (spec.clocks, spec.noise_rule, spec.calibration):
        protocol.update({k: v for k, v in (section or {}).items() if k != "max_sm_mhz" and v is not None})
    protocol["cases"] = [dict(zip(("shape", "layout", "dtype"), _parts(c), strict=True)) for c in spec.cases]
    if spec.protocol_edit:
        spec.protocol_edit(protocol)
    return protocol


def rewrite_ceilings(path: Path, old: str, new: str, rebuild: bool = False) -> None:
    """Planted: edit ceilings.csv and re-hash it as a forger would, then re-seal. `rebuild` also
    recomputes summary.json from the edited rows (only verify's raw-row checks can object);
    otherwise only its hash of ceilings.csv is updated (the figure checks can object too)."""
    ceilings = path / "ceilings.csv"
    text = ceilings.read_text()
    assert old in text
    ceilings.write_text(text.replace(old, new))
    if rebuild:
        write_summary(path, overwrite=True)
    else:
        summary = json.loads((path / "summary.json").read_text())
        summary["inputs_sha256"]["ceilings.csv"] = hashlib.sha256(ceilings.read_bytes()).hexdigest()
        (path / "summary.json").write_text(json.dumps(summary))
    seal(path)
