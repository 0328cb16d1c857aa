"""Scope official only on checkable evidence (issue 36 item 6; serving/dist_records.py, pins.py): the
issue's holes were hand-written package metadata and a shell-script `nvidia-smi`. A distribution
counts only when its installed files match its RECORD and the module the interpreter imports is
one of them; a vendor tool only when it is an ELF executable. Fake distributions in a folder put on
the interpreter's path by a wrapper; fake device tools on PATH."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving.dist_records import DistRecord, record_evidence, record_reasons
from kerneltrial.serving.pins import scope, vendor_devices

PINS = {"vllm": "0.32.0", "flag_gems": "5.3.5", "vllm_plugin_fl_commit": "13eb9be", "vllm_plugin_fl_branch": None}


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site: Path, dist: str, module: str, version: str, record: bool = True, list_module: bool = True) -> Path:
    """A distribution as an installer leaves it: module/__init__.py and dist-info (METADATA, RECORD)."""
    (site / module).mkdir(parents=True)
    init = site / module / "__init__.py"
    init.write_text(f"__version__ = {version!r}\n")
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    (info / "METADATA").write_text(metadata)
    if record:
        rows = [f"{info.name}/METADATA,{_hash(metadata.encode())},{len(metadata)}", f"{info.name}/RECORD,,"]
        if list_module:
            rows.insert(0, f"{module}/__init__.py,{_hash(init.read_bytes())},{init.stat().st_size}")
        (info / "RECORD").write_text("\n".join(rows) + "\n")
    return init


def interpreter(tmp_path: Path, site: Path) -> str:
    """A `python` that is this interpreter with `site` first on its path (as a venv's would be)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def all_three(site: Path, **vllm: Any) -> None:
    install(site, "vllm", "vllm", "0.32.0", **vllm)
    install(site, "flag_gems", "flag_gems", "5.3.5")
    install(site, "vllm_plugin_fl", "vllm_fl", "0.1.0")


def test_installed_files_matching_their_record_are_evidence(tmp_path: Path) -> None:
    site = tmp_path / "site"
    all_three(site)
    records = record_evidence(interpreter(tmp_path, site))
    assert record_reasons(records) == [], records
    vllm = DistRecord.of(records["vllm"])
    assert vllm is not None and (vllm.files, vllm.hashed, vllm.differ, vllm.module_hashed) == (3, 2, 0, True)
    assert vllm.module == str((site / "vllm" / "__init__.py").resolve())


def test_hand_written_metadata_is_no_evidence(tmp_path: Path) -> None:
    """The issue's forgery: a dist-info with a METADATA claiming vLLM 0.32.0 and no RECORD."""
    site = tmp_path / "site"
    all_three(site, record=False)
    assert record_reasons(record_evidence(interpreter(tmp_path, site))) == [
        "vLLM 0.32.0 (vllm): its dist-info has no RECORD, so its version is only what its metadata says"
    ]


def test_a_file_edited_after_installation_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    all_three(site)
    (site / "vllm" / "__init__.py").write_text("__version__ = '0.32.0'  # patched\n")
    [reason] = record_reasons(record_evidence(interpreter(tmp_path, site)))
    assert reason == (
        "vLLM 0.32.0 (vllm): 1 of its 3 RECORD files differ and 0 are missing (vllm/__init__.py differs): the "
        "installed files are not the ones installed"
    )


def test_a_record_that_does_not_list_the_imported_module_is_no_evidence(tmp_path: Path) -> None:
    """A RECORD written for the metadata alone: the module the server imports is another file."""
    site = tmp_path / "site"
    all_three(site, list_module=False)
    [reason] = record_reasons(record_evidence(interpreter(tmp_path, site)))
    module = (site / "vllm" / "__init__.py").resolve()
    assert reason == f"vLLM 0.32.0 (vllm): the module the interpreter imports ({module}) is not a RECORD file"


def test_a_missing_distribution_and_an_older_row_are_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "vllm", "vllm", "0.32.0")
    assert record_reasons(record_evidence(interpreter(tmp_path, site))) == [
        "FlagGems: not installed in the server's interpreter",
        "vllm-plugin-FL: not installed in the server's interpreter",
    ]
    assert record_reasons(None) == ["the server's distributions were not checked against their RECORD (an older run)"]
    assert record_evidence(None) == {"error": "no python interpreter known for the server"}


def honest(tmp_path: Path) -> dict[str, Any]:
    site = tmp_path / "honest"
    all_three(site)
    return record_evidence(interpreter(tmp_path, site))


GPU = {"vendor": "nvidia", "tool": "nvidia-smi", "ok": True, "output": "NVIDIA H200", "hardware": "nvidia: NVIDIA H200"}


def test_scope_official_needs_every_record_and_an_elf_device_tool(tmp_path: Path) -> None:
    rows = [{"mismatches": [], "overridden": False, "records": honest(tmp_path)}]
    elf = GPU | {"path": "/usr/bin/nvidia-smi", "elf": True}
    assert scope("official", PINS, rows, [elf])["kind"] == "official"
    script = GPU | {"path": "/usr/local/bin/nvidia-smi", "elf": False}
    assert scope("official", PINS, rows, [script])["reasons"] == [
        "no vendor tool that answered is an ELF executable: nvidia-smi (/usr/local/bin/nvidia-smi); a script's "
        "answer is no evidence"
    ]
    unchecked = [{"mismatches": [], "overridden": False}]  # a row from before the RECORD check
    assert scope("official", PINS, unchecked, [elf])["reasons"] == [
        "the server's distributions were not checked against their RECORD (an older run)"
    ]


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


def test_a_shell_script_nvidia_smi_is_recorded_as_a_script(tools: Path) -> None:
    """The issue's forgery: a script named nvidia-smi that prints an H200."""
    fake = tools / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 570.1, 143771 MiB'\n")
    fake.chmod(0o755)
    [device] = vendor_devices()
    assert device.ok and device.output.startswith("NVIDIA H200") and not device.elf
    assert device.path == str(fake) and device.sha256 == hashlib.sha256(fake.read_bytes()).hexdigest()


def test_an_elf_tool_is_recorded_as_one(tools: Path) -> None:
    echo = Path("/bin/echo").resolve()
    if not echo.is_file():
        pytest.skip("no /bin/echo to stand in for an ELF device tool")
    os.symlink(echo, tools / "nvidia-smi")
    [device] = vendor_devices()
    assert device.ok and device.elf and device.path == str(echo)
