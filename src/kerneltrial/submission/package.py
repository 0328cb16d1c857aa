"""`kerneltrial package`: a submission archive that is known to be what was tested and to load
the way the target loads it, with a receipt beside it.

In order, each step refusing the package with a one-line reason:
1. identity: with `confirmed` run directories, the module's bytes must hash to the digest each
   run recorded for it in provenance.json `impl_modules` (the runner hashes every user module
   it loads), so the archived code is the code those runs tested;
2. layout: the archive (`archive.build`) must pass `archive.inspect_archive`, the same static
   check `kerneltrial inspect` runs;
3. interface: in a fresh interpreter, the archive unpacked, imported and gated (`probe`), with
   the target's launch limits when one is named.
Only then are the archive and its receipt (`receipt.Receipt`) written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kerneltrial import __version__
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.submission.archive import Rejected, build, inspect_archive
from kerneltrial.submission.probe import ProbeResult
from kerneltrial.submission.receipt import InterfaceRecord, Receipt, RunRecord, receipt_path

# The interface check gates every case of the operator's panel twice; on a CPU (interpreter) the
# small panel takes well under a minute, so this bound only stops a module that hangs.
PROBE_TIMEOUT_S = 1800.0


class PackageError(Exception):
    """A package refused; the message is one line naming what failed and the fix."""


def _module_file(spec: str) -> str:
    """The file name of a module as the runner recorded it (a path, or a dotted module name)."""
    return Path(spec).name if spec.endswith(".py") else spec.rsplit(".", 1)[-1] + ".py"


def confirmed_run(run_dir: Path, module: Path, digest: str, op: str, receipt_folder: Path) -> RunRecord:
    """The run's record of `module`, refused unless the run tested these very bytes for `op`."""
    provenance = run_dir / "provenance.json"
    if not provenance.is_file():
        raise PackageError(f"{run_dir} is not a run directory (no provenance.json); pass the run that tested {module}")
    plan = run_dir / "plan.json"
    ran = json.loads(plan.read_text()).get("op") if plan.is_file() else None
    if ran not in (None, op):
        raise PackageError(f"{run_dir} is a run of {ran}, not {op}")
    recorded: dict[str, str] = json.loads(provenance.read_text()).get("impl_modules") or {}
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
    manifest = run_dir / "manifest.json"
    return RunRecord(
        run_dir=Path(os.path.relpath(run_dir.resolve(), receipt_folder.resolve())).as_posix(),
        module_sha256=digest,
        manifest_sha256=sha256_file(manifest) if manifest.is_file() else None,
    )


def _child_env() -> dict[str, str]:
    """This process's environment, with this kerneltrial first on the path: the check runs the
    code that is packaging, not another installed copy."""
    import kerneltrial

    root = str(Path(kerneltrial.__file__).resolve().parents[1])
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def interface_check(archive: bytes, op: str, target: str | None, timeout: float) -> ProbeResult:
    """`probe` in a fresh interpreter, started in an empty folder (so nothing beside the caller's
    working directory can stand in for a file the archive lacks)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "submission.zip"
        path.write_bytes(archive)
        command = [sys.executable, "-m", "kerneltrial.submission.probe", str(path), op, *([target] if target else [])]
        try:
            done = subprocess.run(
                command, cwd=folder, env=_child_env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise PackageError(
                f"interface check did not finish within {timeout:g} s (a kernel that never returns?)"
            ) from None
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise PackageError(f"interface check crashed (exit {done.returncode}): {last}")
        return ProbeResult.parse(lines[-1])


def package(
    op: str,
    module: Path,
    out: Path,
    data: Sequence[Path] = (),
    confirmed: Sequence[Path] = (),
    target: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> Receipt:
    """Check, then write `out` and its receipt; return the receipt (see the module's docstring)."""
    from kerneltrial.ops.registry import all_ops, get_op
    from kerneltrial.trial.targets import get_target

    operator = get_op(op)
    if target is not None:
        get_target(target)
    if out.suffix != ".zip":
        raise PackageError(f"--out {out} must end in .zip")
    for path in (out, receipt_path(out)):
        if path.exists():
            raise PackageError(f"{path} exists; a package is never overwritten: choose another --out")
    files: dict[str, bytes] = {}
    for path in (module, *data):
        if not path.is_file():
            raise PackageError(f"{path} is not a file")
        if path.name in files:
            raise PackageError(f"two files named {path.name}: every file sits at the top level of the archive")
        files[path.name] = path.read_bytes()
    if module.suffix != ".py":
        raise PackageError(f"{module} is not a Python module (.py)")
    digest = sha256_bytes(files[module.name])
    tested = [confirmed_run(run, module, digest, op, out.parent) for run in confirmed]
    archive = build(files)
    try:
        inspection = inspect_archive(archive, out.name, {o.name: o.signature for o in all_ops()}, op=op)
    except Rejected as exc:
        raise PackageError(f"the archive would be rejected: {exc}") from None
    result = interface_check(archive, op, target, timeout)
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
        interface_check=InterfaceRecord(target=target, device=result.device, checks=result.checks),
    )
    receipt.write(receipt_path(out))
    return receipt
