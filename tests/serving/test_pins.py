"""Pins and scope (issue 26, item 4): a protocol pins vllm-plugin-FL (commit, branch), FlagGems and
vLLM; a server environment that does not match is refused unless --override-pins (recorded); runs
record a scope (official or proxy) with the hardware, and the vendor tools' device information."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltrial.serving import trial
from kerneltrial.serving.launcher import _VERSIONS_SNIPPET
from kerneltrial.serving.pins import installed, pin_mismatches, scope
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .test_acceptance import synthetic_bench, trial_text
from .test_dist_records import honest

PINS = {
    "vllm": "0.32.0",
    "flag_gems": "5.3.5",
    "vllm_plugin_fl_commit": "13eb9be",
    "vllm_plugin_fl_branch": "flagos-2026-s2",
}


def test_a_pin_matches_its_public_version_and_a_commit_prefix():
    have = {
        "vllm": "0.32.0+cpu",
        "flag_gems": "5.3.5",
        "vllm_plugin_fl_commit": "13eb9be0c1d2",
        "vllm_plugin_fl_branch": None,
    }
    assert pin_mismatches(PINS, have) == []  # +cpu is vLLM 0.32.0; an unknown branch does not refuse: the commit does
    assert pin_mismatches(PINS, have | {"vllm_plugin_fl_branch": "main"}) == [
        "vllm-plugin-FL branch main (pinned flagos-2026-s2)"
    ]
    assert pin_mismatches(PINS, {"vllm": "0.31.1"}) == [
        "vLLM 0.31.1 (pinned 0.32.0)",
        "FlagGems not installed (pinned 5.3.5)",
        "vllm-plugin-FL commit unknown (no VCS record in direct_url.json, no sha in _version.py, no git checkout) "
        "(pinned 13eb9be)",
    ]
    assert pin_mismatches({}, {}) == []  # nothing pinned: nothing to match


def test_the_probe_reads_the_plugins_commit_and_branch_from_its_install_record(tmp_path: Path):
    """A `pip install git+...@BRANCH` leaves direct_url.json with vcs_info: the probe reads it."""
    dist = tmp_path / "vllm_plugin_fl-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-plugin-fl\nVersion: 0.1.0\n")
    vcs = {"commit_id": "13eb9be" + "0" * 33, "requested_revision": "flagos-2026-s2", "vcs": "git"}
    (dist / "direct_url.json").write_text(
        json.dumps({"url": "https://github.com/flagos-ai/vllm-plugin-FL", "vcs_info": vcs})
    )
    (dist / "RECORD").write_text("")
    done = subprocess.run(
        [sys.executable, "-c", _VERSIONS_SNIPPET], capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}
    )
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    have = installed(versions)
    assert have["vllm_plugin_fl_commit"] == vcs["commit_id"] and have["vllm_plugin_fl_branch"] == "flagos-2026-s2"
    assert versions["vllm_plugin_fl"]["how"] == "direct_url.json vcs_info"
    assert pin_mismatches({"vllm_plugin_fl_commit": "13eb9be", "vllm_plugin_fl_branch": "flagos-2026-s2"}, have) == []


def test_scope_is_official_only_with_the_official_client_every_pin_matched_and_a_vendor_device(tmp_path: Path):
    gpu = [
        {
            "vendor": "nvidia",
            "tool": "nvidia-smi",
            "ok": True,
            "output": "NVIDIA H200, 570.1, 143771 MiB",
            "hardware": "nvidia: NVIDIA H200, 570.1, 143771 MiB",
            "path": "/usr/bin/nvidia-smi",
            "elf": True,
        }
    ]
    ok = [{"mismatches": [], "overridden": False, "records": honest(tmp_path)}]  # test_dist_records
    assert scope("official", PINS, ok, gpu) == {"kind": "official", "hardware": gpu[0]["hardware"], "reasons": []}
    fork = scope("flagos-chat", PINS, ok, gpu)  # the fork's chat script is not the organisers'
    assert fork["kind"] == "proxy" and fork["reasons"] == [
        "client flagos-chat, not the organisers' (--client official)"
    ]
    s = scope("completions", {"vllm": "0.32.0"}, [{"mismatches": ["x"], "overridden": True}], [])
    assert s["kind"] == "proxy" and s["hardware"].startswith("CPU: ")
    assert s["reasons"] == [
        "client completions, not the organisers' (--client official)",
        "not pinned: vllm_plugin_fl_commit, flag_gems ([pins])",
        "a pin did not match (overridden with --override-pins)",
        "the server's distributions were not checked against their RECORD (an older run)",
        "no vendor accelerator reported (nvidia-smi, ixsmi, mx-smi, npu-smi)",
    ]


def pinned_trial(tmp_path: Path, monkeypatch, *extra: str) -> tuple[int, str, Path]:
    """A trial whose protocol pins FlagGems 5.3.5: the fake server's interpreter has no FlagGems."""
    text = trial_text(rounds=1).replace("[acceptance]\n", '[pins]\nflag_gems = "5.3.5"\n[acceptance]\n')
    proto = write_protocol(tmp_path / "trial.toml", text)
    out = tmp_path / "run"
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda a, L: (1.0, 1.0)))
    r = run_cli("serve", "trial", str(proto), *extra, "--vllm", sys.executable, "-q", "--out", str(out))
    return r.exit_code, r.output, out


def test_a_pin_mismatch_refuses_the_launch_and_is_recorded(tmp_path, monkeypatch):
    code, output, out = pinned_trial(tmp_path, monkeypatch)
    assert code == 1 and "does not match the protocol's [pins]: FlagGems not installed (pinned 5.3.5)" in output
    assert "--override-pins" in output
    [row] = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert row["status"] == "refused" and row["spawned"] is False and "pid" not in row
    assert row["pins"]["mismatches"] == ["FlagGems not installed (pinned 5.3.5)"] and not row["pins"]["overridden"]
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["scope"]["kind"] == "proxy"
        and "not pinned: vllm_plugin_fl_commit, vllm ([pins])" in summary["scope"]["reasons"]
    )
    assert verify_serving_run(out).problems == []
    # tampering: the mismatch erased from the record
    row["pins"]["mismatches"] = []
    (out / "launches.jsonl").write_text(json.dumps(row) + "\n")
    assert any(
        "pin mismatches [], its recorded versions give ['FlagGems not installed" in p
        for p in verify_serving_run(out).problems
    )


def test_override_pins_runs_the_launch_records_it_and_the_scope_says_proxy(tmp_path, monkeypatch):
    code, output, out = pinned_trial(tmp_path, monkeypatch, "--override-pins")
    assert code == 1 and "INCONCLUSIVE" in output, output  # every launch ran; one per arm is no interval
    rows = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and r["pins"]["overridden"] for r in rows)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["override_pins"] is True and plan["pins"]["flag_gems"] == "5.3.5"
    plan_pins = plan["pins"]
    prov = json.loads((out / "provenance.json").read_text())
    assert isinstance(prov["devices"], list)  # every vendor tool present answered (none here)
    assert "a pin did not match (overridden with --override-pins)" in prov["scope"]["reasons"]
    assert "scope: proxy on " in output
    assert verify_serving_run(out).problems == []
    # tampering: the scope claimed official
    summary = json.loads((out / "summary.json").read_text())
    summary["scope"] |= {"kind": "official", "reasons": []}
    (out / "summary.json").write_text(json.dumps(summary))
    assert any(
        p.startswith("summary scope official ([]), the records give proxy") for p in verify_serving_run(out).problems
    )
    # tampering: the pins, the override and the scope deleted (a check skipped is a check passed)
    plan = {k: v for k, v in plan.items() if k not in ("pins", "override_pins")}
    (out / "plan.json").write_text(json.dumps(plan))
    assert "plan.json has no pins, but protocol.toml pins {'flag_gems': '5.3.5'} and 2 launch(es) recorded" in str(
        verify_serving_run(out).problems
    )
    (out / "plan.json").write_text(json.dumps(plan | {"pins": {**plan_pins}}))
    (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "scope"}))
    problems = verify_serving_run(out).problems
    assert "summary.json has no scope, though 2 launch(es) ran pinned" in problems
    assert any(
        "its server did not match the pins (FlagGems not installed (pinned 5.3.5)) but was not refused" in p
        for p in problems
    )
    # tampering: every launch's pin record and the scope deleted (nothing left for the checks above to read)
    (out / "launches.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "pins"}) + "\n" for r in rows)
    )
    problems = verify_serving_run(out).problems
    assert "launch(es) [0, 1] ran a server but record no pin check: the pins' records were stripped" in problems
    assert "summary.json has no scope, though 2 launch(es) ran pinned" in problems


@pytest.mark.parametrize("key", ["flag_gems", "vllm"])
def test_pins_are_protocol_keys(key):
    from kerneltrial.serving.protocol import ProtocolError, parse_protocol

    base = trial_text(rounds=1)
    assert (
        parse_protocol(base.replace("[acceptance]\n", f'[pins]\n{key} = "1.0"\n[acceptance]\n')).pins.flat()[key]
        == "1.0"
    )
    with pytest.raises(ProtocolError, match="pins.vllm_plugin_fl.commit"):
        parse_protocol(base.replace("[acceptance]\n", '[pins]\nvllm_plugin_fl = { commit = "13e" }\n[acceptance]\n'))
