"""Selection you can see (issue 26, item 5): kerneltrial reads vllm-plugin-FL's operator selection
as the plugin's own policy code does, checked against the vendored snapshot's policy
(vllm_fl/dispatch/policy.py, vllm_fl/utils.py, the platform tables) and its dispatcher; the
protocol loader refuses a VLLM_FL_PER_OP that would change other operators (the Ascend table
from the snapshot), and the dispatch proof reads the selection files in precedence order."""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving.dispatch_proof import check_launch, intended_ops
from kerneltrial.serving.fl_policy import Platform, selection
from kerneltrial.serving.protocol import ProtocolError, parse_protocol

from .conftest import shared

SNAPSHOT = shared() / "vendor" / "vllm-plugin-FL"
FL_VARS = (
    "VLLM_FL_CONFIG",
    "VLLM_FL_OP_CONFIG",
    "VLLM_FL_PER_OP",
    "VLLM_FL_PREFER",
    "VLLM_FL_ALLOW_VENDORS",
    "VLLM_FL_DENY_VENDORS",
    "VLLM_FL_PLATFORM",
)
OPS = ("attention_backend", "rms_norm", "silu_and_mul", "rotary_embedding")


def platform_table(name: str) -> Platform:
    """The snapshot's platform table, as a protocol's [server.fl_platform] states it."""
    import yaml

    doc = yaml.safe_load((SNAPSHOT / "vllm_fl" / "dispatch" / "config" / f"{name}.yaml").read_text())
    ops = {op: tuple(v) for op, v in doc["op_backends"].items()}
    return Platform(name, ops, doc.get("prefer", "flagos"))


class Snapshot:
    """The snapshot's policy and dispatcher, imported for real: vllm_fl as a bare package (its
    __init__ imports vLLM), FlagGems stood in for by empty modules (vllm_fl/utils.py imports it at
    the top but reads VLLM_FL_OP_CONFIG without it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch

    def policy(self, env: dict[str, str]) -> Any:
        for var in FL_VARS:
            self.mp.delenv(var, raising=False)
        for k, v in env.items():
            self.mp.setenv(k, v)
        utils = importlib.reload(sys.modules["vllm_fl.utils"])  # reads VLLM_FL_OP_CONFIG at import
        assert utils.get_op_config() == (
            json.loads(Path(env["VLLM_FL_OP_CONFIG"]).read_text()) if "VLLM_FL_OP_CONFIG" in env else None
        )
        from vllm_fl.dispatch import policy

        return policy.PolicyManager.get_instance()._policy_from_env()

    def chosen(self, env: dict[str, str], op: str) -> str:
        """The impl_id the snapshot's dispatcher resolves for `op` among a FlagOS, a reference, a CUDA
        vendor (priority 100) and our kerneltrial vendor (priority 0) implementation ("none": none)."""
        self.policy(env)
        from vllm_fl.dispatch import manager, policy, registry
        from vllm_fl.dispatch.types import BackendImplKind, OpImpl

        reg = registry.OpRegistry()
        for impl_id, kind, vendor, prio in (
            ("default.flagos", BackendImplKind.DEFAULT, None, 150),
            ("reference.torch", BackendImplKind.REFERENCE, None, 50),
            ("vendor.cuda", BackendImplKind.VENDOR, "cuda", 100),
            ("vendor.kerneltrial", BackendImplKind.VENDOR, "kerneltrial", 0),
        ):
            reg.register_impl(OpImpl(op, impl_id, kind, lambda *a: None, vendor=vendor, priority=prio))
        m = manager.OpManager(reg)
        m._state.initialized, m._state.init_pid = True, os.getpid()  # no built-ins: only the four above
        policy.reset_global_policy()
        try:
            fn = m.resolve(op)
        except RuntimeError:  # nothing the order names is allowed: the op has no implementation
            return "none"
        return next(i.impl_id for i in reg.snapshot().impls_by_op[op] if i.fn is fn)


@pytest.fixture
def snapshot(monkeypatch: pytest.MonkeyPatch) -> Iterator[Snapshot]:
    if not (SNAPSHOT / "vllm_fl" / "dispatch" / "policy.py").is_file():
        pytest.skip(f"vllm-plugin-FL snapshot not found at {SNAPSHOT} (set KERNELTRIAL_SHARED to the shared folder)")
    pytest.importorskip("yaml", reason="the snapshot's policy imports yaml (pip install pyyaml)")
    for name in [m for m in sys.modules if m == "vllm_fl" or m.startswith(("vllm_fl.", "flag_gems"))]:
        monkeypatch.delitem(sys.modules, name)
    pkg = types.ModuleType("vllm_fl")
    pkg.__path__ = [str(SNAPSHOT / "vllm_fl")]
    monkeypatch.setitem(sys.modules, "vllm_fl", pkg)
    gems = {n: types.ModuleType(n) for n in ("flag_gems", "flag_gems.runtime", "flag_gems.runtime.backend")}
    gems["flag_gems.runtime.backend.device"] = types.ModuleType("flag_gems.runtime.backend.device")
    gems["flag_gems.runtime.backend.device"].DeviceDetector = object  # type: ignore[attr-defined]
    gems["flag_gems.runtime"].backend = gems["flag_gems.runtime.backend"]  # type: ignore[attr-defined]
    for name, mod in gems.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("VLLM_FL_PLATFORM", "nvidia")  # vllm.platforms is not importable here: the override
    importlib.import_module("vllm_fl.utils")
    yield Snapshot(monkeypatch)
    for name in [m for m in sys.modules if m == "vllm_fl" or m.startswith(("vllm_fl.", "flag_gems"))]:
        sys.modules.pop(name, None)


def cases(tmp_path: Path) -> list[tuple[str, dict[str, str], str]]:
    """(id, environment, platform): each precedence rule of the policy."""
    cfg = tmp_path / "fl.yaml"
    cfg.write_text(
        "prefer: vendor\nop_backends:\n  rms_norm: [vendor:kerneltrial, flagos]\n  silu_and_mul: vendor|flagos\n"
    )
    op_cfg = tmp_path / "ops.json"
    op_cfg.write_text(json.dumps({"rms_norm": "flagos"}))
    ours = "rms_norm=vendor:kerneltrial;silu_and_mul=vendor:kerneltrial"
    return [
        ("platform-table", {}, "ascend"),
        ("per-op-replaces-the-table", {"VLLM_FL_PER_OP": "rms_norm=vendor:kerneltrial"}, "ascend"),
        ("prefer-reorders-the-default", {"VLLM_FL_PER_OP": "rms_norm=vendor:kerneltrial", "VLLM_FL_PREFER": "vendor"}, "nvidia"),
        ("op-config-beats-per-op", {"VLLM_FL_OP_CONFIG": str(op_cfg), "VLLM_FL_PER_OP": ours}, "nvidia"),
        ("config-file-beats-all", {"VLLM_FL_CONFIG": str(cfg), "VLLM_FL_PER_OP": "silu_and_mul=vendor:kerneltrial", "VLLM_FL_PREFER": "reference"}, "ascend"),
        ("config-path-not-a-file-is-ignored", {"VLLM_FL_CONFIG": str(tmp_path / "none.yaml"), "VLLM_FL_PER_OP": ours}, "nvidia"),
        ("deny-drops-ours", {"VLLM_FL_PER_OP": ours, "VLLM_FL_DENY_VENDORS": "kerneltrial"}, "nvidia"),
        ("allow-without-ours", {"VLLM_FL_PER_OP": ours, "VLLM_FL_ALLOW_VENDORS": "cuda"}, "metax"),
        ("generic-vendor-is-not-ours", {"VLLM_FL_PER_OP": "rms_norm=vendor|flagos"}, "nvidia"),
    ]  # fmt: skip


def files_of(env: dict[str, str]) -> dict[str, str | None]:
    return {
        v: Path(env[v]).read_text() if Path(env[v]).is_file() else None
        for v in ("VLLM_FL_CONFIG", "VLLM_FL_OP_CONFIG")
        if v in env
    }


def test_our_reading_equals_the_snapshots_policy_and_dispatcher(snapshot: Snapshot, tmp_path: Path):
    for cid, env, plat in cases(tmp_path):
        table = platform_table(plat)
        theirs = snapshot.policy({**env, "VLLM_FL_PLATFORM": plat})
        mine = selection(env, table, files_of(env))
        for op in OPS:
            want = theirs.get_per_op_order(op) or theirs.get_default_order()
            assert list(mine.order(op)[0] or ()) == want, (cid, op)
            ours = snapshot.chosen({**env, "VLLM_FL_PLATFORM": plat}, op) == "vendor.kerneltrial"
            assert mine.selects_ours(op) == ours, (cid, op)
        assert mine.ours_allowed() == theirs.is_vendor_allowed("kerneltrial"), cid
        # the dispatch proof's intention is the dispatcher's choice, with the source it came from
        intended = intended_ops(env, table, files_of(env))
        want_ops = {
            op
            for op in ("rms_norm", "silu_and_mul")
            if snapshot.chosen({**env, "VLLM_FL_PLATFORM": plat}, op) == "vendor.kerneltrial"
        }
        assert set(intended) == want_ops, cid  # fmt: skip


def test_the_sources_are_named_in_precedence_order(tmp_path: Path):
    by_id = {cid: (env, plat) for cid, env, plat in cases(tmp_path)}
    want = {
        "platform-table": "platform ascend",
        "per-op-replaces-the-table": "VLLM_FL_PER_OP",
        "op-config-beats-per-op": f"VLLM_FL_OP_CONFIG {tmp_path / 'ops.json'}",
        "config-file-beats-all": f"VLLM_FL_CONFIG {tmp_path / 'fl.yaml'}",
        "config-path-not-a-file-is-ignored": "VLLM_FL_PER_OP",
    }
    for cid, source in want.items():
        env, plat = by_id[cid]
        assert selection(env, platform_table(plat), files_of(env)).order("rms_norm")[1] == source, cid
    # an op the per-op order does not name: the default order, not the platform's
    env, plat = by_id["per-op-replaces-the-table"]
    assert selection(env, platform_table(plat), {}).order("attention_backend") == (
        ("flagos", "vendor", "reference"),
        "the default order (prefer flagos)",
    )


ASCEND_PROTOCOL = """
[server]
model_id = "m"
[server.fl_platform]
name = "ascend"
op_backends = {table}
[bench]
cases = [[8, 4, 1, 2]]
[[arms]]
name = "E0"
role = "baseline"
argv = ["vllm"]
[[arms]]
name = "E1"
argv = ["vllm"]
env = {{ VLLM_FL_PER_OP = "{per_op}" }}
"""


def test_the_loader_refuses_a_per_op_that_changes_other_operators_on_ascend(snapshot: Snapshot):
    table = platform_table("ascend")
    toml = "{ " + ", ".join(f"{op} = {json.dumps(list(v))}" for op, v in table.op_backends.items()) + " }"
    with pytest.raises(ProtocolError) as e:
        parse_protocol(ASCEND_PROTOCOL.format(table=toml, per_op="rms_norm=vendor:kerneltrial"))
    msg = str(e.value)
    assert (
        "arm E1: VLLM_FL_PER_OP replaces the ascend platform's whole per-operator table, so it would also change "
        in msg
    )
    assert "attention_backend (vendor|flagos|reference in E0, flagos|vendor|reference in E1)" in msg
    fixed = msg.rsplit("VLLM_FL_PER_OP = ", 1)[1].strip("'")
    # the value it names changes nothing but rms_norm, by the snapshot's own policy
    proto = parse_protocol(ASCEND_PROTOCOL.format(table=toml, per_op=fixed))
    base = snapshot.policy({"VLLM_FL_PLATFORM": "ascend"})
    e1 = snapshot.policy({"VLLM_FL_PLATFORM": "ascend", "VLLM_FL_PER_OP": proto.arms[1].env["VLLM_FL_PER_OP"]})
    for op in OPS:
        order = e1.get_per_op_order(op) or e1.get_default_order()
        assert (order == (base.get_per_op_order(op) or base.get_default_order())) == (op != "rms_norm"), op
    assert snapshot.chosen({"VLLM_FL_PLATFORM": "ascend", "VLLM_FL_PER_OP": fixed}, "rms_norm") == "vendor.kerneltrial"
    # on NVIDIA every platform order is the default one: naming rms_norm alone changes nothing else
    nv = platform_table("nvidia")
    toml = "{ " + ", ".join(f"{op} = {json.dumps(list(v))}" for op, v in nv.op_backends.items()) + " }"
    parse_protocol(
        ASCEND_PROTOCOL.format(table=toml, per_op="rms_norm=vendor:kerneltrial").replace('"ascend"', '"nvidia"')
    )


def test_without_the_platform_table_the_loader_asks_for_it():
    text = ASCEND_PROTOCOL.replace('[server.fl_platform]\nname = "ascend"\nop_backends = {table}\n', "")
    with pytest.raises(
        ProtocolError, match=r"arm E1 sets VLLM_FL_PER_OP, which replaces .*state it in \[server.fl_platform\]"
    ):
        parse_protocol(text.format(per_op="rms_norm=vendor:kerneltrial"))


def test_the_dispatch_proof_reads_the_file_that_decides(tmp_path: Path):
    """Planted: E1's VLLM_FL_PER_OP names only rms_norm, but its VLLM_FL_CONFIG file (which the
    policy reads first) also gives silu_and_mul to kerneltrial. Read as before issue 26 (VLLM_FL_PER_OP
    only) the arm swaps in rms_norm; the policy swaps in both, and the verdict says where from."""
    cfg = tmp_path / "fl.yaml"
    cfg.write_text("op_backends:\n  rms_norm: [vendor:kerneltrial]\n  silu_and_mul: [vendor:kerneltrial]\n")
    env = {"VLLM_FL_PER_OP": "rms_norm=vendor:kerneltrial", "VLLM_FL_CONFIG": str(cfg)}
    assert set(intended_ops({"VLLM_FL_PER_OP": env["VLLM_FL_PER_OP"]})) == {"rms_norm"}  # the old reading
    from kerneltrial.plugins.records import OpCount, PluginLoad, ProcessRecord

    d = tmp_path / "dispatch"
    d.mkdir()
    counts = (OpCount("rms_norm", "kerneltrial", 4, 0), OpCount("silu_and_mul", "kerneltrial", 2, 0))
    (d / "dispatch-1.json").write_text(ProcessRecord(1, 0.0, (PluginLoad("vllm_fl", "k", ()),), counts).to_json())
    v = check_launch(d, env, None, {"VLLM_FL_CONFIG": cfg.read_text()})
    assert v.valid and v.intended == {"rms_norm": "kerneltrial", "silu_and_mul": "kerneltrial"}, v.reason
    assert v.selection["silu_and_mul"] == f"vendor:kerneltrial (VLLM_FL_CONFIG {cfg})"
    # without the file's text (not a file where the server ran) the policy falls back to VLLM_FL_PER_OP
    v = check_launch(d, env, None, {"VLLM_FL_CONFIG": None})
    assert not v.valid and "silu_and_mul: 2 calls of kerneltrial, which this arm does not select" in v.reason
    assert "(its vllm-plugin-FL order: unknown (the platform table (not stated" not in v.reason
    assert v.selection["silu_and_mul"] == "flagos|vendor|reference (the default order (prefer flagos))"
    # a VLLM_FL_OP_CONFIG that is not a file: vllm_fl cannot import, the verdict says so
    v = check_launch(d, {"VLLM_FL_OP_CONFIG": "/nowhere.json"}, None, {"VLLM_FL_OP_CONFIG": None})
    assert not v.valid and v.reason == "VLLM_FL_OP_CONFIG file not found: /nowhere.json (vllm_fl refuses to import)"


def test_verify_reads_the_selection_files_copy_and_the_recorded_orders(tmp_path: Path, monkeypatch):
    from kerneltrial.serving.verify import verify_serving_run

    from .test_acceptance import run_trial, synthetic_bench, trial_text

    cfg = tmp_path / "fl.yaml"
    cfg.write_text("op_backends:\n  rms_norm: [flagos]\n")
    text = trial_text(rounds=1).replace(
        'role = "candidate"\n', f'role = "candidate"\nenv = {{ VLLM_FL_CONFIG = "{cfg}" }}\n'
    )
    code, output, out = run_trial(tmp_path, monkeypatch, text, synthetic_bench(lambda a, L: (1.0, 1.0)))
    assert verify_serving_run(out).problems == [], output
    plan = json.loads((out / "plan.json").read_text())
    copy = plan["arms"][1]["selection_files"]["VLLM_FL_CONFIG"]
    assert copy["path"] == str(cfg) and (out / copy["copy"]).read_text() == cfg.read_text()
    rows = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    b = next(r for r in rows if r["arm"] == "B")
    assert b["dispatch"]["selection"]["rms_norm"] == f"flagos (VLLM_FL_CONFIG {cfg})"
    # tampering: the recorded order of an op, then the copy the orders were read from
    b["dispatch"]["selection"]["rms_norm"] = "vendor:kerneltrial (VLLM_FL_PER_OP)"
    (out / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert any("dispatch selection" in p and "the policy reads" in p for p in verify_serving_run(out).problems)
    (out / copy["copy"]).write_text("op_backends:\n  rms_norm: [vendor:kerneltrial]\n")
    assert any("the copy of its VLLM_FL_CONFIG file" in p for p in verify_serving_run(out).problems)
