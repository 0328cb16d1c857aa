"""Submission archives (issue 12, package): the layout, the receipt, the identity check against a
confirmed run, the isolated interface check, and `inspect`'s rejections."""

from __future__ import annotations

import hashlib
import io
import re
import stat
import warnings
import zipfile
from pathlib import Path

import pytest

from kerneltrial.ops.registry import all_ops
from kerneltrial.submission.archive import (
    FIXED_TIME,
    MAX_ENTRIES,
    MAX_ENTRY_BYTES,
    MAX_TOTAL_BYTES,
    Rejected,
    build,
    inspect_archive,
)
from kerneltrial.submission.package import confirmed_run
from kerneltrial.submission.receipt import FileRecord, Receipt
from tests.conftest import REPO
from tests.kt import run_cli
from tests.trial import confirmation_chain
from tests.trial.confirmation_chain import confirmation_run

GOOD = REPO / "tests" / "fixtures" / "good_rmsnorm.py"
PLANTED = REPO / "tests" / "fixtures" / "planted"
OPERATORS = {o.name: o.signature for o in all_ops()}
chain = confirmation_chain.chain  # the fixture

# A module that reads a data file beside it at import, as the derived dispatchers read their rule.
RULED = '''"""rmsnorm whose epsilon floor comes from the rule file beside it."""
import tomllib
from pathlib import Path

import torch

RULE = tomllib.loads(Path(__file__).with_suffix(".rule.toml").read_text())


def rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    eps = max(eps, RULE["eps_floor"])
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
'''


def zip_of(*entries: tuple[str, bytes] | zipfile.ZipInfo, payloads: dict[str, bytes] | None = None) -> bytes:
    """A hand-made archive (the hostile shapes `build` never writes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate entry written on purpose
        for entry in entries:
            if isinstance(entry, zipfile.ZipInfo):
                archive.writestr(entry, (payloads or {}).get(entry.filename, b""))
            else:  # a fixed time: the bytes (and so the parametrized ids) must not depend on the clock,
                # or the two xdist workers collect different ids a second apart and the run stops
                name, data = entry
                archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def info(name: str, mode: int) -> zipfile.ZipInfo:
    i = zipfile.ZipInfo(name)
    i.create_system = 3
    i.external_attr = mode << 16
    return i


def rejection(data: bytes, op: str | None = "rmsnorm", receipt: Receipt | None = None) -> str:
    with pytest.raises(Rejected) as caught:
        inspect_archive(data, "s.zip", OPERATORS, op, receipt)
    return str(caught.value)


GOOD_SOURCE = GOOD.read_bytes()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (zip_of(("../good_rmsnorm.py", GOOD_SOURCE)), "entry '../good_rmsnorm.py' climbs out of the archive"),
        (zip_of(("a/../../x.py", GOOD_SOURCE)), "climbs out of the archive (path traversal"),
        (zip_of(("/good_rmsnorm.py", GOOD_SOURCE)), "is an absolute path"),
        (zip_of(("C:/good_rmsnorm.py", GOOD_SOURCE)), "is an absolute path"),
        (zip_of(("a\\good_rmsnorm.py", GOOD_SOURCE)), "NUL or backslash"),
        (
            zip_of(info("good_rmsnorm.py", stat.S_IFLNK | 0o777), payloads={"good_rmsnorm.py": b"/etc/passwd"}),
            "is a symbolic link",
        ),
        (zip_of(("good_rmsnorm.py", GOOD_SOURCE), ("lib/", b"")), "entry 'lib/' is a directory"),
        (
            zip_of(info("good_rmsnorm.py", stat.S_IFIFO | 0o644), payloads={"good_rmsnorm.py": GOOD_SOURCE}),
            "is not a regular file (mode 0o10644)",
        ),
        (zip_of(("good_rmsnorm.py", GOOD_SOURCE), ("lib/x.toml", b"")), "is not at the top level"),
        (
            zip_of(("good_rmsnorm.py", GOOD_SOURCE), ("good_rmsnorm.py", b"def rmsnorm(x, weight, eps=1e-6): pass")),
            "entry 'good_rmsnorm.py' appears twice",
        ),
        (
            zip_of(("good_rmsnorm.py", GOOD_SOURCE), ("big.bin", bytes(MAX_ENTRY_BYTES + 1))),
            f"entry 'big.bin' holds {MAX_ENTRY_BYTES + 1} bytes; at most {MAX_ENTRY_BYTES}",
        ),
        (
            zip_of(("good_rmsnorm.py", GOOD_SOURCE), *((f"d{i}.bin", bytes(MAX_ENTRY_BYTES)) for i in range(4))),
            f"at most {MAX_TOTAL_BYTES}",
        ),
        (
            zip_of(("good_rmsnorm.py", GOOD_SOURCE), *((f"d{i}", b"") for i in range(MAX_ENTRIES))),
            f"{MAX_ENTRIES + 1} entries; at most {MAX_ENTRIES}",
        ),
        (b"PK not really", "not a ZIP archive"),
        (zip_of(("rule.toml", b"")), "holds 0 Python modules"),
        (zip_of(("a.py", GOOD_SOURCE), ("b.py", GOOD_SOURCE)), "holds 2 Python modules (a.py, b.py)"),
        (zip_of(("good-rmsnorm.py", GOOD_SOURCE)), "good-rmsnorm.py cannot be imported by its name"),
        (zip_of(("m.py", b"def rmsnorm(x, weight, eps=1e-6)\n")), "m.py does not parse"),
        (
            zip_of(("m.py", b"def rms_norm(x, weight, eps=1e-6):\n    return x\n")),
            "no entry point: m.py has no top-level function rmsnorm (its top-level functions: rms_norm); "
            "name the entry point rmsnorm",
        ),
        (
            zip_of(("m.py", GOOD_SOURCE + b"\ndef silu_and_mul(x):\n    return x\n")),
            "m.py also defines silu_and_mul, named after another operator: a second entry point",
        ),
        (
            zip_of(("m.py", b"def rmsnorm(input, weight, eps=1e-6):\n    return input\n")),
            "entry point: rmsnorm(input, weight, eps=1e-06) does not match the interface rmsnorm(x, weight, eps=1e-6)",
        ),
        (
            zip_of(("m.py", b"def rmsnorm(x, weight, eps):\n    return x\n")),
            "parameter eps of rmsnorm(x, weight, eps) has no default; the interface is rmsnorm(x, weight, eps=1e-6)",
        ),
        (
            zip_of(("m.py", b"def rmsnorm(x, weight, eps=1e-5):\n    return x\n")),
            "parameter eps of rmsnorm(x, weight, eps=1e-05) has another default than the interface rmsnorm(x, weight, eps=1e-6)",
        ),
        (zip_of(("m.py", b"def rmsnorm(*args):\n    return args[0]\n")), "rmsnorm(*args) takes *args (*args)"),
        (
            zip_of(("m.py", b"from kerneltrial.ops.launch import MAX_GRID\n" + GOOD_SOURCE)),
            "m.py imports kerneltrial, which the target does not have",
        ),
    ],
)
def test_inspect_rejects_each_unsafe_or_misnamed_archive_with_its_reason(data, reason):
    assert reason in rejection(data)


def test_a_default_naming_a_module_constant_is_read_as_its_literal():
    """`eps=EPS` with `EPS = 1e-6` at the top level is the interface's default (our dispatcher
    modules write it so); a constant of another value, or one bound twice, is not."""
    ok = b"EPS = 1e-6\n\ndef rmsnorm(x, weight, eps=EPS):\n    return x\n"
    assert inspect_archive(build({"m.py": ok}), "s.zip", OPERATORS).op == "rmsnorm"
    wrong = b"EPS = 1e-5\n\ndef rmsnorm(x, weight, eps=EPS):\n    return x\n"
    assert "parameter eps of rmsnorm(x, weight, eps=EPS) has another default" in rejection(zip_of(("m.py", wrong)))
    rebound = b"EPS = 1e-6\nEPS = 1e-5\n\ndef rmsnorm(x, weight, eps=EPS):\n    return x\n"
    assert "has another default" in rejection(zip_of(("m.py", rebound)))


def _prepended() -> bytes:
    """A ZIP holding sneaky.py in front of a good archive: Python reads only the central
    directory at the end, a streaming (local-header) reader lists sneaky.py too."""
    return zip_of(("sneaky.py", b"import os\n")) + build({"good_rmsnorm.py": GOOD_SOURCE})


def _commented() -> bytes:
    buffer = io.BytesIO(build({"good_rmsnorm.py": GOOD_SOURCE}))
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.comment = b"hello"
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_prepended(), "not the archive `kerneltrial package` builds from its entries"),
        (_commented(), "not the archive `kerneltrial package` builds from its entries"),
        (build({"good_rmsnorm.py": GOOD_SOURCE, "helper.pyc": b"x"}), "entry 'helper.pyc' is not a data file"),
        (
            build({"good_rmsnorm.py": GOOD_SOURCE, "helper.cpython-311-x86_64-linux-gnu.so": b"x"}),
            "entry 'helper.cpython-311-x86_64-linux-gnu.so' is not a data file",
        ),
        (build({"good_rmsnorm.py": GOOD_SOURCE, "helper.pyd": b"x"}), "entry 'helper.pyd' is not a data file"),
        (build({"good_rmsnorm.py": GOOD_SOURCE, "A.txt": b"", "a.txt": b""}), "differ only in case"),
        (
            build({"m.py": b"async def rmsnorm(x, weight, eps=1e-6):\n    return x\n"}),
            "entry point rmsnorm is `async def`",
        ),
        (build({"m.py": GOOD_SOURCE + b"\nrmsnorm = print\n"}), "binds rmsnorm 2 times at the top level"),
        (
            build({"m.py": GOOD_SOURCE + b"\nzimage_qk_rmsnorm = rmsnorm\n"}),
            "also defines zimage_qk_rmsnorm, named after another operator",
        ),
    ],
    ids=["prepended", "comment", "pyc", "so", "pyd", "case", "async", "rebound", "alias"],
)
def test_inspect_rejects_what_another_reader_or_importer_would_see_differently(data, reason):
    assert reason in rejection(data, op="rmsnorm")
    assert (
        inspect_archive(build({"good_rmsnorm.py": GOOD_SOURCE, "r.rule.toml": b""}), "s.zip", OPERATORS).op == "rmsnorm"
    )


def test_inspect_finds_the_operator_when_none_is_named():
    found = inspect_archive(build({"good_rmsnorm.py": GOOD_SOURCE}), "s.zip", OPERATORS)
    assert (found.op, found.module) == ("rmsnorm", "good_rmsnorm.py")
    assert "exactly one top-level function named after an operator; found none" in rejection(
        zip_of(("m.py", b"def f(x):\n    return x\n")), op=None
    )


def test_the_archive_is_deterministic_sorted_and_flat():
    files = {"z.rule.toml": b"eps_floor = 0.0\n", "good_rmsnorm.py": GOOD_SOURCE}
    data = build(files)
    assert data == build(dict(reversed(files.items())))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
    assert [i.filename for i in infos] == ["good_rmsnorm.py", "z.rule.toml"]
    assert {(i.date_time, i.external_attr >> 16, i.compress_type) for i in infos} == {
        (FIXED_TIME, 0o100644, zipfile.ZIP_STORED)
    }


def test_the_cli_inspect_exits_1_with_one_line_and_0_when_accepted(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(zip_of(("../good_rmsnorm.py", GOOD_SOURCE)))
    result = run_cli("inspect", bad)
    assert (
        result.exit_code == 1
        and result.output.strip()
        == f"error: rejected {bad}: entry '../good_rmsnorm.py' climbs out of the archive (path traversal with '..')"
    )
    misnamed = tmp_path / "misnamed.zip"
    misnamed.write_bytes(build({"m.py": b"def rms_norm(x, weight, eps=1e-6):\n    return x\n"}))
    result = run_cli("inspect", misnamed, "--op", "rmsnorm")
    assert result.exit_code == 1 and "no entry point: m.py has no top-level function rmsnorm" in result.output
    good = tmp_path / "good.zip"
    good.write_bytes(build({"good_rmsnorm.py": GOOD_SOURCE}))
    result = run_cli("inspect", good)
    assert result.exit_code == 0 and result.output.startswith(
        f"accepted {good}: entry point rmsnorm in good_rmsnorm.py"
    )
    assert run_cli("inspect", tmp_path / "absent.zip").exit_code == 2


def test_package_refuses_what_its_confirmation_run_did_not_confirm(chain, tmp_path):
    """--confirmed takes a finished confirmation run that verifies and passed the module's arm,
    of these very module and rule bytes; anything else is refused (exit 1) before packaging."""
    module, rule = chain["module"], chain["rule"]
    run = confirmation_run(chain)
    out = tmp_path / "s.zip"

    def refused(*args: str | Path, module: Path = module, data: Path | None = rule) -> str:
        result = run_cli(
            "package", "zimage_qk_rmsnorm", module, "--out", out, *args, *(["--data", data] if data else [])
        )
        assert result.exit_code == 1 and not out.exists(), result.output
        return result.output

    swapped = tmp_path / "swap" / rule.name  # every branch and the default pick the control
    swapped.parent.mkdir()
    swapped.write_text(re.sub(r'(?m)^(default|arm) = ".*"$', r'\1 = "control"', rule.read_text()))
    assert swapped.read_bytes() != rule.read_bytes()
    assert "the archived rule is not the rule that run confirmed" in refused("--confirmed", run, data=swapped)
    assert f"pack it: --data {rule.name}" in refused("--confirmed", run, data=None)
    edited = tmp_path / "edit" / module.name
    edited.parent.mkdir()
    edited.write_bytes(module.read_bytes() + b"# edited\n")
    assert "the archived code is not the code that run confirmed" in refused("--confirmed", run, module=edited)
    assert "is an exploratory run without confirmation links" in refused("--confirmed", chain["explore"])
    lost = confirmation_run(chain, "lost", passed=False)
    assert "user:zimage_qk_rmsnorm did not pass the gate (no_loss)" in refused("--confirmed", lost)
    unverified = confirmation_run(chain, "unverified")
    summary = unverified / "summary.json"
    summary.write_text(summary.read_text().replace('"tie_band": 0.02', '"tie_band": 0.03'))
    assert f"{unverified} does not verify (" in refused("--confirmed", unverified)
    (unverified / "summary.json").unlink()
    assert "did not finish (no summary.json)" in refused("--confirmed", unverified)


def test_the_confirmed_run_record_names_phase_gate_and_rule(chain, tmp_path):
    run = confirmation_run(chain)
    packed = {p.name: p.read_bytes() for p in (chain["module"], chain["rule"])}
    record = confirmed_run(run, chain["module"], packed, "zimage_qk_rmsnorm", tmp_path / "ship")
    assert (record.phase, record.arm, record.gate, record.gate_passed) == (
        "confirmation",
        "user:zimage_qk_rmsnorm",
        "no_loss",
        True,
    )
    assert record.rule == FileRecord.of(chain["rule"].name, packed[chain["rule"].name])
    assert record.module_sha256 == hashlib.sha256(packed[chain["module"].name]).hexdigest()
    assert record.run_dir == "../results/confirmation-run"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["absent.py", "--out", "s.zip", "--unconfirmed"], "absent.py is not a file"),
        ([GOOD, "--out", "s.tar", "--unconfirmed"], "must end in .zip"),
        ([GOOD, "--out", "s.zip", "--confirmed", "absent-run"], "is not a run directory"),
        (
            [GOOD, "--out", "s.zip"],
            "no --confirmed run: pass the confirmation run that tested "
            f"{GOOD} (--confirmed RUN_DIR), or --unconfirmed to package code no confirmation run tested",
        ),
        ([GOOD, "--out", "s.zip", "--confirmed", "run", "--unconfirmed"], "--unconfirmed with --confirmed"),
    ],
)
def test_package_exits_2_on_bad_input(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = run_cli("package", "rmsnorm", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_package_refuses_a_misnamed_module_before_importing_it(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def rms_norm(x, weight, eps=1e-6):\n    return x\n")
    result = run_cli("package", "rmsnorm", module, "--out", tmp_path / "s.zip", "--unconfirmed")
    assert (
        result.exit_code == 1
        and "refused: the archive would be rejected: no entry point: m.py has no top-level function rmsnorm"
        in result.output
    )


@pytest.mark.slow
def test_package_then_inspect_a_good_module_with_its_rule_file(tmp_path):
    """The happy path: layout, the isolated interface check, an unconfirmed receipt; then the
    receipt catches an archive whose code was changed afterwards."""
    module, rule = tmp_path / "ruled_rmsnorm.py", tmp_path / "ruled_rmsnorm.rule.toml"
    module.write_text(RULED)
    rule.write_text("eps_floor = 0.0\n")
    out = tmp_path / "ship" / "submission.zip"
    result = run_cli("package", "rmsnorm", module, "--out", out, "--data", rule, "--target", "ascend", "--unconfirmed")
    assert result.exit_code == 0, result.output
    assert (
        "interface check passed on cpu (isolated: no kerneltrial importable; imported as the target imports it, "
        "under 2 environments): 40 gate checks, every launch within the ascend limits; UNCONFIRMED: no "
        "confirmation run tested this code" in result.output
    )
    receipt = Receipt.read(tmp_path / "ship" / "submission.receipt.json")
    assert receipt.schema_id == "kerneltrial.receipt/4" and receipt.confirmation == "unconfirmed"
    assert receipt.interface_check.process == "isolated"
    assert receipt.op == "rmsnorm" and receipt.signature == "rmsnorm(x, weight, eps=1e-6) -> Tensor"
    assert [(f.name, f.size) for f in receipt.files] == [
        ("ruled_rmsnorm.py", len(RULED)),
        ("ruled_rmsnorm.rule.toml", len("eps_floor = 0.0\n")),
    ]
    assert receipt.archive.sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    assert receipt.tested_in == []
    assert receipt.interface_check.target == "ascend" and receipt.kerneltrial_version
    receipt_file = tmp_path / "ship" / "submission.receipt.json"
    result = run_cli("inspect", out, "--receipt", receipt_file)
    assert (
        result.exit_code == 0
        and "matches its receipt (confirmation: UNCONFIRMED, packaged with --unconfirmed" in result.output
    )
    tampered = tmp_path / "tampered.zip"
    tampered.write_bytes(build({"ruled_rmsnorm.py": RULED.encode() + b"# edited\n", rule.name: rule.read_bytes()}))
    result = run_cli("inspect", tampered, "--receipt", receipt_file)
    assert result.exit_code == 1 and "receipt mismatch: ruled_rmsnorm.py has sha256" in result.output, result.output
    result = run_cli("package", "rmsnorm", module, "--out", out, "--unconfirmed")
    assert result.exit_code == 2 and "exists; a package is never overwritten" in result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "args", "reason"),
    [
        ("ruled", [], "ruled_rmsnorm.py failed to import from the unpacked archive: FileNotFoundError"),
        ("wrong", [], "interface check failed: gate: 1x64/contiguous/bfloat16 seed 0: output has 1 NaN element(s)"),
        (
            "huge_grid",
            ["--target", "ascend"],
            "interface check failed: gate: 1x64/contiguous/bfloat16 seed 0: raised GridLimitError: kernel "
            "_one_program_per_item launched grid (70000,), over the ascend limit",
        ),
    ],
)
def test_the_interface_check_refuses_what_fails_where_the_target_runs_it(tmp_path, module, args, reason):
    """A data file left out (the module reads it at import), a wrong kernel, a grid Ascend rejects."""
    path = {
        "ruled": tmp_path / "ruled_rmsnorm.py",
        "wrong": REPO / "tests" / "fixtures" / "wrong_rmsnorm.py",
        "huge_grid": PLANTED / "huge_grid.py",
    }[module]
    if module == "ruled":
        path.write_text(RULED)
        (tmp_path / "ruled_rmsnorm.rule.toml").write_text("eps_floor = 0.0\n")  # beside it, but not packed
    result = run_cli("package", "rmsnorm", path, "--out", tmp_path / "s.zip", "--unconfirmed", *args)
    assert result.exit_code == 1 and reason in result.output, result.output
    assert not (tmp_path / "s.zip").exists()


def test_package_refuses_the_planted_stub_that_execs_its_packed_txt(tmp_path):
    module = REPO / "tests" / "fixtures" / "planted" / "package" / "exec_from_data.py"
    result = run_cli(
        "package", "rmsnorm", module, "--out", tmp_path / "s.zip", "--data", module.with_suffix(".txt"), "--unconfirmed"
    )
    assert (
        result.exit_code == 1
        and "refused: the archive would be rejected: code from data: exec_from_data.py line 6" in result.output
    )


TARGET_IMPORT = "(imported as the target imports it: python main.py with site, torch's default"
DIFFERS = "gate: 1x64/contiguous/bfloat16 seed 0: output differs from the reference"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "data", "reasons"),
    [
        (
            "right_with_one_thread",
            [],
            [
                "interface check failed: environment-dependent: it passes under python ",
                f"(a module must not tell one process from another): {DIFFERS}",
            ],
        ),
        ("right_under_kerneltrial_parent", [], [f"interface check failed: {DIFFERS}", TARGET_IMPORT]),
        ("right_without_site", [], [f"interface check failed: {DIFFERS}", TARGET_IMPORT]),
        (
            "attrgetter_exec",
            ["exec_from_data.txt"],
            [
                "refused: the archive would be rejected: code from data: attrgetter_exec.py line 13 uses the "
                "attribute exec through attrgetter"
            ],
        ),
    ],
)
def test_package_refuses_each_module_that_can_tell_it_is_being_checked(tmp_path, module, data, reasons):
    """Issue 35, item 6: right only with one torch thread, only under a parent whose command line
    names kerneltrial, only under `python -S`, or running hidden code through
    `operator.attrgetter("exec")(builtins)`: each passed the old check; each is refused now."""
    package_dir = PLANTED / "package"
    extra = [arg for name in data for arg in ("--data", package_dir / name)]
    result = run_cli(
        "package", "rmsnorm", package_dir / f"{module}.py", "--out", tmp_path / "s.zip", *extra, "--unconfirmed"
    )
    assert result.exit_code == 1 and all(reason in result.output for reason in reasons), result.output
    assert not (tmp_path / "s.zip").exists()


RECEIPT_3 = {
    "schema": "kerneltrial.receipt/3",
    "op": "rmsnorm",
    "signature": "rmsnorm(x, weight, eps=1e-6) -> Tensor",
    "module": "good_rmsnorm.py",
    "kerneltrial_version": "0.1.0",
    "archive": {"name": "s.zip", "sha256": "0" * 64, "size": 1},
    "files": [],
    "tested_in": [],
    "confirmation": "unconfirmed",
    "interface_check": {"target": None, "device": "cpu", "checks": 20, "process": "isolated"},
}


def test_receipts_before_receipt_3_read_as_checked_in_harness_and_confirmed_by_their_runs():
    committed = Receipt.read(REPO / "submissions" / "zimage_qk_rmsnorm.receipt.json")
    assert committed.schema_id == "kerneltrial.receipt/2"
    assert (committed.confirmation, committed.interface_check.process) == ("confirmed", "in-harness")
    old = {k: v for k, v in RECEIPT_3.items() if k != "confirmation"} | {"schema": "kerneltrial.receipt/2"}
    old["interface_check"] = {k: v for k, v in RECEIPT_3["interface_check"].items() if k != "process"}
    assert Receipt.model_validate(old).confirmation == "unconfirmed"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"confirmation": None}, "confirmation"),
        ({"confirmation": "confirmed"}, "a receipt is confirmed exactly when it names the runs that tested it"),
        ({"interface_check": {"target": None, "device": "cpu", "checks": 20}}, "process"),
    ],
)
def test_a_receipt_3_states_its_confirmation_and_process(change, message):
    from pydantic import ValidationError

    data = {k: v for k, v in (RECEIPT_3 | change).items() if v is not None}
    with pytest.raises(ValidationError, match=message):
        Receipt.model_validate(data)


def test_inspect_shows_the_receipt_s_confirmation_and_interface_check(tmp_path):
    result = run_cli(
        "inspect",
        REPO / "submissions" / "zimage_qk_rmsnorm.zip",
        "--receipt",
        REPO / "submissions" / "zimage_qk_rmsnorm.receipt.json",
    )
    assert result.exit_code == 0 and (
        "matches its receipt (confirmation: confirmed in 4 run(s); interface check in-harness, imported where "
        "kerneltrial was (receipt before receipt/3), on cuda, 56 gate checks); its 4 run(s) verify and were made "
        "from this module, and 8 of their checked calls, re-executed from the archive on the CPU, are within the "
        "gate's tolerance" in result.output
    ), (
        result.output
    )  # issue 35, item 7: the runs re-verified and the module re-executed (tests/submission/test_evidence.py)
    archive = tmp_path / "s.zip"
    archive.write_bytes(build({"good_rmsnorm.py": GOOD_SOURCE}))
    found = inspect_archive(archive.read_bytes(), "s.zip", OPERATORS)
    receipt = tmp_path / "s.receipt.json"
    receipt.write_text(
        Receipt.model_validate(
            RECEIPT_3 | {"archive": found.archive.model_dump(), "files": [f.model_dump() for f in found.files]}
        ).model_dump_json(by_alias=True)
    )
    result = run_cli("inspect", archive, "--receipt", receipt)
    assert result.exit_code == 0 and (
        "(confirmation: UNCONFIRMED, packaged with --unconfirmed: no confirmation run tested this code; "
        "interface check isolated, no kerneltrial importable, unconfined (receipt before receipt/4), on cpu, "
        "20 gate checks)" in result.output
    ), result.output
