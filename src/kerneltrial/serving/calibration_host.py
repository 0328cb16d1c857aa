"""The host a serving calibration was measured on (issue 36, review A5): a calibration's noise band is
its host's, so a trial rests only on a calibration of the host it runs on.

calibration.json (schema kerneltrial.serving-calibration/4) records `host`, a `HostFingerprint`: the
hostname, the CPU model and logical CPU count, the total memory, the GPUs as nvidia-smi names them
(name, UUID, driver; rundir/provenance.py `nvidia_smi`) and CUDA_VISIBLE_DEVICES (which of them the
server inherits: serving/launcher.py passes this process's environment on), and a digest of the
model's weights where server.model is a local path. `host_differences` names each field in which a
recorded fingerprint is not this host's (serving/calibration_gate.py refuses the trial with them);
`provenance_differences` checks a fingerprint against the hostname and GPUs a serving run's
provenance.json records (verify: the calibration run's own, and a trial's against the calibration's).
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.provenance import nvidia_smi

GPU_IDENTITY = ("name", "uuid", "driver_version")
CONFIG = "config.json"


class Gpu(BaseModel):
    """One GPU of the host as nvidia-smi names it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    uuid: str
    driver_version: str


class Weights(BaseModel):
    """A cheap digest of a local model folder (or file): every file's relative path and size, and the
    sha256 of config.json. Not a hash of the weights' bytes (gigabytes, minutes per trial): a file of
    the same name and size rewritten in place is not seen; other files, other sizes or another config are."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    files: int
    total_bytes: int
    listing_sha256: str  # sha256 of the sorted "relative/path<TAB>size" lines
    config_sha256: str | None  # None: no config.json (a single-file model)


class HostFingerprint(BaseModel):
    """The host a calibration was measured on; a trial compares it with its own, field by field."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    hostname: str
    cpu_model: str
    cpu_count: int | None  # os.cpu_count(): logical CPUs of the machine
    memory_gib: int | None  # physical memory in whole GiB (the kernel's reserve moves the bytes between boots)
    gpus: list[Gpu] | None  # every GPU of the machine; None: no nvidia-smi, or it failed
    cuda_visible_devices: str | None  # the servers inherit it; None: not set
    weights: Weights | None  # None: server.model is not a local path (a hub id) or is unset


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first CPU's "model name" in /proc/cpuinfo, else what platform says (an ARM /proc/cpuinfo has none)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> int | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError):
        return None


def gpus() -> list[Gpu] | None:
    rows = nvidia_smi(GPU_IDENTITY)
    return [Gpu(**{k: row.get(k, "") for k in GPU_IDENTITY}) for row in rows] if rows is not None else None


def weights_digest(model: str | None) -> Weights | None:
    """The digest of server.model where it is a local folder or file (see Weights). Files and folders
    whose name starts with a dot are left out: a download's .cache/ metadata (times, etags) differs
    between two copies of the same weights."""
    if not model or not Path(model).exists():
        return None
    root = Path(model)
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    rows = []
    for p in paths:
        rel = p.name if p == root else p.relative_to(root).as_posix()
        if not any(part.startswith(".") for part in Path(rel).parts):
            rows.append((rel, p.stat().st_size))
    listing = "".join(f"{rel}\t{size}\n" for rel, size in rows)
    config = root / CONFIG
    return Weights(
        files=len(rows),
        total_bytes=sum(size for _, size in rows),
        listing_sha256=hashlib.sha256(listing.encode()).hexdigest(),
        config_sha256=sha256_file(config) if root.is_dir() and config.is_file() else None,
    )


def this_host(model: str | None) -> HostFingerprint:
    """This host's fingerprint, with the weights digest of `model` (server.model, resolved)."""
    return HostFingerprint(
        hostname=socket.gethostname(),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        memory_gib=memory_gib(),
        gpus=gpus(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        weights=weights_digest(model),
    )


def _differences(theirs: Any, mine: Any, key: str) -> list[str]:
    """Dumped values compared down to the first level where they differ (a dict of the same keys or a
    list of the same length is compared item by item), each named by its dotted field."""
    if theirs == mine:
        return []
    if isinstance(theirs, dict) and isinstance(mine, dict) and theirs.keys() == mine.keys():
        return [d for k in theirs for d in _differences(theirs[k], mine[k], f"{key}.{k}")]
    if isinstance(theirs, list) and isinstance(mine, list) and len(theirs) == len(mine):
        return [d for i, (a, b) in enumerate(zip(theirs, mine, strict=True)) for d in _differences(a, b, f"{key}[{i}]")]
    return [f"{key} {theirs!r} there, {mine!r} here"]


def host_differences(recorded: HostFingerprint, here: HostFingerprint) -> list[str]:
    """Each field in which `recorded` (the calibration's) is not `here` (this host's), as
    "FIELD X there, Y here"; empty when they are the same host."""
    theirs, mine = recorded.model_dump(), here.model_dump()
    return [d for k in theirs for d in _differences(theirs[k], mine[k], k)]


def provenance_differences(host: HostFingerprint, prov: dict[str, Any]) -> list[str]:
    """Where a serving run's provenance.json (`hostname`, `gpu`: serving/trial.py) names another host
    or other GPUs than `host`, as "FIELD X in calibration.json, Y in provenance.json"."""
    out = []
    if prov.get("hostname") != host.hostname:
        out.append(f"hostname {host.hostname!r} in calibration.json, {prov.get('hostname')!r} in provenance.json")
    recorded = prov.get("gpu") if isinstance(prov.get("gpu"), list) else None
    ran = [(str(g.get("name")), str(g.get("driver_version"))) for g in recorded or [] if isinstance(g, dict)]
    fingerprint = [(g.name, g.driver_version) for g in host.gpus or []]
    if ran != fingerprint:
        out.append(f"GPUs (name, driver) {fingerprint} in calibration.json, {ran} in provenance.json")
    return out
