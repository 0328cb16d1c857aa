"""The vllm-plugin-FL snapshot (../shared/vendor/vllm-plugin-FL, Apache-2.0) for the plugin tests.

Its dispatch layer (vllm_fl/dispatch) is pure Python over torch and pyyaml, but the package
`vllm_fl/__init__.py` and `vllm_fl/utils.py` import vLLM and FlagGems. The fixture makes
`vllm_fl` a bare package over the snapshot folder (its __init__ is not run) and stands in
for `vllm_fl.utils` with the two functions dispatch imports from it, with their values when
VLLM_FL_OP_CONFIG is unset and FlagGems is absent. Everything else is the snapshot's code.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneltrial.plugins import ops as kt_ops
from kerneltrial.plugins import records as rec_mod
from tests.conftest import REPO

SNAPSHOT = REPO.parent / "shared" / "vendor" / "vllm-plugin-FL"


def snapshot_dir() -> Path:
    if not (SNAPSHOT / "vllm_fl" / "dispatch" / "manager.py").is_file():
        pytest.skip(f"vllm-plugin-FL snapshot not found at {SNAPSHOT} (see ../shared/vendor/README.md)")
    return SNAPSHOT


@pytest.fixture
def fl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[types.ModuleType]:
    """`vllm_fl.dispatch` from the snapshot, fresh per test, with records going to tmp_path/log."""
    root = snapshot_dir()
    pytest.importorskip("yaml", reason="the snapshot's dispatch policy imports yaml (pip install pyyaml)")
    for name in [m for m in sys.modules if m == "vllm_fl" or m.startswith("vllm_fl.")]:
        monkeypatch.delitem(sys.modules, name)
    pkg = types.ModuleType("vllm_fl")
    pkg.__path__ = [str(root / "vllm_fl")]
    utils = types.ModuleType("vllm_fl.utils")
    utils.get_op_config = lambda: None  # VLLM_FL_OP_CONFIG unset
    utils.use_flaggems_op = lambda op_name, default=True: False  # no FlagGems here
    monkeypatch.setitem(sys.modules, "vllm_fl", pkg)
    monkeypatch.setitem(sys.modules, "vllm_fl.utils", utils)
    for var in ("VLLM_FL_PER_OP", "VLLM_FL_PREFER", "VLLM_FL_ALLOW_VENDORS", "VLLM_FL_DENY_VENDORS", "VLLM_FL_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("KERNELTRIAL_KERNELS", raising=False)
    monkeypatch.setenv("VLLM_FL_PLUGIN_MODULES", "kerneltrial.plugins.vllm_fl")
    monkeypatch.setenv("KERNELTRIAL_DISPATCH_LOG", str(tmp_path / "log"))
    monkeypatch.setattr(rec_mod, "_recorder", None)
    monkeypatch.setattr(kt_ops, "_active", None)
    import vllm_fl.dispatch as dispatch

    yield dispatch
    for name in [m for m in sys.modules if m == "vllm_fl" or m.startswith("vllm_fl.")]:
        sys.modules.pop(name, None)
