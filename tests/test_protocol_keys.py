"""docs/PROTOCOL_KEYS.md is generated from the protocol models, and every key has a description."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from kerneltrial.model.spec import Protocol as ModelProtocol
from kerneltrial.model_fields import undocumented
from kerneltrial.protocol_keys import reference, render
from kerneltrial.serving.protocol import Protocol as ServingProtocol
from kerneltrial.trial.protocol import Protocol as KernelProtocol

REPO = Path(__file__).resolve().parents[1]


def test_committed_reference_is_generated():
    """Never edited by hand: `python -m kerneltrial.protocol_keys > docs/PROTOCOL_KEYS.md`."""
    assert (REPO / "docs" / "PROTOCOL_KEYS.md").read_text() == reference()


def test_every_protocol_key_has_a_description():
    assert undocumented(KernelProtocol) == []
    assert undocumented(ServingProtocol) == []
    assert undocumented(ModelProtocol) == []


class _Inner(BaseModel):
    documented: int = Field(default=1, ge=1, description="A documented key.")
    bare: str = "x"


class _Planted(BaseModel):
    ok: float = Field(default=0.5, gt=0, lt=1, description="Documented.")
    missing: int = 0
    blank: int = Field(default=0, description="  ")
    inner: list[_Inner] = Field(default=[], description="Nested tables.")


def test_planted_undocumented_fields_are_caught():
    assert undocumented(_Planted) == ["missing", "blank", "inner.bare"]


def test_render_lists_type_bounds_default_and_nested_tables():
    text = render(_Planted, "Planted", "intro")
    assert "| `ok` | float, > 0, < 1 | `0.5` | Documented. |" in text
    assert "| `inner` | array of tables | `[]` | Nested tables. |" in text
    assert "### `[[inner]]`" in text and "| `documented` | int, >= 1 | `1` | A documented key. |" in text


def test_rendering_the_serving_keys_needs_no_torch():
    code = (
        "import sys\n"
        "from kerneltrial.protocol_keys import render\n"
        "from kerneltrial.serving.protocol import Protocol\n"
        "render(Protocol, 't', 'i')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
