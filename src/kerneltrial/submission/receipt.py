"""The receipt `package` writes beside a submission archive: what is inside it (sha256 and size
of every file and of the archive), what it implements (the operator and its signature), which
kerneltrial checked it, where it was tested (or that it was not: `confirmation`; and, for each
run, how many of its checked calls `package` re-executed from the archive: `replayed`), and the
interface check it passed (how: `interface_check.process`; in which sandbox: `.sandbox`).
`inspect --receipt` compares an archive with it, re-verifies the runs it names and re-executes
the archive on their checked inputs (submission/evidence.py, submission/replay.py), and shows
both."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kerneltrial.rundir.hashing import sha256_bytes

RECEIPT_SCHEMA = "kerneltrial.receipt/4"
# receipt/4 adds `replayed` to each run and `sandbox` to the interface check; receipt/3 (before
# the replay and the sandbox) reads them as None.
# Older receipts are still read. receipt/1 (before package checked the run's phase, gate, verify
# and rule): its run records lack the fields below marked "receipt/2". receipt/1 and /2 (before
# the isolated interface check and --unconfirmed) lack `confirmation` and
# `interface_check.process`: read as confirmed when they name a run (package had no other way
# then), else unconfirmed, and as checked in-harness.
RECEIPT_SCHEMA_2 = "kerneltrial.receipt/2"
RECEIPT_SCHEMA_1 = "kerneltrial.receipt/1"
Confirmation = Literal["confirmed", "unconfirmed"]


class FileRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha256: str
    size: int

    @classmethod
    def of(cls, name: str, data: bytes) -> FileRecord:
        return cls(name=name, sha256=sha256_bytes(data), size=len(data))


class RunRecord(BaseModel):
    """A confirmation run the module was tested in: the module digest that run recorded, the
    run's phase and gate outcome for the module's arm, and the packed rule file it confirmed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str  # relative to the receipt's folder
    module_sha256: str
    manifest_sha256: str | None  # the run's manifest.json (every file of the run), None if it has none
    # receipt/2 (None only in receipt/1 receipts)
    phase: Literal["confirmation"] | None = None
    arm: str | None = None  # the module's arm, user:<stem>
    gate: str | None = None  # the run's preregistered gate rule
    gate_passed: bool | None = None  # the arm among the run's summary.json gate passed_arms
    rule: FileRecord | None = None  # the packed rule file, as the run's confirmation links it
    # receipt/4 (None before): checked calls of this run `package` re-executed from the archive
    # on the CPU, every one within the gate's tolerance (submission/replay.py)
    replayed: int | None = None


class SandboxRecord(BaseModel):
    """The sandbox the interface check's workers ran in (trial/confine.py): the pieces the host
    gave, and each piece it refused with the reason its probe gave."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed: list[str]
    missing: dict[str, str]


class InterfaceRecord(BaseModel):
    """The interface check the archive passed: unpacked, imported and gated on the panel."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str | None
    device: str
    checks: int
    # "isolated" (receipt/3): run where no kerneltrial module was importable, outputs judged by
    # the harness (submission/isolated.py); "in-harness" (receipt/1, /2): imported into a
    # process that had imported kerneltrial first
    process: Literal["isolated", "in-harness"]
    # receipt/4 (None before: the worker ran unconfined, as the harness's user)
    sandbox: SandboxRecord | None = None


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal[
        "kerneltrial.receipt/4", "kerneltrial.receipt/3", "kerneltrial.receipt/2", "kerneltrial.receipt/1"
    ] = Field(default=RECEIPT_SCHEMA, alias="schema")
    op: str
    signature: str
    module: str
    kerneltrial_version: str
    archive: FileRecord
    files: list[FileRecord]
    tested_in: list[RunRecord]
    # "unconfirmed": packaged with --unconfirmed, no confirmation run tested these bytes
    confirmation: Confirmation
    interface_check: InterfaceRecord

    @model_validator(mode="before")
    @classmethod
    def _adapt_older(cls, data: Any) -> Any:
        """receipt/1 and /2 as receipt/3 reads them (see RECEIPT_SCHEMA_2)."""
        if not isinstance(data, dict) or data.get("schema") not in (RECEIPT_SCHEMA_1, RECEIPT_SCHEMA_2):
            return data
        check = data.get("interface_check")
        return data | {
            "confirmation": "confirmed" if data.get("tested_in") else "unconfirmed",
            "interface_check": check | {"process": "in-harness"} if isinstance(check, dict) else check,
        }

    @model_validator(mode="after")
    def _complete_run_records(self) -> Receipt:
        if self.schema_id == RECEIPT_SCHEMA_1:
            return self
        for run in self.tested_in:
            if None in (run.phase, run.arm, run.gate, run.gate_passed, run.rule):
                raise ValueError(f"{self.schema_id}: tested_in {run.run_dir} lacks phase, arm, gate or rule")
            if self.schema_id == RECEIPT_SCHEMA and run.replayed is None:
                raise ValueError(f"{self.schema_id}: tested_in {run.run_dir} lacks replayed (the calls re-executed)")
        if self.schema_id == RECEIPT_SCHEMA and self.interface_check.sandbox is None:
            raise ValueError(f"{self.schema_id}: interface_check lacks sandbox (the pieces its workers ran in)")
        if (self.confirmation == "confirmed") != bool(self.tested_in):
            raise ValueError(
                f"confirmation {self.confirmation!r} with {len(self.tested_in)} tested_in run(s): "
                "a receipt is confirmed exactly when it names the runs that tested it"
            )
        return self

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(by_alias=True, indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> Receipt:
        return cls.model_validate_json(path.read_text())


def receipt_path(archive: Path) -> Path:
    """`submission.zip` -> `submission.receipt.json`, beside it."""
    return archive.with_suffix(".receipt.json")
