"""Every committed run directory under results/ verifies from its raw rows (as `kerneltrial verify` does),
its recorded commit is in the repository's history and its git history shows no downgrade, superseded
runs live under results/archive/, and PERFORMANCE.md is what the current runs generate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kerneltrial.cli.analysis import verify_one
from kerneltrial.kernel.git_history import objects, package_at
from kerneltrial.kernel.report import superseded_by
from kerneltrial.kernel.summary import build_summary
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.model.summary import build as build_model_summary
from kerneltrial.rundir.files import json_text
from kerneltrial.rundir.model_summary_doc import MODEL_SUMMARY_V3, read_model_summary
from kerneltrial.rundir.summary_doc import read_summary, summary_json
from tests.conftest import REPO
from tests.kt import run_cli

RESULTS = REPO / "results"
ARCHIVE = "archive"
RUNS = sorted(p.parent for p in RESULTS.rglob("provenance.json"))
KERNEL_RUNS = [r for r in RUNS if json.loads((r / "provenance.json").read_text()).get("kind") == "kernel"]
MODEL_RUNS = [r for r in RUNS if json.loads((r / "provenance.json").read_text()).get("kind") == "model"]


def misplaced_runs(results: Path) -> list[str]:
    """Run directories on the wrong side of results/archive/: a superseded run (its ERRATA.md says
    `Superseded by:`) outside it, or a current run inside it."""
    wrong = []
    for run in sorted(p.parent for p in results.rglob("provenance.json")):
        rel = run.relative_to(results)
        archived = rel.parts[0] == ARCHIVE
        if superseded_by(run) is None and archived:
            wrong.append(f"{rel}: current but under {ARCHIVE}/")
        elif superseded_by(run) is not None and not archived:
            wrong.append(f"{rel}: superseded but outside {ARCHIVE}/")
    return wrong


def test_there_is_committed_evidence():
    assert RUNS, "results/ holds no run directory"


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(REPO)) for r in RUNS])
def test_committed_run_verifies(run):
    result = verify_one(run)  # the kernel, serving or model verifier, by the directory's kind
    assert result.ok, [c for c in result.checks if not c.ok]
    commit = (json.loads((run / "provenance.json").read_text()).get("git") or {}).get("commit")
    if commit and package_at("HEAD").files is not None:  # committed evidence: its commit is always compared
        check = next(c for c in result.checks if c.name == "source commit")
        assert check.applicable, check.detail


def _git_log(repo: Path, results: str) -> list[tuple[str, str, list[str]]]:
    """(commit, status, paths) of every change under `results`, oldest first, renames followed."""
    out = subprocess.run(
        ["git", "-C", str(repo), "log", "--reverse", "-M", "--name-status", "--format=commit %H", "--", results],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    changes, commit = [], ""
    for line in filter(None, out.splitlines()):
        if line.startswith("commit "):
            commit = line.split()[1]
        else:
            status, *paths = line.split("\t")
            changes.append((commit, status, paths))
    return changes


def history_downgrades(repo: Path, results: str = "results") -> list[str]:
    """What the git history of committed runs shows that verify, reading one directory, cannot: a
    file deleted from a run directory that is still committed, or plan.json's `checks` lowered or
    its `host` removed by a later commit (or in the working tree) than the one that wrote it."""
    problems: list[str] = []
    versions: dict[str, list[str]] = {}  # a plan.json's path now -> its versions (`commit:path then`)
    for commit, status, paths in _git_log(repo, results):
        if status.startswith("R"):
            versions[paths[1]] = versions.pop(paths[0], []) + [f"{commit}:{paths[1]}"]
        elif status == "D" and (repo / paths[0]).parent.joinpath("provenance.json").is_file():
            problems.append(f"{paths[0]}: deleted in commit {commit[:8]} from a run directory that is still committed")
        elif status != "D":
            versions.setdefault(paths[0], []).append(f"{commit}:{paths[0]}")
    plans = {path: names for path, names in versions.items() if path.endswith("/plan.json")}
    contents = iter(objects([name for names in plans.values() for name in names], repo) or [])
    for path, names in plans.items():
        seen = [(name.partition(":")[0][:8], next(contents)) for name in names]
        if (repo / path).is_file():
            seen.append(("the working tree", (repo / path).read_bytes()))
        contracts = [(where, json.loads(data)) for where, data in seen if data is not None]
        for (before, old), (after, new) in zip(contracts, contracts[1:], strict=False):
            if new.get("checks", 0) < old.get("checks", 0) or ("host" in old and "host" not in new):
                problems.append(
                    f"{path}: checks {old.get('checks', 0)}{' with host' if 'host' in old else ''} in {before}, "
                    f"checks {new.get('checks', 0)}{' with host' if 'host' in new else ''} in {after}: a downgrade"
                )
    return problems


def test_committed_summaries_are_their_own_model_written_back():
    """One model reads and writes summary.json: every committed kernel summary, read and serialised in
    its version's shape (rundir/summary_doc.py `summary_json`), is its own bytes."""
    assert KERNEL_RUNS
    differ = [
        str(run.relative_to(RESULTS))
        for run in KERNEL_RUNS
        if json_text(summary_json(read_summary(run))) != (run / "summary.json").read_text()
    ]
    assert differ == []


def test_committed_model_summaries_are_their_own_record_written_back():
    """Every committed model summary (model-summary/1 to /3), read as rundir/model_summary_doc.py's record and
    written by its writer, is its own bytes."""
    assert MODEL_RUNS
    differ = [
        str(run.relative_to(RESULTS))
        for run in MODEL_RUNS
        if json_text(read_model_summary(run).as_json()) != (run / "summary.json").read_text()
    ]
    assert differ == []


def test_committed_model_summaries_rebuild_from_their_raw_rows():
    """model/summary.py on each committed model-summary/3 run's raw rows writes its summary.json byte for byte
    (the older runs' builders are gone: verify re-derives their figures)."""
    current = [run for run in MODEL_RUNS if read_model_summary(run).schema_ == MODEL_SUMMARY_V3]
    assert current
    differ = [
        str(run.relative_to(RESULTS))
        for run in current
        if json_text(build_model_summary(run).as_json()) != (run / "summary.json").read_text()
    ]
    assert differ == []


@pytest.mark.slow
def test_committed_summaries_rebuild_from_their_raw_rows():
    """The summary builder on each committed kernel run's raw rows writes its summary.json byte for byte
    (about 25 s for the committed runs on 2 cores)."""
    differ = [
        str(run.relative_to(RESULTS))
        for run in KERNEL_RUNS
        if json_text(build_summary(run)) != (run / "summary.json").read_text()
    ]
    assert differ == []


def test_the_history_of_committed_runs_shows_no_downgrade():
    if package_at("HEAD").files is None:
        pytest.skip("this checkout has no git history")
    assert history_downgrades(REPO) == []


def test_history_downgrades_catches_a_deleted_file_and_a_lowered_contract(tmp_path):
    """A planted repository: a run committed with timed checks, then a commit that deletes its
    timed_checks.jsonl and plan.json's `checks` and `host` (the downgrade of issue 24)."""

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
        )

    run = tmp_path / "results" / "h200" / "run"
    run.mkdir(parents=True)
    (run / "provenance.json").write_text("{}")
    (run / "timed_checks.jsonl").write_text("{}\n")
    (run / "plan.json").write_text(json.dumps({"checks": 2, "host": {"samples": 5, "calls": 200}}))
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "a run")
    (run / "timed_checks.jsonl").unlink()
    (run / "plan.json").write_text(json.dumps({}))
    git("commit", "-qam", "downgraded")
    first, second = (f"{c[:8]}" for c in reversed(_log_commits(tmp_path)))
    assert history_downgrades(tmp_path) == [
        f"results/h200/run/timed_checks.jsonl: deleted in commit {second} from a run directory that is still committed",
        f"results/h200/run/plan.json: checks 2 with host in {first}, checks 0 in {second}: a downgrade",
    ]
    (run / "plan.json").write_text(json.dumps({"checks": 2, "host": {"samples": 5, "calls": 200}}))
    git("commit", "-qam", "restored")
    (run / "plan.json").write_text(json.dumps({"checks": 1}))  # not committed: the working tree counts too
    assert history_downgrades(tmp_path)[-1].endswith(", checks 1 in the working tree: a downgrade")


def _log_commits(repo: Path) -> list[str]:
    return subprocess.run(["git", "-C", str(repo), "log", "--format=%H"], capture_output=True, text=True).stdout.split()


def test_superseded_runs_are_archived():
    """`git mv results/X results/archive/X` a run once its ERRATA.md says `Superseded by:`."""
    assert misplaced_runs(RESULTS) == []
    assert any(r.relative_to(RESULTS).parts[0] == ARCHIVE for r in RUNS), "the archive check ran on no archived run"


def test_misplaced_runs_catches_both_directions(tmp_path):
    def run(rel: str, errata: str | None = None) -> None:
        path = tmp_path / rel
        path.mkdir(parents=True)
        (path / "provenance.json").write_text("{}")
        if errata is not None:
            (path / "ERRATA.md").write_text(errata)

    run("h200/new")
    run("h200/old", "Superseded by: `new`\n")
    run("archive/h200/older", "Superseded by: `new`\n")
    run("archive/h200/stray")
    assert misplaced_runs(tmp_path) == [
        "archive/h200/stray: current but under archive/",
        "h200/old: superseded but outside archive/",
    ]


def test_performance_md_is_what_the_committed_runs_generate(tmp_path):
    """PERFORMANCE.md and results/PERFORMANCE-runs.md are never edited by hand: regenerate both with
    `kerneltrial performance $(dirname results/h200/*/summary.json) --out PERFORMANCE.md` (the per-run
    tables go to results/PERFORMANCE-runs.md beside it; results/archive/ is not read). The command
    verifies every run before it writes a line, as it does here."""
    from kerneltrial.analysis.performance_overview import RUNS_FILE

    runs = sorted(p for p in (RESULTS / "h200").iterdir() if (p / "summary.json").is_file())
    out = tmp_path / "PERFORMANCE.md"
    done = run_cli("performance", *map(str, runs), "--out", str(out))
    assert done.exit_code == 0, done.output
    assert out.read_text() == (REPO / "PERFORMANCE.md").read_text()
    assert (tmp_path / RUNS_FILE).read_text() == (REPO / RUNS_FILE).read_text()


REPLICATES = sorted(p.parent for p in (REPO / "results").rglob("replicates.json"))
SUITES = sorted(p.parent for p in (REPO / "results").rglob("suite.json"))


@pytest.mark.parametrize("suite", SUITES, ids=[str(s.relative_to(REPO)) for s in SUITES])
def test_committed_suites_verify(suite):
    """Every run of a suite verifies and the suite record holds: every protocol ran, unchanged."""
    assert verify_one(suite).ok


SUBMISSIONS = sorted((REPO / "submissions").glob("*.zip"))


@pytest.mark.parametrize("reps", REPLICATES, ids=[str(r.relative_to(REPO)) for r in REPLICATES])
def test_committed_replicates_verify(reps):
    """Each replicate run verifies and the cross-run table is what those runs give."""
    result = verify_one(reps)
    assert result.ok, [c for c in result.checks if not c.ok]


def test_there_is_a_committed_submission():
    assert SUBMISSIONS, "submissions/ holds no archive"


@pytest.mark.parametrize("archive", SUBMISSIONS, ids=[a.name for a in SUBMISSIONS])
def test_committed_submission_is_the_confirmed_code(archive):
    """The archive passes `inspect` against its receipt; its module is, byte for byte, the
    module every run in the receipt recorded (provenance impl_modules) and the one the
    repository ships, and those runs' manifests are the ones the receipt names."""
    import hashlib
    import json
    import zipfile

    from kerneltrial.ops.registry import all_ops
    from kerneltrial.submission.archive import inspect_archive
    from kerneltrial.submission.receipt import Receipt, receipt_path

    receipt = Receipt.read(receipt_path(archive))
    signatures = {o.name: o.signature for o in all_ops()}
    assert inspect_archive(archive.read_bytes(), archive.name, signatures, receipt.op, receipt).op == receipt.op
    with zipfile.ZipFile(archive) as z:
        archived = {name: z.read(name) for name in z.namelist()}
    for name, data in archived.items():
        assert data == (REPO / "src" / "kerneltrial" / "ops" / name).read_bytes(), (
            f"{name} differs from the shipped file"
        )
    module_sha = hashlib.sha256(archived[receipt.module]).hexdigest()
    assert receipt.tested_in, "the receipt names no run that tested the module"
    for run in receipt.tested_in:
        run_dir = (archive.parent / run.run_dir).resolve()
        recorded = json.loads((run_dir / "provenance.json").read_text())["impl_modules"]
        assert module_sha in recorded.values(), f"{run.run_dir} did not test these bytes"
        assert run.manifest_sha256 == hashlib.sha256((run_dir / "manifest.json").read_bytes()).hexdigest()
        assert verify_run_dir(run_dir).ok
        # receipt/2: a passed confirmation of this module with this very rule file
        provenance = json.loads((run_dir / "provenance.json").read_text())
        assert run.phase == "confirmation" and run.gate_passed and run.rule is not None
        assert run.rule.sha256 == hashlib.sha256(archived[run.rule.name]).hexdigest()
        assert run.rule.sha256 == provenance["confirmation"]["rule"]["sha256"]


def test_the_committed_rule_is_what_dispatch_derive_gives(tmp_path):
    """src/kerneltrial/ops/zimage_qk_rmsnorm.rule.toml is derived, not typed: `dispatch derive`
    from the run it cites gives the same rule, up to the run's path (relative to the rule)."""
    import os

    from kerneltrial.analysis.dispatch import derive_rule

    committed = REPO / "src" / "kerneltrial" / "ops" / "zimage_qk_rmsnorm.rule.toml"
    run = RESULTS / "h200" / "zimage_qk_rmsnorm-t2"
    out = tmp_path / "rule.toml"
    derive_rule([run], out)
    cited_here = Path(os.path.relpath(run, tmp_path)).as_posix()
    cited_there = Path(os.path.relpath(run, committed.parent)).as_posix()
    assert cited_here in out.read_text()
    assert out.read_text().replace(cited_here, cited_there) == committed.read_text()


MODEL_RUNS = sorted(p.parent for p in (REPO / "results").rglob("kernels.csv"))


def our_kernels() -> set[str]:
    """Names of every @triton.jit function in src/kerneltrial/ops."""
    import ast

    names = set()
    for path in (REPO / "src" / "kerneltrial" / "ops").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def foreign_kernels(run: Path) -> set[str]:
    """Kernels the kerneltrial arm's routed regions launched that are not kerneltrial's own."""
    import csv

    rows = [r for r in csv.DictReader((run / "kernels.csv").open()) if r["arm"] == "kerneltrial"]
    assert rows, f"{run}: no profiled kernels for the kerneltrial arm"
    return {r["kernel"] for r in rows} - our_kernels()


@pytest.mark.parametrize("run", MODEL_RUNS, ids=[str(r.relative_to(REPO)) for r in MODEL_RUNS])
def test_the_kerneltrial_arm_of_a_model_run_launched_only_our_kernels(run):
    """The call counts prove routing; the profiled kernels prove what ran: in the kerneltrial arm every
    routed region launched kerneltrial's own Triton kernels and nothing else (no torch fallback)."""
    assert foreign_kernels(run) == set()


def test_a_torch_fallback_in_the_kerneltrial_arm_is_caught(tmp_path):
    (tmp_path / "kernels.csv").write_text(
        "case,arm,region,kernel,ns,count\n"
        "c,kerneltrial,rmsnorm,_rms_norm_rows,10,1\n"
        "c,kerneltrial,silu_and_mul,void at::native::vectorized_elementwise_kernel<4>,10,1\n"
    )
    assert foreign_kernels(tmp_path) == {"void at::native::vectorized_elementwise_kernel<4>"}
