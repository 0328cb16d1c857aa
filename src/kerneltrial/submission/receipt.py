"""The receipt `package` writes beside a submission archive: what is inside it (sha256 and size
of every file and of the archive), what it implements (the operator and its signature), which
kerneltrial checked it, where it was tested, and the interface check it passed.
`inspect --receipt` compares an archive with it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RECEIPT_SCHEMA = "kerneltrial.receipt/1"


class FileRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha256: str
    size: int

    @classmethod
    def of(cls, name: str, data: bytes) -> FileRecord:
        return cls(name=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


class RunRecord(BaseModel):
    """A run directory the module was tested in, and the module digest that run recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str  # relative to the receipt's folder
    module_sha256: str
    manifest_sha256: str | None  # the run's manifest.json (every file of the run), None if it has none


class InterfaceRecord(BaseModel):
    """The interface check the archive passed: imported in a fresh interpreter, gated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str | None
    device: str
    checks: int


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal["kerneltrial.receipt/1"] = Field(default=RECEIPT_SCHEMA, alias="schema")
    op: str
    signature: str
    module: str
    kerneltrial_version: str
    archive: FileRecord
    files: list[FileRecord]
    tested_in: list[RunRecord]
    interface_check: InterfaceRecord

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(by_alias=True, indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> Receipt:
        return cls.model_validate_json(path.read_text())


def receipt_path(archive: Path) -> Path:
    """`submission.zip` -> `submission.receipt.json`, beside it."""
    return archive.with_suffix(".receipt.json")
