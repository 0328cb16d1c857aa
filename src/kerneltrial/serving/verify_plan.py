"""verify derives, never trusts (issue 36, item 5): a serving run's plan.json against the plan its
own protocol.toml gives.

Every plan value that bounds a check (the nonce and the ledger, the client, the cases, repeats and
seeds, the launch order, the proof of dispatch's records, the accuracy and acceptance rules) is
derived again with serving/plan.py from protocol.toml and the run's `effective` values, and a value
plan.json states otherwise is a problem with its name. The model's layer count (the dispatch
proof's call bound) is derived from the model's config.json where the model is on this machine;
elsewhere the bound never exceeds verify_dispatch.UNKNOWN_LAYERS, whatever plan.json says. A plan
without `effective` (a run from before it) is compared on the values that do not depend on the
model path or the client.

No downgrade: a key missing from plan.json is a problem where the runner at the run's recorded
commit (this checkout's git history, kernel/git_history.py) writes it: deleting the proof of
dispatch, the nonce and every newer key no longer reads as an older run. Where the commit is
unknown here, or the tree was dirty, only the keys' values are compared (and a forger who rewrites
protocol.toml, its hash in three documents and every record that follows from it has written
another run: docs/VERIFY.md).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from kerneltrial.kernel.git_history import package_at
from kerneltrial.rundir.layout import PROTOCOL
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.plan import plan_doc, with_effective
from kerneltrial.serving.protocol import ProtocolError, parse_protocol

RUNNER = "serving/plan.py"  # the module that writes plan.json's keys, in the package at a commit
OLD_RUNNER = "serving/trial.py"  # where plan_doc lived before serving/plan.py
# what the model path and the client fix: not derivable for a run without `effective`
MODEL_OR_CLIENT = ("arms", "client", "tokenizer", "bench_seeds", "seeding")
# checked elsewhere (the protocol hash), or by their own check here (the layers)
NOT_COMPARED = ("protocol_sha256", "model_layers", "effective")


def derived_plan(path: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan protocol.toml gives with the run's `effective` values (ProtocolError if it does not
    parse), as JSON would hold it; the selection files' copies are the plan's own (verify_dispatch
    rehashes them)."""
    proto = parse_protocol((path / PROTOCOL).read_text(encoding="utf-8"), path)
    recorded = plan.get("effective")
    proto = with_effective(proto, recorded if isinstance(recorded, dict) else {})
    copies = {a.get("name"): a.get("selection_files", {}) for a in plan.get("arms", []) if isinstance(a, dict)}
    order = planned_launches(proto.arms, proto.rounds, proto.seed)
    derived = plan_doc(
        proto, str(plan.get("protocol_sha256")), order, {a.name: copies.get(a.name, {}) for a in proto.arms}
    )
    return json.loads(json.dumps(derived))


def written_keys(prov: dict[str, Any], keys: list[str]) -> tuple[set[str] | None, str]:
    """Which of `keys` the runner at the recorded commit writes into plan.json, or None and why not."""
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    commit = git.get("commit")
    if not isinstance(commit, str) or not commit or git.get("dirty") is not False:
        return None, "the run names no clean commit"
    tree = package_at(commit)
    if tree.files is None:
        return None, tree.reason
    source = tree.files.get(RUNNER) or tree.files.get(OLD_RUNNER) or b""
    return plan_doc_keys(source) & set(keys), f"the runner at commit {commit[:12]}"


def plan_doc_keys(source: bytes) -> set[str]:
    """The string keys of the dict `plan_doc` returns in a module's source (none where it has no
    such function): its other dicts (provenance's "client", say) are not plan.json's."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "plan_doc":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    return {k.value for k in ret.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def plan_problems(path: Path, plan: dict[str, Any], prov: dict[str, Any]) -> tuple[list[str], str]:
    """Each plan value unlike the derived one, each key the recorded commit's runner writes that is
    missing, and the layer count against the model's config.json where it is here; and a detail."""
    try:
        derived = derived_plan(path, plan)
    except (ProtocolError, UnicodeDecodeError, OSError) as error:
        return [f"{PROTOCOL} does not give a plan, so plan.json cannot be derived: {error}"], ""
    written, source = written_keys(prov, list(derived))
    problems = []
    for key in derived:
        if key not in plan:
            if written is not None and key in written:
                problems.append(f"plan.json has no `{key}`, which {source} (git history) writes: no downgrade")
            continue
        if key in NOT_COMPARED or ("effective" not in plan and key in MODEL_OR_CLIENT):
            continue
        if plan[key] != derived.get(key):
            problems.append(f"plan.json {key} is {_short(plan[key])}, {PROTOCOL} gives {_short(derived.get(key))}")
    problems += _layer_problems(plan, derived)
    compared = "every value" if "effective" in plan else "the values that do not rest on the model path or client"
    keys = f"the keys {source} writes required" if written is not None else f"no key required ({source})"
    return problems, f"plan.json derived from {PROTOCOL}: {compared} compared; {keys}"


def _layer_problems(plan: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """plan.json model_layers against the derived plan's (the model's config.json, read once by
    plan_doc), where the model is on this machine."""
    recorded = plan.get("effective")
    model = recorded.get("model") if isinstance(recorded, dict) else None
    # an absolute path only: a relative one would be read from the verifier's working directory
    here = derived.get("model_layers") if isinstance(model, str) and Path(model).is_absolute() else None
    if here is None or plan.get("model_layers") == here:
        return []
    return [f"plan.json model_layers is {plan.get('model_layers')!r}, the model's config.json here says {here}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."
