"""Call records (plugins/records.py) and the dispatch verdict (serving/dispatch_proof.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kerneltrial.plugins import FALLBACK, LOG_ENV, OURS, parse_ops
from kerneltrial.plugins import records as rec_mod
from kerneltrial.plugins.records import OpCount, PluginLoad, ProcessRecord
from kerneltrial.serving.dispatch_proof import check_launch, decide, intended_ops, read_records

E1_ENV = {"KERNELTRIAL_VLLM_OPS": "rms_norm"}


def record(pid: int, counts: list[tuple[str, str, int, int]], error: str | None = None) -> ProcessRecord:
    load = PluginLoad("vllm_oot", "kerneltrial.plugins.kernels", ("rms_norm",), error)
    return ProcessRecord(pid, 0.0, (load,), tuple(OpCount(*c) for c in counts))


def test_record_round_trip_and_bad_file(tmp_path: Path):
    r = record(7, [("rms_norm", OURS, 3, 0)])
    assert ProcessRecord.from_json(r.to_json(), "x") == r
    (tmp_path / "dispatch-1.json").write_text('{"schema": 1, "pid": 1}')
    with pytest.raises(ValueError, match="dispatch-1.json: not a kerneltrial dispatch record"):
        read_records(tmp_path)
    v = check_launch(tmp_path, E1_ENV)
    assert not v.valid and "not a kerneltrial dispatch record" in v.reason


def test_recorder_writes_one_file_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(LOG_ENV, str(tmp_path))
    monkeypatch.setattr(rec_mod, "_recorder", None)
    rec_mod.record_load(PluginLoad("vllm_oot", "m", ("rms_norm",)))
    for ok in (True, True, False):
        rec_mod.record_call("rms_norm", OURS, ok)
    rec_mod._recorder.flush()
    [got] = read_records(tmp_path)
    assert got.pid == os.getpid() and got.counts == (OpCount("rms_norm", OURS, 3, 1),)
    # a forked child (another pid) keeps the loads, starts its counts at zero, writes its own file
    child = rec_mod._recorder.forked()
    child.pid = got.pid + 100000
    child.call("silu_and_mul", OURS, True)
    child.flush()
    files = sorted(p.name for p in tmp_path.glob("dispatch-*.json"))
    assert files == sorted([f"dispatch-{got.pid}.json", f"dispatch-{got.pid + 100000}.json"])
    kid = ProcessRecord.from_json((tmp_path / f"dispatch-{got.pid + 100000}.json").read_text(), "kid")
    assert kid.loads == got.loads and kid.counts == (OpCount("silu_and_mul", OURS, 1, 0),)


def test_no_log_env_means_no_records(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(LOG_ENV, raising=False)
    monkeypatch.setattr(rec_mod, "_recorder", None)
    rec_mod.record_call("rms_norm", OURS, True)
    assert rec_mod.recorder() is None


def test_intended_ops_from_the_arm_environment():
    assert intended_ops({}) == {}
    assert intended_ops(E1_ENV) == {"rms_norm": OURS}
    assert intended_ops({"KERNELTRIAL_VLLM_OPS": "silu_and_mul", "KERNELTRIAL_KERNELS": "cand.mod"}) == {
        "silu_and_mul": "cand.mod"
    }
    # vllm-plugin-FL: only a first token naming kerneltrial selects it
    fl = {"VLLM_FL_PER_OP": "rms_norm=vendor:kerneltrial|reference;silu_and_mul=flagos|vendor:kerneltrial"}
    assert intended_ops(fl) == {"rms_norm": OURS}
    assert intended_ops({"VLLM_FL_PER_OP": "silu_and_mul=impl:vendor.kerneltrial"}) == {"silu_and_mul": OURS}
    with pytest.raises(ValueError, match="unknown op"):
        parse_ops("rms_norm,gelu")


def test_verdicts_valid_and_planted_faults():
    good = [record(1, []), record(2, [("rms_norm", OURS, 5, 0), ("fused_add_rms_norm", OURS, 9, 0)])]
    v = decide(good, {"rms_norm": OURS})
    assert v.valid and v.processes == 2 and "fused_add_rms_norm: 9 calls of kerneltrial" in v.reason
    # baseline: no records, or records without calls, is a clean baseline
    assert decide([], {}).valid and decide([record(1, [])], {}).valid
    cases = {
        "no dispatch records": ([], {"rms_norm": OURS}),
        "failed to load in pid 3": ([record(3, [], error="ValueError: no module x")], {"rms_norm": OURS}),
        "selected kerneltrial served no calls": ([record(1, [])], {"rms_norm": OURS}),
        "1 of 6 calls of kerneltrial raised": ([record(1, [("rms_norm", OURS, 6, 1)])], {"rms_norm": OURS}),
        "handed back to vLLM": (
            [record(1, [("rms_norm", OURS, 6, 0), ("rms_norm", FALLBACK, 1, 0)])],
            {"rms_norm": OURS},
        ),
        "which this arm does not select": ([record(1, [("rms_norm", OURS, 4, 0)])], {}),
        "silu_and_mul: 2 calls of kerneltrial": (
            [record(1, [("rms_norm", OURS, 4, 0), ("silu_and_mul", OURS, 2, 0)])],
            {"rms_norm": OURS},
        ),
        # the candidate's arm, but our own kernels served the op
        "rms_norm: 4 calls of kerneltrial, which this arm": (
            [record(1, [("rms_norm", OURS, 4, 0)])],
            {"rms_norm": "cand.mod"},
        ),
    }
    for reason, (recs, intended) in cases.items():
        v = decide(recs, intended)
        assert not v.valid and reason in v.reason, (reason, v.reason)


def test_check_launch_reads_the_directory(tmp_path: Path):
    assert not check_launch(tmp_path / "absent", E1_ENV).valid
    assert check_launch(tmp_path / "absent", {}).valid
    (tmp_path / "dispatch-5.json").write_text(record(5, [("fused_add_rms_norm", OURS, 2, 0)]).to_json())
    v = check_launch(tmp_path, E1_ENV)
    assert v.valid and v.intended == {"rms_norm": OURS}
    assert not check_launch(tmp_path, {}).valid  # the same records under a baseline arm
    # a tampered record (calls edited to zero) no longer proves dispatch
    raw = json.loads((tmp_path / "dispatch-5.json").read_text())
    raw["counts"][0]["calls"] = 0
    (tmp_path / "dispatch-5.json").write_text(json.dumps(raw))
    assert not check_launch(tmp_path, E1_ENV).valid
