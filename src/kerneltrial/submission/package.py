"""`kerneltrial package`: a submission archive that is known to be what was tested and to load
the way the target loads it, with a receipt beside it.

In order, each step refusing the package with a one-line reason:
1. identity: each `confirmed` run directory must be a finished confirmation run (protocol
   phase "confirmation", with its links) that `verify` passes and whose gate passed the
   module's arm `user:<stem>`; the module's bytes must hash to the digest the run recorded
   for it in provenance.json `impl_modules` (the runner hashes every user module it loads),
   and a packed data file named as the run's confirmed rule must hash to the rule's digest
   the run links (provenance.json `confirmation.rule`): for a dispatcher the rule is the
   behaviour, so the archived code and rule are what that run confirmed;
2. layout: the archive (`archive.build`) must pass `archive.inspect_archive`, the same static
   check `kerneltrial inspect` runs;
3. interface: the archive unpacked and imported in a process where no kerneltrial module is
   importable, its outputs gated by this process (`isolated.interface_check`), with the
   target's launch limits when one is named.
Without a `confirmed` run it refuses (bad input) unless `unconfirmed` is set; the receipt then
says `"confirmation": "unconfirmed"`. Only then are the archive and its receipt written.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from kerneltrial import __version__
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.submission.archive import Rejected, build, inspect_archive
from kerneltrial.submission.receipt import FileRecord, InterfaceRecord, Receipt, RunRecord, receipt_path

# The interface check gates every case of the operator's panel twice; on a CPU (interpreter) the
# small panel takes well under a minute, so this bound only stops a module that hangs.
INTERFACE_TIMEOUT_S = 1800.0


class PackageError(Exception):
    """A package refused; the message is one line naming what failed and the fix."""


class BadInput(PackageError):
    """An argument that cannot be packaged at all (a missing file, an --out that is not a .zip,
    a path that is no run directory): bad input (exit 2), where a refusal exits 1."""


def _module_file(spec: str) -> str:
    """The file name of a module as the runner recorded it (a path, or a dotted module name)."""
    return Path(spec).name if spec.endswith(".py") else spec.rsplit(".", 1)[-1] + ".py"


def confirmed_run(run_dir: Path, module: Path, packed: Mapping[str, bytes], op: str, receipt_folder: Path) -> RunRecord:
    """The run's record of `module` and its rule as packed (`packed`: name -> bytes), refused
    unless the run is a finished, verified confirmation of these very bytes for `op` whose gate
    passed the module's arm (see the module docstring)."""
    from kerneltrial.kernel.links import Links
    from kerneltrial.kernel.verify import verify_run_dir
    from kerneltrial.rundir.errors import RunDirError

    if not (run_dir / "provenance.json").is_file() or not (run_dir / "protocol.toml").is_file():
        raise BadInput(
            f"{run_dir} is not a run directory (no provenance.json and protocol.toml); "
            f"pass the confirmation run that tested {module}"
        )
    provenance = json.loads((run_dir / "provenance.json").read_text())
    if not provenance.get("finished_at") or not (run_dir / "summary.json").is_file():
        raise PackageError(f"{run_dir} did not finish (no summary.json); package from a finished confirmation run")
    phase = tomllib.loads((run_dir / "protocol.toml").read_text()).get("phase", "exploratory")
    record = provenance.get("confirmation")
    if phase != "confirmation" or not isinstance(record, dict):
        raise PackageError(
            f"{run_dir} is an {phase} run without confirmation links; --confirmed takes a confirmation run "
            "(kerneltrial protocol confirm, then run it)"
        )
    ran = json.loads((run_dir / "plan.json").read_text()).get("op")
    if ran != op:
        raise PackageError(f"{run_dir} is a run of {ran}, not {op}")
    digest = sha256_bytes(packed[module.name])
    recorded: dict[str, str] = provenance.get("impl_modules") or {}
    mine = {spec: sha for spec, sha in recorded.items() if _module_file(spec) == module.name}
    if not mine:
        raise PackageError(
            f"{run_dir} ran no module named {module.name} (its user modules: {', '.join(recorded) or 'none'}); "
            "package the module that run tested"
        )
    if digest not in mine.values():
        spec, sha = next(iter(mine.items()))
        raise PackageError(
            f"{module} has sha256 {digest}, but {run_dir} tested {spec} with sha256 {sha}: "
            "the archived code is not the code that run confirmed"
        )
    rule = Links.from_record(record).rule
    name = PurePosixPath(rule.path).name
    if name not in packed:
        raise PackageError(
            f"{run_dir} confirmed {module.name} loading the rule {name} (sha256 {rule.sha256}); pack it: --data {name}"
        )
    if sha256_bytes(packed[name]) != rule.sha256:
        raise PackageError(
            f"the packed {name} has sha256 {sha256_bytes(packed[name])}, but {run_dir} confirmed the rule with "
            f"sha256 {rule.sha256}: the archived rule is not the rule that run confirmed"
        )
    arm = f"user:{module.stem}"
    gate = json.loads((run_dir / "summary.json").read_text())["gate"]
    if arm not in gate.get("passed_arms", []):
        raise PackageError(
            f"{arm} did not pass the gate ({gate.get('rule')}) in {run_dir}; only a confirmed dispatcher is packaged"
        )
    try:
        failures = verify_run_dir(run_dir).failures
    except RunDirError as exc:
        raise PackageError(f"{run_dir} does not verify: {exc}") from None
    if failures:
        raise PackageError(
            f"{run_dir} does not verify ({failures[0].name}: {failures[0].detail}); see kerneltrial verify {run_dir}"
        )
    manifest = run_dir / "manifest.json"
    return RunRecord(
        run_dir=Path(os.path.relpath(run_dir.resolve(), receipt_folder.resolve())).as_posix(),
        module_sha256=digest,
        manifest_sha256=sha256_file(manifest) if manifest.is_file() else None,
        phase="confirmation",
        arm=arm,
        gate=gate.get("rule"),
        gate_passed=True,
        rule=FileRecord.of(name, packed[name]),
    )


def package(
    op: str,
    module: Path,
    out: Path,
    data: Sequence[Path] = (),
    confirmed: Sequence[Path] = (),
    target: str | None = None,
    timeout: float = INTERFACE_TIMEOUT_S,
    unconfirmed: bool = False,
) -> Receipt:
    """Check, then write `out` and its receipt; return the receipt (see the module's docstring)."""
    from kerneltrial.ops.registry import all_ops, get_op
    from kerneltrial.submission.isolated import WorkerEnded, interface_check
    from kerneltrial.trial.targets import get_target

    operator = get_op(op)
    if target is not None:
        get_target(target)
    if out.suffix != ".zip":
        raise BadInput(f"--out {out} must end in .zip")
    if bool(confirmed) == unconfirmed:
        raise BadInput(
            "--unconfirmed with --confirmed: a package is either confirmed or not; drop one"
            if unconfirmed
            else f"no --confirmed run: pass the confirmation run that tested {module} (--confirmed RUN_DIR), "
            "or --unconfirmed to package code no confirmation run tested (the receipt then says so)"
        )
    for path in (out, receipt_path(out)):
        if path.exists():
            raise BadInput(f"{path} exists; a package is never overwritten: choose another --out")
    files: dict[str, bytes] = {}
    for path in (module, *data):
        if not path.is_file():
            raise BadInput(f"{path} is not a file")
        if path.name in files:
            raise BadInput(f"two files named {path.name}: every file sits at the top level of the archive")
        files[path.name] = path.read_bytes()
    if module.suffix != ".py":
        raise BadInput(f"{module} is not a Python module (.py)")
    tested = [confirmed_run(run, module, files, op, out.parent) for run in confirmed]
    archive = build(files)
    try:
        inspection = inspect_archive(archive, out.name, {o.name: o.signature for o in all_ops()}, op=op)
    except Rejected as exc:
        raise PackageError(f"the archive would be rejected: {exc}") from None
    try:
        result = interface_check(archive, op, target, timeout)
    except WorkerEnded as exc:
        raise PackageError(f"interface check {exc}") from None
    if not result.passed:
        raise PackageError(f"interface check failed: {result.reason}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(archive)
    receipt = Receipt(
        op=op,
        signature=operator.signature,
        module=inspection.module,
        kerneltrial_version=__version__,
        archive=inspection.archive,
        files=list(inspection.files),
        tested_in=tested,
        confirmation="confirmed" if tested else "unconfirmed",
        interface_check=InterfaceRecord(target=target, device=result.device, checks=result.checks, process="isolated"),
    )
    receipt.write(receipt_path(out))
    return receipt
