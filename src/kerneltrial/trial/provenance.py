"""Kernel-run provenance: the torch device and the record provenance.json starts with. The
torch-free parts (versions, git, source digest, nvidia-smi) are rundir/provenance.py."""

from __future__ import annotations

import platform
import socket
import sys
from typing import Any

from kerneltrial.rundir import provenance
from kerneltrial.rundir.documents import PROVENANCE_V1
from kerneltrial.rundir.files import now


def device_info() -> dict[str, Any]:
    import torch  # here, not at the top: importing the runner's helpers stays cheap

    if not torch.cuda.is_available():
        return {"gpu": None, "cpu": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(0)
    smi = provenance.nvidia_smi(("driver_version", "name"), gpu=provenance.visible_gpu())
    uuid = getattr(props, "uuid", None)  # which chip of a fleet ran it (`run --ray`)
    return {
        "gpu": props.name,
        "uuid": f"GPU-{uuid}" if uuid is not None else None,
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "memory_bytes": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
        "cuda": torch.version.cuda,
        "driver": smi[0].get("driver_version") if smi else None,
    }


def collect(protocol_sha256: str, source: list[tuple[str, bytes]]) -> dict[str, Any]:
    """Provenance at the start of a kernel run; `source` (see `rundir.provenance.source_files`)
    is the code whose digest is recorded, read once by a caller that also archives it."""
    from kerneltrial.ops.launch import interpreted

    return {
        "schema": PROVENANCE_V1,
        "kind": "kernel",
        "protocol_sha256": protocol_sha256,
        "versions": provenance.versions(),
        "device": device_info(),
        "triton_interpreter": interpreted(),
        "clocks_at_start": provenance.clocks(),
        "hostname": socket.gethostname(),
        "git": provenance.git_state(source=source),
        "argv": sys.argv,
        "started_at": now(),
        "finished_at": None,
    }
