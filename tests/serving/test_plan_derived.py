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
    assert found.detail.startswith("plan.json derived from protocol.toml: every value compared; ")
    plan = json.loads((clean_run / "plan.json").read_text())
    assert plan["effective"] == {"model": None, "client": "completions"}


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
    assert plan_doc_keys(b"def other():\n    return {'nonce': 1}\n") == set()
