"""What a package's confirmation rests on, checked from the run directories (issue 35, item 7):
the runs `package --confirmed` takes, and the runs a receipt names when `inspect --receipt`
re-checks it.

A confirmation run stands for the archived code when (`confirmed_run`): it is a finished
confirmation run (protocol phase "confirmation", provenance `confirmation` links) of the operator
that `verify` passes and whose gate passed the module's arm `user:<stem>`; the module's bytes hash
to the digest the run recorded for it (provenance.json `impl_modules`); where the run's source
archive holds that module (a module of kerneltrial's package, e.g. ops/zimage_qk_rmsnorm.py), its
bytes there are the archived module's too (`source_problem`: source.tar.gz is the one record of
the run that verify ties to this checkout's git history, so a digest edited in provenance.json
and a rehashed manifest do not get past it); and a packed data file named as the run's
confirmed rule hashes to the rule's digest the run links.

A receipt's runs (`receipt_runs`) must be present where the receipt says (relative to its folder),
stand for the archived code as above, and be the runs that were packaged: every field the receipt
records of a run (its manifest's sha256 included) as the run gives it now. The re-execution of the
archived module on the runs' checked inputs is submission/replay.py's.

What remains: a module outside kerneltrial's package is in no source archive, so for it the
digest in provenance.json is the run's word, checked by the re-execution only as far as a wrong
module fails it; a run marked dirty (`git.dirty` true) has its source archive compared with no
commit.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.submission.receipt import FileRecord, Receipt, RunRecord

PACKAGE = "kerneltrial"


class PackageError(Exception):
    """A package refused; the message is one line naming what failed and the fix."""


class BadInput(PackageError):
    """An argument that cannot be packaged at all (a missing file, an --out that is not a .zip,
    a path that is no run directory): bad input (exit 2), where a refusal exits 1."""


def module_file(spec: str) -> str:
    """The file name of a module as the runner recorded it (a path, or a dotted module name)."""
    return Path(spec).name if spec.endswith(".py") else spec.rsplit(".", 1)[-1] + ".py"


def package_path(spec: str) -> str | None:
    """Where a recorded module lies in kerneltrial's package (source.tar.gz's member name without
    "kerneltrial/"), or None for a module outside it: `../src/kerneltrial/ops/x.py` and
    `kerneltrial.ops.x` are `ops/x.py`."""
    parts = PurePosixPath(spec).parts if spec.endswith(".py") else tuple(spec.split("."))
    if PACKAGE not in parts[:-1]:
        return None
    inside = parts[len(parts) - parts[::-1].index(PACKAGE) :]
    return "/".join(inside) if spec.endswith(".py") else "/".join(inside) + ".py"


def source_problem(run_dir: Path, provenance: dict[str, Any], spec: str, digest: str) -> str:
    """'' unless the run's source.tar.gz holds the module recorded as `spec` with other bytes
    than those of sha256 `digest` (the archived module's, which the run's `impl_modules` records)."""
    from kerneltrial.kernel.integrity import ArchiveError, archive_members
    from kerneltrial.rundir.layout import SOURCE_ARCHIVE

    inside = package_path(spec)
    archive = run_dir / SOURCE_ARCHIVE
    if inside is None or not archive.is_file():
        return ""
    try:
        members = archive_members(archive)
    except ArchiveError as exc:
        return f"{run_dir}/{SOURCE_ARCHIVE} cannot be read ({exc}); the archived module cannot be compared with it"
    if inside not in members:
        return ""
    held = sha256_bytes(members[inside])
    if held == digest:
        return ""
    commit = (provenance.get("git") or {}).get("commit")
    return (
        f"{run_dir}'s provenance.json records sha256 {digest} for {spec}, but its {SOURCE_ARCHIVE} (which verify "
        f"ties to commit {commit}) holds kerneltrial/{inside} with sha256 {held}: provenance.json was edited, and "
        "the run was not made from the archived module; package the module that run tested"
    )


def _confirmation_record(run_dir: Path, module: Path, op: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(provenance.json, its `confirmation` links) of a finished confirmation run of `op`."""
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
    return provenance, record


def _module_problem(run_dir: Path, provenance: dict[str, Any], module: Path, digest: str) -> str:
    """'' when the run recorded `module` with sha256 `digest`, and its source archive agrees."""
    recorded: dict[str, str] = provenance.get("impl_modules") or {}
    mine = {spec: sha for spec, sha in recorded.items() if module_file(spec) == module.name}
    if not mine:
        return (
            f"{run_dir} ran no module named {module.name} (its user modules: {', '.join(recorded) or 'none'}); "
            "package the module that run tested"
        )
    if digest not in mine.values():
        spec, sha = next(iter(mine.items()))
        return (
            f"{module} has sha256 {digest}, but {run_dir} tested {spec} with sha256 {sha}: "
            "the archived code is not the code that run confirmed"
        )
    spec = next(s for s, sha in mine.items() if sha == digest)
    return source_problem(run_dir, provenance, spec, digest)


def _rule_file(run_dir: Path, record: dict[str, Any], module: Path, packed: Mapping[str, bytes]) -> FileRecord:
    """The packed rule file the run's confirmation links, refused unless packed with its bytes."""
    from kerneltrial.kernel.links import Links

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
    return FileRecord.of(name, packed[name])


def confirmed_run(run_dir: Path, module: Path, packed: Mapping[str, bytes], op: str, receipt_folder: Path) -> RunRecord:
    """The run's record of `module` and its rule as packed (`packed`: name -> bytes), refused
    unless the run stands for these very bytes for `op` (see the module docstring)."""
    from kerneltrial.kernel.verify import verify_run_dir
    from kerneltrial.rundir.errors import RunDirError

    provenance, record = _confirmation_record(run_dir, module, op)
    digest = sha256_bytes(packed[module.name])
    problem = _module_problem(run_dir, provenance, module, digest)
    if problem:
        raise PackageError(problem)
    rule = _rule_file(run_dir, record, module, packed)
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
        rule=rule,
    )


# the fields a receipt records of a run that the run itself gives again (`replayed` is inspect's to redo)
COMPARED = ("module_sha256", "manifest_sha256", "phase", "arm", "gate", "gate_passed", "rule")


def receipt_runs(receipt: Receipt, receipt_folder: Path, files: Mapping[str, bytes]) -> list[Path]:
    """The run directories `receipt` names, after checking each (see the module docstring) against
    the archive's `files` (name -> bytes); PackageError naming the run and what is wrong."""
    runs = []
    for recorded in receipt.tested_in:
        run_dir = receipt_folder / recorded.run_dir
        if not (run_dir / "provenance.json").is_file():
            raise PackageError(
                f"the receipt says the module was tested in {recorded.run_dir}, but {run_dir} holds no run: a "
                "receipt's runs must lie where it says (beside the archive as packaged); without them it confirms nothing"
            )
        try:
            found = confirmed_run(run_dir, Path(receipt.module), files, receipt.op, receipt_folder)
        except PackageError as exc:
            raise PackageError(f"the receipt's run {recorded.run_dir} does not confirm the archive: {exc}") from None
        for name in COMPARED:
            want, have = getattr(recorded, name), getattr(found, name)
            if want is not None and want != have:
                raise PackageError(
                    f"the receipt records {name} {want!r} for {recorded.run_dir}, but the run gives {have!r}: the run "
                    "is not the one packaged (changed since, or the receipt was written by hand)"
                )
        runs.append(run_dir)
    return runs
