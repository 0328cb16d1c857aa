"""verify derives, never trusts (issue 36, item 5; serving/verify_plan.py): the issue's forgeries of
plan.json, each with the run's other files left as they were: `nonce = false`, a model layer count
of 10^9 (the dispatch proof's call bound), another client, and the proof of
dispatch stripped with every newer key while provenance names a commit whose runner writes them.
Fake servers, synthetic benchmark client (test_acceptance)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.kernel.git_history import package_at
from kerneltrial.kernel.integrity import package_digest
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving import trial
from kerneltrial.serving.verify import verify_serving_run
from kerneltrial.serving.verify_dispatch import UNKNOWN_LAYERS, call_bounds
from kerneltrial.serving.verify_plan import plan_doc_keys
from tests.conftest import REPO
from tests.kt import run_cli, write_protocol

from .test_acceptance import synthetic_bench, trial_text

CHECK = "plan derived"


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("derived")
    proto = write_protocol(root / "trial.toml", trial_text(rounds=1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", synthetic_bench(lambda arm, launch: (1.0, 1.0)))
        done = run_cli("serve", "trial", str(proto), "--vllm", "python3", "--quiet", "--out", str(root / "run"))
    assert done.exit_code in (0, 1), done.output  # 1: the candidate is not accepted (no gain)
    return root / "run"


@pytest.fixture
def run(clean_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(clean_run, tmp_path / "run"))


def edit(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def check(run: Path) -> Any:
    return next(c for c in verify_serving_run(run).checks if c.name == CHECK)


def test_the_clean_run_is_its_protocols_plan(clean_run: Path) -> None:
    found = check(clean_run)
    assert found.ok, found.detail
    assert found.detail.startswith(
        "plan.json derived from protocol.toml and its `effective`, each derived again from provenance.json argv: "
        "every value compared; "
    )
    plan = json.loads((clean_run / "plan.json").read_text())
    assert plan["effective"] == {"model": None, "client": "completions", "tokenizer": None}


def test_nonce_false_is_caught(run: Path) -> None:
    edit(run / "plan.json", lambda plan: plan.update(nonce=False, ledger=False))
    found = check(run)
    assert not found.ok
    assert "plan.json nonce is false, protocol.toml gives true" in found.problems
    assert "plan.json ledger is false, protocol.toml gives true" in found.problems


def test_another_client_is_caught(run: Path) -> None:
    edit(run / "plan.json", lambda plan: plan.update(client="flagos-chat"))
    assert 'plan.json client is "flagos-chat", protocol.toml gives "completions"' in check(run).problems


def test_a_forged_layer_count_cannot_lift_the_call_bound(run: Path, tmp_path: Path) -> None:
    """The issue's 10^9 calls passed with model_layers edited to match; the bound now stops at the
    deepest model's, and a model on this machine gives its own count."""
    plan = json.loads((run / "plan.json").read_text())
    launches = [json.loads(x) for x in (run / "launches.jsonl").read_text().splitlines()]
    deepest = call_bounds(run, plan | {"model_layers": UNKNOWN_LAYERS}, launches)
    assert call_bounds(run, plan | {"model_layers": 10**9}, launches) == deepest
    assert call_bounds(run, plan | {"model_layers": 2}, launches)[0] < deepest[0]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    edit(run / "plan.json", lambda plan: plan.update(model_layers=10**9) or plan["effective"].update(model=str(model)))
    assert "plan.json model_layers is 1000000000, the model's config.json here says 2" in check(run).problems


def test_a_stripped_proof_of_dispatch_fails_no_downgrade_at_a_known_commit(run: Path) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not head or package_at(head).files is None:
        pytest.skip("this checkout has no git history to read the runner at a commit from")
    stripped = ("dispatch", "nonce", "ledger", "model_layers", "client", "effective")
    edit(run / "plan.json", lambda plan: [plan.pop(k) for k in stripped])
    edit(run / "summary.json", lambda summary: summary.pop("dispatch"))
    rows = [json.loads(x) for x in (run / "launches.jsonl").read_text().splitlines()]
    (run / "launches.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in x.items() if k != "dispatch"}) + "\n" for x in rows)
    )
    edit(run / "provenance.json", lambda prov: prov.update(git={"commit": head, "dirty": False}))
    found = check(run)
    missing = f"which the runner at commit {head[:12]} (git history) writes: no downgrade"
    for key in ("dispatch", "nonce", "ledger", "model_layers", "client"):
        assert f"plan.json has no `{key}`, {missing}" in found.problems, found.problems


def test_only_plan_docs_own_keys_are_required() -> None:
    """The runner's other dicts are not plan.json's: provenance_doc's "client" at a commit whose
    plan_doc wrote none made an honest run fail no downgrade (the hostile review)."""
    source = b"""
def plan_doc(proto):
    return {"nonce": proto.nonce, "dispatch": {"env": 1}}

def provenance_doc():
    return {"client": {"vllm": 1}}
"""
    assert plan_doc_keys(source) == {"nonce", "dispatch"}
    assert plan_doc_keys(b"def other():\n    return {'nonce': 1}\n") is None  # no plan: nothing known, nothing required
    before_plan_doc = b"def run_protocol(proto):\n    plan = {'arms': 1, 'cases': 2}\n    write_json(plan)\n"
    assert plan_doc_keys(before_plan_doc) == {"arms", "cases"}  # the runner of b1290ad to 5c14f16


# ---------------------------------------------------------------- the hostile review's holes (issue 36 item 5)

BEFORE_EFFECTIVE = "93e1c81b755b3eac1e8b325861f68c5c7bc2a900"  # its runner writes every key but `effective` (and
# those added since: `imported_files`)
BEFORE_LEDGER = "57c85fb95a7c13c1d9899374d8d090c00ddacb65"  # its runner writes neither `ledger` nor `effective`


def at_commit(run: Path, commit: str) -> None:
    """provenance.json names `commit`, clean (skips where this checkout cannot read it)."""
    if package_at(commit).files is None:
        pytest.skip(f"this checkout has no commit {commit[:12]} in its history to read the runner from")
    edit(run / "provenance.json", lambda prov: prov.update(git={"commit": commit, "dirty": False}))


def swap_protocol(run: Path, text: str) -> None:
    """protocol.toml replaced by `text`, its hash rewritten in the three documents that hold it."""
    (run / "protocol.toml").write_text(text)
    sha = sha256_file(run / "protocol.toml")
    for name in ("provenance.json", "plan.json", "summary.json"):
        edit(run / name, lambda doc: doc.update(protocol_sha256=sha))


def test_a_swapped_protocol_without_effective_at_an_older_commit_is_caught(run: Path) -> None:
    """The hostile review: deleting `effective` and naming a commit from before it skipped the arms,
    the client, the tokenizer and the seeds, so another protocol's plan passed."""
    text = (run / "protocol.toml").read_text()
    swapped = text.replace('"baseline"', '"was"').replace('"candidate"', '"baseline"').replace('"was"', '"candidate"')
    assert swapped != text  # the roles swapped: the candidate's launches read as the baseline's
    swap_protocol(run, swapped)
    edit(run / "plan.json", lambda plan: plan.pop("effective"))
    at_commit(run, BEFORE_EFFECTIVE)
    found = check(run)
    assert not found.ok
    assert 'plan.json arms[0].role is "baseline", protocol.toml gives "candidate"' in found.problems, found.problems


def test_seeding_is_compared_without_effective(run: Path) -> None:
    edit(run / "plan.json", lambda plan: plan.pop("effective") and plan.update(seeding="per_run"))
    assert 'plan.json seeding is "per_run", protocol.toml gives "official"' in check(run).problems


def test_without_effective_the_client_comes_from_the_argv(run: Path) -> None:
    """A run without `effective` whose argv gave no --client ran the protocol's client; one whose
    argv gave --client ran that one."""
    edit(run / "plan.json", lambda plan: plan.pop("effective") and plan.update(client="flagos-chat"))
    assert 'plan.json client is "flagos-chat", protocol.toml gives "completions"' in check(run).problems
    edit(run / "provenance.json", lambda prov: prov.update(argv=[*prov["argv"], "--client", "flagos-chat"]))
    assert not [p for p in check(run).problems if p.startswith("plan.json client is")]


def test_the_honest_run_without_effective_still_passes_from_a_dirty_tree(run: Path) -> None:
    """A run from before `effective`, of a dirty tree of that commit: its values, with the model and
    client recovered from its argv, are the protocol's, and the keys that commit writes are there."""
    edit(run / "plan.json", lambda plan: plan.pop("effective"))
    at_commit(run, BEFORE_EFFECTIVE)
    edit(run / "provenance.json", lambda prov: prov["git"].update(dirty=True))
    found = check(run)
    assert found.ok, found.problems
    assert "the model and client recovered from provenance.json argv (no `effective`: an older run)" in found.detail
    assert "(edited: the run's tree was dirty)" in found.detail


def test_a_dirty_tree_does_not_lift_no_downgrade(run: Path) -> None:
    """The review's case: `effective` stripped and git.dirty set to true named no key required. A dirty
    tree is its commit edited: that commit's runner writes `effective`, so it is required still."""
    edit(run / "plan.json", lambda plan: plan.pop("effective"))
    edit(run / "provenance.json", lambda prov: prov["git"].update(dirty=True))
    problems = check(run).problems
    assert any(p.startswith("plan.json has no `effective`, which the runner at commit") for p in problems), problems
    assert all("never writes" not in p for p in problems)  # a dirty tree may write newer keys


def test_a_key_the_named_commits_runner_never_writes_proves_a_later_runner(run: Path) -> None:
    """A plan holding `effective` (and `ledger`) while provenance names a commit whose runner writes
    neither was written by a later runner: the commit is not the code that ran."""
    at_commit(run, BEFORE_LEDGER)
    later = "(git history) never writes: a later runner wrote this plan, not the commit provenance.json names"
    problems = check(run).problems
    for key in ("effective", "ledger"):
        assert f"plan.json has `{key}`, which the runner at commit {BEFORE_LEDGER[:12]} {later}" in problems, problems
    assert not [p for p in problems if "`nonce`" in p or "`dispatch`" in p]  # both written then


def test_the_keys_of_the_named_commit_are_those_of_its_runner(run: Path) -> None:
    """The honest twin: a plan with exactly the keys the commit's runner writes passes (neither
    `effective` nor the later `imported_files`)."""
    edit(run / "plan.json", lambda plan: [plan.pop(key) for key in ("effective", "imported_files")])
    at_commit(run, BEFORE_EFFECTIVE)
    found = check(run)
    assert found.ok, found.problems
    assert f"the keys the runner at commit {BEFORE_EFFECTIVE[:12]} writes required, and only those" in found.detail


def test_an_older_commit_named_beside_the_current_source_digest_is_caught(run: Path) -> None:
    """git.source_sha256 is the digest of the package that ran: naming an older commit beside it
    contradicts the git history (check 'source commit', as for kernel runs)."""
    if package_at(BEFORE_EFFECTIVE).files is None:
        pytest.skip(f"this checkout has no commit {BEFORE_EFFECTIVE[:12]} in its history")
    edit(run / "provenance.json", lambda prov: prov["git"].update(commit=BEFORE_EFFECTIVE, dirty=False))
    found = next(c for c in verify_serving_run(run).checks if c.name == "source commit")
    assert not found.ok
    assert found.problems[0].startswith(f"the package at commit {BEFORE_EFFECTIVE} digests to ")
    assert found.problems[0].endswith(f"commit {BEFORE_EFFECTIVE} is not the code that ran (provenance.json edited?)")


def test_a_declared_commit_whose_source_it_is_fixes_the_keys(run: Path) -> None:
    """A copy of the tree sent to a GPU machine declares its commit (git.dirty null): with the
    commit's own package digest, its runner's keys are required as for a clean tree."""
    tree = package_at(BEFORE_LEDGER)
    if tree.files is None:
        pytest.skip(f"this checkout has no commit {BEFORE_LEDGER[:12]} in its history")
    declared = {"commit": BEFORE_LEDGER, "dirty": None, "source_sha256": package_digest(tree.files)}
    edit(run / "provenance.json", lambda prov: prov.update(git=declared))
    later = f"plan.json has `ledger`, which the runner at commit {BEFORE_LEDGER[:12]} (git history) never writes"
    assert any(p.startswith(later) for p in check(run).problems)
    edit(run / "provenance.json", lambda prov: prov["git"].update(source_sha256="0" * 64))
    found = check(run)
    assert found.ok and f"no key required (the run's source is not commit {BEFORE_LEDGER[:12]}'s" in found.detail
