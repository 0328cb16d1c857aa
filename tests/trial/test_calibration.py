"""A/A calibration, the injected-slowdown power check, the noise rule and throttle flags on the CPU backend."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kerneltrial.analysis.verify import verify_run_dir
from kerneltrial.trial.calibration import CalibrationError
from kerneltrial.trial.runner import calibrate, run_trial

BASE = """
name = "cal"
op = "rmsnorm"
control = "control"
candidates = ["packed_r4_w4"]
seeds = [0, 1]
rounds = {rounds}
warmup = 1
calls_per_sample = 2
l2 = "hot"
tie_band = 0.05
injected_slowdown = 0.9
{extra}
[[cases]]
shape = [8, 256]
"""


def protocol(tmp_path: Path, rounds: int = 6, extra: str = "") -> Path:
    path = tmp_path / "p.toml"
    path.write_text(BASE.format(rounds=rounds, extra=extra))
    return path


def rows(run: Path) -> list[dict[str, str]]:
    with (run / "timings.csv").open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_calibration_runs_aa_copy_and_slowed_control(tmp_path):
    run = calibrate(protocol(tmp_path), tmp_path / "cal")
    assert (tmp_path / "cal.protocol.toml").exists()
    plan = json.loads((run / "plan.json").read_text())
    assert [a["name"] for a in plan["arms"]] == ["control", "aa:control", "slow:control"]
    assert plan["cases"][0]["injected_delay_ns"] > 0
    summary = json.loads((run / "summary.json").read_text())
    case = summary["cases"][0]["arms"]
    # A 90% injected slowdown is seen as a loss; the A/A copy is compared like any arm.
    assert case["slow:control"]["verdict"] == "loss"
    assert case["aa:control"]["status"] == "timed"
    assert case["aa:control"]["n_samples"] == case["control"]["n_samples"] == 2 * 6
    calibration = summary["calibration"]
    assert calibration["arms"]["slow:control"]["power"] == 1.0
    assert verify_run_dir(run).ok


@pytest.mark.slow
def test_noise_rule_adds_rounds_until_max(tmp_path):
    extra = "target_ci_width = 1e-9\nmax_rounds = 4\n"
    run = run_trial(protocol(tmp_path, rounds=2, extra=extra), tmp_path / "run")
    plan = json.loads((run / "plan.json").read_text())
    assert plan["cases"][0]["rounds"] == 4  # an unreachable target: stopped by max_rounds
    keys = {(r["seed"], r["round"], r["arm"]) for r in rows(run)}
    assert len(keys) == 2 * 4 * 2 == len(rows(run))
    assert verify_run_dir(run).ok


def test_noise_rule_stops_when_ci_is_narrow(tmp_path):
    extra = "target_ci_width = 100.0\nmax_rounds = 9\n"
    run = run_trial(protocol(tmp_path, rounds=2, extra=extra), tmp_path / "run")
    assert json.loads((run / "plan.json").read_text())["cases"][0]["rounds"] == 2


def test_uncalibrated_run_is_refused(tmp_path):
    with pytest.raises(CalibrationError, match="calibration_run"):
        run_trial(protocol(tmp_path, extra='calibration_run = "no-such-run"\n'), tmp_path / "run")


def test_timings_carry_clock_columns(tmp_path):
    run = run_trial(protocol(tmp_path, rounds=2), tmp_path / "run")
    first = rows(run)[0]
    assert "sm_mhz" in first and first["sm_mhz"] == ""  # no NVML on a CPU run: recorded as unknown


def test_calibration_of_another_operator_is_refused(tmp_path):
    run = calibrate(protocol(tmp_path), tmp_path / "cal")
    other = tmp_path / "other.toml"
    other.write_text(
        BASE.format(rounds=2, extra='calibration_run = "cal"\n').replace('op = "rmsnorm"', 'op = "rmsnorm_fp32"')
    )
    summary = json.loads((run / "summary.json").read_text())
    if not summary["calibration"]["passed"]:
        pytest.skip("the CPU calibration itself did not pass on this loaded machine")
    with pytest.raises(Exception, match="calibrated 'rmsnorm', not 'rmsnorm_fp32'"):
        run_trial(other, tmp_path / "run")
