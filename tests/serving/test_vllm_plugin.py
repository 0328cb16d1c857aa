"""kerneltrial's plain-vLLM plugin (entry point vllm.general_plugins) inside the CPU vLLM venv.

Needs `bash .ci/serving-setup.sh`, which installs kerneltrial into that venv (skips otherwise).
The server processes run our Triton kernels through the interpreter: TRITON_INTERPRET=1 is in
every arm's environment (E0 too, so the arms differ in operator selection only), and so is
VLLM_DISABLE_COMPILE_CACHE=1: vLLM keys its compiled-model cache on the model and config, not
on plugins, and an E1 launch was seen looking up the artifact E0 had just saved (had it
loaded, E1 would have run E0's graph, without our ops).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from kerneltrial.plugins import OURS
from kerneltrial.serving.dispatch_proof import check_launch
from kerneltrial.serving.launcher import LaunchError, Server, ServerSpec, free_port
from kerneltrial.serving.verify import verify_serving_run
from tests.serving.conftest import RealTrial, vllm_venv

pytestmark = pytest.mark.serving

UNIT = r"""
import importlib.metadata as md, json, sys, torch
from vllm.config import VllmConfig, set_current_vllm_config
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "kerneltrial"]
if not eps:
    sys.exit(3)
eps[0].load()()
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
with set_current_vllm_config(VllmConfig()):
    norm, act = RMSNorm(200, eps=1e-5, dtype=torch.bfloat16), SiluAndMul()
torch.manual_seed(0)
norm.weight.data.normal_()
x, r, g = torch.randn(5, 200, dtype=torch.bfloat16), torch.randn(5, 200, dtype=torch.bfloat16), torch.randn(5, 400, dtype=torch.bfloat16)
out, res = norm(x.clone(), r.clone())
ref_out, ref_res = norm.forward_native(x.clone(), r.clone())
err = lambda a, b: float((a.float() - b.float()).abs().max())
print(json.dumps({
    "norm": type(norm).__name__, "act": type(act).__name__,
    "rms_norm": err(norm(x), norm.forward_native(x)),
    "fused_out": err(out, ref_out), "fused_res": err(res, ref_res),
    "silu_and_mul": err(act(g), SiluAndMul.forward_native(g)),
}))
"""


def run_unit(env: dict[str, str], tmp_path: Path) -> dict[str, object]:
    python = vllm_venv() / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no vLLM venv at {vllm_venv()} (run bash .ci/serving-setup.sh)")
    p = subprocess.run(
        [str(python), "-c", UNIT],
        env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "VLLM_TARGET_DEVICE": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    if p.returncode == 3:
        pytest.skip("kerneltrial is not installed in the vLLM venv (run bash .ci/serving-setup.sh)")
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_oot_layers_replace_vllm_and_match_its_native_forward(tmp_path):
    log = tmp_path / "log"
    got = run_unit({"KERNELTRIAL_VLLM_OPS": "rms_norm,silu_and_mul", "KERNELTRIAL_DISPATCH_LOG": str(log)}, tmp_path)
    assert got["norm"] == "KerneltrialRMSNorm" and got["act"] == "KerneltrialSiluAndMul"
    assert got["rms_norm"] == 0.0 and got["silu_and_mul"] == 0.0 and got["fused_res"] == 0.0
    # vLLM normalises the fp32 sum, our kernel the stored bf16 sum (as vLLM's CUDA kernel does)
    assert got["fused_out"] <= 0.07
    v = check_launch(log, {"KERNELTRIAL_VLLM_OPS": "rms_norm,silu_and_mul"})
    assert v.valid, v.reason
    assert {(s.op, s.impl, s.calls) for s in v.served} == {
        ("rms_norm", OURS, 1),
        ("fused_add_rms_norm", OURS, 1),
        ("silu_and_mul", OURS, 1),
    }


def test_oot_plugin_is_off_by_default(tmp_path):
    got = run_unit({"KERNELTRIAL_DISPATCH_LOG": str(tmp_path / "log")}, tmp_path)
    assert got["norm"] == "RMSNorm" and got["act"] == "SiluAndMul"
    v = check_launch(tmp_path / "log", {})
    assert v.valid and v.served == () and v.processes == 1


def serve_and_query(make, env: dict[str, str], log_dir: Path, tmp_path: Path, tag: str) -> None:
    port = free_port()
    spec = ServerSpec(make(port), "tiny", port=port, env=env, ready_timeout_s=600)
    with Server(spec, tmp_path / f"{tag}-server.log") as srv:
        r = httpx.post(
            srv.spec.base_url + "/v1/completions",
            json={"model": "tiny", "prompt": "one two three", "max_tokens": 4, "ignore_eos": True},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4


def test_real_server_with_a_bad_kernels_module_does_not_serve(vllm_server_cmd, tmp_path):
    """A plugin that fails to load stops the server; it never serves the baseline as E1."""
    make, env, _ = vllm_server_cmd
    arm = {"KERNELTRIAL_VLLM_OPS": "rms_norm", "KERNELTRIAL_KERNELS": "no_such_module.kernels"}
    log = tmp_path / "dispatch"
    with pytest.raises(LaunchError):
        serve_and_query(
            make,
            {
                **env,
                "TRITON_INTERPRET": "1",
                "VLLM_DISABLE_COMPILE_CACHE": "1",
                **arm,
                "KERNELTRIAL_DISPATCH_LOG": str(log),
            },
            log,
            tmp_path,
            "bad",
        )
    v = check_launch(log, arm)
    assert not v.valid and "failed to load" in v.reason and "no_such_module.kernels" in v.reason, v.reason


@pytest.mark.slow
def test_trial_e0_e1_records_the_proof_of_dispatch_and_verify_checks_it(e0_e1_trial: RealTrial, tmp_path: Path) -> None:
    """A trial of E0 and E1 (RMSNorm swapped in; conftest's e0_e1_trial): ours served calls in E1
    only, verify passes, and a dispatch record edited afterwards (in a copy) fails verify."""
    summary = json.loads((e0_e1_trial.out / "summary.json").read_text())
    assert summary["failures"] == [], summary["failures"]
    out = tmp_path / "run"
    shutil.copytree(e0_e1_trial.out, out)  # the trial is shared: tamper with a copy
    rows = {r["arm"]: r for r in map(json.loads, (out / "launches.jsonl").read_text().splitlines())}
    e0, e1 = rows["E0"]["dispatch"], rows["E1"]["dispatch"]
    assert rows["E1"]["env_set"]["VLLM_DISABLE_COMPILE_CACHE"] == "1"
    assert e0["valid"] and e0["processes"] >= 1 and e0["counts"] == [], e0
    assert e1["valid"] and e1["intended"] == {"rms_norm": OURS}, e1
    calls = {(c["op"], c["impl"]): c["calls"] for c in e1["counts"]}
    assert set(calls) == {("rms_norm", OURS), ("fused_add_rms_norm", OURS)} and min(calls.values()) > 0, calls
    assert summary["dispatch"]["E0"]["valid"] is True and summary["dispatch"]["E1"]["valid"] is True
    assert summary["acceptance"]["dispatch_ok"] is True
    # E0's records read under E1's selection: the swapped kernel served nothing there
    assert not check_launch(out / rows["E0"]["dispatch"]["dir"], {"KERNELTRIAL_VLLM_OPS": "rms_norm"}).valid
    assert verify_serving_run(out).problems == []
    # tampering: E1's calls edited to 0 in its records
    for rec in (out / e1["dir"]).glob("dispatch-*.json"):
        raw = json.loads(rec.read_text())
        raw["counts"] = [{**c, "calls": 0} for c in raw["counts"]]
        rec.write_text(json.dumps(raw))
    problems = verify_serving_run(out).problems
    assert any("dispatch verdict valid=True, recomputed False" in p for p in problems), problems
    assert any("summary dispatch E1: valid=True, recomputed False" in p for p in problems), problems
