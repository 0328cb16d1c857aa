"""scripts/serving_t2_gpu.sh (issue 26, item 8): Track 2 E0-E3 on a GPU machine in one command. No vLLM
GPU build fits the machines here, so what runs without a GPU is checked: its syntax, and its dry run
(KT_DRY_RUN=1), which resolves the pins from the protocol and the vLLM requirement from the
vllm-plugin-FL snapshot's pyproject.toml as the install step does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kerneltrial.serving.protocol import load_protocol

from .conftest import REPO, shared

SCRIPT = REPO / "scripts" / "serving_t2_gpu.sh"
PROTOCOL = REPO / "protocols" / "serving" / "minicpm5-2b-t2.toml"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_a_dry_run_names_the_pinned_stack_and_the_trial(tmp_path: Path):
    snapshot = shared() / "vendor" / "vllm-plugin-FL"
    if not (snapshot / "pyproject.toml").is_file():
        pytest.skip(f"vllm-plugin-FL snapshot not found at {snapshot} (set KERNELTRIAL_SHARED to the shared folder)")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "vllm-plugin-FL").symlink_to(snapshot)
    env = {**os.environ, "KT_DRY_RUN": "1", "KT_SRC": str(tmp_path / "src"), "KT_VENV": str(tmp_path / "venv")}
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path), str(tmp_path / "out")], env=env, capture_output=True, text=True, check=True
    )
    pins = load_protocol(PROTOCOL)[0].pins
    assert pins.vllm_plugin_fl is not None and pins.flag_gems == "5.3.5"
    assert done.stdout.splitlines() == [
        f"vllm-plugin-FL {pins.vllm_plugin_fl.branch}@{pins.vllm_plugin_fl.commit}",
        f"FlagGems v{pins.flag_gems}",
        "vLLM vllm==0.13.0",  # the snapshot's test extra (vllm[audio]==0.13.0), its extras dropped
        f"kerneltrial serve trial {PROTOCOL} --model {tmp_path} --vllm {tmp_path / 'venv'}/bin/vllm --client official "
        f"--out {tmp_path / 'out'}",
    ]
    missing = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "nowhere")], env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "model directory" in missing.stderr
