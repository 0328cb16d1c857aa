"""Confirmation and replicates: a derived dispatcher confirmed on fresh seeds, linked by digest to
the runs it came from; `run` refuses reused seeds, broken links and unfrozen confirmations;
`replicate` runs it twice (fresh processes, distinct order seeds); `verify` checks it all and
catches a linked run edited afterwards."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest

from kerneltrial.analysis.dispatch import sha256_file
from kerneltrial.cli.analysis import verify_one
from kerneltrial.replicates.record import cross_run, table_problems, write_table
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.confirm import check_confirmation, write_confirmation
from tests.analysis.rundir_factory import seal
from tests.conftest import REPO
from tests.kt import run_cli
from tests.trial import confirmation_chain
from tests.trial.confirmation_chain import CASE, confirmation_run, rewrite

chain = confirmation_chain.chain  # the fixture


def test_confirmation_protocol_has_one_candidate_fresh_seeds_and_links(chain):
    p = tomllib.loads(chain["confirm"].read_text())
    assert p["phase"] == "confirmation" and p["op"] == "zimage_qk_rmsnorm"
    assert p["candidates"] == ["user:zimage_qk_rmsnorm"] and p["control"] == "control"
    assert p["impl_modules"] == ["submission/zimage_qk_rmsnorm.py"]
    assert (p["seeds"], p["exploratory_seeds"]) == ([2], [0, 1])
    assert [c["shape"] for c in p["cases"]] == [[2, 3, 128]]
    assert (p["gate"], p["rounds"], p["calls_per_sample"]) == ("no_loss", 3, 1)
    assert p["rule"] == {"path": "submission/zimage_qk_rmsnorm.rule.toml", "sha256": sha256_file(chain["rule"])}
    assert p["derived_from"] == [
        {
            "path": "results/explore",
            "summary_sha256": sha256_file(chain["explore"] / "summary.json"),
            "manifest_sha256": sha256_file(chain["explore"] / "manifest.json"),
        }
    ]
    default = chain["root"] / "default.toml"
    write_confirmation(chain["rule"], chain["module"], default)
    assert tomllib.loads(default.read_text())["seeds"] == [2, 3]  # as many as the run used, above them


def test_run_refuses_an_unfrozen_confirmation(chain):
    result = run_cli("run", str(chain["confirm"]), "--out", str(chain["root"] / "run"))
    assert result.exit_code == 2 and "must be frozen first" in result.output


def test_run_refuses_a_confirmation_reusing_a_seed(chain):
    """The protocol claims exploratory seed 0 only and takes seed 1, which the linked run used."""
    rewrite(chain["confirm"], seeds=[1], exploratory_seeds=[0])
    proto.freeze(chain["confirm"])
    result = run_cli("run", str(chain["confirm"]), "--out", str(chain["root"] / "run"))
    assert result.exit_code == 2, result.output
    assert "seed 1 draws inputs the linked run results/explore drew (seeds 1 and 1 are equal" in result.output
    assert not (chain["root"] / "run").exists()


@pytest.mark.parametrize("seed", [2**32 + 1, 1 - 7919])
def test_run_refuses_a_confirmation_seed_drawing_the_linked_runs_inputs(chain, seed):
    """Another number, the same inputs: 2**32 + 1 seeds a CPU generator as 1 does, and the
    fresh-buffer inputs of 1 - 7919 are the checked inputs of 1 (the linked run used 0 and 1;
    the protocol hides seed 1 from exploratory_seeds)."""
    rewrite(chain["confirm"], seeds=[seed], exploratory_seeds=[0])
    proto.freeze(chain["confirm"])
    with pytest.raises(proto.ProtocolError, match=f"seed {seed} draws inputs the linked run results/explore drew"):
        check_confirmation(chain["confirm"], proto.load(chain["confirm"]))


@pytest.mark.parametrize("edit", ["summary", "rule", "missing run", "other rule"])
def test_run_refuses_links_that_do_not_resolve(chain, edit):
    if edit == "summary":
        summary = chain["explore"] / "summary.json"
        summary.write_text(summary.read_text().replace('"tie_band": 0.02', '"tie_band": 0.03'))
        expected = "run summary"
    elif edit == "rule":
        chain["rule"].write_text(chain["rule"].read_text() + "\n# edited\n")
        expected = "rule"
    elif edit == "missing run":
        shutil.rmtree(chain["explore"])
        expected = "does not exist"
    else:
        rewrite(chain["confirm"], impl_modules=["other/zimage_qk_rmsnorm.py"])
        expected = "is not the rule of the one dispatcher module"
    proto.freeze(chain["confirm"])
    result = run_cli("run", str(chain["confirm"]), "--out", str(chain["root"] / "run"))
    assert result.exit_code == 2 and expected in result.output, result.output


@pytest.mark.parametrize("edit", ["plan edited", "plan missing"])
def test_run_refuses_a_linked_plan_that_does_not_hash_as_its_summary(chain, edit):
    """Seed freshness rests on the linked run's summary.json (hashed by the link), not on an
    unhashed plan.json: an edited plan cannot hide seed 1, a missing one is not skipped."""
    plan = chain["explore"] / "plan.json"
    if edit == "plan edited":
        plan.write_text(json.dumps(json.loads(plan.read_text()) | {"seeds": [0]}))  # hides seed 1
        expected = "plan.json hashes to"
    else:
        plan.unlink()
        expected = "has no plan.json; its seeds cannot be checked"
    rewrite(chain["confirm"], seeds=[1], exploratory_seeds=[0])
    proto.freeze(chain["confirm"])
    with pytest.raises(proto.ProtocolError, match=expected):
        check_confirmation(chain["confirm"], proto.load(chain["confirm"]))
    result = run_cli("run", str(chain["confirm"]), "--out", str(chain["root"] / "run"))
    assert result.exit_code == 2 and expected in result.output, result.output


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"candidates": ["packed_r16_w8"]}, "so its one candidate is user:zimage_qk_rmsnorm"),
        (
            {"impl_modules": ["submission/zimage_qk_rmsnorm.py", "kerneltrial.ops.rms_norm"]},
            "a confirmation loads exactly one user module",
        ),
    ],
)
def test_run_refuses_a_confirmation_of_another_arm_than_the_linked_dispatcher(chain, fields, expected):
    rewrite(chain["confirm"], **fields)
    proto.freeze(chain["confirm"])
    with pytest.raises(proto.ProtocolError, match=expected):
        check_confirmation(chain["confirm"], proto.load(chain["confirm"]))


def test_verify_checks_the_confirmation_candidate_and_the_linked_plan(chain):
    """verify repeats run's refusals on a finished confirmation run: a linked plan.json edited
    or removed afterwards, a second user module beside the dispatcher."""
    run = confirmation_run(chain)
    assert verify_one(run).ok
    plan = chain["explore"] / "plan.json"
    original = plan.read_text()
    plan.write_text(json.dumps(json.loads(original) | {"seeds": [0]}))
    failed = {c.name: c.detail for c in verify_one(run).failures}
    assert set(failed) == {"confirmation seeds fresh"} and "plan.json hashes to" in failed["confirmation seeds fresh"]
    plan.unlink()
    failed = {c.name: c.detail for c in verify_one(run).failures}
    assert "has no plan.json; its seeds cannot be checked" in failed["confirmation seeds fresh"]
    plan.write_text(original)
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["impl_modules"]["kerneltrial.ops.rms_norm"] = "0" * 64
    (run / "provenance.json").write_text(json.dumps(provenance))
    seal(run)
    failed = {c.name: c.detail for c in verify_one(run).failures}
    assert set(failed) == {"confirmation candidate"}, failed
    assert (
        "a confirmation has one user module, its `user:<stem>` arm as the one candidate"
        in failed["confirmation candidate"]
    )


def test_confirm_refuses_a_rule_the_module_does_not_load(chain):
    other = chain["root"] / "other.rule.toml"
    shutil.copyfile(chain["rule"], other)
    result = run_cli(
        "protocol", "confirm", str(other), "--module", str(chain["module"]), "--out", str(chain["root"] / "c2.toml")
    )
    assert result.exit_code == 2 and "confirm the rule the module loads" in result.output


@pytest.mark.slow
def test_replicated_confirmation_is_verified_and_a_broken_link_is_caught(chain):
    done = run_cli("protocol", "freeze", str(chain["confirm"]))
    assert done.exit_code == 0, done.output
    out = chain["root"] / "replicates"
    done = run_cli("replicate", str(chain["confirm"]), "--runs", "2", "--out", str(out))
    assert done.exit_code in (0, 1), done.output
    table = json.loads((out / "replicates.json").read_text())
    assert table["runs"] == ["run-1", "run-2"] and table["order_seeds"] == [1, 2] and table["requested_runs"] == 2
    (row,) = table["cases"]
    assert (row["case"], row["arm"]) == (CASE, "user:zimage_qk_rmsnorm")
    assert len(row["verdicts"]) == 2 and row["wins"] == sum(v == "win" for v in row["verdicts"])
    assert row["between_run_range"] is not None and row["within_run_ci_width"] is not None
    (arm,) = table["arms"]
    assert arm["every_case_every_run"] == (row["wins"] == 2)
    assert "wins" in (out / "replicates.md").read_text() and "win on every case in every run" in done.output
    for name in ("run-1", "run-2"):
        plan = json.loads((out / name / "plan.json").read_text())
        assert plan["order_seed_override"] is True
        record = json.loads((out / name / "provenance.json").read_text())["confirmation"]
        assert record["rule"]["path"] == "../../submission/zimage_qk_rmsnorm.rule.toml"
        assert "user:zimage_qk_rmsnorm" in [a["name"] for a in plan["arms"]]

    result = verify_one(out)
    assert result.ok, [c for c in result.failures]
    names = [c.name for c in result.checks]
    assert "run-1: confirmation links" in names and "run-2: confirmation seeds fresh" in names
    assert "cross-run table" in names

    summary = chain["explore"] / "summary.json"  # planted: the exploration edited after the confirmation
    summary.write_text(summary.read_text().replace('"tie_band": 0.02', '"tie_band": 0.03'))
    failed = {c.name: c.detail for c in verify_one(out).failures}
    assert set(failed) == {"run-1: confirmation links", "run-2: confirmation links"}
    assert "changed since" in failed["run-1: confirmation links"]
    done = run_cli("verify", str(out))
    assert done.exit_code == 1 and "VERIFY FAILED" in done.output

    (out / "replicates.json").write_text((out / "replicates.json").read_text().replace('"wins": ', '"wins": 1'))
    assert "cross-run table" in {c.name for c in verify_one(out).failures}


COMMITTED_REPLICATES = REPO / "results" / "h200" / "zimage_qk_rmsnorm-confirm-replicates"


@pytest.mark.parametrize("plant", ["none", "gap", "run left out"])
def test_a_replicate_table_cannot_leave_a_run_out(tmp_path, plant):
    """The committed table (replicates/1, N from the run directories) checks out; a table made
    after dropping run-2 (run-3 renamed into the gap: order seeds 1, 3) or one that leaves run-3
    on disk outside it is caught."""
    root = tmp_path / "reps"
    shutil.copytree(COMMITTED_REPLICATES, root)
    if plant == "gap":
        shutil.rmtree(root / "run-2")
        (root / "run-3").rename(root / "run-2")
        write_table(root, cross_run(root, 2))
        expected = "order seeds [1, 3] are not [1, 2]"
    elif plant == "run left out":
        (root / "run-3").rename(tmp_path / "aside")
        write_table(root, cross_run(root, 2))
        (tmp_path / "aside").rename(root / "run-3")
        expected = "covers runs ['run-1', 'run-2'] of 2 requested, the directory holds ['run-1', 'run-2', 'run-3']"
    problems = table_problems(root)
    if plant == "none":
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0], problems
