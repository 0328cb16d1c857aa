"""Receipts and confirmations that cost a GPU run to forge (issue 35, item 7): `inspect --receipt`
re-verifies every run a receipt names, and `package --confirmed` and `inspect` re-execute the
archived module on a sample of the runs' checked calls. Planted: a hand-written receipt (the
project's own model) for an archive that never went through `package`; a copy of the committed
confirmation run with the module digest in provenance.json changed and its manifest rehashed; the
chain's confirmation run so edited to record a swapped module (planted/package/swapped)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.ops import inputs as inp
from kerneltrial.ops.registry import Case, get_op
from kerneltrial.rundir.layout import RunDir
from kerneltrial.rundir.streams import values_seed
from kerneltrial.submission.archive import build
from kerneltrial.submission.evidence import package_path
from kerneltrial.submission.receipt import Receipt, receipt_path
from kerneltrial.submission.replay import CPU, Checked, recorded
from kerneltrial.trial.runner import write_manifest
from kerneltrial.trial.timed import Unit
from tests.conftest import REPO
from tests.kt import run_cli
from tests.trial import confirmation_chain
from tests.trial.confirmation_chain import confirmation_run

chain = confirmation_chain.chain  # the fixture
H200 = REPO / "results" / "h200"
CONFIRM = H200 / "zimage_qk_rmsnorm-confirm"
SUBMISSION = REPO / "submissions" / "zimage_qk_rmsnorm.zip"
SWAPPED = REPO / "tests" / "fixtures" / "planted" / "package" / "swapped" / "zimage_qk_rmsnorm.py"
OPS = REPO / "src" / "kerneltrial" / "ops"
RULE = OPS / "zimage_qk_rmsnorm.rule.toml"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def forged(run: Path, module: bytes) -> Path:
    """`run` with provenance.json recording `module`'s sha256 for its user module and its
    manifest rehashed (trial/runner.py write_manifest), as a forger would leave it."""
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["impl_modules"] = dict.fromkeys(provenance["impl_modules"], sha(module))
    (run / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    write_manifest(RunDir(run))
    return run


def committed_copy(tmp_path: Path) -> Path:
    """A copy of the committed confirmation run where its links resolve (the run it was derived
    from and the rule, at the same relative paths)."""
    h200 = tmp_path / "results" / "h200"
    h200.mkdir(parents=True)
    (h200 / "zimage_qk_rmsnorm-t2").symlink_to(H200 / "zimage_qk_rmsnorm-t2")
    (tmp_path / "src" / "kerneltrial" / "ops").mkdir(parents=True)
    shutil.copy(RULE, tmp_path / "src" / "kerneltrial" / "ops")
    return Path(shutil.copytree(CONFIRM, h200 / "zimage_qk_rmsnorm-confirm"))


def hand_written(archive: Path, runs: list[tuple[Path, bytes]], rule: Path = RULE) -> Path:
    """A receipt/4 beside `archive`, written with the project's own model, claiming a confirmation
    in each run (path, module bytes it claims) and an isolated interface check on cuda."""
    with zipfile.ZipFile(archive) as zipped:
        files = {n: zipped.read(n) for n in zipped.namelist()}
    module = next(n for n in files if n.endswith(".py"))
    receipt = {
        "schema": "kerneltrial.receipt/4",
        "op": "zimage_qk_rmsnorm",
        "signature": get_op("zimage_qk_rmsnorm").signature,
        "module": module,
        "kerneltrial_version": "0.1.0",
        "archive": {"name": archive.name, "sha256": sha(archive.read_bytes()), "size": archive.stat().st_size},
        "files": [{"name": n, "sha256": sha(b), "size": len(b)} for n, b in sorted(files.items())],
        "tested_in": [
            {
                "run_dir": os.path.relpath(run, archive.parent),
                "module_sha256": sha(claimed),
                "manifest_sha256": sha((run / "manifest.json").read_bytes())
                if (run / "manifest.json").is_file()
                else None,
                "phase": "confirmation",
                "arm": "user:zimage_qk_rmsnorm",
                "gate": "no_loss",
                "gate_passed": True,
                "rule": {"name": rule.name, "sha256": sha(rule.read_bytes()), "size": rule.stat().st_size},
                "replayed": 2,
            }
            for run, claimed in runs
        ],
        "confirmation": "confirmed",
        "interface_check": {
            "target": None,
            "device": "cuda",
            "checks": 44,
            "process": "isolated",
            "sandbox": {"allowed": ["uid", "pidns", "cgroup", "no_new_privs", "seccomp"], "missing": {}},
        },
    }
    path = receipt_path(archive)
    path.write_text(Receipt.model_validate(receipt).model_dump_json(by_alias=True))
    return path


def archive_of(folder: Path, module: bytes, rule: Path = RULE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "zimage_qk_rmsnorm.zip"
    path.write_bytes(build({"zimage_qk_rmsnorm.py": module, rule.name: rule.read_bytes()}))
    return path


def rejected(archive: Path, receipt: Path) -> str:
    result = run_cli("inspect", archive, "--receipt", receipt)
    assert result.exit_code == 1, result.output
    return result.output


@pytest.mark.parametrize("claimed", ["absent", "another module"])
def test_a_hand_written_receipt_for_an_archive_that_never_went_through_package_is_refused(tmp_path, claimed):
    """The archive holds a swapped module; the receipt claims it was confirmed in a run that does
    not exist, or in the committed confirmation run (which tested another module)."""
    archive = archive_of(tmp_path / "ship", SWAPPED.read_bytes())
    run = tmp_path / "results" / "nowhere" if claimed == "absent" else CONFIRM
    output = rejected(archive, hand_written(archive, [(run, SWAPPED.read_bytes())]))
    if claimed == "absent":
        assert f"the receipt says the module was tested in {os.path.relpath(run, archive.parent)}, but " in output
        assert "holds no run: a receipt's runs must lie where it says" in output
    else:
        assert "does not confirm the archive: " in output
        assert "the archived code is not the code that run confirmed" in output


def test_a_receipt_whose_run_changed_since_packaging_is_refused(tmp_path):
    """The committed module and run, but a receipt that records another manifest for the run."""
    archive = tmp_path / "ship" / SUBMISSION.name
    archive.parent.mkdir()
    shutil.copy(SUBMISSION, archive)
    receipt = hand_written(archive, [(CONFIRM, (OPS / "zimage_qk_rmsnorm.py").read_bytes())])
    data = json.loads(receipt.read_text())
    data["tested_in"][0]["manifest_sha256"] = "0" * 64
    receipt.write_text(json.dumps(data))
    assert "the receipt records manifest_sha256 '000" in rejected(archive, receipt)


def test_a_copy_of_the_committed_confirmation_with_another_module_digest_is_refused(tmp_path):
    """The forgery of the issue: one field of provenance.json changed, the manifest rehashed;
    verify passes it, and the run's source archive (tied to the commit) refuses it."""
    swapped = (OPS / "zimage_qk_rmsnorm.py").read_bytes() + b"\n# swapped\n"  # right, but not the tested bytes
    run = forged(committed_copy(tmp_path), swapped)
    assert verify_run_dir(run).ok
    module = tmp_path / "swap" / "zimage_qk_rmsnorm.py"
    module.parent.mkdir()
    module.write_bytes(swapped)
    out = tmp_path / "ship" / "s.zip"
    args = ("package", "zimage_qk_rmsnorm", module, "--data", RULE, "--confirmed", run, "--out", out)
    result = run_cli(*args)
    anchor = (
        "its source.tar.gz (which verify ties to commit c440885) holds kerneltrial/ops/zimage_qk_rmsnorm.py with "
        f"sha256 {sha((OPS / 'zimage_qk_rmsnorm.py').read_bytes())}: provenance.json was edited"
    )
    assert result.exit_code == 1 and anchor in result.output and not out.exists(), result.output
    archive = archive_of(tmp_path / "hand", swapped)
    assert anchor in rejected(archive, hand_written(archive, [(run, swapped)]))


def test_a_swapped_module_under_a_rehashed_confirmation_is_refused_by_its_re_execution(chain, tmp_path):
    """A module outside kerneltrial's package is in no source archive: the chain's confirmation run
    edited to record the swapped module verifies, and re-executing the module on the run's
    recorded checked calls refuses it."""
    run = forged(confirmation_run(chain), SWAPPED.read_bytes())
    assert verify_run_dir(run).ok
    out = tmp_path / "ship" / "s.zip"
    args = ("package", "zimage_qk_rmsnorm", SWAPPED, "--data", chain["rule"], "--confirmed", run, "--out", out)
    result = run_cli(*args)
    replayed = (
        "the archived zimage_qk_rmsnorm.py, re-executed on the CPU on the run's gate check 2x3x128/contiguous/bfloat16 "
        "seed 2 (its inputs drawn again from the recorded seeds), fails the gate: output "
    )
    assert result.exit_code == 1 and "refused: replay: " in result.output and replayed in result.output, result.output
    assert "the run recorded that call as passed, so it was not made from this module" in result.output
    archive = archive_of(tmp_path / "hand", SWAPPED.read_bytes(), chain["rule"])
    assert replayed in rejected(archive, hand_written(archive, [(run, SWAPPED.read_bytes())], chain["rule"]))


def test_package_confirmed_records_the_calls_it_re_executed(chain, tmp_path):
    """The honest chain: the run's checked calls re-executed from the archive pass, the receipt
    records how many, and inspect re-verifies and re-executes them again."""
    run = confirmation_run(chain)
    out = tmp_path / "ship" / "s.zip"
    args = ("package", "zimage_qk_rmsnorm", chain["module"], "--data", chain["rule"], "--confirmed", run, "--out", out)
    result = run_cli(*args)
    assert result.exit_code == 0 and "1 of their checked calls re-executed from the archive on the CPU" in result.output
    receipt = Receipt.read(receipt_path(out))
    assert [r.replayed for r in receipt.tested_in] == [1]
    shown = run_cli("inspect", out, "--receipt", receipt_path(out))
    assert shown.exit_code == 0 and "; its 1 run(s) verify and were made from this module, and 1 of" in shown.output


def test_a_timed_check_s_inputs_are_drawn_again_as_the_runner_drew_them():
    """`Checked.inputs` of a timed check is the runner's value set (trial/timed.py Unit.draw),
    bit for bit, under an inputs seed, for a strided layout."""
    op, case = get_op("zimage_qk_rmsnorm"), Case((4, 3, 128), "bfloat16", "qkv_slice")
    with inp.drawing(12345):
        pool = Unit.draw(op, case, 3, 1, 4, CPU).pool
    again = Checked(Path("."), "timed", case, 3, 12345, values_seed(3, 1), 2).inputs(op)
    for name, value in pool[2].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, again[name]) and value.stride() == again[name].stride(), name
        else:
            assert value == again[name]


def test_the_committed_run_s_checked_calls_are_read_on_its_cheapest_cases():
    gates, timed = recorded(CONFIRM, "user:zimage_qk_rmsnorm")
    assert {c.case.id for c in gates + timed} == {"256x30x128/contiguous/bfloat16", "256x30x128/qkv_slice/bfloat16"}
    assert len(gates) == 6 and timed and all(c.call is not None and c.inputs_seed is None for c in timed)


@pytest.mark.parametrize(
    ("spec", "inside"),
    [
        ("../src/kerneltrial/ops/zimage_qk_rmsnorm.py", "ops/zimage_qk_rmsnorm.py"),
        ("kerneltrial.ops.rms_norm", "ops/rms_norm.py"),
        ("submission/zimage_qk_rmsnorm.py", None),
        ("/home/me/kerneltrial-work/m.py", None),
        ("mymodule", None),
    ],
)
def test_a_recorded_module_is_found_in_the_package_only_under_kerneltrial(spec, inside):
    assert package_path(spec) == inside
