"""Provenance cross-checks: the commit and the device a run names, against what else records them.

provenance.json is the run's own statement of where it ran; a forger can edit it and rehash the
manifest. These checks compare it with records the forger must also change, and consistently:
- `source commit`: the package at the recorded commit, read from this checkout's git history
  (kernel/git_history.py), digests to `git.source_sha256` (which the source archive check
  ties to source.tar.gz), unless the run says its tree was modified (`git.dirty` true). Every
  committed run's commit is in the history; elsewhere an unknown commit is not applicable.
- `device`: the CPU/GPU fields agree with plan.json (`is_gpu`, the timer) and the interpreter
  flag; for a GPU in `GPUS`, the recorded SM count, compute capability, memory and L2 are that
  GPU's, the measured copy and read ceilings (ceilings.csv) do not exceed its memory bandwidth,
  and the maximum SM clock (plan.json clocks, nvidia-smi at the start, every clock reading in
  timings.csv) is its maximum. A GPU outside the table gets the clock agreement only.
What remains: the hostname is recorded nowhere else (a fleet records each unit's host in
fleet.json); a device renamed to a GPU outside the table, or to one whose every figure it also
rewrites, passes; a run marked dirty is not compared with its commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerneltrial.kernel.git_history import package_at
from kerneltrial.kernel.integrity import package_digest

GIB = 1 << 30
MEMORY_TOLERANCE = 0.02  # torch's total_memory of one GPU model varies by driver reservation, by well under 2%
CUDA_BACKENDS = ("cuda-events", "cuda-graph")


@dataclass(frozen=True)
class GpuSpec:
    sm_count: int
    capability: str
    memory_gib: float  # torch.cuda.get_device_properties().total_memory / 2**30
    l2_bytes: int
    peak_gbps: float  # memory bandwidth from the datasheet: no copy or read can exceed it
    max_sm_mhz: int  # nvidia-smi clocks.max.sm


# torch's device name -> its figures. H200: every committed run under results/ (132 SMs, 9.0,
# 150109880320 bytes, 62914560 bytes of L2, clocks.max.sm 1980; copy ceilings 4.18-4.27 TB/s) and
# NVIDIA's H200 datasheet (4.8 TB/s). H100 SXM5 80GB and A100 SXM4: NVIDIA's H100 and A100
# datasheets (3.35 TB/s; 2,039 and 1,555 GB/s) and whitepapers (SMs, L2, boost clocks).
GPUS = {
    "NVIDIA H200": GpuSpec(132, "9.0", 139.8, 60 << 20, 4800.0, 1980),
    "NVIDIA H100 80GB HBM3": GpuSpec(132, "9.0", 79.6, 50 << 20, 3350.0, 1980),
    "NVIDIA A100-SXM4-80GB": GpuSpec(108, "8.0", 79.2, 40 << 20, 2039.0, 1410),
    "NVIDIA A100-SXM4-40GB": GpuSpec(108, "8.0", 39.4, 40 << 20, 1555.0, 1410),
}


def commit_problems(provenance: dict[str, Any]) -> tuple[list[str] | None, str]:
    """(problems, detail) of `source commit`; problems None: not applicable (detail says why)."""
    git = provenance.get("git") if isinstance(provenance.get("git"), dict) else {}
    commit, claimed = git.get("commit"), git.get("source_sha256")
    if not isinstance(commit, str) or not commit:
        return None, "not applicable: provenance.json records no commit"
    tree = package_at(commit)
    if tree.files is None:
        return None, f"not applicable: {tree.reason}; the commit's source is not compared"
    digest = package_digest(tree.files)
    if claimed is None:
        return [], f"commit {commit} is in this checkout's history (no source digest recorded to compare)"
    if digest == claimed:
        return [], f"the package at commit {commit} digests to git.source_sha256 {digest[:12]}..."
    if git.get("dirty") is True:
        return [], f"the run says it ran a modified tree of commit {commit} (git.dirty): its code is the archive's"
    return [
        f"the package at commit {commit} digests to {digest[:12]}..., but the run recorded git.source_sha256 "
        f"{str(claimed)[:12]}... and a tree that was not modified (dirty {git.get('dirty')!r}): commit {commit} "
        "is not the code that ran (provenance.json edited?)"
    ], ""


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    n = len(ordered)
    return None if not n else ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _ceiling_gbps(rows: list[dict[str, str]], kind: str) -> float | None:
    """The median GB/s of one ceilings.csv kind (bytes / ns); None without rows."""
    rates = []
    for row in rows:
        try:
            if row["kind"] == kind and float(row["ns"]) > 0:
                rates.append(float(row["bytes"]) / float(row["ns"]))
        except (KeyError, ValueError):
            continue  # the ceilings check names a malformed row
    return _median(rates)


def _host_problems(provenance: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """CPU or GPU, as provenance, plan.json and the interpreter flag each say it."""
    gpu = (provenance.get("device") or {}).get("gpu")
    is_gpu, backend = plan.get("is_gpu"), plan.get("backend")
    problems = []
    if bool(gpu) != bool(is_gpu):
        problems.append(f"provenance device.gpu {gpu!r} but plan.json is_gpu {is_gpu!r}")
    if bool(is_gpu) != (backend in CUDA_BACKENDS):
        problems.append(f"plan.json is_gpu {is_gpu!r} with backend {backend!r}")
    if gpu and provenance.get("triton_interpreter") is True:
        problems.append(f"device.gpu {gpu!r} but the Triton interpreter ran (triton_interpreter true): a CPU run")
    return problems


def _clock_problems(
    provenance: dict[str, Any], plan: dict[str, Any], clock_readings: list[float], most: int | None
) -> list[str]:
    """The maximum SM clock: plan.json's, nvidia-smi's at the start, every reading, and the GPU's own (`most`)."""
    planned = (plan.get("clocks") or {}).get("max_sm_mhz")
    smi = (provenance.get("clocks_at_start") or {}).get("clocks.max.sm")
    problems = []
    if planned is not None and smi is not None and str(planned) != str(smi).split()[0]:
        problems.append(f"plan.json clocks.max_sm_mhz {planned} but nvidia-smi clocks.max.sm {smi} at the start")
    if most is not None and planned is not None and planned != most:
        problems.append(f"plan.json clocks.max_sm_mhz {planned}, the GPU's maximum is {most} MHz")
    ceiling = most if most is not None else planned
    above = [mhz for mhz in clock_readings if ceiling is not None and mhz > ceiling]
    if above:
        problems.append(f"{len(above)} timings.csv clock reading(s) above {ceiling} MHz (max {max(above):g})")
    return problems


def _spec_problems(name: str, spec: GpuSpec, device: dict[str, Any], ceiling_rows: list[dict[str, str]]) -> list[str]:
    problems = [
        f"device.{key} {device.get(key)!r}, a {name} has {want!r}"
        for key, want in (("sm_count", spec.sm_count), ("capability", spec.capability), ("l2_bytes", spec.l2_bytes))
        if device.get(key) is not None and device.get(key) != want
    ]
    memory = device.get("memory_bytes")
    if isinstance(memory, int) and abs(memory / GIB - spec.memory_gib) > MEMORY_TOLERANCE * spec.memory_gib:
        problems.append(f"device.memory_bytes {memory} ({memory / GIB:.1f} GiB), a {name} has {spec.memory_gib:g} GiB")
    for kind in ("copy", "read"):
        gbps = _ceiling_gbps(ceiling_rows, kind)
        if gbps is not None and gbps > spec.peak_gbps:
            problems.append(f"the {kind} ceiling measured {gbps:.0f} GB/s, above a {name}'s {spec.peak_gbps:g} GB/s")
    return problems


def device_problems(
    provenance: dict[str, Any], plan: dict[str, Any], ceiling_rows: list[dict[str, str]], clock_readings: list[float]
) -> tuple[list[str], str]:
    """(problems, detail) of `device`: the recorded device against plan.json, ceilings.csv and the clocks."""
    device = provenance.get("device") if isinstance(provenance.get("device"), dict) else {}
    name = device.get("gpu")
    spec = GPUS.get(name) if isinstance(name, str) else None
    problems = _host_problems(provenance, plan)
    problems += _clock_problems(provenance, plan, clock_readings, spec.max_sm_mhz if spec else None)
    if spec is not None:
        problems += _spec_problems(name, spec, device, ceiling_rows)
    detail = (
        "a CPU run (plan.json and the interpreter flag agree)"
        if not name
        else f"{name}: SMs, capability, memory, L2, ceilings and clocks are its own"
        if spec
        else f"{name} (not in the table of known GPUs: only the clocks and the plan are compared)"
    )
    return problems, detail


def retake_problems(provenance: dict[str, Any], plan: dict[str, Any]) -> tuple[list[str] | None, str]:
    """provenance.json lead's throttle re-takes by arm against their total and the plan's arms; None
    (not applicable) for a run from before the per-arm counts. Only the kept samples are recorded,
    so the counts themselves are the runner's word: this catches an edit that left them unequal."""
    lead = provenance.get("lead") if isinstance(provenance.get("lead"), dict) else {}
    by_arm, total = lead.get("samples_retaken_throttled_by_arm"), lead.get("samples_retaken_throttled")
    if by_arm is None:
        return None, "not applicable: the run records no throttle re-takes by arm (before them, or still running)"
    if not isinstance(by_arm, dict) or not all(type(n) is int and n > 0 for n in by_arm.values()):
        return [f"lead.samples_retaken_throttled_by_arm is {by_arm!r}, not arm names with positive counts"], ""
    arms = {a.get("name") for a in plan.get("arms", []) if isinstance(a, dict)}
    problems = [
        f"lead.samples_retaken_throttled_by_arm names {name!r}, no arm of plan.json"
        for name in by_arm
        if name not in arms
    ]
    if sum(by_arm.values()) != total:
        problems.append(
            f"lead.samples_retaken_throttled is {total!r}, its arms' re-takes sum to {sum(by_arm.values())}"
        )
    return problems, f"{total} re-take(s) by arm: {by_arm or 'none'}"
