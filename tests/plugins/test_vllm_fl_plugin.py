"""kerneltrial's vllm-plugin-FL dispatch plugin against the snapshot's real registry and policy."""

from __future__ import annotations

import inspect
import re
import tomllib
import types
from pathlib import Path

import pytest
import torch

from kerneltrial.plugins import FL_IMPL_ID, OURS
from kerneltrial.plugins import vllm_fl as plugin
from kerneltrial.serving.dispatch_proof import check_launch
from tests.conftest import REPO
from tests.plugins.conftest import snapshot_dir

BOTH = "rms_norm=vendor:kerneltrial;silu_and_mul=vendor:kerneltrial"


def layer(hidden: int, dtype: torch.dtype) -> types.SimpleNamespace:
    """What vllm_fl passes as `obj`: the RMSNorm layer (weight, variance_epsilon)."""
    g = torch.Generator().manual_seed(1)
    return types.SimpleNamespace(weight=torch.randn(hidden, generator=g).to(dtype), variance_epsilon=1e-5)


def inputs(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * width)
    return torch.randn(rows, width, generator=g).to(dtype)


def flush() -> None:
    from kerneltrial.plugins import records

    records.recorder().flush()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_op_selects_kerneltrial_and_matches_reference(fl, monkeypatch, tmp_path, dtype):
    monkeypatch.setenv("VLLM_FL_PER_OP", BOTH)
    mgr = fl.OpManager()
    mgr.ensure_initialized()
    assert ("kerneltrial.plugins.vllm_fl", "env_module", True) in fl.get_discovered_plugins()
    ours = mgr.registry.get_implementation("rms_norm", FL_IMPL_ID)
    assert ours.kind == fl.BackendImplKind.VENDOR and ours.vendor == "kerneltrial" and ours.is_available()
    assert mgr.resolve("rms_norm") is plugin.rms_norm and mgr.resolve("silu_and_mul") is plugin.silu_and_mul
    ref_norm = mgr.registry.get_implementation("rms_norm", "reference.torch").fn
    ref_silu = mgr.registry.get_implementation("silu_and_mul", "reference.torch").fn
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    for rows, width in ((1, 64), (5, 200), (33, 1536)):
        lay, x, r = layer(width, dtype), inputs(rows, width, dtype), inputs(rows, width, dtype) / 2
        torch.testing.assert_close(mgr.call("rms_norm", lay, x), ref_norm(lay, x), **tol)
        out, res = mgr.call("rms_norm", lay, x.clone(), r.clone())
        ref_out, ref_res = ref_norm(lay, x.clone(), r.clone())
        torch.testing.assert_close(res, ref_res, **tol)
        torch.testing.assert_close(out, ref_out, **tol)
        g = inputs(rows, 2 * width, dtype)
        torch.testing.assert_close(mgr.call("silu_and_mul", None, g), ref_silu(None, g), **tol)
    flush()
    v = check_launch(tmp_path / "log", {"VLLM_FL_PER_OP": BOTH})
    assert v.valid, v.reason
    assert {(s.op, s.impl, s.calls) for s in v.served} == {
        ("rms_norm", OURS, 3),
        ("fused_add_rms_norm", OURS, 3),
        ("silu_and_mul", OURS, 3),
    }


def test_policy_chooses_ours_only_where_named(fl, monkeypatch):
    other = fl.OpImpl("rms_norm", "vendor.other", fl.BackendImplKind.VENDOR, lambda *a: "other", "other", 100)
    mgr = fl.OpManager()
    mgr.ensure_initialized()
    mgr.registry.register_impl(other)
    monkeypatch.setenv("VLLM_FL_PER_OP", "rms_norm=vendor")  # any vendor: the built-in priority wins
    fl.reset_global_policy()
    assert mgr.resolve("rms_norm") is other.fn
    monkeypatch.setenv("VLLM_FL_PER_OP", "rms_norm=vendor:kerneltrial")
    fl.reset_global_policy()
    assert mgr.resolve("rms_norm") is plugin.rms_norm
    monkeypatch.setenv("VLLM_FL_PER_OP", f"rms_norm=impl:{FL_IMPL_ID}")
    fl.reset_global_policy()
    assert mgr.resolve("rms_norm") is plugin.rms_norm
    monkeypatch.setenv("VLLM_FL_DENY_VENDORS", "kerneltrial")  # the deny list removes ours
    fl.reset_global_policy()
    with pytest.raises(RuntimeError, match="No implementation selected"):
        mgr.resolve("rms_norm")
    monkeypatch.delenv("VLLM_FL_DENY_VENDORS")
    monkeypatch.setenv("VLLM_FL_ALLOW_VENDORS", "other")  # so does an allow list without it
    fl.reset_global_policy()
    with pytest.raises(RuntimeError, match="No implementation selected"):
        mgr.resolve("rms_norm")


def test_registration_is_idempotent(fl):
    reg = fl.OpRegistry()
    plugin.register(reg)
    plugin.register(reg)  # entry point and VLLM_FL_PLUGIN_MODULES both naming us
    assert [i.impl_id for i in reg.get_implementations("rms_norm")] == [FL_IMPL_ID]


def test_plugin_that_fails_to_load_makes_the_arm_invalid(fl, monkeypatch, tmp_path):
    """FL's discovery swallows a plugin's error and serves the next token: the records say so."""
    monkeypatch.setenv("KERNELTRIAL_KERNELS", "no_such_module.kernels")
    env = {"VLLM_FL_PER_OP": "rms_norm=vendor:kerneltrial|reference", "KERNELTRIAL_KERNELS": "no_such_module.kernels"}
    monkeypatch.setenv("VLLM_FL_PER_OP", env["VLLM_FL_PER_OP"])
    mgr = fl.OpManager()
    lay, x = layer(64, torch.float32), inputs(2, 64, torch.float32)
    out = mgr.call("rms_norm", lay, x)  # served, silently, by the reference implementation
    assert mgr.get_selected_impl_id("rms_norm") == "reference.torch" and out.shape == x.shape
    assert ("kerneltrial.plugins.vllm_fl", "env_module", False) in fl.get_discovered_plugins()
    v = check_launch(tmp_path / "log", env)
    assert not v.valid
    assert "plugin vllm_fl failed to load" in v.reason and "no_such_module.kernels" in v.reason


def test_candidate_that_raises_is_a_fallback_and_invalid(fl, monkeypatch, tmp_path):
    env = {
        "VLLM_FL_PER_OP": "rms_norm=vendor:kerneltrial|reference",
        "KERNELTRIAL_KERNELS": "tests.plugins.raising_kernels",
    }
    for k, val in env.items():
        monkeypatch.setenv(k, val)
    mgr = fl.OpManager()
    lay, x = layer(64, torch.float32), inputs(2, 64, torch.float32)
    out = mgr.call("rms_norm", lay, x)  # ours raised; the dispatcher fell back to the reference
    torch.testing.assert_close(out, mgr.registry.get_implementation("rms_norm", "reference.torch").fn(lay, x))
    flush()
    v = check_launch(tmp_path / "log", env)
    assert not v.valid and "1 of 1 calls of tests.plugins.raising_kernels raised" in v.reason


def test_signatures_match_the_snapshot_call_sites():
    """vllm_fl's layers call call_op("rms_norm", self, x, residual) and call_op("silu_and_mul", self, x);
    our functions take what the snapshot's reference implementations take."""
    root = snapshot_dir() / "vllm_fl"
    assert 'call_op("rms_norm", self, x, residual)' in (root / "ops" / "layernorm.py").read_text()
    assert 'call_op("silu_and_mul", self, x)' in (root / "ops" / "activation.py").read_text()
    norm_src = (root / "dispatch" / "backends" / "reference" / "impl" / "normalization.py").read_text()
    assert re.search(
        r"def rms_norm_torch\(\s*obj,\s*x: torch.Tensor,\s*residual: Optional\[torch.Tensor\] = None,", norm_src
    )
    params = list(inspect.signature(plugin.rms_norm).parameters.values())
    assert [p.default for p in params] == [inspect.Parameter.empty, inspect.Parameter.empty, None]
    assert len(inspect.signature(plugin.silu_and_mul).parameters) == 2


def test_entry_point_group_and_env_match_the_snapshot_discovery():
    src = (snapshot_dir() / "vllm_fl" / "dispatch" / "discovery.py").read_text()
    group = re.search(r'^PLUGIN_GROUP = "([^"]+)"', src, re.M).group(1)
    env = re.search(r'^PLUGIN_MODULES_ENV = "([^"]+)"', src, re.M).group(1)
    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert eps[group] == {"kerneltrial": "kerneltrial.plugins.vllm_fl:register"}
    assert env == "VLLM_FL_PLUGIN_MODULES" and env in Path(plugin.__file__).read_text()
