"""Refusals before any heavy import and before a run directory exists (torch-free).

`preflight(path)` reads and validates a protocol (the file, every key, the freeze record) and
refuses a case whose inputs cannot fit in the memory free here. `run` calls it before it
imports torch; the runner calls it again first thing, so every caller (suite, replicate,
fleet, demo) gets the same refusal before `prepare` creates the run directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kerneltrial.rundir.layout import DTYPE_BYTES
from kerneltrial.rundir.provenance import nvidia_smi, visible_gpu
from kerneltrial.trial import protocol as proto

# Peak memory of one gate check grows by at least this many tensors of a case's first input per
# input: the values, the arm's guarded copy, clones and outputs of the formula and of the float64
# oracle, the repeated calls' inputs and outputs (trial/gate.py). Measured on the CPU with the
# torch_eager arm, peak RSS between inputs of 32 and 128 MiB (bf16): silu_and_mul 21.7 per input
# byte (2048x8192 -> 8192x8192), rmsnorm 27 (2048x8192 -> 8192x8192), fused_add_rmsnorm 63.5
# (two inputs and two outputs of the shape), plus under 1 GiB of float64 comparison temporaries
# (gate.CHUNK elements at a time). 20, below every operator measured, refuses only a case that
# cannot fit: one that needs more than 20 copies but less than its operator's own may still end
# in an allocation error.
GATE_COPIES = 20


@dataclass(frozen=True)
class Memory:
    """Bytes free where a run allocates its tensors, and where that is (for the message)."""

    free: int
    where: str


def free_memory() -> Memory:
    """The GPU's free memory when nvidia-smi sees one (the one CUDA_VISIBLE_DEVICES names first),
    else the host's available memory (/proc/meminfo MemAvailable, else free physical pages)."""
    gpus = nvidia_smi(("memory.free", "name"), gpu=visible_gpu())
    if gpus:
        return Memory(int(float(gpus[0]["memory.free"])) << 20, f"free on the GPU ({gpus[0]['name']})")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Memory(int(line.split()[1]) << 10, "available on this host")
    except OSError:
        pass
    return Memory(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "available on this host")


def input_bytes(case: proto.CaseSpec) -> int:
    """Bytes of one tensor of the case's shape and dtype (the case's first input)."""
    n = DTYPE_BYTES[case.dtype]
    for size in case.shape:
        n *= size
    return n


def unfittable(p: proto.Protocol, memory: Memory) -> str:
    """'' when every case's gate check fits in `memory`; else a refusal naming the first case
    that does not, its byte counts and the fix."""
    for case in p.cases:
        one = input_bytes(case)
        if one * GATE_COPIES > memory.free:
            return (
                f"case {case.id} cannot fit: one input of that shape is {one:,} bytes, and checking it "
                f"needs at least {GATE_COPIES} such tensors ({one * GATE_COPIES:,} bytes); {memory.free:,} bytes "
                f"are {memory.where}. Choose a smaller shape"
            )
    return ""


def preflight(path: Path, memory: Memory | None = None) -> proto.Protocol:
    """The validated protocol at `path`, or ProtocolError: no such file, a bad key or value, a
    changed frozen protocol, an unfrozen confirmation, or a case too large for `memory`
    (default: what `free_memory` finds)."""
    p = proto.load(path)
    refusal = unfittable(p, memory or free_memory())
    if refusal:
        raise proto.ProtocolError(f"{path}: {refusal}")
    return p
