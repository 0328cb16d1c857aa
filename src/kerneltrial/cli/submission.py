"""Submission commands: `package` (build and check a submission archive) and `inspect`
(re-check one without importing it). Heavy imports happen inside the commands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kerneltrial.cli.support import CliError, ExitCode
from kerneltrial.cli.trial import TARGET_OPTION

if TYPE_CHECKING:
    from kerneltrial.submission.receipt import Receipt


def package(
    op: Annotated[str, typer.Argument(help="Operator the module implements (see `kerneltrial ops`).")],
    module: Annotated[Path, typer.Argument(help="The module (.py) whose top-level function OP is the entry point.")],
    out: Annotated[Path, typer.Option(help="The archive to write (.zip); its receipt goes beside it.")],
    data: Annotated[list[Path] | None, typer.Option(help="A data file the module reads, packed beside it.")] = None,
    confirmed: Annotated[
        list[Path] | None,
        typer.Option(
            help="A finished confirmation run that passed MODULE's arm and verifies; its recorded module "
            "and rule sha256 must match the packed bytes."
        ),
    ] = None,
    unconfirmed: Annotated[
        bool,
        typer.Option(
            "--unconfirmed",
            help='Package without a --confirmed run; the receipt then says "confirmation": "unconfirmed".',
        ),
    ] = False,
    target: Annotated[str | None, TARGET_OPTION] = None,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds the interface check may take.")] = 1800.0,
) -> None:
    """Build a submission archive (MODULE at the top level, data files beside it, deterministic
    bytes) and its receipt, after checking that MODULE is the confirmed code (--confirmed; or
    --unconfirmed, said in the receipt), that the archive passes `inspect`, and that, unpacked
    and run where no kerneltrial module is importable (as the target runs it), it has exactly one
    entry point OP of the operator's signature whose outputs pass the correctness gate (with the
    launch limits of --target), imported as a target imports it (python with site, nothing of
    kerneltrial in its environment or parent) under two environments that must agree, each worker
    in the trial's sandbox (another uid, its own PID namespace and cgroup, no-new-privs, seccomp;
    a piece the host lacks is said and recorded); with --confirmed, the archived module is first
    re-executed on the CPU on a sample of each run's checked calls and must pass the gate's
    comparison on each. Exit 1 when refused, naming why; 2 on bad input (a missing file, an --out
    that is not a .zip, a --confirmed path that is no run directory, neither or both of
    --confirmed and --unconfirmed)."""
    from kerneltrial.submission.confined import record_note
    from kerneltrial.submission.package import BadInput, PackageError
    from kerneltrial.submission.package import package as build_package
    from kerneltrial.submission.receipt import receipt_path
    from kerneltrial.submission.target_env import ENVIRONMENTS, roomy_allocator

    roomy_allocator()
    try:
        receipt = build_package(op, module, out, data or [], confirmed or [], target, timeout, unconfirmed)
    except BadInput as exc:
        raise CliError(str(exc), ExitCode.BAD_INPUT) from None
    except PackageError as exc:
        raise CliError(f"refused: {exc}", ExitCode.FAILED) from None
    check = receipt.interface_check
    typer.echo(
        f"packaged {out} (sha256 {receipt.archive.sha256}, {len(receipt.files)} file(s)); receipt {receipt_path(out)}\n"
        f"interface check passed on {check.device} (isolated: no kerneltrial importable; imported as the target "
        f"imports it, under {ENVIRONMENTS} environments): {check.checks} gate checks"
        + (f", every launch within the {check.target} limits" if check.target else "")
        + (
            f"; tested in {', '.join(r.run_dir for r in receipt.tested_in)}, "
            f"{sum(r.replayed or 0 for r in receipt.tested_in)} of their checked calls re-executed from the archive "
            "on the CPU, each within the gate's tolerance"
            if receipt.tested_in
            else "; UNCONFIRMED: no confirmation run tested this code (the receipt says so)"
        )
    )
    note = record_note(check.sandbox) if check.sandbox else ""
    typer.echo(
        f"warning: {note} (the interface check's workers; the receipt records it)"
        if note
        else "sandbox: every piece (uid, pidns, cgroup, no_new_privs, seccomp)"
    )


def inspect(
    archive: Annotated[Path, typer.Argument(help="A submission archive (.zip).")],
    op: Annotated[str | None, typer.Option(help="The operator it must implement (default: the receipt's).")] = None,
    receipt: Annotated[Path | None, typer.Option(help="A receipt the archive must match.")] = None,
    timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds the re-execution on the receipt's runs may take.")
    ] = 600.0,
) -> None:
    """Re-check a submission archive without importing it: no path traversal, absolute path,
    link, duplicate or oversized entry; one module with a top-level function named after the
    operator, of its signature, and no other entry point; ASCII names; no code loaded from a
    data entry or a string (exec, eval, compile, importlib, runpy, pickle, ...); the receipt, if
    given, matches, and its confirmation and interface check are shown. A receipt's runs must
    be present, verify, have passed the module's arm and have been made from the archived module
    (provenance impl_modules, and the run's source archive where it holds the module), and the
    archived module, re-executed (sandboxed, on the CPU) on a sample of their checked calls, must
    pass the gate's comparison on each. Exit 0 when accepted, 1 when rejected (one line says
    why), 2 on bad input."""
    from pydantic import ValidationError

    from kerneltrial.ops.registry import all_ops
    from kerneltrial.submission.archive import Rejected, inspect_archive
    from kerneltrial.submission.receipt import Receipt

    if not archive.is_file():
        raise CliError(f"{archive} is not a file")
    signatures = {o.name: o.signature for o in all_ops()}
    if op is not None and op not in signatures:  # bad input (exit 2), not a rejected archive
        raise CliError(f"unknown operator {op!r}; known: {', '.join(signatures)}")
    try:
        recorded = Receipt.read(receipt) if receipt else None
    except (OSError, ValidationError) as exc:
        raise CliError(f"{receipt} is not a kerneltrial receipt: {str(exc).splitlines()[0]}") from None
    try:
        found = inspect_archive(archive.read_bytes(), archive.name, signatures, op, recorded)
    except Rejected as exc:
        raise CliError(f"rejected {archive}: {exc}", ExitCode.FAILED) from None
    rechecked = _recheck_runs(archive, recorded, receipt.parent, timeout) if recorded and receipt else ""
    typer.echo(
        f"accepted {archive}: entry point {found.op} in {found.module}, {len(found.files)} file(s), "
        f"sha256 {found.archive.sha256}"
        + (f", matches its receipt ({_receipt_line(recorded)})" if recorded else "")
        + rechecked
    )


def _recheck_runs(archive: Path, receipt: Receipt, folder: Path, timeout: float) -> str:
    """Re-verify the runs `receipt` names and re-execute the archive on their checked calls (exit
    1 naming what fails); what was done, for inspect's line ('' for an unconfirmed receipt)."""
    from kerneltrial.submission.archive import read_entries
    from kerneltrial.submission.evidence import PackageError, receipt_runs
    from kerneltrial.submission.isolated import WorkerEnded
    from kerneltrial.submission.replay import replay

    if not receipt.tested_in:
        return ""
    data = archive.read_bytes()
    try:
        runs = receipt_runs(receipt, folder, read_entries(data))
        result = replay(data, receipt.op, runs, timeout)
    except PackageError as exc:
        raise CliError(f"rejected {archive}: {exc}", ExitCode.FAILED) from None
    except WorkerEnded as exc:
        raise CliError(f"rejected {archive}: the re-execution on the receipt's runs {exc}", ExitCode.FAILED) from None
    if not result.passed:
        raise CliError(f"rejected {archive}: replay: {result.reason}", ExitCode.FAILED)
    return (
        f"; its {len(runs)} run(s) verify and were made from this module, and {sum(result.calls.values())} of "
        "their checked calls, re-executed from the archive on the CPU, are within the gate's tolerance"
    )


def _receipt_line(receipt: Receipt) -> str:
    """What a receipt says about the code's confirmation and its interface check."""
    check = receipt.interface_check
    confirmation = (
        f"confirmation: confirmed in {len(receipt.tested_in)} run(s)"
        if receipt.confirmation == "confirmed"
        else "confirmation: UNCONFIRMED, packaged with --unconfirmed: no confirmation run tested this code"
    )
    process = (
        "isolated, no kerneltrial importable"
        if check.process == "isolated"
        else "in-harness, imported where kerneltrial was (receipt before receipt/3)"
    )
    if check.sandbox is not None:
        missing = ", ".join(check.sandbox.missing)
        process += f", in a sandbox without {missing}" if missing else ", in the whole sandbox"
    elif check.process == "isolated":
        process += ", unconfined (receipt before receipt/4)"
    return f"{confirmation}; interface check {process}, on {check.device}, {check.checks} gate checks"


def mount(app: typer.Typer) -> None:
    app.command("package")(package)
    app.command("inspect")(inspect)
