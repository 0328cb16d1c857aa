"""docs/RUNDIR.md is generated from the layouts and the document models; every key has a description
and every file of a kernel run directory is listed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from kerneltrial.rundir.documents import Plan, Provenance
from kerneltrial.rundir.layout import ERRATA, REPORT, REPORT_FIGURES, RunDir
from kerneltrial.rundir.summary_doc import Summary
from kerneltrial.rundir_reference import KERNEL_FILES, keys, reference

REPO = Path(__file__).resolve().parents[1]


def test_committed_reference_is_generated():
    """Never edited by hand: `python -m kerneltrial.rundir_reference > docs/RUNDIR.md`."""
    assert (REPO / "docs" / "RUNDIR.md").read_text() == reference()


def test_every_file_of_a_kernel_run_directory_is_listed():
    run = RunDir(Path("run"))
    names = {getattr(run, p).name for p in dir(RunDir) if isinstance(getattr(RunDir, p), property)}
    names |= {REPORT, ERRATA, *REPORT_FIGURES}
    listed = {name for entry in KERNEL_FILES for name in entry.names}
    assert names - listed == set()


def test_the_typed_documents_are_rendered_with_every_nested_model():
    text = reference()
    for model in (Plan, Provenance, Summary):
        assert f"({model.__name__})" in text
    # dict[str, AACalibration | SlowCalibration]: both shapes of a calibration arm
    assert "`summary.json: calibration.arms` (AACalibration)" in text
    assert "`summary.json: calibration.arms` (SlowCalibration)" in text
    assert "| `schema` | string | required |" in text  # the alias, not the Python name


class _Inner(BaseModel):
    documented: int = Field(description="A documented key.")
    bare: str | None = None


class _Planted(BaseModel):
    ok: float = Field(default=0.5, description="Documented | with a pipe.")
    inner: dict[str, _Inner] = Field(description="Nested objects.")


def test_a_key_without_description_is_refused():
    with pytest.raises(ValueError, match=r"planted.json: keys without a description: inner\.bare; add Field"):
        keys(_Planted, "planted.json")


def test_keys_lists_type_default_and_nested_objects():
    class Inner(BaseModel):
        documented: int | None = Field(default=None, description="A documented key.")

    class Outer(BaseModel):
        ok: float = Field(default=0.5, description="Documented | with a pipe.")
        inner: dict[str, Inner] = Field(description="Nested objects.")

    text = keys(Outer, "x.json")
    assert "| `ok` | number | `0.5` | Documented \\| with a pipe. |" in text
    assert "| `inner` | object of object by name | required | Nested objects. |" in text
    assert "#### `x.json: inner` (Inner)" in text
    assert "| `documented` | integer or null | `null` | A documented key. |" in text


def test_rendering_needs_no_torch():
    code = (
        "import sys\n"
        "from kerneltrial.rundir_reference import reference\n"
        "reference()\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
