"""Throttled samples taken again (issue 40 item 2): a sample whose SM clock reads below the
throttle threshold right after it is taken again after a rest, up to `throttle_retakes` times;
provenance.json counts the re-takes and the kept sample's clock is the one timings.csv records."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.rundir.layout import RunDir
from kerneltrial.trial import rounds, runner
from kerneltrial.trial.rounds import Retakes
from kerneltrial.trial.runner import run_trial
from tests.kt import write_protocol

PROTOCOL = """
name = "throttle"
op = "rmsnorm"
candidates = ["packed_r4_w4"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
throttle_retakes = 2
throttle_recovery_s = 0
[[cases]]
shape = [4, 64]
"""
MAX_MHZ = 2000


@dataclass
class Clocks:
    """A GPU clock that reads `readings` (SM MHz) in turn, then the maximum."""

    readings: list[int] = field(default_factory=list)

    def read(self) -> tuple[int | None, int | None]:
        return (self.readings.pop(0) if self.readings else MAX_MHZ), 3201

    def max_sm_mhz(self) -> int:
        return MAX_MHZ


def test_a_throttled_sample_is_retaken_up_to_the_bound_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # control and candidate, 2 rounds: 4 samples. The first sample reads throttled three times
    # (two re-takes, then kept throttled), the second once (one re-take), the rest at full clock
    clocks = Clocks([1000, 1000, 1000, 1500])
    for module in (rounds, runner):
        monkeypatch.setattr(module.ClockReader, "open", classmethod(lambda cls, enabled: clocks))
    out = run_trial(write_protocol(tmp_path / "p.toml", PROTOCOL), tmp_path / "run")
    lead = json.loads((out / "provenance.json").read_text())["lead"]
    assert lead["samples_retaken_throttled"] == 3
    # the first sample is the control's (two re-takes), the second packed_r4_w4's (one)
    assert lead["samples_retaken_throttled_by_arm"] == {"control": 2, "packed_r4_w4": 1}
    with (out / "timings.csv").open(newline="") as handle:
        sm = [int(r["sm_mhz"]) for r in csv.DictReader(handle)]
    assert sorted(sm) == [1000, MAX_MHZ, MAX_MHZ, MAX_MHZ]  # 4 samples kept; only the first still throttled
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clocks"]["throttled_samples"] == 1
    result = verify_run_dir(out)
    assert result.ok and next(c for c in result.checks if c.name == "throttle re-takes").applicable
    # a reviewer rebalances the re-takes between the arms, or names another arm, and rehashes the manifest
    provenance = json.loads((out / "provenance.json").read_text())
    for by_arm, says in (
        ({"control": 1, "packed_r4_w4": 1}, "lead.samples_retaken_throttled is 3, its arms' re-takes sum to 2"),
        ({"control": 2, "torch_eager": 1}, "lead.samples_retaken_throttled_by_arm names 'torch_eager', no arm"),
    ):
        provenance["lead"]["samples_retaken_throttled_by_arm"] = by_arm
        (out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
        runner.write_manifest(RunDir(out))
        check = next(c for c in verify_run_dir(out).checks if c.name == "throttle re-takes")
        assert not check.ok and check.problems[0].startswith(says), check.problems


def test_retakes_only_below_the_threshold_and_within_the_bound(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(rounds.time, "sleep", lambda s: None)
    retakes = Retakes(1800.0, 2, 0.5)
    assert retakes.again(1000, 0, "a") and retakes.again(1000, 1, "a") and not retakes.again(1000, 2, "a")
    assert not retakes.again(1900, 0, "b") and not retakes.again(None, 0, "b") and retakes.count == 2
    assert retakes.again(1000, 0, "b") and retakes.by_arm == {"a": 2, "b": 1} and retakes.count == 3
    assert not Retakes(None, 2, 0.5).again(1000, 0, "a")  # no clock (a CPU run): nothing is re-taken
