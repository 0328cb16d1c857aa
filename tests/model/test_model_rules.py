"""The model trial's rules, each on its own: the teacher-forced gate against planted arms, the
fresh-input draws (and verify's independent redraw), the weight-read floor's bytes, the graph
attribution's kernel alignment, and a capture failure's records (through a stand-in capture:
the CPU has no CUDA graph; tests/model/test_graph_cuda.py captures real ones)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kerneltrial.cli.analysis import verify_one
from kerneltrial.model import build, cases
from kerneltrial.model.arms import op_table
from kerneltrial.model.attribution import align
from kerneltrial.model.floor import floor_bytes, kv_cache_bytes, weight_bytes
from kerneltrial.model.gate import Reference, check_arm, oracle_of, rule_problems
from kerneltrial.model.graphs import CaptureFailed
from kerneltrial.model.inputs import draw, ids_sha256, round_seed
from kerneltrial.model.runner import run_model_trial
from kerneltrial.model.spec import PRESETS, Correctness, parse_protocol
from kerneltrial.model.verify import copy_gbps, input_seed, llama_weight_bytes, redraw
from kerneltrial.rundir.files import read_json, read_jsonl
from tests.conftest import REPO
from tests.kt import write_protocol

# one xdist worker for the whole module: its module-scoped fixture (gate_rows) is built once,
# not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("model/test_model_rules")

pytest.importorskip("transformers")

PLANTED = REPO / "tests" / "fixtures" / "planted" / "model"
TINY = """
name = "tiny"
model = "tiny"
rounds = 2
warmup = 1
arms = [{arms}]
modes = ["eager", "graph"]
[[prefill]]
batch = 1
tokens = 4
[[decode]]
batch = 2
context = 4
[correctness]
prompts = 2
prompt_tokens = 6
steps = 4
"""


@pytest.fixture(scope="module")
def gate_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """The teacher-forced gate's row of each planted arm on the tiny model (eager first)."""
    base = tmp_path_factory.mktemp("gate")
    planted = ["scaled_norm.py", "norm_ignores_weight.py", "reordered_norm.py"]
    for name in planted:
        shutil.copy(PLANTED / name, base / name)
    p = parse_protocol(TINY.format(arms='"eager"'))
    model = build.build_model(p, torch.device("cpu"))
    prompts = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(3))
    oracle = oracle_of(model, prompts, p.correctness.steps)
    arms = ["torch_eager", *(f"user:{name}" for name in planted)]
    router = build.Router(tables={arm: op_table(arm, base) for arm in arms})
    build.patch(model, router)
    rows, reference = {}, None
    for arm in ["eager", *arms]:
        rows[arm], made = check_arm(model, router, arm, p.correctness, oracle, reference, prompts)
        reference = reference or made
    return rows


@pytest.mark.parametrize("arm", ["user:scaled_norm.py", "user:norm_ignores_weight.py"])
def test_the_teacher_forced_gate_fails_a_wrong_norm(gate_rows: dict[str, dict[str, object]], arm: str) -> None:
    row = gate_rows[arm]
    assert not row["passed"]
    assert "teacher-forced logits are" in str(row["message"]) and "from the float32 model" in str(row["message"])


def test_the_teacher_forced_gate_passes_an_honest_reduction_order(gate_rows: dict[str, dict[str, object]]) -> None:
    for arm in ("torch_eager", "user:reordered_norm.py"):
        row = gate_rows[arm]
        assert row["passed"], row["message"]
        assert row["oracle_rel_error"] <= row["oracle_rel_error_limit"] and row["top1_agreement"] >= row["top1_limit"]
    assert gate_rows["user:reordered_norm.py"]["logits_rel_diff"] > 0  # its rounding is not eager's
    # 2 prompts x 4 steps, each step's logits from the same prefix in every arm
    assert np.array(gate_rows["eager"]["top1_tokens"]).shape == (2, 4)


def test_the_top1_rule_fails_an_arm_close_in_distance_but_off_in_choices() -> None:
    """A planted row: within the distance limit, two top-1 flips more than eager's margin allows."""
    rule = Correctness(top1_margin=0.05)
    eager = Reference(logits=torch.zeros(1), distance=0.01, top1=1.0)
    row = {"oracle_rel_error": 0.015, "oracle_rel_error_limit": 0.02, "top1_agreement": 0.75, "top1_limit": 0.95}
    assert rule_problems(row, rule, eager) == [
        "top-1 agreement with the float32 model 0.750 is below eager's 1.000 minus the margin 0.05"
    ]


def test_each_round_draws_its_own_inputs_and_verify_redraws_them() -> None:
    decode = {"phase": "decode", "batch": 3, "context": 9}
    seeds = {round_seed(0, "decode-b3-c9", r) for r in (-1, 0, 1)}
    assert len(seeds) == 3 and round_seed(0, "decode-b3-c9", 0) == input_seed(0, "decode-b3-c9", 0)
    for seed in seeds:
        drawn = draw(seed, 512, 3, 1, 4, 9)
        assert drawn.positions is not None
        assert drawn.positions == sorted(set(drawn.positions), reverse=True)  # distinct, decreasing
        assert all(5 <= q <= 9 for q in drawn.positions)  # the context's upper half
        assert [(q, ids_sha256(a)) for q, a in zip(drawn.positions, drawn.ids, strict=True)] == redraw(
            seed, 512, decode, 4
        )
    prefill = draw(7, 512, 2, 5, 2, None)
    assert prefill.positions is None and prefill.ids[0].shape == (2, 5)
    assert [(-1, ids_sha256(a)) for a in prefill.ids] == redraw(
        7, 512, {"phase": "prefill", "batch": 2, "tokens": 5}, 2
    )


def test_the_floor_reads_every_weight_once_and_the_static_cache() -> None:
    """MiniCPM5-2B (on the meta device: shapes only) reads 4.50 GB of weights per call, as
    issue 27 states; verify's Llama formula agrees with the model's own parameters."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**PRESETS["minicpm5-2b"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    weights = weight_bytes(model)
    assert weights == llama_weight_bytes(config.to_dict(), 2)
    assert round(weights / 1e9, 2) == 4.50
    kv = kv_cache_bytes(config, batch=1, length=513, element_size=2)
    assert kv == 2 * 42 * 2 * 128 * 513 * 2
    got = floor_bytes(model, tokens=1, batch=1, cache_length=513)
    assert (got.weights, got.embedding_rows, got.kv_cache) == (weights, 2048 * 2, kv)
    assert floor_bytes(model, tokens=4096, batch=1, cache_length=0).kv_cache == 0


def test_the_copy_rate_needs_every_sample() -> None:
    rows = [{"sample": str(i), "bytes": "2000", "ns": str(ns)} for i, ns in enumerate((1000, 500, 400))]
    assert copy_gbps(rows) == 4.0  # the median of 2, 4 and 5 bytes per ns
    assert copy_gbps(rows[1:]) is None  # sample 0 dropped
    assert copy_gbps([*rows[:2], {"sample": "2", "bytes": "2000", "ns": "0"}]) is None


def test_replayed_kernels_take_the_labels_of_the_annotated_call() -> None:
    eager = [("embed", None, 5), ("rms", "rmsnorm", 3), ("sdpa_flash", None, 9), ("silu", "silu_and_mul", 2)]
    # under capture: a mask kernel added, another attention kernel; the region kernels align
    replay = [("embed", 4), ("mask", 1), ("rms", 2), ("sdpa_masked", 12), ("silu", 2)]
    assert align(eager, replay) == [
        ("embed", None, 4),
        ("mask", None, 1),
        ("rms", "rmsnorm", 2),
        ("sdpa_masked", None, 12),
        ("silu", "silu_and_mul", 2),
    ]
    assert align(eager, [("embed", 4), ("sdpa_masked", 12), ("silu", 2)]) is None  # a region kernel is missing


def test_an_arm_that_cannot_be_captured_is_left_out_of_the_graph_cases_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in capture refuses eager in the first graph case (the case runs no rounds) and
    the reordered arm in the second; both are recorded, summarised and verified."""
    real = cases.capture
    made = []

    def refuses(fn, device, pool):  # noqa: ANN001, ANN202
        made.append(None)
        if len(made) in (1, 6):  # prefill-graph's eager; decode-graph's third arm
            raise CaptureFailed("cannot be captured in a CUDA graph: RuntimeError: planted")
        return real(fn, device, pool)

    monkeypatch.setattr(cases, "capture", refuses)
    shutil.copy(PLANTED / "reordered_norm.py", tmp_path / "reordered_norm.py")
    write_protocol(tmp_path / "p.toml", TINY, arms='"eager", "torch_eager", "user:reordered_norm.py"')
    run = run_model_trial(tmp_path / "p.toml", tmp_path / "run")
    captures = {(r["case"], r["arm"]): r for r in read_jsonl(run / "captures.jsonl")}
    assert not captures[("prefill-b1-t4-graph", "eager")]["captured"]
    assert not captures[("decode-b2-c4-graph", "user:reordered_norm.py")]["captured"]
    summary = read_json(run / "summary.json")["cases"]
    assert summary["prefill-b1-t4-graph"]["arms"] == {}
    assert set(summary["prefill-b1-t4-graph"]["excluded"]) == {"eager", "torch_eager", "user:reordered_norm.py"}
    assert set(summary["decode-b2-c4-graph"]["arms"]) == {"eager", "torch_eager"}
    assert summary["decode-b2-c4-graph"]["excluded"] == {
        "user:reordered_norm.py": "cannot be captured in a CUDA graph: RuntimeError: planted"
    }
    assert "user:reordered_norm.py" in summary["decode-b2-c4"]["arms"]  # eager mode still times it
    result = verify_one(run)
    assert result.ok, [c for c in result.checks if not c.ok]


def test_the_committed_schema_2_run_is_read_by_its_own_rules(tmp_path: Path) -> None:
    """results/h200/minicpm5-2b-model (free-running greedy rule, `greedy_steps` and `near_tie` in
    its protocol) verifies through verify_legacy; passing its failed torch_compile arm is caught."""
    import json

    from kerneltrial.rundir.hashing import sha256_file

    run = shutil.copytree(REPO / "results" / "h200" / "minicpm5-2b-model", tmp_path / "run")
    assert verify_one(run).ok
    rows = read_jsonl(run / "correctness.jsonl")
    row = next(r for r in rows if r["arm"] == "torch_compile")
    row["passed"], row["message"] = True, ""
    (run / "correctness.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = read_json(run / "manifest.json")
    manifest["correctness.jsonl"] = sha256_file(run / "correctness.jsonl")
    (run / "manifest.json").write_text(json.dumps(manifest))
    problems = [c.detail for c in verify_one(run).checks if not c.ok]
    assert any("gate: torch_compile is recorded passed=True, its numbers give False" in p for p in problems), problems


@pytest.mark.parametrize(
    ("arm", "ours"),
    [("E1", {"rmsnorm", "fused_add_rmsnorm"}), ("E2", {"silu_and_mul"}), ("E3", set(build.OPS))],
)
def test_a_track2_arm_replaces_only_its_operators(arm: str, ours: set[str]) -> None:
    """E1-E3 run kerneltrial's kernels for what the serving arm replaces and the torch formulas
    (torch_eager, the structure's control) for the rest, the same functions those arms run."""
    table, kernels, formulas = op_table(arm, REPO), op_table("kerneltrial", REPO), op_table("torch_eager", REPO)
    for op in build.OPS:
        expected = kernels if op in ours else formulas
        assert getattr(table, op) is getattr(expected, op), op
        assert table.sources[op] == f"{op}/{'kerneltrial' if op in ours else 'torch_eager'}"
    assert parse_protocol(
        f'name = "t"\nmodel = "tiny"\narms = ["eager", "{arm}"]\n[[decode]]\nbatch = 1\ncontext = 8\n'
    ).arms == ("eager", arm)
