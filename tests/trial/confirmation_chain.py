"""A Track 1 chain in a temporary folder, for the confirmation, replicate and package tests:
a synthetic exploratory run of zimage_qk_rmsnorm, the dispatcher with the rule derived from it,
the confirmation protocol, and (`confirmation_run`) a verifiable run of that protocol."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from kerneltrial.analysis.dispatch import derive_rule, sha256_file
from kerneltrial.kernel.links import Links
from kerneltrial.kernel.summary import write_summary
from kerneltrial.ops import zimage_qk_rmsnorm as module
from kerneltrial.trial.confirm import write_confirmation
from tests.analysis.rundir_factory import RunSpec, seal, write_checked_run, write_run_dir

CASE = "2x3x128/contiguous/bfloat16"
ARMS = [
    {"name": name, "kind": "control" if name == "control" else "candidate", "available": True, "reason": None}
    for name in ("control", "packed_r4_w4", "packed_r16_w8")
]


def explore_settings(protocol: dict) -> None:
    protocol.update(calls_per_sample=1, warmup=1)  # what the confirmation copies: tiny on a CPU


@pytest.fixture
def chain(tmp_path: Path) -> dict[str, Path]:
    """An exploratory run of zimage_qk_rmsnorm (synthetic, seeds 0 and 1), the dispatcher module
    copied with the rule derived from that run, and the confirmation protocol written for it."""
    spec = RunSpec(
        op="zimage_qk_rmsnorm",
        cases=[CASE],
        arms=ARMS,
        seeds=[0, 1],
        rounds=3,  # an isolated arm needs 3 samples per (case, arm) in a frozen protocol (refuse_thin_isolation)
        l2="hot",
        resamples=200,
        failures=set(),
        gate="no_loss",
        per_call=lambda case, arm, seed, rnd: {"control": 1000.0, "packed_r4_w4": 800.0}.get(arm, 600.0) + rnd,
        protocol_edit=explore_settings,
    )
    explore = write_checked_run(tmp_path / "results" / "explore", spec)
    kernel = tmp_path / "submission" / "zimage_qk_rmsnorm.py"
    kernel.parent.mkdir()
    shutil.copyfile(module.__file__, kernel)
    rule = kernel.with_name("zimage_qk_rmsnorm.rule.toml")
    derive_rule([explore], rule)
    confirm = tmp_path / "confirm.toml"
    write_confirmation(rule, kernel, confirm, seeds=[2])
    return {"explore": explore, "module": kernel, "rule": rule, "confirm": confirm, "root": tmp_path}


def confirmation_run(chain: dict[str, Path], name: str = "confirmation-run", passed: bool = True) -> Path:
    """A finished, verifiable synthetic run of the chain's confirmation protocol (seed 2), written
    as the runner writes one: provenance records the module's sha256 and the links rebased to
    the run directory. The one candidate wins (`passed`) or loses to the control."""
    arm = "user:zimage_qk_rmsnorm"
    confirm = tomllib.loads(chain["confirm"].read_text())
    spec = RunSpec(
        op="zimage_qk_rmsnorm",
        cases=[CASE],
        arms=[ARMS[0], {"name": arm, "kind": "candidate", "available": True, "reason": None}],
        seeds=[2],
        rounds=3,  # an isolated arm needs 3 samples per (case, arm) in a frozen protocol (refuse_thin_isolation)
        l2="hot",
        resamples=200,
        failures=set(),
        gate="no_loss",
        per_call=lambda case, a, seed, rnd: (600.0 if passed else 1500.0) + rnd if a == arm else 1000.0 + rnd,
        protocol_edit=lambda protocol: protocol.update(
            {key: confirm[key] for key in ("phase", "impl_modules", "exploratory_seeds", "rule", "derived_from")}
        ),
        checks=1,
    )
    run = chain["root"] / "results" / name
    write_run_dir(run, spec)
    links = Links.from_record(confirm)
    provenance = json.loads((run / "provenance.json").read_text())
    provenance |= {
        "impl_modules": {"submission/zimage_qk_rmsnorm.py": sha256_file(chain["module"])},
        "confirmation": links.rebased(chain["root"], run).record(),
    }
    (run / "provenance.json").write_text(json.dumps(provenance))
    write_summary(run)
    return seal(run)


def rewrite(path: Path, **fields: object) -> None:
    path.write_text(tomli_w.dumps({**tomllib.loads(path.read_text()), **fields}))
