"""The kernel verifier's entry points and the order of its checks; each check family is its own module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kerneltrial.kernel import derived, provenance_checks, schema_requirements
from kerneltrial.kernel.verify.arithmetic import median_of
from kerneltrial.kernel.verify.contract import HOST_FAMILY, ISOLATION_FAMILY, TIMED_FAMILY, contract_of, not_checked
from kerneltrial.kernel.verify.figures import check_figures
from kerneltrial.kernel.verify.host import check_host
from kerneltrial.kernel.verify.isolation import isolation_problems, under_claim_reasons
from kerneltrial.kernel.verify.plan import check_confirmation, check_document_schemas, check_protocol
from kerneltrial.kernel.verify.rows import read_csv_rows, read_document, read_samples
from kerneltrial.kernel.verify.timed import check_integrity, check_timed_checks
from kerneltrial.kernel.verify.timings import check_order, check_rows, correctness_outcome
from kerneltrial.rundir.checks import Check, VerifyResult
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_jsonl
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import (
    ADDED_FIGURES,
    ERRATA,
    INPUT_FILES,
    REPORT,
    kind_of,
)


def verify_run_dir(run_dir: Path) -> VerifyResult:
    """Recompute every figure of a kernel run directory and compare; see VerifyResult.checks.
    Any other directory is its own package's (replicates/, suite/, fleet/, serving/, model/; the CLI
    picks by `rundir.layout.kind_of`)."""
    run_dir = Path(run_dir)
    kind = kind_of(run_dir)
    if kind != "kernel":
        raise RunDirError(f"{run_dir}: a {kind} run directory, not a kernel one; check it with `kerneltrial verify`")
    return _verify_kernel(run_dir, read_document(run_dir, "provenance.json"))


def member_checks(name: str, run_dir: Path) -> list[Check]:
    """The kernel checks of one run of a replicate, suite or fleet directory, each prefixed with
    `name`; an unreadable run is one failed check (it does not stop the other runs' checks)."""
    try:
        checks = verify_run_dir(run_dir).checks
    except RunDirError as error:
        checks = [Check("run directory", False, str(error), problems=(str(error),))]
    return [c.renamed(f"{name}: {c.name}") for c in checks]


def kernel_page(run_dir: Path) -> derived.Render:
    """report.md of a kernel run as a function of `unverified` (kernel/report.py)."""

    def render(unverified: bool) -> str:
        from kerneltrial.kernel.report import report_text  # only where a report.md exists

        return report_text(run_dir, unverified)

    return render


def check_written_after(result: VerifyResult, run_dir: Path, page: Path, render: derived.Render) -> None:
    """The files written after the run (kernel/derived.py): `page` (report.md or replicates.md) is
    what its renderer gives, and ERRATA.md's machine-read lines are well formed; each not
    applicable where the directory has none."""
    checks = (
        (page.name, derived.derived_problems(page, render), "what `kerneltrial report` renders from this directory"),
        (ERRATA, derived.errata_problems(run_dir), "its `Superseded by:` and `Reason:` lines are well formed"),
    )
    for name, problems, detail in checks:
        result.record(
            name, problems, detail if problems is not None else f"not applicable: no {name} in this directory"
        )


def kernel_figures(run_dir: Path) -> derived.FigureRender:
    """Each figure of a kernel run as `kerneltrial report` or `plot` draws it (kernel/plots.py), as PNG bytes."""

    def render(name: str, unverified: bool) -> bytes:
        from kerneltrial.kernel.plots import figure_png  # matplotlib: only where a figure is compared

        return figure_png(run_dir, name, unverified)

    return render


def check_added_figures(result: VerifyResult, run_dir: Path, render: derived.FigureRender) -> None:
    """Each figure a command added to the run directory is the one `render` draws (kernel/derived.py:
    a difference fails where this matplotlib drew it, and is a not-applicable warning where another
    did); one line when there is none."""
    present = [name for name in ADDED_FIGURES if (run_dir / name).is_file()]
    if not present:
        result.not_applicable("figures added", f"not applicable: no {', '.join(ADDED_FIGURES)} in this directory")
    installed = derived.installed_matplotlib()
    for name in present:
        result.record(name, *derived.figure_problems(run_dir / name, render, installed))


def _verify_kernel(run_dir: Path, provenance: dict[str, Any]) -> VerifyResult:
    """Every check of a kernel run, in the order `kerneltrial verify` lists them."""
    missing = [name for name in ("protocol.toml", "summary.json", *INPUT_FILES) if not (run_dir / name).is_file()]
    if missing:
        raise RunDirError(f"{run_dir}: missing {', '.join(missing)}; not a complete kernel run directory")
    result = VerifyResult(run_dir)
    plan = read_document(run_dir, "plan.json")
    summary = read_document(run_dir, "summary.json")
    digest = sha256_file(run_dir / "protocol.toml")
    for name, document in (("provenance.json", provenance), ("plan.json", plan), ("summary.json", summary)):
        recorded = document.get("protocol_sha256")
        result.add(
            f"protocol hash in {name}",
            [] if recorded == digest else [f"{name} says {recorded}, protocol.toml hashes to {digest}"],
            f"sha256 {digest[:12]}... matches protocol.toml",
        )

    samples = read_samples(run_dir)
    correctness = read_jsonl(run_dir / "correctness.jsonl")
    ceiling_rows = read_csv_rows(run_dir, "ceilings.csv", ["kind", "sample", "bytes", "ns"])
    contract = contract_of(plan, summary, samples, result)
    result.add(
        "raw files unchanged since summary",
        _changed_inputs(run_dir, summary.get("inputs_sha256", {}), contract.inputs),
        f"{', '.join(contract.inputs)} hash as recorded in summary.json",
    )
    check_protocol(run_dir, plan, result)
    check_document_schemas(plan, provenance, result)
    check_confirmation(run_dir, provenance, plan, result)
    floor = check_writer_contract(run_dir, plan, provenance, correctness, ceiling_rows, result)
    result.record("source commit", *provenance_checks.commit_problems(provenance))
    result.record("throttle re-takes", *provenance_checks.retake_problems(provenance, plan))
    clock_readings = [s.sm_mhz for s in samples if s.sm_mhz is not None]
    result.add("device", *provenance_checks.device_problems(provenance, plan, ceiling_rows, clock_readings))
    outcome = correctness_outcome(plan, correctness, result)
    timed = None
    if contract.has(TIMED_FAMILY):
        timed = check_timed_checks(run_dir, plan, summary, samples, outcome, result)
        check_integrity(run_dir, plan, provenance, digest, correctness, result)
    else:
        not_checked(TIMED_FAMILY, floor, result)
    check_rows(plan, samples, outcome, result, timed)
    check_order(plan, samples, outcome, result, timed)
    under = under_claim_reasons(run_dir, plan, median_of) if contract.has(ISOLATION_FAMILY) else {}
    check_figures(plan, summary, samples, outcome, ceiling_rows, correctness, result, contract, timed, under)
    if contract.has(HOST_FAMILY):
        check_host(run_dir, plan, summary, outcome, timed, result)
    else:
        not_checked(HOST_FAMILY, floor, result)
    if contract.has(ISOLATION_FAMILY):
        result.add("isolation bounds", *isolation_problems(run_dir, plan, summary, median_of))
    else:
        not_checked(ISOLATION_FAMILY, floor, result)
    check_written_after(result, run_dir, run_dir / REPORT, kernel_page(run_dir))
    check_added_figures(result, run_dir, kernel_figures(run_dir))
    return result


def check_writer_contract(
    run_dir: Path,
    plan: dict[str, Any],
    provenance: dict[str, Any],
    correctness: list[dict[str, Any]],
    ceiling_rows: list[dict[str, str]],
    result: VerifyResult,
) -> schema_requirements.WriterContract:
    """`required files` (what the declared contract makes a run hold) and `no downgrade` (the
    declaration is not below what the code and rows show; kernel/schema_requirements.py).
    Returns the least contract the witnesses show."""
    declared = schema_requirements.declared(plan)
    result.add(
        "required files",
        schema_requirements.required_problems(run_dir, plan, provenance, declared),
        f"every file and key a run of {declared} writes is present",
    )
    floor, witnesses = schema_requirements.writer_floor(
        run_dir, plan, provenance, correctness, {row["kind"] for row in ceiling_rows}
    )
    result.add(
        "no downgrade",
        schema_requirements.downgrade_problems(declared, witnesses),
        f"plan.json declares {declared}; "
        + (
            f"no later contract shown by {', '.join(w.what for w in witnesses)}"
            if witnesses
            else "no witness of a later one"
        ),
    )
    return floor


def _changed_inputs(run_dir: Path, recorded: dict[str, str], names: tuple[str, ...]) -> list[str]:
    problems = []
    for name in names:
        if not (run_dir / name).is_file():
            problems.append(f"{name} is missing")
            continue
        digest = sha256_file(run_dir / name)
        if digest != recorded.get(name):
            problems.append(f"{name} hashes to {digest[:12]}..., summary.json recorded {recorded.get(name)}")
    return problems
