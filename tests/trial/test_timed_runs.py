"""What is timed is what was checked: planted cheats that pass the gate are caught while timed
(tests/fixtures/planted/, each file's header says what is wrong), and the honest arms of the
same run are unaffected."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kerneltrial.ops.registry import Case, Impl, get_op, load_user_module
from kerneltrial.trial import gate, guard
from kerneltrial.trial.runner import RunError, run_trial
from tests.conftest import REPO
from tests.kt import run_cli, run_process, write_protocol

# one xdist worker for the whole module: its module-scoped fixture (cheat_run) is built once,
# not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("trial/test_timed_runs")

PLANTED = REPO / "tests" / "fixtures" / "planted"
# The late cheats turn after 40 calls: more than the gate makes for two seeds (at most 16 a check:
# 4 warm-ups, the checked call, the repeat, 2 stale-result calls, 8 extra shapes), fewer than the
# gate and the timed calls together (2 seeds x (1 warm-up + 3 rounds x 8 calls) = 50 timed).
CHEATS = {  # arm -> the message its timed checks must carry
    "user:stale_after_warmup": "wrong result while timed: ",
    "user:watches_the_gate": "wrong result while timed: ",
    "user:pointer_cache": "wrong result while timed: ",
    "user:sabotages_late": "modified its inputs while timed: weight",
    "user:raises_when_timed": "raised while timed: RuntimeError",
}

PROTOCOL = """
name = "planted-cheats"
op = "rmsnorm"
candidates = ["packed_r4_w4", "user:pointer_version_cache", {cheats}]
impl_modules = [{modules}]
seeds = [0, 1]
rounds = 3
warmup = 1
calls_per_sample = 8
l2 = "hot"
isolate = "none"  # the checks of arms in kerneltrial's process (isolated: tests/trial/test_isolation.py)
[[cases]]
shape = [4, 64]
"""


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cheat_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cheats")
    names = [*(n.removeprefix("user:") for n in CHEATS), "pointer_version_cache"]
    cheats = ", ".join(f'"{n}"' for n in CHEATS)
    modules = ", ".join(f'"{PLANTED / n}.py"' for n in names)
    protocol = write_protocol(tmp / "p.toml", PROTOCOL, cheats=cheats, modules=modules)
    return run_trial(protocol, tmp / "run")


def test_cheats_pass_the_gate_and_are_caught_while_timed(cheat_run: Path):
    gate_rows = rows(cheat_run / "correctness.jsonl")
    assert all(r["passed"] for r in gate_rows), [r for r in gate_rows if not r["passed"]]  # the gate was fooled
    checks = rows(cheat_run / "timed_checks.jsonl")
    for arm, message in CHEATS.items():
        failed = [r["message"] for r in checks if r["arm"] == arm and not r["passed"]]
        assert failed and all(m.startswith(message.split(":")[0]) for m in failed), (arm, failed)
        assert any(m.startswith(message) for m in failed), (arm, failed)


def test_honest_arms_of_the_same_run_are_unaffected(cheat_run: Path):
    checks = rows(cheat_run / "timed_checks.jsonl")
    for arm in ("control", "packed_r4_w4", "user:pointer_version_cache"):
        mine = [r for r in checks if r["arm"] == arm]
        assert len(mine) == 2 * 3 and all(r["passed"] for r in mine), (arm, mine)


def test_an_arm_that_raises_leaves_the_case_and_the_run_finishes(cheat_run: Path):
    checks = [r for r in rows(cheat_run / "timed_checks.jsonl") if r["arm"] == "user:raises_when_timed"]
    raised = [r for r in checks if r["message"].startswith("raised while timed")]
    assert len(raised) == 1 and checks[-1] == raised[0]  # nothing after it
    timed = (cheat_run / "timings.csv").read_text()
    assert timed.count("user:raises_when_timed") == len(checks) - 1  # a row per sample that ran
    assert json.loads((cheat_run / "provenance.json").read_text())["finished_at"]


def test_every_timing_row_has_its_check_and_the_same_values_for_every_arm(cheat_run: Path):
    checks = {(r["seed"], r["round"], r["arm"]): r for r in rows(cheat_run / "timed_checks.jsonl")}
    lines = (cheat_run / "timings.csv").read_text().splitlines()[1:]
    for line in lines:
        _, seed, round_index, _, arm, *_ = line.split(",")
        assert (int(seed), int(round_index), arm) in checks
    seeds_per_unit: dict[tuple[int, int], set[int]] = {}
    for (seed, round_index, _), r in checks.items():
        seeds_per_unit.setdefault((seed, round_index), set()).add(r["values_seed"])
    assert all(len(v) == 1 for v in seeds_per_unit.values())
    assert len({next(iter(v)) for v in seeds_per_unit.values()}) == len(seeds_per_unit)  # fresh per unit


def test_a_pointer_and_version_cache_never_serves_a_timed_call(cheat_run: Path):
    module = sys.modules["kerneltrial_user_pointer_version_cache"]
    assert module.HITS[0] == 0
    assert module.CACHE  # it did cache: the misses are the version bumps, not an unused cache


def test_every_file_is_in_the_manifest(cheat_run: Path):
    manifest = json.loads((cheat_run / "manifest.json").read_text())
    present = {p.relative_to(cheat_run).as_posix() for p in cheat_run.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == present and "source.tar.gz" in present


# ---- the gate on guarded inputs -------------------------------------------------------------


def planted(op_name: str, stem: str) -> Impl:
    return next(i for i in load_user_module(str(PLANTED / f"{stem}.py")) if i.op == op_name)


def test_a_persistent_output_buffer_is_caught():
    op = get_op("rmsnorm")
    result = gate.check(op, planted("rmsnorm", "persistent_buffer"), Case((4, 64)), 0, torch.device("cpu"))
    assert not result.passed and result.message.startswith("returns a persistent buffer")


def test_a_write_past_the_end_of_an_in_place_output_is_caught():
    op = get_op("fused_add_rmsnorm")
    result = gate.check(op, planted("fused_add_rmsnorm", "writes_past_residual"), Case((4, 64)), 0, torch.device("cpu"))
    assert not result.passed and result.message.startswith("wrote outside its output")


def test_a_write_into_strided_padding_is_caught():
    op = get_op("rmsnorm")
    values = op.make_inputs(Case((4, 64), layout="row_strided"), 0, torch.device("cpu"))
    g = guard.guard(values)
    assert guard.problems(op, g, values) == ""
    x = g.inputs["x"]
    torch.as_strided(x, (1,), (1,), x.storage_offset() + x.shape[-1]).fill_(7)  # the gap after row 0
    assert guard.problems(op, g, values).startswith("wrote outside its output")


def test_exact_mode_catches_a_skipped_rounding_step_the_tolerance_lets_through():
    op = get_op("zimage_qk_rmsnorm")
    impl = planted("zimage_qk_rmsnorm", "skips_rounding")
    case = op.small_cases[0]
    loose = gate.check(op, impl, case, 0, torch.device("cpu"))
    exact = gate.check(op, impl, case, 0, torch.device("cpu"), exact=True)
    assert loose.passed and sum(loose.ulp_hist[1:]) > 0  # the histogram shows what the tolerance hides
    assert not exact.passed and "exact equality" in exact.message
    control = gate.check(op, op.impl("control"), case, 0, torch.device("cpu"), exact=True)
    assert control.passed and control.ulp_hist[1:] == [0] * 5


def test_the_gate_does_not_make_a_fixed_number_of_calls():
    op = get_op("rmsnorm")
    counts = []
    for seed in range(6):
        calls = [0]

        def counting(x, weight, eps=1e-6, calls=calls):
            calls[0] += 1
            return op.reference(x, weight, eps)[0]

        assert gate.check(
            op,
            Impl(op="rmsnorm", name="counting", kind="user", loader=lambda f=counting: f),
            Case((4, 64)),
            seed,
            torch.device("cpu"),
        ).passed
        counts.append(calls[0])
    assert len(set(counts)) > 1, counts


# ---- protocols whose arms cannot run are refused before any work ------------------------------


def test_a_peer_as_control_is_refused_before_any_work(tmp_path: Path):
    protocol = write_protocol(
        tmp_path / "p.toml",
        'name = "x"\nop = "rmsnorm"\ncontrol = "torch_eager"\ncandidates = ["control"]\n[[cases]]\nshape = [4, 64]\n',
    )
    with pytest.raises(RunError, match="not a control"):
        run_trial(protocol, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_protocol_new_names_a_users_kernel_as_an_arm(tmp_path: Path):

    from kerneltrial.trial import protocol as proto

    out = tmp_path / "p.toml"
    result = run_cli(
        "protocol",
        "new",
        "rmsnorm",
        "--out",
        str(out),
        "--shape",
        "4x64",
        "--impl-module",
        str(REPO / "tests" / "fixtures" / "good_rmsnorm.py"),
    )
    assert result.exit_code == 0, result.output
    written = proto.parse(out.read_text())
    assert written.candidates == ["user:good_rmsnorm"] and written.impl_modules[0].endswith("good_rmsnorm.py")


def test_freeze_refuses_a_protocol_whose_arms_cannot_run(tmp_path: Path):

    protocol = write_protocol(
        tmp_path / "p.toml", 'name = "x"\nop = "rmsnorm"\ncandidates = ["no_such_kernel"]\n[[cases]]\nshape = [4, 64]\n'
    )
    result = run_cli("protocol", "freeze", str(protocol))
    assert result.exit_code == 2 and "unknown implementation 'no_such_kernel'" in result.output
    assert not (tmp_path / "p.toml.freeze.json").exists()


def test_run_exits_1_when_no_arm_passes_the_gate_and_logs_progress_lines(tmp_path: Path):

    protocol = write_protocol(
        tmp_path / "p.toml",
        PROTOCOL.format(cheats='"user:raises_when_timed"', modules=f'"{PLANTED / "raises_when_timed.py"}"')
        .replace('"packed_r4_w4", "user:pointer_version_cache", ', "")
        .replace("rounds = 3", "rounds = 12"),
    )
    result = run_cli("run", str(protocol), "--out", str(tmp_path / "run"))
    assert result.exit_code == 1, result.output
    assert "gate failed by user:raises_when_timed" in result.output and "passed by: no arm" in result.output
    assert "timing: " in result.output and "correctness: " in result.output  # plain progress lines: not a terminal


def test_a_pointer_and_version_cache_from_the_first_call_is_caught_by_the_gate():
    """Values written without a version bump (as a Triton kernel writes) expose it."""
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    op = get_op("rmsnorm")

    def cached(x, weight, eps=1e-6):
        key = (x.data_ptr(), x._version)
        if key not in cache:
            cache[key] = (x, op.reference(x, weight, eps)[0])
        return cache[key][1].clone()

    result = gate.check(
        op, Impl(op="rmsnorm", name="cached", kind="user", loader=lambda: cached), Case((4, 64)), 0, torch.device("cpu")
    )
    assert not result.passed and result.message.startswith("stale result: on new values in the same buffers")


def test_writing_new_values_changes_neither_pointer_nor_version():
    op = get_op("rmsnorm")
    g = guard.guard(op.make_inputs(Case((4, 64)), 0, torch.device("cpu")))
    x = g.inputs["x"]
    before = (x.data_ptr(), x._version)
    values = op.make_inputs(Case((4, 64)), 1, torch.device("cpu"))
    guard.write(g, values)
    assert (x.data_ptr(), x._version) == before and torch.equal(x, values["x"])


def test_resume_refuses_a_run_started_by_other_code(tmp_path: Path):
    from kerneltrial.trial import protocol as proto
    from kerneltrial.trial.runner import prepare

    protocol = write_protocol(
        tmp_path / "p.toml", 'name = "x"\nop = "rmsnorm"\ncandidates = ["packed_r4_w4"]\n[[cases]]\nshape = [4, 64]\n'
    )
    run, _ = prepare(tmp_path / "run", protocol, proto.load(protocol), resume=False)
    record = json.loads(run.provenance.read_text())
    record["git"]["source_sha256"] = "0" * 64
    run.provenance.write_text(json.dumps(record))
    with pytest.raises(RunError, match="started by other kerneltrial code"):
        run_trial(protocol, tmp_path / "run", resume=True)


def test_a_run_killed_before_its_manifest_is_sealed_on_resume(cheat_run: Path, tmp_path: Path):
    import shutil

    from kerneltrial.kernel.verify import verify_run_dir

    run = tmp_path / "run"
    shutil.copytree(cheat_run, run)
    (run / "manifest.json").unlink()
    assert not verify_run_dir(run).ok
    assert run_trial(run / "protocol.toml", run, resume=True) == run
    assert verify_run_dir(run).ok


def test_every_call_runs_on_fresh_values_and_a_random_call_is_checked(cheat_run: Path, tmp_path: Path):
    import shutil

    from kerneltrial.kernel.verify import verify_run_dir

    plan = json.loads((cheat_run / "plan.json").read_text())
    assert plan["checks"] == 3  # 2's contract, and isolated arms (none in this run)
    rows = [r for r in rows_of(cheat_run) if not r["message"].startswith("raised")]
    checked = {r["checked_call"] for r in rows}
    assert checked <= set(range(8)) and len(checked) > 3  # calls_per_sample = 8: positions vary
    run = tmp_path / "run"
    shutil.copytree(cheat_run, run)
    tampered = rows_of(run)
    tampered[0]["checked_call"] = 8  # no such call in an 8-call sample
    (run / "timed_checks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tampered))
    failures = [c for c in verify_run_dir(run).checks if not c.ok]
    assert any("checked_call" in c.detail for c in failures), failures


def rows_of(run: Path) -> list[dict]:
    return rows(run / "timed_checks.jsonl")


def test_check_stops_a_kernel_that_never_returns():
    module = PLANTED / "never_returns.py"
    done = run_process(
        "check",
        "rmsnorm",
        "--impl-module",
        module,
        "--impl",
        "user:never_returns",
        "--shape",
        "4x64",
        "--seeds",
        "1",
        "--timeout",
        "3",
        "--isolate",
        "none",  # in kerneltrial's process; an isolated one: tests/trial/test_isolation.py
        timeout=120,
    )
    assert done.exit_code == 1, done.stdout + done.stderr
    assert "user:never_returns seed 0 did not return within 3 s" in done.stderr


def test_a_units_value_sets_keep_the_seeds_scalar_arguments():
    """Fresh tensors per call, but eps stays the (case, seed)'s: a compiled peer or a captured
    graph must not see another eps inside a timed sample."""
    from kerneltrial.trial import timed

    op, case = get_op("rmsnorm"), Case((4, 64))
    for seed in (0, 1):
        eps = op.make_inputs(case, seed, torch.device("cpu"))["eps"]
        unit = timed.Unit.draw(op, case, seed, 0, 4, torch.device("cpu"))
        assert {values["eps"] for values in unit.pool} == {eps}
        assert len({values["x"].sum().item() for values in unit.pool}) == 4  # the tensors are fresh
    assert op.make_inputs(case, 0, torch.device("cpu"))["eps"] != op.make_inputs(case, 1, torch.device("cpu"))["eps"]


def test_the_run_records_its_inputs_seed_and_a_reviewer_rebuilds_the_checked_inputs(cheat_run: Path):
    """plan.json and provenance.json record the run's inputs seed (drawn at start), every
    correctness row what its checked call ran on: make_inputs under that seed rebuilds it."""
    from kerneltrial.ops import inputs as inp

    plan = json.loads((cheat_run / "plan.json").read_text())
    seed = json.loads((cheat_run / "provenance.json").read_text())["inputs_seed"]
    assert isinstance(seed, int) and plan["inputs_seed"] == seed
    row = next(r for r in rows(cheat_run / "correctness.jsonl") if r["arm"] == "control" and r["seed"] == 1)
    assert row["inputs_seed"] == seed
    op = get_op("rmsnorm")
    with inp.drawing(seed):
        values = op.make_inputs(Case((4, 64)), 1, torch.device("cpu"))
        g = guard.guard(values)
        assert gate.describe(values, g).offsets == row["drawn"]["offsets"]
        control = op.impls["control"]  # the interpreted control draws no extra shape over 128 rows
        extras = [c.id for c in inp.extra_cases(op, Case((4, 64)), 1) if control.draws_extra(c)]
        assert row["drawn"]["extra"] == extras
    assert row["drawn"]["scalars"] == {"eps": values["eps"]}
