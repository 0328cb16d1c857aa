"""calibration.json as evidence (issue 36 item 4): `verify` recomputes a calibration run's record
from the run itself, as it recomputes a trial's verdict.

A calibration run directory is an ordinary serving run (its figures are recomputed from the raw
files by serving/verify.py) plus calibration.json. `calibration_problems` derives the record again
with serving/calibration.py from the run's protocol.toml (with plan.json `effective`, itself
derived from the provenance argv: serving/verify_plan.py) and its summary.json, and names every
field that calibration.json states otherwise (the pilot's decision too, recomputed from runs.jsonl:
serving/pilot.py): a `passed` flipped to true, reasons deleted, noise
or comparisons edited, a binding rewritten to fit another trial (other repeats, another client)
or a binding_sha256 that is not its binding's hash. Its `host` (serving/calibration_host.py) cannot be
derived from the run: it is checked against the hostname, GPUs and CUDA_VISIBLE_DEVICES the run's
provenance.json records (one process wrote both). A trial is checked against the host of the
calibration it rested on by the gate's own identity rule (`compare_hosts`): the host the trial
recorded (provenance.json calibration.host, itself checked against the trial's provenance.json, and
the rule's warnings against calibration.host_warnings), or, for a trial from before it recorded its
host, what its provenance.json records (hostname, GPUs without UUIDs, CUDA_VISIBLE_DEVICES; CPU,
memory and weights then not compared) (review A5). A calibration.json of schema /3 (from before the
host was recorded) still verifies as the record of its run; a trial refuses it
(serving/calibration_gate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.serving_summary_doc import ServingSummary
from kerneltrial.serving.calibration import (
    CALIBRATION,
    CalibrationError,
    CalibrationRecord,
    binding,
    calibration_record,
    read_calibration,
)
from kerneltrial.serving.calibration_host import (
    HostFingerprint,
    Sides,
    compare_hosts,
    describe_host,
    provenance_differences,
    provenance_host,
)
from kerneltrial.serving.effective import with_effective
from kerneltrial.serving.pilot import pilot_reason
from kerneltrial.serving.protocol import ProtocolError
from kerneltrial.serving.verify_plan import RunProtocol, first_difference, read_run_protocol, short

SHOWN = 5  # fields named before "and N more"
Verifier = Callable[[Path], list[str]]  # a run directory's problems (serving/verify.py, which calls these checks)


def calibration_problems(
    path: Path,
    prov: dict[str, Any],
    plan: dict[str, Any],
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    rp: RunProtocol,
) -> list[str] | None:
    """Each field of calibration.json unlike the record its run gives, a binding_sha256 that is not
    its binding's hash, and a host unlike the one provenance.json `prov` names; None when the run has
    no calibration.json (a trial, not a calibration)."""
    if not (path / CALIBRATION).is_file():
        return None
    try:
        record = read_calibration(path)
    except (CalibrationError, RunDirError) as error:
        return [str(error)]
    if rp.proto is None:
        return [f"protocol.toml does not parse, so {CALIBRATION} cannot be recomputed: {rp.error}"]
    recorded = plan.get("effective")
    try:
        proto = with_effective(rp.proto, recorded if isinstance(recorded, dict) else {})
        stopped = pilot_reason(proto, rows, record.trial_rounds)  # runs.jsonl, whose figures verify recomputes
        summarised = ServingSummary.model_validate(summary)  # a ValueError when it is not a summary
        again = calibration_record(proto, summarised, record.trial_rounds, stopped, host=record.host)
    except (ProtocolError, KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        return [f"{CALIBRATION} cannot be recomputed from its run ({type(error).__name__}: {error}): not an A/A run"]
    again = again.model_copy(update={"schema_": record.schema_})  # read_calibration admits it (/3: no host)
    problems = _host_problems(record, prov)
    if record.binding.sha256() != record.binding_sha256:
        problems.append(
            f"{CALIBRATION} binding_sha256 is {record.binding_sha256[:12]}..., its binding hashes to "
            f"{record.binding.sha256()[:12]}...: the binding or its hash was edited"
        )
    stored, derived = record.model_dump(by_alias=True), again.model_dump(by_alias=True)
    for key, want in derived.items():
        if stored.get(key) != want:
            where, got, then = first_difference(stored.get(key), want, key)
            problems.append(
                f"{CALIBRATION} {where} is {short(got)}, its run (protocol.toml, summary.json) gives {short(then)}"
            )
    if len(problems) > SHOWN:
        problems = [*problems[:SHOWN], f"... and {len(problems) - SHOWN} more fields of {CALIBRATION}"]
    return problems


def _host_problems(record: CalibrationRecord, prov: dict[str, Any]) -> list[str]:
    """The calibration's host is the one its own run's provenance.json names (hostname, GPUs, CUDA_VISIBLE_DEVICES)."""
    if record.host is None:
        return []  # a /3 record names none (a trial refuses it)
    return [
        f"{CALIBRATION} host differs from its run's provenance.json: {d}: the host was edited"
        for d in provenance_differences(record.host, prov)
    ]


def trial_calibration_problems(
    path: Path, prov: dict[str, Any], plan: dict[str, Any], rp: RunProtocol, verify_run: Verifier
) -> list[str] | None:
    """A trial whose protocol requires a calibration records the one it rested on (provenance.json
    `calibration`), passed and bound to this trial's own binding (its protocol.toml with plan.json
    `effective`), and that calibration is opened again where the trial recorded it (relative to the
    run directory `path`): the same calibration.json, a calibration that verifies (its record
    recomputed from its runs) and passed. None when the protocol requires none."""
    if rp.proto is None:
        return None  # 'plan derived' names it
    recorded = plan.get("effective")
    try:
        proto = with_effective(rp.proto, recorded if isinstance(recorded, dict) else {})
    except ProtocolError:
        return None  # likewise
    name = proto.acceptance.calibration
    if name is None:
        return None
    used = prov.get("calibration")
    if not isinstance(used, dict):
        return [
            f"provenance.json records no calibration, though protocol.toml requires acceptance.calibration {name!r}: "
            "the trial cannot show it rested on a passed calibration of itself"
        ]
    want = binding(proto, proto.rounds).sha256()
    problems = []
    if used.get("dir") != name:
        problems.append(f"provenance.json calibration dir is {used.get('dir')!r}, protocol.toml names {name!r}")
    if used.get("binding_sha256") != want:
        problems.append(
            f"provenance.json calibration binding_sha256 is {str(used.get('binding_sha256'))[:12]}..., this trial's "
            f"binding (protocol.toml with plan.json effective) hashes to {want[:12]}...: it rested on a calibration "
            "of another trial"
        )
    if used.get("passed") is not True:
        problems.append(f"provenance.json calibration passed is {used.get('passed')!r}: a trial rests on a passed one")
    return problems + _calibration_opened(path, prov, used, want, verify_run)


def _calibration_opened(
    path: Path, prov: dict[str, Any], used: dict[str, Any], want: str, verify_run: Verifier
) -> list[str]:
    """The calibration directory the trial recorded, opened again: its calibration.json is the one
    the trial hashed, it is an A/A calibration (its protocol requires no calibration itself), it
    verifies, it passed, its binding is this trial's and it was measured on the host the trial's
    provenance.json `prov` names (a /3 calibration names no host: the trial's gate refused it from
    schema /4 on, and a trial before that rested on it unbound)."""
    rel = used.get("path")
    if not isinstance(rel, str) or not rel:
        return ["provenance.json calibration has no path: the calibration the trial rested on cannot be opened again"]
    where = path / rel
    if not (where / CALIBRATION).is_file():
        return [
            f"the calibration the trial rested on is not at {rel} (relative to the run directory): keep the trial "
            "and its calibration directory side by side as they were when the trial ran, and verify again"
        ]
    problems, digest = [], sha256_file(where / CALIBRATION)
    if digest != used.get("sha256"):
        problems.append(
            f"{rel}/{CALIBRATION} has sha256 {digest[:12]}..., the trial recorded "
            f"{str(used.get('sha256'))[:12]}...: the calibration was replaced or edited after the trial"
        )
    own = read_run_protocol(where)
    if own.proto is None or own.proto.acceptance.calibration is not None:
        return [*problems, f"{rel} is not an A/A calibration run (its protocol.toml requires a calibration itself)"]
    failed = verify_run(where)
    if failed:
        problems.append(f"{rel} does not verify ({len(failed)} problem(s); first: {failed[0]})")
    try:
        record = read_calibration(where)
    except (CalibrationError, RunDirError) as error:
        return [*problems, str(error)]
    if not record.passed:
        problems.append(f"{rel}/{CALIBRATION} did not pass: {'; '.join(record.reasons)}")
    if record.binding_sha256 != want:
        problems.append(
            f"{rel}/{CALIBRATION} binding_sha256 is {record.binding_sha256[:12]}..., this trial's is {want[:12]}..."
        )
    if record.host is None:  # a /3 record: no trial refuses less since the host binding (calibration_gate.py)
        problems.append(
            f"{rel}/{CALIBRATION} records no host (schema /3): a trial refuses such a calibration, so this one "
            "cannot have rested on it; calibrate again on the trial's host and run the trial again"
        )
    else:
        problems += trial_host_problems(rel, record.host, prov, used)
    return problems


TRIAL_SIDES = Sides(there="in calibration.json", here="in the trial's record")


def trial_host_problems(
    rel: str, calibration: HostFingerprint, prov: dict[str, Any], used: dict[str, Any]
) -> list[str]:
    """The gate's identity rule applied again to the calibration's host and the trial's: the fingerprint the
    trial recorded (provenance.json calibration.host; its hostname, GPUs and CUDA_VISIBLE_DEVICES must be
    what the same provenance.json records, its warnings calibration.host_warnings), else (a trial from
    before that) the hostname, GPUs and CUDA_VISIBLE_DEVICES its provenance.json records."""
    recorded = used.get("host")
    problems: list[str] = []
    if recorded is None:
        trial, unrecorded = provenance_host(prov)
    else:
        try:
            trial, unrecorded = HostFingerprint.model_validate(recorded), frozenset[str]()
        except ValidationError as error:
            return [
                f"provenance.json calibration.host is not a host fingerprint ({' '.join(str(error).split())}): edited"
            ]
        problems += [
            f"provenance.json calibration.host differs from the trial's provenance.json: {d}: the host was edited"
            for d in provenance_differences(trial, prov, "calibration.host")
        ]
        warnings = compare_hosts(calibration, trial).warnings  # as the gate worded them
        if used.get("host_warnings") != warnings:
            problems.append(
                f"provenance.json calibration.host_warnings is {short(used.get('host_warnings'))}, the identity rule "
                f"gives {short(warnings)}: the record was edited"
            )
    match = compare_hosts(calibration, trial, unrecorded, TRIAL_SIDES)
    problems += [
        f"{rel}/{CALIBRATION} was measured on another host than the trial ran on: {d}; calibrate on the trial's host"
        for d in match.differ
    ]
    problems += [f"{rel}/{CALIBRATION} cannot be matched to the trial's host: {d}" for d in match.unknown]
    return problems


@dataclass(frozen=True)
class Check:
    """One of verify's calibration checks: its problems (None: not applicable, and why)."""

    name: str
    problems: list[str] | None
    detail: str
    not_applicable: str


def calibration_checks(
    path: Path,
    prov: dict[str, Any],
    plan: dict[str, Any],
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    rp: RunProtocol,
    verify_run: Verifier,
) -> list[Check]:
    """verify's calibration checks: a calibration run's record (its host printed), and a trial's calibration."""
    return [
        Check(
            "calibration",
            calibration_problems(path, prov, plan, summary, rows, rp),
            "calibration.json recomputed from its run, bound by hash" + _measured_on(path),
            "not applicable: no calibration.json (a trial, not a calibration)",
        ),
        Check(
            "calibration used",
            trial_calibration_problems(path, prov, plan, rp, verify_run),
            "the trial rested on a passed calibration bound to its own protocol, opened again and verified",
            "not applicable: the protocol requires no calibration",
        ),
    ]


def _measured_on(path: Path) -> str:
    """ "; measured on HOST" (serving/calibration_host.py `describe_host`), where calibration.json reads and names one."""
    try:
        host = read_calibration(path).host if (path / CALIBRATION).is_file() else None
    except (CalibrationError, RunDirError):
        return ""
    return f"; measured on {describe_host(host)}" if host is not None else ""
