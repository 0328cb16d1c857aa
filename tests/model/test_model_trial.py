"""Whole-model trials on a tiny Llama through the Triton interpreter: the run, its gate
(call counts, logits against the float32 model, greedy tokens), verify and the report."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kerneltrial.analysis.cli import verify_one
from kerneltrial.analysis.model_report import write_model_report
from kerneltrial.cli import app
from kerneltrial.model import build
from kerneltrial.model.arms import ArmUnavailable, op_table
from kerneltrial.model.build import Router, patch
from kerneltrial.model.runner import ModelRunError, greedy_agreement, run_model_trial
from kerneltrial.model.spec import ProtocolError, parse_protocol
from kerneltrial.rundir.files import read_json, read_jsonl, write_json
from kerneltrial.rundir.layout import kind_of

pytest.importorskip("transformers")

PROTOCOL = """
name = "tiny"
model = "tiny"
rounds = 3
warmup = 1
arms = [{arms}]
[[prefill]]
batch = 1
tokens = 8
[[decode]]
batch = 2
context = 8
[correctness]
prompts = 2
prompt_tokens = 8
greedy_steps = 3
"""

# A user arm whose RMSNorm scales its output by 1.5: plausible-looking, wrong.
SCALED = """
import torch

def rmsnorm(x, weight, eps=1e-6):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (1.5 * x.float() * torch.rsqrt(v + eps) * weight.float()).to(x.dtype)
"""


# A user arm whose RMSNorm ignores its weight (a cheaper kernel that forgot the scale).
NO_WEIGHT = """
import torch

def rmsnorm(x, weight, eps=1e-6):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + eps)).to(x.dtype)
"""


def protocol(tmp_path: Path, arms: str) -> Path:
    path = tmp_path / "model.toml"
    path.write_text(PROTOCOL.format(arms=arms))
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("model")
    (base / "scaled.py").write_text(SCALED)
    return run_model_trial(protocol(base, '"eager", "torch_eager", "kerneltrial", "user:scaled.py"'), base / "run")


def test_a_tiny_model_runs_end_to_end_and_verifies(tiny_run: Path) -> None:
    assert kind_of(tiny_run) == "model"
    rows = {r["arm"]: r for r in read_jsonl(tiny_run / "correctness.jsonl")}
    # 2 layers: eager routes 2 norms per layer and the final one; the patched arms fuse one per layer
    assert rows["eager"]["calls_per_forward"] == {"rmsnorm": 5, "fused_add_rmsnorm": 0, "silu_and_mul": 2}
    assert rows["kerneltrial"]["calls_per_forward"] == {"rmsnorm": 3, "fused_add_rmsnorm": 2, "silu_and_mul": 2}
    assert rows["kerneltrial"]["passed"] and rows["torch_eager"]["passed"]
    assert rows["kerneltrial"]["oracle_rel_error"] <= rows["kerneltrial"]["oracle_rel_error_limit"]
    summary = read_json(tiny_run / "summary.json")
    case = summary["cases"]["decode-b2-c8"]["arms"]
    assert set(case) == {"eager", "torch_eager", "kerneltrial"}
    assert case["kerneltrial"]["samples"] == 3 and "vs_eager" in case["kerneltrial"]
    assert case["kerneltrial"]["attribution"]["regions_ns"].keys() == {"rmsnorm", "fused_add_rmsnorm", "silu_and_mul"}
    assert verify_one(tiny_run).ok
    report = write_model_report(tiny_run).read_text()
    assert "NOT GPU performance" in report and "| kerneltrial | yes |" in report


def test_an_arm_that_changes_the_model_is_caught_and_not_timed(tiny_run: Path) -> None:
    row = next(r for r in read_jsonl(tiny_run / "correctness.jsonl") if r["arm"].startswith("user:"))
    assert not row["passed"]
    assert "from the float32 model" in row["message"]
    assert "greedy tokens diverge from eager at step" in row["message"]
    plan = read_json(tiny_run / "plan.json")
    assert not next(a for a in plan["arms"] if a["name"].startswith("user:"))["timed"]
    assert all(
        not arm.startswith("user:") for arm in read_json(tiny_run / "summary.json")["cases"]["prefill-b1-t8"]["arms"]
    )


def test_an_arm_that_ignores_the_norm_weight_is_caught(tmp_path: Path) -> None:
    """Random norm weights are drawn around 1 (Hugging Face sets them to 1.0, which would hide this)."""
    (tmp_path / "noweight.py").write_text(NO_WEIGHT)
    run = run_model_trial(protocol(tmp_path, '"eager", "user:noweight.py"'), tmp_path / "run")
    row = next(r for r in read_jsonl(run / "correctness.jsonl") if r["arm"] == "user:noweight.py")
    assert not row["passed"] and "from the float32 model" in row["message"]


def test_greedy_divergence_is_a_failure_unless_a_near_tie_or_the_float32_choice() -> None:
    ref_tokens = torch.tensor([[3, 1, 2]])
    exact = ref_tokens.clone()  # the float32 model chose what eager chose
    decided = [
        torch.tensor([[0.0, 0.0, 0.0, 10.0]]),
        torch.tensor([[0.0, 9.0, 0.0, 10.0]]),
        torch.tensor([[0.0, 0.0, 10.0, 9.99]]),
    ]
    same = greedy_agreement(ref_tokens.clone(), ref_tokens, decided, 0.01, exact)
    assert same == {"greedy_identical_steps": 3, "first_divergence": None}
    wide = greedy_agreement(torch.tensor([[3, 3, 2]]), ref_tokens, decided, 0.01, exact)["first_divergence"]
    assert wide["step"] == 1 and not wide["near_tie"] and not wide["agrees_with_float32"]  # margin 1 of 10: a failure
    tie = greedy_agreement(torch.tensor([[3, 1, 3]]), ref_tokens, decided, 0.01, exact)["first_divergence"]
    assert tie["step"] == 2 and tie["near_tie"]  # margin 0.01 of 10
    # eager left the float32 model's path at step 1 and the arm did not: not the arm's error
    eager_off = greedy_agreement(torch.tensor([[3, 3, 2]]), ref_tokens, decided, 0.01, torch.tensor([[3, 3, 0]]))
    assert eager_off["first_divergence"]["agrees_with_float32"] and not eager_off["first_divergence"]["near_tie"]


def tampered(run: Path, tmp_path: Path, edit: Callable[[Path], None]) -> list[str]:
    """The problems verify finds in a copy of `run` edited by `edit`, the manifest rewritten to match
    (as a careful cheater would)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    edit(copy)
    manifest = read_json(copy / "manifest.json")
    for name in manifest:
        manifest[name] = build_sha(copy / name)
    write_json(copy / "manifest.json", manifest)
    return [c.detail for c in verify_one(copy).checks if not c.ok]


def rewrite_csv(path: Path, change: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> None:
    rows = list(csv.DictReader(path.open()))
    columns = list(rows[0])
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerows(change(rows))


def test_verify_catches_a_shrunk_sample(tiny_run: Path, tmp_path: Path) -> None:
    def halve(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        rows[0]["ns"] = str(int(rows[0]["ns"]) // 2)
        return rows

    problems = tampered(tiny_run, tmp_path, lambda d: rewrite_csv(d / "timings.csv", halve))
    assert any("figures:" in p for p in problems), problems


def test_verify_catches_a_reordered_round(tiny_run: Path, tmp_path: Path) -> None:
    def swap(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        rows[0]["arm"], rows[1]["arm"] = rows[1]["arm"], rows[0]["arm"]
        return rows

    problems = tampered(tiny_run, tmp_path, lambda d: rewrite_csv(d / "timings.csv", swap))
    assert any("the seed gives" in p for p in problems), problems


def test_verify_catches_an_arm_hidden_after_it_passed(tiny_run: Path, tmp_path: Path) -> None:
    """torch_eager passed correctness; marking it untimed and dropping its rows and figures is caught."""

    def hide(d: Path) -> None:
        plan = read_json(d / "plan.json")
        next(a for a in plan["arms"] if a["name"] == "torch_eager")["timed"] = False
        write_json(d / "plan.json", plan)
        rewrite_csv(d / "timings.csv", lambda rows: [r for r in rows if r["arm"] != "torch_eager"])
        write_json(d / "summary.json", summary_of(d))

    problems = tampered(tiny_run, tmp_path, hide)
    assert any("gate: torch_eager timed=False but its correctness gives passed=True" in p for p in problems), problems


def test_verify_rederives_every_verdict(tiny_run: Path, tmp_path: Path) -> None:
    def flip(d: Path) -> None:
        summary = read_json(d / "summary.json")
        summary["cases"]["prefill-b1-t8"]["arms"]["kerneltrial"]["vs_eager"]["verdict"] = "win"
        rows = read_jsonl(d / "correctness.jsonl")
        user = next(r for r in rows if r["arm"].startswith("user:"))
        user["passed"], user["message"] = True, ""
        (d / "correctness.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary["correctness"][user["arm"]] = {"passed": True, "message": ""}
        write_json(d / "summary.json", summary)

    problems = tampered(tiny_run, tmp_path, flip)
    assert any("is recorded passed=True, its numbers give False" in p for p in problems), problems
    verdict = read_json(tiny_run / "summary.json")["cases"]["prefill-b1-t8"]["arms"]["kerneltrial"]["vs_eager"][
        "verdict"
    ]
    if verdict != "win":
        assert any("vs_eager" in p for p in problems), problems


def test_verify_holds_the_plan_to_the_protocol(tiny_run: Path, tmp_path: Path) -> None:
    def loosen(d: Path) -> None:
        plan = read_json(d / "plan.json")
        plan["confidence"], plan["tie_band"] = 0.51, 0.5
        write_json(d / "plan.json", plan)
        write_json(d / "summary.json", summary_of(d))

    problems = tampered(tiny_run, tmp_path, loosen)
    assert any("plan: confidence is 0.51" in p and "plan: tie_band is 0.5" in p for p in problems), problems


def summary_of(run: Path) -> dict[str, object]:
    from kerneltrial.model.summary import build

    return build(run)


def build_sha(path: Path) -> str:
    from kerneltrial.rundir.hashing import sha256_file

    return sha256_file(path)


def test_a_norm_the_patcher_does_not_recognise_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose final norm is another class runs it unpatched in every arm: the call
    counts (expected from the config, not from what the patcher found) catch it."""
    real = build.build_model

    def renamed_final_norm(p, device):  # noqa: ANN001, ANN202
        model = real(p, device)
        norm = model.model.norm
        plain = type("FinalNorm", (torch.nn.Module,), {"forward": lambda self, x: norm.__class__.forward(norm, x)})()
        model.model.norm = plain
        return model

    monkeypatch.setattr("kerneltrial.model.runner.build_model", renamed_final_norm)
    with pytest.raises(ModelRunError, match="does not recognise"):
        run_model_trial(protocol(tmp_path, '"eager", "kerneltrial"'), tmp_path / "run")


def test_a_user_function_named_almost_like_an_operator_is_refused(tmp_path: Path) -> None:
    """`rms_norm` instead of `rmsnorm`: the arm would time the torch formula under the user's name."""
    (tmp_path / "typo.py").write_text(
        SCALED.replace("def rmsnorm", "def rms_norm") + "\ndef silu_and_mul(x):\n    return x\n"
    )
    with pytest.raises(ArmUnavailable, match="defines rms_norm, not rmsnorm"):
        op_table("user:typo.py", tmp_path)


def test_a_patched_layer_is_the_same_model(tmp_path: Path) -> None:
    """torch_eager through the patched structure computes eager's logits (the structure
    itself changes nothing but the operators)."""
    p = parse_protocol(PROTOCOL.format(arms='"eager", "torch_eager"'))
    model = build.build_model(p, torch.device("cpu"))
    router = Router(tables={"torch_eager": op_table("torch_eager", tmp_path)})
    found = patch(model, router)
    assert (found.norms, found.mlps, found.layers) == (5, 2, 2)
    ids = torch.randint(0, 512, (2, 8), generator=torch.Generator().manual_seed(0))
    eager = build.prefill_call(model, ids)
    router.arm = "torch_eager"
    patched = build.prefill_call(model, ids)
    assert torch.allclose(eager.float(), patched.float(), rtol=0.05, atol=0.05)
    # a repeated decode step on one cache gives the same logits (the cache is rewound)
    cache = build.static_cache(model, 12)
    build.step(model, cache, ids, 0)
    first = build.step(model, cache, ids[:, :1], 8)
    assert torch.equal(first, build.step(model, cache, ids[:, :1], 8))


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ('"kerneltrial"', "must include 'eager'"),
        ('"eager", "mystery"', "unknown arm 'mystery'"),
        ('"eager", "eager"', "repeat"),
    ],
)
def test_bad_protocols_name_the_fix(arms: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_protocol(PROTOCOL.format(arms=arms))


def test_the_command_line_refuses_a_bad_protocol_with_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", str(protocol(tmp_path, '"kerneltrial"')), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "must include 'eager'" in result.output


def test_the_committed_model_protocol_parses() -> None:
    from tests.conftest import REPO

    p = parse_protocol((REPO / "protocols/model/minicpm5-2b.toml").read_text())
    assert {"eager", "kerneltrial", "liger", "torch_compile"} <= set(p.arms)
    assert {c.id for c in p.decode} >= {"decode-b1-c512", "decode-b64-c512"}
    assert json.dumps(p.model_dump())  # a plain record
