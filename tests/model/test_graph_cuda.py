"""Graph mode on a CUDA device: capture, replay, checks and attribution of the tiny model.

Skipped where CUDA is absent (the CPU tests run graph mode through the stand-in graph of
model/graphs.py, which replays Python and so cannot show what a capture freezes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kerneltrial.cli.analysis import verify_one
from kerneltrial.model.runner import run_model_trial
from kerneltrial.rundir.files import read_json, read_jsonl
from tests.conftest import REPO
from tests.kt import write_protocol

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="graph mode captures CUDA graphs: no CUDA device")
pytest.importorskip("transformers")

PLANTED = REPO / "tests" / "fixtures" / "planted" / "model"
ARMS = ("syncs_the_host.py", "memoises_after_gate.py")
PROTOCOL = """
name = "tiny-graphs"
model = "tiny"
rounds = 5
warmup = 1
arms = ["eager", "torch_eager", "kerneltrial", "user:syncs_the_host.py", "user:memoises_after_gate.py"]
modes = ["eager", "graph"]
[[prefill]]
batch = 2
tokens = 16
[[decode]]
batch = 4
context = 32
[correctness]
prompts = 2
prompt_tokens = 8
steps = 3
"""


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("graphs")
    for name in ARMS:
        shutil.copy(PLANTED / name, base / name)
    write_protocol(base / "p.toml", PROTOCOL)
    return run_model_trial(base / "p.toml", base / "run")


def test_every_honest_arm_is_captured_replayed_checked_and_verified(cuda_run: Path) -> None:
    captures = {(r["case"], r["arm"]): r for r in read_jsonl(cuda_run / "captures.jsonl")}
    for case in ("prefill-b2-t16-graph", "decode-b4-c32-graph"):
        for arm in ("eager", "torch_eager", "kerneltrial"):
            assert captures[(case, arm)]["captured"], captures[(case, arm)]
    checks = read_jsonl(cuda_run / "timed_checks.jsonl")
    assert all(r["passed"] for r in checks if r["arm"] in ("eager", "torch_eager", "kerneltrial"))
    assert read_json(cuda_run / "plan.json")["graph_label"] == "CUDA graph per case and arm, replayed"
    result = verify_one(cuda_run)
    assert result.ok, [c for c in result.checks if not c.ok]


def test_a_host_synchronisation_cannot_be_captured(cuda_run: Path) -> None:
    rows = [r for r in read_jsonl(cuda_run / "captures.jsonl") if r["arm"] == "user:syncs_the_host.py"]
    assert rows and all(
        not r["captured"] and r["reason"].startswith("cannot be captured in a CUDA graph") for r in rows
    )
    summary = read_json(cuda_run / "summary.json")
    assert "user:syncs_the_host.py" in summary["cases"]["decode-b4-c32"]["arms"]  # eager mode takes it
    assert summary["cases"]["decode-b4-c32-graph"]["excluded"]["user:syncs_the_host.py"].startswith(
        "cannot be captured"
    )


def test_a_memoiser_frozen_into_its_graph_fails_the_timed_checks(cuda_run: Path) -> None:
    """At capture the memoiser serves a cached tensor: the graph copies it on every replay."""
    failed = [r for r in read_jsonl(cuda_run / "timed_checks.jsonl") if r["arm"] == "user:memoises_after_gate.py"]
    graph = [r for r in failed if r["case"].endswith("-graph") and not r["passed"]]
    assert graph and all(r["message"].startswith("wrong result while timed: ") for r in graph)


def test_a_graph_replay_is_attributed_and_beats_python_dispatch(cuda_run: Path) -> None:
    """The tiny model's decode step is all launch overhead eagerly; replayed, the device is busier
    and the step shorter. The replay's kernels align with the annotated eager call's."""
    cases = read_json(cuda_run / "summary.json")["cases"]
    eager, graph = cases["decode-b4-c32"]["arms"]["kerneltrial"], cases["decode-b4-c32-graph"]["arms"]["kerneltrial"]
    assert graph["median_ns"] < eager["median_ns"]
    assert graph["attribution"]["device_busy"] > eager["attribution"]["device_busy"]
    assert graph["attribution"]["share"] is not None and graph["attribution"]["share"] > 0
    # a captured prefill materialises the causal mask (another SDPA kernel): the regions still align
    assert cases["prefill-b2-t16-graph"]["arms"]["kerneltrial"]["attribution"]["share"] is not None
    assert graph["device_vs_floor"] is not None and graph["vs_floor"] > 1
