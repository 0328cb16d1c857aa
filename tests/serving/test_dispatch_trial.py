"""The proof of dispatch inside the serving trial, with planted call records (no vLLM).

The trial gives every launched server KERNELTRIAL_DISPATCH_LOG=launches/NN-ARM/dispatch,
judges the records after the server stopped, stores the verdict in launches.jsonl and
summary.json, and never accepts an arm whose proof is invalid; verify decides again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kerneltrial.plugins import OURS
from kerneltrial.plugins.records import OpCount, PluginLoad, ProcessRecord
from kerneltrial.rundir.serving_summary_doc import CaseResult, LaunchResult
from kerneltrial.serving.launcher import LaunchError, free_port
from kerneltrial.serving.order import launch_order
from kerneltrial.serving.protocol import Protocol, parse_protocol
from kerneltrial.serving.summary import acceptance, dispatch_summary
from kerneltrial.serving.trial import dispatch_dir, prove_launch, run_protocol
from kerneltrial.serving.verify import verify_serving_run

CASE = "in32-out8-c2-n4"
# stands in for vLLM loading its general plugins: the real plugin's register(), which records
# its failure and raises (vLLM does not catch it, so the server exits before it is ready). It
# fails here on the bad kernels module, or (without vLLM in this venv) on importing vLLM.
REGISTER = "from kerneltrial.plugins.vllm_oot import register; register()"
SHARED = {"TRITON_INTERPRET": "1"}  # every arm: arms may differ only in operator selection
BAD_E1 = {"KERNELTRIAL_VLLM_OPS": "rms_norm", "KERNELTRIAL_KERNELS": "no_such_module.kernels"}


def protocol(e1_env: dict[str, str], seed: int = 0, port: int = 8000) -> tuple[Protocol, str]:
    lines = [
        'name = "dispatch"',
        f"seed = {seed}",
        "rounds = 2",
        "repeats = 2",
        "[server]",
        'model_id = "tiny"',
        f"port = {port}",
        "ready_timeout_s = 60",
        "[bench]",
        "cases = [[32, 8, 2, 4]]",
    ]
    for name, role, env in (("E0", "baseline", SHARED), ("E1", "candidate", {**SHARED, **e1_env})):
        lines += [
            "[[arms]]",
            f'name = "{name}"',
            f'role = "{role}"',
            f"argv = {json.dumps([sys.executable, '-c', REGISTER])}",
            "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
        ]
    text = "\n".join(lines) + "\n"
    return parse_protocol(text), text


def plant(out: Path, tag: str, counts: list[tuple[str, str, int, int]], error: str | None = None) -> None:
    d = dispatch_dir(out, tag)
    d.mkdir(parents=True)
    load = PluginLoad("vllm_oot", "kerneltrial.plugins.kernels", ("rms_norm",), error)
    (d / "dispatch-11.json").write_text(ProcessRecord(11, 0.0, (load,), tuple(OpCount(*c) for c in counts)).to_json())


def good_results(proto: Protocol) -> dict[str, dict[str, CaseResult]]:
    """Figures that pass the acceptance rule: E1 doubles throughput at the same TTFT in every round."""
    fig = {"E0": (100.0, 10.0), "E1": (200.0, 10.0)}
    order = list(enumerate(launch_order(proto.arms, proto.rounds, proto.seed)))
    return {
        a.name: {
            CASE: CaseResult(
                runs=proto.rounds,
                failed_runs=0,
                status="ok",
                launches=[
                    LaunchResult(
                        launch=i,
                        kept_runs=[],
                        total_token_throughput=fig[a.name][0] * (1 + r / 100),
                        mean_ttft_ms=fig[a.name][1],
                    )
                    for i, (r, _, name) in order
                    if name == a.name
                ],
            )
        }
        for a in proto.arms
    }


@pytest.mark.parametrize(
    ("arm", "counts", "error", "reason"),
    [
        ("E1", [], "ValueError: no module", "plugin vllm_oot failed to load in pid 11: ValueError: no module"),
        ("E1", [], None, "rms_norm: selected kerneltrial served no calls"),
        (
            "E0",
            [("rms_norm", OURS, 5, 0)],
            None,
            "rms_norm: 5 calls of kerneltrial, which this arm does not select for rms_norm",
        ),
    ],
    ids=["plugin-load-error", "zero-calls", "ours-in-E0"],
)
def test_an_invalid_launch_makes_its_arm_invalid_and_never_accepted(tmp_path, arm, counts, error, reason):
    proto, _ = protocol({"KERNELTRIAL_VLLM_OPS": "rms_norm"})
    arms = {a.name: a for a in proto.arms}
    other = "E0" if arm == "E1" else "E1"
    plant(tmp_path, f"00-{arm}", counts, error)
    plant(tmp_path, f"01-{other}", [("fused_add_rms_norm", OURS, 8, 0)] if other == "E1" else [])
    proofs = [prove_launch(tmp_path, 0, f"00-{arm}", arms[arm]), prove_launch(tmp_path, 1, f"01-{other}", arms[other])]
    assert [(p.valid, p.reason) for p in proofs][0] == (False, reason)
    assert proofs[1].valid, proofs[1].reason
    assert proofs[0].files == {"dispatch-11.json": proofs[0].files["dispatch-11.json"]} and proofs[0].processes == 1
    dispatch = dispatch_summary(proto, proofs)
    assert dispatch[arm].model_dump() == {
        "valid": False,
        "reason": f"launch 0: {reason}",
        "launches": [0],
        "counts": [{"op": c[0], "impl": c[1], "calls": c[2], "errors": c[3]} for c in counts],
    }
    assert dispatch[other].valid is True
    verdict = acceptance(proto, good_results(proto), {}, dispatch)
    assert verdict is not None and verdict.accepted is False and verdict.dispatch_ok is False
    role = "candidate" if arm == "E1" else "baseline"
    assert f"{role} {arm}: dispatch proof invalid (launch 0: {reason})" in verdict.reasons
    # the control: the same figures with both proofs valid are ACCEPTED
    ok = acceptance(
        proto, good_results(proto), {}, {a: d.model_copy(update={"valid": True}) for a, d in dispatch.items()}
    )
    assert ok is not None and ok.accepted is True and ok.reasons == []


def test_plugin_that_fails_to_load_is_an_invalid_arm_not_a_baseline(tmp_path):
    seed = next(s for s in range(50) if launch_order(protocol(BAD_E1)[0].arms, 1, s)[0][2] == "E1")
    proto, text = protocol(BAD_E1, seed=seed, port=free_port())
    out = tmp_path / "run"
    with pytest.raises(LaunchError) as err:
        run_protocol(proto, text.encode(), out, sys.executable, argv=["test"])
    [row] = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert row["arm"] == "E1" and row["status"] == "error"
    assert row["env_set"]["KERNELTRIAL_DISPATCH_LOG"] == str((out / "launches" / "00-E1" / "dispatch").resolve())
    assert row["env_set"]["VLLM_DISABLE_COMPILE_CACHE"] == "1"
    d = row["dispatch"]
    [rec] = (out / d["dir"]).glob("dispatch-*.json")
    [load] = json.loads(rec.read_text())["loads"]
    assert load["plugin"] == "vllm_oot" and load["kernels"] == "no_such_module.kernels" and load["error"]
    assert d["valid"] is False and d["processes"] == 1 and d["counts"] == [] and load["error"] in d["reason"]
    # the error says why the server did not start: the plugin's own error from its records
    assert "before it was ready" in str(err.value)
    assert f"dispatch proof: plugin vllm_oot failed to load in pid {json.loads(rec.read_text())['pid']}" in str(
        err.value
    )
    assert load["error"] in str(err.value)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["dispatch"]["E1"]["valid"] is False and "failed to load" in summary["dispatch"]["E1"]["reason"]
    assert summary["dispatch"]["E0"] == {"valid": False, "reason": "not launched", "launches": [], "counts": []}
    assert any("dispatch proof invalid" in f for f in summary["failures"])
    assert summary["acceptance"]["accepted"] is False
    assert any(r.startswith("candidate E1: dispatch proof invalid") for r in summary["acceptance"]["reasons"])
    assert verify_serving_run(out).problems == []
    # tampering: the record says the plugin loaded (the sha256 and the verdict disagree) ...
    raw = json.loads(rec.read_text())
    raw["loads"][0]["error"] = None
    rec.write_text(json.dumps(raw))
    problems = verify_serving_run(out).problems
    assert any("sha256 differ from launches.jsonl" in p for p in problems), problems
    # ... or is gone: the recount has no process and finds no records for the selected kernel
    rec.unlink()
    problems = verify_serving_run(out).problems
    assert any("dispatch processes 1, recounted 0" in p for p in problems), problems


def test_run_directories_without_dispatch_records_are_not_applicable(tmp_path):
    """verify of a run directory written before the proof existed checks nothing about it."""
    from kerneltrial.serving.verify_dispatch import check_dispatch

    plan = {"arms": [{"name": "server", "argv": ["vllm"], "env": {}}], "launches": [{"launch": 0, "arm": "server"}]}
    problems: list[str] = []
    assert check_dispatch(tmp_path, plan, [{"launch": 0, "arm": "server"}], {"status": "ok"}, problems) == {}
    assert problems == []
    # once the plan declares the proof, a launch without a verdict is a problem
    check_dispatch(tmp_path, plan | {"dispatch": {}}, [{"launch": 0, "arm": "server"}], {}, problems)
    assert problems == [
        "launch 0 (server): launches.jsonl has no dispatch verdict",
        "summary.json has no dispatch entry for arm server",
    ]
