"""`kerneltrial package`: a submission archive that is known to be what was tested and to load
the way the target loads it, with a receipt beside it.

In order, each step refusing the package with a one-line reason:
1. identity: each `confirmed` run directory must be a finished confirmation run (protocol
   phase "confirmation", with its links) that `verify` passes and whose gate passed the
   module's arm `user:<stem>`; the module's bytes must hash to the digest the run recorded
   for it in provenance.json `impl_modules` (the runner hashes every user module it loads),
   and a packed data file named as the run's confirmed rule must hash to the rule's digest
   the run links (provenance.json `confirmation.rule`): for a dispatcher the rule is the
   behaviour, so the archived code and rule are what that run confirmed; where the run's
   source archive holds the module, its bytes there too (submission/evidence.py);
2. layout: the archive (`archive.build`) must pass `archive.inspect_archive`, the same static
   check `kerneltrial inspect` runs;
3. replay: the archived module, re-executed on the CPU on a sample of each run's checked calls
   (their inputs drawn again from the recorded seeds), passes the gate's comparison on every one
   (submission/replay.py), so a module swapped under a rehashed manifest is refused;
4. interface: the archive unpacked and imported in a process where no kerneltrial module is
   importable, in the trial's sandbox (submission/confined.py), its outputs gated by this
   process (`isolated.interface_check`), with the target's launch limits when one is named.
Without a `confirmed` run it refuses (bad input) unless `unconfirmed` is set; the receipt then
says `"confirmation": "unconfirmed"`. Only then are the archive and its receipt written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kerneltrial import __version__
from kerneltrial.submission.archive import Rejected, build, inspect_archive
from kerneltrial.submission.evidence import BadInput, PackageError, confirmed_run
from kerneltrial.submission.receipt import InterfaceRecord, Receipt, RunRecord, receipt_path

__all__ = ["BadInput", "PackageError", "confirmed_run", "package"]

# The interface check gates every case of the operator's panel twice; on a CPU (interpreter) the
# small panel takes well under a minute, so this bound only stops a module that hangs.
INTERFACE_TIMEOUT_S = 1800.0


def _files(module: Path, data: Sequence[Path]) -> dict[str, bytes]:
    """The files to pack, by name (BadInput for a missing one, two of a name, a module that is no .py)."""
    files: dict[str, bytes] = {}
    for path in (module, *data):
        if not path.is_file():
            raise BadInput(f"{path} is not a file")
        if path.name in files:
            raise BadInput(f"two files named {path.name}: every file sits at the top level of the archive")
        files[path.name] = path.read_bytes()
    if module.suffix != ".py":
        raise BadInput(f"{module} is not a Python module (.py)")
    return files


def _replayed(
    archive: bytes, op: str, runs: Sequence[Path], tested: list[RunRecord], timeout: float
) -> list[RunRecord]:
    """`tested` with the number of each run's checked calls re-executed, after `replay` passed."""
    from kerneltrial.submission.isolated import WorkerEnded
    from kerneltrial.submission.replay import replay

    if not runs:
        return tested
    try:
        result = replay(archive, op, runs, timeout)
    except WorkerEnded as exc:
        raise PackageError(f"the re-execution on the confirmation runs' checked calls {exc}") from None
    if not result.passed:
        raise PackageError(f"replay: {result.reason}")
    return [record.model_copy(update={"replayed": result.calls[run]}) for run, record in zip(runs, tested, strict=True)]


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
    files = _files(module, data)
    tested = [confirmed_run(run, module, files, op, out.parent) for run in confirmed]
    archive = build(files)
    try:
        inspection = inspect_archive(archive, out.name, {o.name: o.signature for o in all_ops()}, op=op)
    except Rejected as exc:
        raise PackageError(f"the archive would be rejected: {exc}") from None
    tested = _replayed(archive, op, confirmed, tested, timeout)
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
        interface_check=InterfaceRecord(
            target=target, device=result.device, checks=result.checks, process="isolated", sandbox=result.sandbox
        ),
    )
    receipt.write(receipt_path(out))
    return receipt
