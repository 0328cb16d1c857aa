"""verify derives, never trusts (issue 36, item 5): a serving run's plan.json against the plan its
own protocol.toml gives.

Every plan value that bounds a check (the nonce and the ledger, the client, the arms, the cases,
repeats and seeds, the launch order, the proof of dispatch's records, the accuracy and acceptance
rules) is derived again with serving/plan.py from protocol.toml and the values beside it, and a
value plan.json states otherwise is a problem with its name. The values beside it are plan.json
`effective`, each derived again from provenance.json `argv` (serving/effective.py: an `effective`
the command line does not give is a problem); a run from before `effective` has its model and
client recovered from that argv, so deleting `effective` leaves every value compared. The model's
layer count (the dispatch proof's call bound) is derived from the model's config.json where the
model is on this machine; elsewhere the bound never exceeds verify_dispatch.UNKNOWN_LAYERS,
whatever plan.json says.

No downgrade, both ways: a key missing from plan.json is a problem where the runner at the run's
recorded commit (this checkout's git history, kernel/git_history.py; a clean tree, or a declared
commit whose package digest is the run's git.source_sha256) writes it, and a key that
runner never writes is proof that a later runner wrote the plan, so provenance.json names the wrong
commit: deleting the proof of dispatch and every newer key, or naming an older commit, no longer
reads as an older run. A dirty tree is its commit edited: that runner's keys are still required,
and keys it never writes are allowed. Where the commit is unknown here, only the keys'
values are compared (and a forger who rewrites protocol.toml, its hash in three documents and
every record that follows from it has written another run: docs/VERIFY.md).

protocol.toml is parsed once (`read_run_protocol`) for every check that reads it: this one, the
launch order and the pins (serving/verify_evidence.py).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltrial.kernel.git_history import descends_from, knows, package_at
from kerneltrial.kernel.integrity import package_digest
from kerneltrial.rundir.layout import PROTOCOL
from kerneltrial.serving.effective import Written, argv_problems, command_line, recovered, with_effective, written
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.plan import plan_doc
from kerneltrial.serving.protocol import Protocol, ProtocolError, parse_protocol

RUNNER = "serving/plan.py"  # the module that writes plan.json's keys, in the package at a commit
OLD_RUNNER = "serving/trial.py"  # where plan_doc lived before serving/plan.py (and the plan before plan_doc)
# checked elsewhere (the protocol hash), or by their own check here (the layers, `effective`)
NOT_COMPARED = ("protocol_sha256", "model_layers", "effective")
# The first commit whose runner writes every record an acceptance rests on (provenance.json
# calibration.path, e3ad6c4; pins.records, the official scope's evidence and the devices came
# before it). The plan's key check cannot see records outside plan.json: a run that names an older
# commit may shed what that commit's runner never wrote, so it is read as an older run but grants
# no acceptance.
ACCEPTANCE_FLOOR = "e3ad6c46b87fc2bac9ebbc76ccf17a74261c8fd6"
FULL_HASH = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class RunProtocol:
    """A run's protocol.toml parsed once (with the run directory as its folder), with the values the
    command line can change as written; or why it does not parse."""

    proto: Protocol | None
    written: Written | None
    error: str | None = None


@dataclass(frozen=True)
class Writer:
    """The runner at a run's recorded commit, as far as this checkout's git history gives it."""

    keys: set[str] | None  # the keys it writes into plan.json; None: not known here
    source: str  # how problems name it, or why its keys are not known
    edited: bool = False  # the run's tree was dirty: that commit edited, so keys it never writes are allowed


def read_run_protocol(path: Path) -> RunProtocol:
    """The protocol.toml of the run directory `path`, for every check that reads it."""
    try:
        text = (path / PROTOCOL).read_text(encoding="utf-8")
        proto = parse_protocol(text, path)
    except (ProtocolError, UnicodeDecodeError, OSError) as error:
        return RunProtocol(None, None, str(error))
    return RunProtocol(proto, written(text, proto))


def derived_plan(proto: Protocol, plan: dict[str, Any], beside: dict[str, Any]) -> dict[str, Any]:
    """The plan `proto` gives with the values `beside` it (plan.json `effective`, or those recovered
    from the command line; ProtocolError for a client the protocol refuses), as JSON would hold it;
    the selection files' copies are the plan's own (verify_dispatch rehashes them)."""
    proto = with_effective(proto, beside)
    copies = {a.get("name"): a.get("selection_files", {}) for a in plan.get("arms", []) if isinstance(a, dict)}
    order = planned_launches(proto.arms, proto.rounds, proto.seed)
    derived = plan_doc(
        proto, str(plan.get("protocol_sha256")), order, {a.name: copies.get(a.name, {}) for a in proto.arms}
    )
    return json.loads(json.dumps(derived))


def written_keys(prov: dict[str, Any]) -> Writer:
    """The runner at the recorded commit and the keys it writes into plan.json (None, and why not,
    where they are not known here). A dirty tree is that commit edited: its runner's keys are still
    required, and keys it never writes are allowed."""
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    commit = git.get("commit")
    if not isinstance(commit, str) or not commit:
        return Writer(None, "the run names no commit")
    tree = package_at(commit)
    if tree.files is None:
        return Writer(None, tree.reason)
    edited = git.get("dirty") is True
    # a clean tree, or a declared commit (a copy sent to a GPU machine: dirty null) whose source it is
    if not edited and git.get("dirty") is not False and package_digest(tree.files) != git.get("source_sha256"):
        return Writer(
            None, f"the run's source is not commit {commit[:12]}'s (git.dirty null, git.source_sha256 another)"
        )
    source = tree.files.get(RUNNER) or tree.files.get(OLD_RUNNER) or b""
    keys = plan_doc_keys(source)
    if keys is None:
        return Writer(None, f"the runner at commit {commit[:12]} writes no plan.json this verifier can read")
    edit = " (edited: the run's tree was dirty)" if edited else ""
    return Writer(keys, f"the runner at commit {commit[:12]}{edit}", edited)


def plan_doc_keys(source: bytes) -> set[str] | None:
    """The string keys of the dict `plan_doc` returns in a module's source, or (a runner from before
    plan_doc) of the dict literal it assigns to `plan`; None where it has neither. Its other dicts
    (provenance's "client", say) are not plan.json's."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "plan_doc":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    return _keys(ret.value)
            return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(isinstance(t, ast.Name) and t.id == "plan" for t in node.targets):
                return _keys(node.value)
    return None


def _keys(node: ast.Dict) -> set[str]:
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def plan_problems(rp: RunProtocol, plan: dict[str, Any], prov: dict[str, Any]) -> tuple[list[str], str]:
    """Each `effective` value the command line does not give, each plan value unlike the derived
    one, each key the recorded commit's runner writes that is missing or never writes that is
    there, and the layer count against the model's config.json where it is here; and a detail."""
    if rp.proto is None or rp.written is None:
        return [f"{PROTOCOL} does not give a plan, so plan.json cannot be derived: {rp.error}"], ""
    cmd = command_line(prov.get("argv"))
    recorded = plan.get("effective")
    if isinstance(recorded, dict):
        problems, beside = argv_problems(recorded, rp.written, cmd), recorded
        whence = "its `effective`, each derived again from provenance.json argv"
    else:
        problems, beside = [], recovered(rp.written, cmd, plan.get("tokenizer"))
        whence = "the model and client recovered from provenance.json argv (no `effective`: an older run)"
    try:
        derived = derived_plan(rp.proto, plan, beside)
    except ProtocolError as error:
        return [*problems, f"{PROTOCOL} with the run's values beside it does not give a plan: {error}"], ""
    writer = written_keys(prov)
    problems += key_problems(plan, set(derived), writer)
    problems += value_problems(plan, derived)
    problems += _layer_problems(plan, derived, beside.get("model"))
    keys = (
        f"no key required ({writer.source})"
        if writer.keys is None
        else f"the keys {writer.source} writes required" + ("" if writer.edited else ", and only those")
    )
    return problems, f"plan.json derived from {PROTOCOL} and {whence}: every value compared; {keys}"


def key_problems(plan: dict[str, Any], current: set[str], writer: Writer) -> list[str]:
    """No downgrade: a key of the current plan that the recorded commit's runner writes and plan.json
    lacks; no later runner: one that runner never writes and plan.json holds (unless the tree was
    dirty)."""
    written_by, source = writer.keys, writer.source
    if written_by is None:
        return []
    missing = [
        f"plan.json has no `{key}`, which {source} (git history) writes: no downgrade"
        for key in sorted(current & written_by)
        if key not in plan
    ]
    later = [
        f"plan.json has `{key}`, which {source} (git history) never writes: a later runner wrote this plan, "
        "not the commit provenance.json names"
        for key in sorted(current - written_by)
        if key in plan and not writer.edited
    ]
    return missing + later


def value_problems(plan: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """Each value plan.json holds that the derived plan states otherwise (every key but those checked
    elsewhere)."""
    problems = []
    for key in derived:
        if key in plan and key not in NOT_COMPARED and plan[key] != derived[key]:
            where, got, want = first_difference(plan[key], derived[key], key)
            problems.append(f"plan.json {where} is {short(got)}, {PROTOCOL} gives {short(want)}")
    return problems


ABSENT = "(absent)"


def first_difference(got: Any, want: Any, where: str) -> tuple[str, Any, Any]:
    """The first place two JSON values differ (`arms[1].role`, say), and the two values there."""
    if isinstance(got, dict) and isinstance(want, dict):
        for k in [*want, *(k for k in got if k not in want)]:
            if got.get(k, ABSENT) != want.get(k, ABSENT):
                return first_difference(got.get(k, ABSENT), want.get(k, ABSENT), f"{where}.{k}")
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                return first_difference(a, b, f"{where}[{i}]")
    return where, got, want


def _layer_problems(plan: dict[str, Any], derived: dict[str, Any], model: Any) -> list[str]:
    """plan.json model_layers against the derived plan's (the model's config.json, read once by
    plan_doc), where the model is on this machine."""
    # an absolute path only: a relative one would be read from the verifier's working directory
    here = derived.get("model_layers") if isinstance(model, str) and Path(model).is_absolute() else None
    if here is None or plan.get("model_layers") == here:
        return []
    return [f"plan.json model_layers is {plan.get('model_layers')!r}, the model's config.json here says {here}"]


def short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."


def floor_problems(prov: dict[str, Any]) -> tuple[list[str], str] | None:
    """An accepted run's recorded commit (a full hash: a name such as HEAD means whatever the reader's
    checkout holds) at or after ACCEPTANCE_FLOOR in this checkout's history: its problems and a
    detail; None where this checkout does not hold the floor (no git, a shallow clone: the caller
    says that an older commit's run would then pass). A contract check, not proof of the code that
    ran: that is `source commit`'s, and a forger who names a later commit and copies its digest
    passes both (docs/serving.md)."""
    if not knows(ACCEPTANCE_FLOOR):
        return None
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    commit = git.get("commit")
    floor = ACCEPTANCE_FLOOR[:12]
    detail = f"the recorded commit is {floor} or later, whose runner writes every record an acceptance rests on"
    if not isinstance(commit, str) or not FULL_HASH.fullmatch(commit):
        return [
            f"the run is accepted but names no commit by its full hash ({short(commit)}), so its runner may "
            f"predate {floor}: re-run it"
        ], detail
    if not knows(commit):
        return [f"the run is accepted, but commit {commit[:12]} is not in this checkout's history: fetch it"], detail
    if not descends_from(commit, ACCEPTANCE_FLOOR):
        return [
            f"the run is accepted, but commit {commit[:12]} is older than {floor}: its runner need not write "
            "the calibration's path, the pins' records or the scope's evidence, so its acceptance stands on "
            "nothing verify can check; re-run it at a current commit"
        ], detail
    return [], detail
