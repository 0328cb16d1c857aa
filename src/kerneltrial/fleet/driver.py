"""The fleet driver: plan the work units, run them as Ray tasks, record each, combine.

A fresh fleet writes DIR/protocol.toml, one piece per unit (pieces.py) and fleet.json (every
unit pending) before the first task. Each task asks for one GPU (one CPU on a cluster without
GPUs). Before the units, one probe task tells the fleet's device model (or the finished units
do, on --resume); a worker on another model refuses its unit unless the protocol sets
`mixed_devices`. fleet.json is rewritten as each unit ends: finished, failed (the task raised,
its worker died, or `run` exited other than 0/1: the error is kept) or refused. `--resume`
runs only the units not finished, each with `run --resume` on its own directory (the kernel
runner keeps every row already written and repeats none) unless Ray put it on another GPU or
host than its partial run started on: then that run is moved to abandoned/<unit>-attemptN,
listed on the unit with the reason, and the unit starts afresh (no run mixes two chips' rows).
A unit whose run finished after fleet.json last saw it is recorded finished without running
again. When every unit finished, the combined figures (fleet/record.py) are written into
fleet.json. Replicas need one GPU each: more replicas than the cluster has GPUs are refused.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

from kerneltrial.fleet.pieces import path_digests, write_piece
from kerneltrial.fleet.record import Abandoned, Fleet, Mode, Unit, combine, read_fleet, write_fleet
from kerneltrial.fleet.worker import FAULT_ENV, TESTING_ENV, Outcome, identity, run_unit
from kerneltrial.rundir.documents import Freeze, Git, read_provenance
from kerneltrial.rundir.files import now, read_json
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import FLEET, FLEET_PIECES, PROTOCOL, SUMMARY
from kerneltrial.rundir.provenance import git_state, source_digest
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.runner import check_arms

INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'kerneltrial[ray]'"
GATE_FAILED = 1  # `run` exits 1 when no candidate passed the gate: a finished run all the same


class FleetError(ValueError):
    """A fleet that cannot start or continue; the message says why and what to do."""


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise FleetError(INSTALL_HINT) from None
    return ray


def _plan(protocol: Path, out: Path, mode: Mode, replicas: int, workers: int, address: str | None) -> Fleet:
    p = proto.load(protocol)
    parent = tomllib.loads(protocol.read_text())
    n = len(parent["cases"])
    if mode == "replicas":
        units = [
            Unit(id=f"replica-{i}", case_indices=list(range(n)), order_seed=p.order_seed + i)
            for i in range(1, replicas + 1)
        ]
    else:
        w = min(n, workers)  # cases dealt round-robin: shard k runs cases k, k + w, ...
        units = [
            Unit(id=f"shard-{k + 1}", case_indices=list(range(k, n, w)), order_seed=p.order_seed) for k in range(w)
        ]
    out.mkdir(parents=True, exist_ok=True)
    (out / PROTOCOL).write_bytes(protocol.read_bytes())
    for unit in units:
        write_piece(protocol, parent, unit, out / unit.piece)
    freeze = proto.freeze_record(protocol)
    fleet = Fleet(
        mode=mode,
        requested=len(units),
        protocol_sha256=sha256_file(protocol),
        freeze=Freeze.model_validate(freeze) if freeze else None,
        mixed_devices=p.mixed_devices,
        address=address,
        git=Git.model_validate(git_state()),
        paths=path_digests(protocol, parent, out / FLEET_PIECES),
        started_at=now(),
        finished_at=None,
        units=units,
        combined=None,
    )
    write_fleet(out, fleet)
    return fleet


def _resumed(protocol: Path, out: Path, mode: Mode, replicas: int) -> Fleet:
    fleet = read_fleet(out)
    if sha256_file(protocol) != fleet.protocol_sha256:
        raise FleetError(
            f"{protocol} is not the protocol of the fleet in {out} (sha256 differs); resume with that protocol"
        )
    if mode != fleet.mode or (mode == "replicas" and replicas != fleet.requested):
        raise FleetError(
            f"{out} holds a fleet of {fleet.requested} {fleet.mode}; resume it with the same --replicas/--shard"
        )
    if source_digest() != fleet.git.source_sha256:
        raise FleetError(f"{out} was started by other kerneltrial code; resume it with the code that started it")
    return fleet


def _finished(run_dir: Path) -> bool:
    return (run_dir / SUMMARY).is_file() and bool(read_json(run_dir / "provenance.json").get("finished_at"))


def _with(fleet: Fleet, unit_id: str, **update: Any) -> Fleet:
    units = [u.model_copy(update=update) if u.id == unit_id else u for u in fleet.units]
    return fleet.model_copy(update={"units": units})


def _finish(fleet: Fleet, out: Path, unit: Unit, exit_code: int | None) -> Fleet:
    """The unit finished: its host and device are those its run recorded."""
    provenance = read_provenance(out / unit.run)
    device = provenance.device.gpu or provenance.device.cpu
    return _with(
        fleet,
        unit.id,
        status="finished",
        exit_code=exit_code,
        error=None,
        host=provenance.hostname,
        device=device,
        device_uuid=provenance.device.uuid,
    )


def _abandoned(fleet: Fleet, out: Path, unit: Unit, why: str | None) -> Fleet:
    """List the partial run the unit's attempt (`unit` as recorded when it started) moved aside,
    if it did; `why` is None when its worker died before saying."""
    path = unit.set_aside(unit.attempts)
    if not (out / path).exists():
        return fleet
    reason = why or f"its worker died before reporting why; see {unit.log}"
    return _with(fleet, unit.id, abandoned=[*unit.abandoned, Abandoned(path=path, reason=reason)])


def _ended(fleet: Fleet, out: Path, unit: Unit, outcome: Outcome) -> Fleet:
    fleet = _abandoned(fleet, out, unit, outcome.abandoned)
    if outcome.refused is not None:
        return _with(fleet, unit.id, status="refused", error=outcome.refused, host=outcome.identity.host)
    if outcome.exit_code in (0, GATE_FAILED) and _finished(out / unit.run):
        return _finish(fleet, out, unit, outcome.exit_code)
    error = f"`kerneltrial run` exited {outcome.exit_code} on {outcome.identity.host}; see {unit.log}"
    return _with(fleet, unit.id, status="failed", exit_code=outcome.exit_code, error=error, host=outcome.identity.host)


def _faults() -> dict[str, int]:
    """The tests' fault hook (fleet/worker.py): {unit: rows} from FAULT_ENV ("UNIT:ROWS"), honoured
    only with TESTING_ENV=1; {} otherwise."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or os.environ.get(TESTING_ENV) != "1":
        return {}
    unit, _, rows = spec.partition(":")
    return {unit: int(rows)}


def _schedule(ray: ModuleType, resources: dict[str, float], out: Path, fleet: Fleet) -> Fleet:
    known = [u.device for u in fleet.units if u.status == "finished" and u.device]
    probe = ray.remote(max_retries=0, **resources)(identity)
    expected = None if fleet.mixed_devices else known[0] if known else ray.get(probe.remote()).device
    task = ray.remote(max_retries=0, **resources)(run_unit)
    faults = _faults()
    pending: dict[Any, Unit] = {}
    for unit in fleet.units:
        if unit.status == "finished":
            continue
        if _finished(out / unit.run):  # it ended after fleet.json last recorded it
            fleet = _finish(fleet, out, unit, None)
            continue
        aside = str(out / unit.set_aside(unit.attempts + 1))
        args = (str(out / unit.piece), str(out / unit.run), str(out / unit.log), expected, aside, faults.get(unit.id))
        pending[task.remote(*args)] = unit
        fleet = _with(fleet, unit.id, status="running", attempts=unit.attempts + 1, error=None)
    write_fleet(out, fleet)
    while pending:
        [ref], _ = ray.wait(list(pending), num_returns=1)
        started = pending.pop(ref)
        unit = next(u for u in fleet.units if u.id == started.id)  # as recorded when it started
        try:
            fleet = _ended(fleet, out, unit, ray.get(ref))
        except ray.exceptions.RayError as error:  # the task raised or its worker died
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            fleet = _abandoned(fleet, out, unit, None)
            fleet = _with(fleet, unit.id, status="failed", error=f"{type(error).__name__}: {first}")
        write_fleet(out, fleet)
    if fleet.complete:
        fleet = fleet.model_copy(update={"combined": combine(out, fleet), "finished_at": now()})
        write_fleet(out, fleet)
    return fleet


def run_fleet(protocol: Path, out: Path, *, address: str | None, mode: Mode, replicas: int, resume: bool) -> Fleet:
    """Run `protocol` over the Ray cluster at `address` (None: the local one, started if none
    runs) into `out`; see the module's text. Returns the fleet record as written."""
    ray = import_ray()
    check_arms(protocol, proto.load(protocol))  # a protocol that cannot run here is refused before any task
    if resume:
        fleet = _resumed(protocol, out, mode, replicas)
    elif out.exists() and any(out.iterdir()):
        hint = " (a fleet: continue it with --resume)" if (out / FLEET).is_file() else ""
        raise FleetError(f"{out} is not empty{hint}; a fleet starts in a new directory")
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, **({} if address else {"include_dashboard": False}))
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if mode == "replicas" and gpus and replicas > gpus:  # two replicas on one chip would count it twice
            raise FleetError(
                f"--replicas {replicas} needs {replicas} GPUs, one per replica; the cluster has {gpus}: "
                f"ask for at most {gpus} replicas or add GPUs to the cluster"
            )
        resources = {"num_gpus": 1} if gpus else {"num_cpus": 1}
        if not resume:
            workers = gpus or int(ray.cluster_resources().get("CPU", 1))
            fleet = _plan(protocol, out, mode, replicas, workers, address)
        return _schedule(ray, resources, out, fleet)
    finally:
        if started:
            ray.shutdown()
