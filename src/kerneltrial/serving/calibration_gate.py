"""A trial that requires a passed calibration (`[acceptance] calibration = DIR`) refuses, before its
first launch, a calibration that does not match it or is not evidence (issue 36 item 4).

`require_calibration` reads DIR/calibration.json and refuses (CalibrationError, one line, exit 2)
unless it calibrated the trial's own binding (serving/calibration.py `Binding`: model, tokenizer,
baseline argv and environment apart from operator selection, cases, repeats, client, prompt
seeds, pins, acceptance rule, rounds; compared by hash, the first differing value named), it was
measured on this host (calibration.json `host` against this host's fingerprint by the identity rule,
serving/calibration_host.py `compare_hosts`: CPU model and count, memory, GPUs and driver,
CUDA_VISIBLE_DEVICES, the weights' digest, every differing field named; GPUs read on one side only
refused as unknown, not as another host; a new hostname alone printed as a warning; a calibration
from before the host was recorded is refused too), its run directory verifies (serving/verify.py,
with calibration.json recomputed from the run: serving/calibration_evidence.py) and it passed; the
trial's provenance.json then records it (`calibration`: its directory as the protocol names it and
as a path relative to the trial's run directory, its binding hash, calibration.json's sha256, this
host's fingerprint `host` and the rule's `host_warnings`), and verify opens that directory again,
verifies it (calibration.json recomputed from its runs), checks that hash and the binding against
the trial's own protocol, and applies the same rule to the two hosts (serving/calibration_evidence.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving.calibration import (
    CALIBRATION,
    HOSTLESS_LACKS,
    CalibrationError,
    CalibrationRecord,
    binding,
    read_calibration,
)
from kerneltrial.serving.calibration_host import HostFingerprint, HostMatch, compare_hosts, this_host
from kerneltrial.serving.protocol import Arm, Protocol, non_operator_difference
from kerneltrial.serving.verify import verify_serving_run
from kerneltrial.serving.verify_plan import first_difference, short


def require_calibration(proto: Protocol, base_dir: Path, run_dir: Path) -> dict[str, Any] | None:
    """Refuse (CalibrationError, one line) unless the protocol's calibration (`proto` with the command
    line's --model and --client applied) matches this trial, verifies and passed; return what the
    trial's provenance.json (in `run_dir`) records of it (`calibration`). Nothing to check without
    `calibration`."""
    name = proto.acceptance.calibration
    if name is None:
        return None
    where = f"acceptance.calibration {name!r}"
    record = read_calibration(base_dir / name)
    _require_same_trial(proto, record, where)
    _require_binding(proto, record, where)
    here, match = _require_host(proto, record, where)
    result = verify_serving_run(base_dir / name)
    if result.problems:
        raise CalibrationError(
            f"{where} does not verify ({len(result.problems)} problem(s); first: {result.problems[0]}); "
            f"`kerneltrial verify {base_dir / name}` lists them; calibrate again"
        )
    if not record.passed:
        raise CalibrationError(f"{where} did not pass: {'; '.join(record.reasons)}")
    for warning in match.warnings:
        print(f"warning: {where}: {warning} (recorded in provenance.json calibration.host_warnings)", file=sys.stderr)
    return {
        "dir": name,
        "path": Path(os.path.relpath((base_dir / name).resolve(), run_dir.resolve())).as_posix(),
        "binding_sha256": record.binding_sha256,
        "sha256": sha256_file(base_dir / name / CALIBRATION),
        "passed": record.passed,
        "host": here.model_dump(mode="json"),
        "host_warnings": match.warnings,
    }


def _require_same_trial(proto: Protocol, record: CalibrationRecord, where: str) -> None:
    """The model, the server, the cases, the rule and the rounds, each refused with its own message."""
    base = proto.arm("baseline") or proto.arms[0]
    if (record.model, record.model_id) != (proto.server.model, proto.server.model_id):
        raise CalibrationError(
            f"{where} calibrated model {record.model!r} ({record.model_id}), this trial serves "
            f"{proto.server.model!r} ({proto.server.model_id}); calibrate this model first"
        )
    diff = non_operator_difference(Arm(name="calibration", argv=record.argv, env=record.env), base)
    if diff is not None:
        raise CalibrationError(f"{where} used another server: {diff}; calibrate with this protocol")
    cases = [c.id for c in proto.bench.cases]
    if record.cases != cases:
        raise CalibrationError(f"{where} calibrated cases {record.cases}, this trial runs {cases}; calibrate them")
    a = proto.acceptance
    mine = (a.noise_band, a.ttft_ratio_max, a.confidence, proto.rounds)
    theirs = (record.noise_band, record.ttft_ratio_max, record.confidence, record.trial_rounds)
    if mine != theirs:
        raise CalibrationError(
            f"{where} calibrated (noise_band, ttft_ratio_max, confidence, rounds) = {theirs}, this trial has {mine}; "
            "calibrate this protocol"
        )


def _require_binding(proto: Protocol, record: CalibrationRecord, where: str) -> None:
    """The calibration's binding hash is this trial's (repeats, client, pins, seeds, tokenizer ... : the
    first differing value named)."""
    want = binding(proto, proto.rounds)
    if record.binding_sha256 == want.sha256():
        return
    got, need = record.binding.model_dump(), want.model_dump()
    if got == need:
        raise CalibrationError(
            f"{where}: calibration.json binding_sha256 is not the hash of its binding (edited); calibrate again"
        )
    key, theirs, mine = first_difference(got, need, "binding")
    raise CalibrationError(
        f"{where} calibrated {key.removeprefix('binding.')} {short(theirs)}, this trial has {short(mine)} "
        f"(binding sha256 {record.binding_sha256[:12]}..., this trial's {want.sha256()[:12]}...); "
        "calibrate this protocol"
    )


RECALIBRATE = (
    "calibrate again on this host (`kerneltrial serve calibrate PROTOCOL --out DIR`, then name DIR in "
    "[acceptance] calibration)"
)


def _require_host(proto: Protocol, record: CalibrationRecord, where: str) -> tuple[HostFingerprint, HostMatch]:
    """The calibration was measured on this host, with these weights: a noise band is its host's. Returns
    this host's fingerprint (for provenance.json) and the rule's verdict, whose warnings are printed once
    the calibration has qualified."""
    if record.host is None:
        raise CalibrationError(
            f"{where} is a {record.schema_} calibration, {HOSTLESS_LACKS}: it records no host, so its noise "
            f"band may be another machine's; {RECALIBRATE}"
        )
    here = this_host(proto.server.model)
    match = compare_hosts(record.host, here)
    if match.differ:
        raise CalibrationError(
            f"{where} was measured on another host ({'; '.join(match.differ + match.unknown + match.warnings)}): "
            f"its noise band is not this host's; {RECALIBRATE}"
        )
    if match.unknown:
        raise CalibrationError(
            f"{where} cannot be matched to this host: {'; '.join(match.unknown + match.warnings)} (else {RECALIBRATE})"
        )
    return here, match
