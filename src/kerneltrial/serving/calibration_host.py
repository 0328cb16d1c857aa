"""The host a serving calibration was measured on (issue 36, review A5): a calibration's noise band is
its host's, so a trial rests only on a calibration of the host it runs on.

calibration.json (schema kerneltrial.serving-calibration/4) records `host`, a `HostFingerprint`: the
hostname, the CPU model and logical CPU count, the total memory, the GPUs as nvidia-smi names them
(name, UUID, driver) or why they could not be read, CUDA_VISIBLE_DEVICES (which of them the server
inherits: serving/launcher.py passes this process's environment on), and a digest of the model's
weights where server.model is a local path (a hub id is recorded as not digested, `NotDigested`).

`compare_hosts` is the identity rule, the one the trial's gate (serving/calibration_gate.py) and
verify (serving/calibration_evidence.py) both apply: identity is the hardware, not the name. A new
hostname alone is a warning (a container gets one on every start); another CPU model or count,
memory beyond MEMORY_TOLERANCE, other GPUs (by UUID where both sides know them, else by model and
count), another driver, other CUDA_VISIBLE_DEVICES or other weights refuse; a field read on one side
only (nvidia-smi absent or failing) is unknown, refused with its own message, not taken for another
host. `provenance_differences` checks a fingerprint against what the same run's provenance.json
records (hostname, GPUs, CUDA_VISIBLE_DEVICES): a record edited after the run.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.provenance import SMI_TIMEOUT_S

GPU_IDENTITY = ("name", "uuid", "driver_version")
CONFIG = "config.json"
HUB_ID = "hub id: weights not digested"
MEMORY_TOLERANCE = 0.02  # memory_gib may differ by 2% (at least 1 GiB): firmware and kernel reserves move it
UNREAD_WHY = "no reason recorded (a calibration from before the reason was recorded)"
SMI_WORDS = 200  # characters of nvidia-smi's own words kept in a reason


class Gpu(BaseModel):
    """One GPU of the host as nvidia-smi names it (uuid "": not recorded, an older trial's provenance.json)."""

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


class NotDigested(BaseModel):
    """server.model is not a local path here (a hub id: the server downloads it): its weights are not
    digested, and the fingerprint says so rather than leaving the field empty."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str
    note: Literal["hub id: weights not digested"] = HUB_ID


class HostFingerprint(BaseModel):
    """The host a calibration was measured on; a trial compares it with its own (`compare_hosts`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    hostname: str
    cpu_model: str
    cpu_count: int | None  # os.cpu_count(): logical CPUs of the machine; None: unknown
    memory_gib: int | None  # physical memory in whole GiB; None: unknown
    gpus: list[Gpu] | None  # every GPU of the machine; None: nvidia-smi absent or failed (gpus_unread says why)
    gpus_unread: str | None = None  # why gpus is None, nvidia-smi's words; None in a /4 record from before it
    cuda_visible_devices: str | None  # the servers inherit it; None: not set
    weights: Weights | NotDigested | None  # None: server.model unset (or a hub id in an older /4 record)


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


@dataclass(frozen=True)
class GpuReading:
    """nvidia-smi's answer: the GPUs, or why there are none to compare."""

    gpus: list[Gpu] | None
    unread: str | None  # None when gpus were read


def read_gpus() -> GpuReading:
    """Every GPU's name, UUID and driver from nvidia-smi, or the reason it gave none (not on PATH, did not
    answer, failed: its first line, listed none)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return GpuReading(None, "nvidia-smi is not on PATH")
    argv = [exe, f"--query-gpu={','.join(GPU_IDENTITY)}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return GpuReading(None, f"nvidia-smi did not answer within {SMI_TIMEOUT_S} s")
    except OSError as error:
        return GpuReading(None, f"nvidia-smi could not run ({error})")
    rows = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0:
        words = next((line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()), "")
        return GpuReading(None, f"nvidia-smi exited {done.returncode}: {words[:SMI_WORDS] or 'no output'}")
    if not rows:
        return GpuReading(None, "nvidia-smi listed no GPU")
    gpus = []
    for row in rows:
        values = [value.strip() for value in row.split(",")]
        gpus.append(Gpu(**dict(zip(GPU_IDENTITY, values + [""] * len(GPU_IDENTITY), strict=False))))
    return GpuReading(gpus, None)


def weights_digest(model: str | None) -> Weights | NotDigested | None:
    """The digest of server.model where it is a local folder or file (see Weights); `NotDigested` where it
    is not a path here (a hub id); None where it is unset. Files and folders whose name starts with a dot
    are left out: a download's .cache/ metadata (times, etags) differs between two copies of the same weights."""
    if not model:
        return None
    if not Path(model).exists():
        return NotDigested(model=model)
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
    reading = read_gpus()
    return HostFingerprint(
        hostname=socket.gethostname(),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        memory_gib=memory_gib(),
        gpus=reading.gpus,
        gpus_unread=reading.unread,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        weights=weights_digest(model),
    )


@dataclass(frozen=True)
class Sides:
    """How a comparison names its two fingerprints: the calibration's ("there") and the trial's ("here")."""

    there: str = "there"
    here: str = "here"


@dataclass(frozen=True)
class HostMatch:
    """The identity rule's verdict (`compare_hosts`): `differ` and `unknown` refuse, each with its own
    message; `warnings` (a new hostname, fields compared on neither side) are printed and recorded."""

    differ: list[str] = field(default_factory=list)  # "FIELD X there, Y here": other hardware or weights
    unknown: list[str] = field(default_factory=list)  # read on one side only: not shown to be the same host
    warnings: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differ and not self.unknown


def compare_hosts(
    calibration: HostFingerprint,
    trial: HostFingerprint,
    unrecorded: frozenset[str] = frozenset(),
    sides: Sides = Sides(),
) -> HostMatch:
    """The identity rule, shared by the gate and verify: is `trial` the host `calibration` was measured on?
    `unrecorded`: fields the trial's record lacks (a trial from before it recorded its host), not compared.

    Identity is the hardware: CPU model and count, memory within MEMORY_TOLERANCE, the GPUs (UUIDs where
    both sides know them, else models and count; and their driver, which times the kernels too), which of
    them CUDA_VISIBLE_DEVICES selects, and the weights. A new hostname with the same hardware is a
    warning, not a refusal: a container is renamed on every start, and the name says nothing about noise.

    A field read on one side only (GPUs: nvidia-smi absent or failing) is `unknown` and refuses, with a
    message that says it could not be read and how to proceed, never "another host". Accepting it with a
    warning would accept any machine of the same instance type (the same CPU and memory, other GPUs):
    with the hostname no longer binding, the GPU UUIDs are what tells two such machines apart. GPUs read
    on neither side are not compared, which is said in a warning (a host without NVIDIA GPUs)."""
    match = HostMatch()
    _compare_cpu(calibration, trial, unrecorded, sides, match)
    if "gpus" not in unrecorded:
        _compare_gpus(calibration, trial, sides, match)
    if "cuda_visible_devices" not in unrecorded:
        _compare_devices(calibration, trial, match)
    if "weights" not in unrecorded:
        _compare_weights(calibration.weights, trial.weights, sides, match)
    if calibration.hostname != trial.hostname and "hostname" not in unrecorded:
        renamed = f"hostname {calibration.hostname!r} {sides.there}, {trial.hostname!r} {sides.here}"
        if match.same:
            renamed += (
                ", on the same hardware: taken as the same machine under a new name (a container gets one on "
                "every start)"
            )
        match.warnings.insert(0, renamed)
    return match


def _compare_cpu(a: HostFingerprint, b: HostFingerprint, unrecorded: frozenset[str], s: Sides, m: HostMatch) -> None:
    for key in ("cpu_model", "cpu_count", "memory_gib"):
        theirs, mine = getattr(a, key), getattr(b, key)
        if key in unrecorded or theirs == mine:
            continue
        if theirs is None or mine is None:
            side = s.there if theirs is None else s.here
            m.unknown.append(f"{key} could not be read {side} ({theirs!r} {s.there}, {mine!r} {s.here})")
        elif key == "memory_gib" and abs(theirs - mine) <= max(1, MEMORY_TOLERANCE * max(theirs, mine)):
            continue
        else:
            beyond = f" (beyond the {MEMORY_TOLERANCE:.0%} tolerance)" if key == "memory_gib" else ""
            m.differ.append(f"{key} {theirs!r} {s.there}, {mine!r} {s.here}{beyond}")


def _known(uuid: str) -> bool:
    return bool(uuid) and "N/A" not in uuid


def _gpu_list(gpus: list[Gpu]) -> str:
    return "[" + ", ".join(f"{g.name} {g.uuid}".strip() for g in gpus) + "]"


def _compare_gpus(a: HostFingerprint, b: HostFingerprint, s: Sides, m: HostMatch) -> None:
    if a.gpus is None and b.gpus is None:
        m.warnings.append(
            f"GPUs not compared: they could not be read {s.there} ({a.gpus_unread or UNREAD_WHY}) nor {s.here} "
            f"({b.gpus_unread or UNREAD_WHY})"
        )
    elif b.gpus is None:
        m.unknown.append(
            f"could not read the GPUs {s.here}: {b.gpus_unread or UNREAD_WHY} ({s.there}: {_gpu_list(a.gpus or [])}); "
            "an unread GPU is not shown to be the one calibrated: make `nvidia-smi -L` list the GPUs and run "
            "the trial again"
        )
    elif a.gpus is None:
        m.unknown.append(
            f"could not read the GPUs {s.there}: {a.gpus_unread or UNREAD_WHY} ({s.here}: {_gpu_list(b.gpus)}); "
            "the calibration cannot show which GPUs its noise is of: calibrate again on this host with "
            "`nvidia-smi -L` listing the GPUs"
        )
    else:
        m.differ.extend(_gpu_differences(a.gpus, b.gpus, s))


def _gpu_differences(a: list[Gpu], b: list[Gpu], s: Sides) -> list[str]:
    """UUIDs where both sides know every one, else the count; then the models and the drivers (each set)."""
    out = []
    uuids_a, uuids_b = [g.uuid for g in a], [g.uuid for g in b]
    if all(_known(u) for u in uuids_a + uuids_b):
        if sorted(uuids_a) != sorted(uuids_b):
            out.append(f"gpus UUIDs {uuids_a} {s.there}, {uuids_b} {s.here}")
    elif len(a) != len(b):
        out.append(f"gpus {len(a)} GPU(s) {s.there}, {len(b)} {s.here}")
    names_a, names_b = sorted({g.name for g in a}), sorted({g.name for g in b})  # the count is said above
    if names_a != names_b:
        out.append(f"gpus models {names_a} {s.there}, {names_b} {s.here}")
    drivers_a, drivers_b = sorted({g.driver_version for g in a}), sorted({g.driver_version for g in b})
    if drivers_a != drivers_b:
        out.append(f"gpus driver {drivers_a} {s.there}, {drivers_b} {s.here}")
    return out


def _selected(devices: str | None, gpus: list[Gpu] | None) -> list[Gpu | None] | None:
    """The GPUs CUDA_VISIBLE_DEVICES names, in nvidia-smi's numbering (an index or a UUID prefix; None
    where one cannot be resolved); None when it is unset (every GPU)."""
    if devices is None:
        return None
    out: list[Gpu | None] = []
    for entry in (e.strip() for e in devices.split(",") if e.strip()):
        if entry.isdigit():
            found = [gpus[int(entry)]] if gpus and int(entry) < len(gpus) else []
        else:
            found = [g for g in gpus or [] if _known(g.uuid) and g.uuid.startswith(entry)]
        out.append(found[0] if len(found) == 1 else None)
    return out


def _devices_text(devices: str | None, gpus: list[Gpu] | None) -> str:
    selected = _selected(devices, gpus)
    if selected is None:
        return "no CUDA_VISIBLE_DEVICES (every GPU)"
    named = ", ".join(f"{g.name} {g.uuid}" if g else "not among the GPUs read" for g in selected)
    return f"CUDA_VISIBLE_DEVICES={devices} ({named or 'no GPU'})"


def _compare_devices(a: HostFingerprint, b: HostFingerprint, m: HostMatch) -> None:
    """Two settings that name the same GPUs (an index and its UUID) are the same devices."""
    if a.cuda_visible_devices == b.cuda_visible_devices:
        return
    chosen_a, chosen_b = _selected(a.cuda_visible_devices, a.gpus), _selected(b.cuda_visible_devices, b.gpus)
    if chosen_a and chosen_b and None not in chosen_a and chosen_a == chosen_b:
        return
    m.differ.append(
        f"the calibration saw {_devices_text(a.cuda_visible_devices, a.gpus)}, the trial sees "
        f"{_devices_text(b.cuda_visible_devices, b.gpus)}: the calibration's noise belongs to the GPUs it ran on; "
        f"run the trial with {_setting(a.cuda_visible_devices)}, or calibrate again with this setting"
    )


def _setting(devices: str | None) -> str:
    return "CUDA_VISIBLE_DEVICES unset" if devices is None else f"CUDA_VISIBLE_DEVICES={devices}"


def weights_text(weights: Weights | NotDigested | None) -> str:
    if isinstance(weights, NotDigested):
        return f"{weights.model!r}: {weights.note}"
    if weights is None:
        return "none (server.model unset, or a hub id in a calibration from before that was recorded)"
    config = weights.config_sha256[:12] + "..." if weights.config_sha256 else "none"
    return f"{weights.files} files, {weights.total_bytes} bytes, config.json sha256 {config}"


def _compare_weights(a: Weights | NotDigested | None, b: Weights | NotDigested | None, s: Sides, m: HostMatch) -> None:
    """A digest against a digest, field by field; a digest against none is other weights; neither
    digested (a hub id: the model itself is compared by the gate) is a warning that they were not compared."""
    if isinstance(a, Weights) and isinstance(b, Weights):
        m.differ.extend(_differences(a.model_dump(), b.model_dump(), "weights", s))
    elif isinstance(a, Weights) or isinstance(b, Weights):
        m.differ.append(f"weights {weights_text(a)} {s.there}, {weights_text(b)} {s.here}")
    elif isinstance(b, NotDigested) or isinstance(a, NotDigested):
        m.warnings.append(f"weights not compared: {weights_text(b if isinstance(b, NotDigested) else a)}")


def _differences(theirs: Any, mine: Any, key: str, s: Sides) -> list[str]:
    """Dumped values compared down to the first level where they differ, each named by its dotted field."""
    if theirs == mine:
        return []
    if isinstance(theirs, dict) and isinstance(mine, dict) and theirs.keys() == mine.keys():
        return [d for k in theirs for d in _differences(theirs[k], mine[k], f"{key}.{k}", s)]
    return [f"{key} {theirs!r} {s.there}, {mine!r} {s.here}"]


def describe_host(host: HostFingerprint) -> str:
    """One line: the fingerprint as verify prints it (weights of a hub id: "not digested")."""
    gpus = _gpu_list(host.gpus) if host.gpus is not None else f"unread ({host.gpus_unread or UNREAD_WHY})"
    cpus, memory = ("?" if n is None else n for n in (host.cpu_count, host.memory_gib))
    return (
        f"host {host.hostname!r}: {host.cpu_model} x{cpus}, {memory} GiB, GPUs {gpus}, "
        f"{_setting(host.cuda_visible_devices)}, weights {weights_text(host.weights)}"
    )


NOT_IN_PROVENANCE = frozenset({"cpu_model", "cpu_count", "memory_gib", "weights"})


def provenance_host(prov: dict[str, Any]) -> tuple[HostFingerprint, frozenset[str]]:
    """The host a serving run's provenance.json records (hostname, `gpu` without UUIDs, CUDA_VISIBLE_DEVICES
    in `environment`) as a fingerprint, with the fields it does not record (left as placeholders, which
    `compare_hosts` skips): a trial from before it recorded its host (provenance.json calibration.host)."""
    listed = prov.get("gpu") if isinstance(prov.get("gpu"), list) else None
    gpus = None
    if listed is not None:
        gpus = [
            Gpu(name=str(g.get("name")), uuid="", driver_version=str(g.get("driver_version")))
            for g in listed
            if isinstance(g, dict)
        ]
    env = prov.get("environment")
    unrecorded = NOT_IN_PROVENANCE | ({"cuda_visible_devices"} if not isinstance(env, dict) else set())
    host = HostFingerprint(
        hostname=str(prov.get("hostname")),
        cpu_model="",
        cpu_count=None,
        memory_gib=None,
        gpus=gpus,
        gpus_unread=None if gpus is not None else "provenance.json gpu is null: nvidia-smi was absent or failed",
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES") if isinstance(env, dict) else None,
        weights=None,
    )
    return host, frozenset(unrecorded)


def provenance_differences(host: HostFingerprint, prov: dict[str, Any], label: str = "calibration.json") -> list[str]:
    """Where the same run's provenance.json (`hostname`, `gpu`, `environment`: serving/trial.py) records
    another hostname, other GPUs or another CUDA_VISIBLE_DEVICES than `host` (the fingerprint `label`
    names), as "FIELD X in LABEL, Y in provenance.json": one process wrote both, so a difference is an edit."""
    out = []
    if prov.get("hostname") != host.hostname:
        out.append(f"hostname {host.hostname!r} in {label}, {prov.get('hostname')!r} in provenance.json")
    recorded = prov.get("gpu") if isinstance(prov.get("gpu"), list) else None
    ran = [(str(g.get("name")), str(g.get("driver_version"))) for g in recorded or [] if isinstance(g, dict)]
    fingerprint = [(g.name, g.driver_version) for g in host.gpus or []]
    if ran != fingerprint:
        out.append(f"GPUs (name, driver) {fingerprint} in {label}, {ran} in provenance.json")
    env = prov.get("environment")
    if isinstance(env, dict) and env.get("CUDA_VISIBLE_DEVICES") != host.cuda_visible_devices:
        out.append(
            f"CUDA_VISIBLE_DEVICES {host.cuda_visible_devices!r} in {label}, "
            f"{env.get('CUDA_VISIBLE_DEVICES')!r} in provenance.json environment"
        )
    return out
