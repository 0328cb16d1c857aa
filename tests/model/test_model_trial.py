"""Whole-model trials on a tiny Llama through the Triton interpreter: the run in both modes, its
gate (call counts, teacher-forced logits against the float32 model), fresh inputs and timed
checks, verify and the report."""

from __future__ import annotations

import ast
import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kerneltrial.analysis.model_report import write_model_report
from kerneltrial.cli.analysis import verify_one
from kerneltrial.model import build
from kerneltrial.model.arms import ArmUnavailable, op_table
from kerneltrial.model.build import Router, patch
from kerneltrial.model.runner import ModelRunError, run_model_trial
from kerneltrial.model.spec import ProtocolError, parse_protocol
from kerneltrial.rundir.files import read_csv, read_json, read_jsonl, write_json
from kerneltrial.rundir.layout import kind_of
from tests.conftest import REPO
from tests.kt import run_cli, write_protocol

# one xdist worker for the whole module: its module-scoped fixture (tiny_run) is built once,
# not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("model/test_model_trial")

pytest.importorskip("transformers")

PROTOCOL = """
name = "tiny"
model = "tiny"
rounds = 3
warmup = 1
arms = [{arms}]
modes = [{modes}]
[[prefill]]
batch = 1
tokens = 8
[[decode]]
batch = 2
context = 8
[correctness]
prompts = 2
prompt_tokens = 8
steps = 3
"""

PLANTED = REPO / "tests" / "fixtures" / "planted" / "model"
USER_ARMS = ("scaled_norm.py", "reordered_norm.py", "memoises_after_gate.py")


def protocol(tmp_path: Path, arms: str, modes: str = '"eager"') -> Path:
    path = write_protocol(tmp_path / "model.toml", PROTOCOL, arms=arms, modes=modes)
    for name in (*USER_ARMS, "norm_ignores_weight.py"):
        shutil.copy(PLANTED / name, tmp_path / name)
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both modes (graph: the CPU stand-in), our kernels, a wrong arm, an honest one and a memoiser."""
    base = tmp_path_factory.mktemp("model")
    arms = ", ".join(['"eager"', '"torch_eager"', '"kerneltrial"', *(f'"user:{a}"' for a in USER_ARMS)])
    return run_model_trial(protocol(base, arms, '"eager", "graph"'), base / "run")


def test_a_tiny_model_runs_end_to_end_and_verifies(tiny_run: Path) -> None:
    assert kind_of(tiny_run) == "model"
    rows = {r["arm"]: r for r in read_jsonl(tiny_run / "correctness.jsonl")}
    # 2 layers: eager routes 2 norms per layer and the final one; the patched arms fuse one per layer
    assert rows["eager"]["calls_per_forward"] == {"rmsnorm": 5, "fused_add_rmsnorm": 0, "silu_and_mul": 2}
    assert rows["kerneltrial"]["calls_per_forward"] == {"rmsnorm": 3, "fused_add_rmsnorm": 2, "silu_and_mul": 2}
    assert rows["kerneltrial"]["passed"] and rows["torch_eager"]["passed"]
    assert rows["kerneltrial"]["oracle_rel_error"] <= rows["kerneltrial"]["oracle_rel_error_limit"]
    summary = read_json(tiny_run / "summary.json")
    assert set(summary["cases"]) == {"prefill-b1-t8", "decode-b2-c8", "prefill-b1-t8-graph", "decode-b2-c8-graph"}
    for cid in ("decode-b2-c8", "decode-b2-c8-graph"):
        case = summary["cases"][cid]["arms"]
        assert set(case) == {"eager", "torch_eager", "kerneltrial", "user:reordered_norm.py"}
        assert case["kerneltrial"]["samples"] == 3 and "vs_eager" in case["kerneltrial"]
        regions = case["kerneltrial"]["attribution"]["regions_ns"]
        assert regions.keys() == {"rmsnorm", "fused_add_rmsnorm", "silu_and_mul"}
        assert case["kerneltrial"]["vs_floor"] > 1  # the interpreter is far above any floor
    result = verify_one(tiny_run)
    assert result.ok, [c for c in result.checks if not c.ok]
    report = write_model_report(tiny_run).read_text()
    assert "NOT GPU performance" in report and "| kerneltrial | yes |" in report
    assert "decode-b2-c8-graph (decode, graph mode" in report and "x floor" in report


def test_every_arm_is_captured_in_graph_mode_with_the_models_call_counts(tiny_run: Path) -> None:
    captures = read_jsonl(tiny_run / "captures.jsonl")
    timed = {a["name"] for a in read_json(tiny_run / "plan.json")["arms"] if a["timed"]}
    assert {(r["case"], r["arm"]) for r in captures} == {
        (c, a) for c in ("prefill-b1-t8-graph", "decode-b2-c8-graph") for a in timed
    }
    assert all(r["captured"] and r["calls_per_forward"] == r["expected_calls_per_forward"] for r in captures)
    assert read_json(tiny_run / "plan.json")["graph_label"].startswith("CPU stand-in")


def test_every_timed_call_ran_on_fresh_inputs(tiny_run: Path) -> None:
    """Each round of a case draws its own prompts (prefill) or tokens and cache positions (decode)."""
    rows = read_csv(tiny_run / "inputs.csv")
    for cid in ("prefill-b1-t8", "decode-b2-c8-graph"):
        mine = [r for r in rows if r["case"] == cid]
        assert sorted(int(r["round"]) for r in mine) == [-1, 0, 1, 2]  # the warm-up round too
        assert len({r["ids_sha256"] for r in mine}) == 4 and len({r["seed"] for r in mine}) == 4
    positions = {int(r["position"]) for r in rows if r["case"] == "decode-b2-c8"}
    assert positions <= set(range(5, 9)) and len(positions) > 1  # the upper half of the 8-token context


def test_an_arm_that_changes_the_model_is_caught_and_not_timed(tiny_run: Path) -> None:
    row = next(r for r in read_jsonl(tiny_run / "correctness.jsonl") if r["arm"] == "user:scaled_norm.py")
    assert not row["passed"]
    assert "teacher-forced logits are" in row["message"] and "from the float32 model" in row["message"]
    plan = read_json(tiny_run / "plan.json")
    assert not next(a for a in plan["arms"] if a["name"] == "user:scaled_norm.py")["timed"]
    cases = read_json(tiny_run / "summary.json")["cases"].values()
    assert all("user:scaled_norm.py" not in c["arms"] for c in cases)


def test_an_arm_that_memoises_on_its_input_fails_the_timed_checks(tiny_run: Path) -> None:
    """It passes the gate (honest for its first calls), then serves cached norms keyed on the
    input's shape and weight: right for a repeated prompt, wrong on every fresh one."""
    arm = "user:memoises_after_gate.py"
    assert next(r for r in read_jsonl(tiny_run / "correctness.jsonl") if r["arm"] == arm)["passed"]
    failed = [r for r in read_jsonl(tiny_run / "timed_checks.jsonl") if r["arm"] == arm and not r["passed"]]
    assert failed and all(r["message"].startswith("wrong result while timed: ") for r in failed)
    assert {r["case"] for r in failed} >= {"decode-b2-c8", "decode-b2-c8-graph"}
    summary = read_json(tiny_run / "summary.json")
    for cid in ("decode-b2-c8", "decode-b2-c8-graph"):
        assert arm not in summary["cases"][cid]["arms"]
        assert summary["cases"][cid]["excluded"][arm].startswith("wrong result while timed: ")
    honest = [r for r in read_jsonl(tiny_run / "timed_checks.jsonl") if r["arm"] != arm]
    assert all(r["passed"] for r in honest)  # ours, torch_eager and the reordered norm pass every check


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

    return build(run).as_json()


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
        (PLANTED / "scaled_norm.py").read_text().replace("def rmsnorm", "def rms_norm")
        + "\ndef silu_and_mul(x):\n    return x\n"
    )
    with pytest.raises(ArmUnavailable, match="defines rms_norm, not rmsnorm"):
        op_table("user:typo.py", tmp_path)


def test_a_patched_layer_is_the_same_model(tmp_path: Path) -> None:
    """torch_eager through the patched structure computes eager's logits (the structure
    itself changes nothing but the operators)."""
    p = parse_protocol(PROTOCOL.format(arms='"eager", "torch_eager"', modes='"eager"'))
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
        parse_protocol(PROTOCOL.format(arms=arms, modes='"eager"'))


def test_the_command_line_refuses_a_bad_protocol_with_exit_2(tmp_path: Path) -> None:
    result = run_cli("model", str(protocol(tmp_path, '"kerneltrial"')), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "must include 'eager'" in result.output


def test_the_committed_model_protocol_parses() -> None:
    p = parse_protocol((REPO / "protocols/model/minicpm5-2b.toml").read_text())
    assert {"eager", "kerneltrial", "liger", "torch_compile"} <= set(p.arms)
    assert {c.id for c in p.decode} >= {"decode-b1-c512", "decode-b64-c512"}
    assert json.dumps(p.model_dump())  # a plain record


def _edit_jsonl(path: Path, change: Callable[[list[dict[str, object]]], None]) -> None:
    rows = read_jsonl(path)
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_json(path: Path, change: Callable[[dict[str, object]], None]) -> None:
    data = read_json(path)
    change(data)
    write_json(path, data)


def _forge_digest(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    rows[0]["ids_sha256"] = "0" * 64  # the inputs a round claims are not what its seed draws
    return rows


def _pass_the_memoiser(rows: list[dict[str, object]]) -> None:
    for r in rows:
        if r["arm"] == "user:memoises_after_gate.py":
            r["passed"], r["message"] = True, ""


def _uncapture(rows: list[dict[str, object]]) -> None:
    row = next(r for r in rows if r["arm"] == "torch_eager")
    row["captured"], row["reason"] = False, "forged"


def _forge_top1(rows: list[dict[str, object]]) -> None:
    row = next(r for r in rows if r["arm"] == "kerneltrial")
    row["top1_agreement"] = 1.0 - float(row["top1_agreement"]) / 2


def _slow_copies(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    for r in rows:
        r["ns"] = str(2 * int(r["ns"]))  # a slower copy would lower every floor's rate
    return rows


def _heavier_weights(plan: dict[str, object]) -> None:
    plan["cases"][0]["floor_bytes"]["weights"] += 2  # type: ignore[index]


def _downgrade(summary: dict[str, object]) -> None:
    summary["schema"] = "kerneltrial.model-summary/2"  # read as an old run, schema 3's checks would be skipped


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: rewrite_csv(d / "inputs.csv", _forge_digest), "inputs: prefill-b1-t8 round -1's inputs are not"),
        (lambda d: _edit_jsonl(d / "timed_checks.jsonl", _pass_the_memoiser), "checks: decode-b2-c8 round"),
        (lambda d: _edit_jsonl(d / "captures.jsonl", _uncapture), "rounds: prefill-b1-t8-graph round 0 ran"),
        (lambda d: _edit_jsonl(d / "correctness.jsonl", _forge_top1), "gate: kerneltrial's top-1 agreement"),
        (lambda d: rewrite_csv(d / "copies.csv", _slow_copies), "figures: the copy rate"),
        (lambda d: _edit_json(d / "plan.json", _heavier_weights), "floor bytes"),
        (lambda d: _edit_json(d / "summary.json", _downgrade), "schema: plan.json is schema 3's"),
    ],
    ids=["input digest", "timed check", "capture", "top-1", "copy rate", "floor bytes", "schema downgrade"],
)
def test_verify_catches_forged_schema_3_records(
    tiny_run: Path, tmp_path: Path, edit: Callable[[Path], None], message: str
) -> None:
    problems = tampered(tiny_run, tmp_path, edit)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("name", ["verify", "verify_common", "verify_legacy"])
def test_model_verify_imports_neither_the_summary_builder_nor_stats(name: str) -> None:
    """verify re-derives every figure with its own code: it reads summary.json as rundir's record, never
    through the code that built it (model/summary.py, kerneltrial/stats.py, the runner)."""
    tree = ast.parse((REPO / "src" / "kerneltrial" / "model" / f"{name}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported |= {node.module or ""} | {f"{node.module}.{alias.name}" for alias in node.names}
    assert not imported & {"kerneltrial.stats", "kerneltrial.model.summary", "kerneltrial.model.runner"}


def _drop_a_median(run: Path) -> None:
    (run / "report.md").unlink(missing_ok=True)  # the page is rendered from the summary verify refuses
    _edit_json(run / "summary.json", lambda s: s["cases"]["prefill-b1-t8"]["arms"]["eager"].pop("median_ns"))  # type: ignore[index]


def test_verify_names_the_key_of_a_summary_that_does_not_read(tiny_run: Path, tmp_path: Path) -> None:
    problems = tampered(tiny_run, tmp_path, _drop_a_median)
    assert any(p.startswith("summary: ") and "eager.median_ns: Field required" in p for p in problems), problems


def test_a_frozen_model_protocol_is_refused_once_edited(tmp_path: Path) -> None:
    path = protocol(tmp_path, '"eager"')
    frozen = run_cli("protocol", "freeze", str(path))
    assert frozen.exit_code == 0, frozen.output
    path.write_text(path.read_text() + "# an edit after the freeze\n")
    result = run_cli("model", str(path), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "changed after it was frozen" in result.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda run: _edit_json(run / "plan.json", lambda p: p.update(frozen_at="2026-01-01T00:00:00+00:00")),
            "not frozen",
        ),
        (
            lambda run: _edit_json(
                run / "provenance.json", lambda p: p.update(freeze={"sha256": "0" * 64, "frozen_at": "2026-01-01"})
            ),
            "not of this protocol.toml",
        ),
        (lambda run: _edit_json(run / "provenance.json", lambda p: p.pop("freeze")), "records its freeze"),
    ],
    ids=["claims-frozen", "another-protocols-record", "record-removed"],
)
def test_verify_checks_the_freeze_record(
    tiny_run: Path, tmp_path: Path, edit: Callable[[Path], None], message: str
) -> None:
    assert any(message in p for p in tampered(tiny_run, tmp_path, edit))


def test_the_track2_protocol_is_frozen_with_every_arm() -> None:
    path = REPO / "protocols/model/minicpm5-2b-track2.toml"
    p = parse_protocol(path.read_text())
    assert {"eager", "torch_compile", "E1", "E2", "E3"} <= set(p.arms) and p.modes == ("eager", "graph")
    record = json.loads(path.with_name(path.name + ".freeze.json").read_text())
    assert record["sha256"] == build_sha(path)
