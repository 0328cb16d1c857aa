"""Clocks, run-to-run spread, per-case rounds and calibration arms: summary, verify, report.

Every expected value is worked out by hand in the comments; the default synthetic run is
described in rundir_factory.py (ctrl ~1000 ns, fast ~800 ns, slow ~1100 ns per call in c1,
twice that in c2, with a wobble of -20, -10, 0, 10, 20 ns each seen twice per arm and case).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rundir_factory import C1, C2, RunSpec, write_run_dir

from kerneltrial import stats
from kerneltrial.kernel.report import write_report
from kerneltrial.kernel.summary import build_summary, write_summary
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.kernel.verify.arithmetic import spread

# ---------------------------------------------------------------- helpers


def _summary(path: Path) -> dict[str, Any]:
    return json.loads((path / "summary.json").read_text())


def _tamper(path: Path, edit) -> dict[str, str]:
    """Apply `edit` to summary.json; return the failed checks of verify, by name."""
    summary = _summary(path)
    edit(summary)
    (path / "summary.json").write_text(json.dumps(summary))
    return {check.name: check.detail for check in verify_run_dir(path).failures}


def _written(path: Path) -> Path:
    write_summary(path)
    result = verify_run_dir(path)
    assert result.ok, result.failures
    return path


# ---------------------------------------------------------------- stats: hand-computed


def test_relative_spread_hand_computed() -> None:
    # 1..10: p10 at rank 0.9 -> 1.9, p90 at rank 8.1 -> 9.1, median 5.5: (9.1 - 1.9) / 5.5
    values = [float(v) for v in range(10, 0, -1)]
    assert math.isclose(stats.relative_spread(values), 7.2 / 5.5, rel_tol=1e-12)
    assert math.isclose(spread(values), 7.2 / 5.5, rel_tol=1e-12)  # verify's own code agrees
    assert stats.relative_spread([5.0]) == 0.0
    assert stats.relative_spread([100.0, 110.0]) == pytest.approx((109.0 - 101.0) / 105.0, rel=1e-12)
    with pytest.raises(ValueError, match="no timing rows"):
        stats.relative_spread([])


def test_throttle_rule_is_strictly_below_the_threshold() -> None:
    assert stats.throttle_threshold(2000, 0.5) == 1000.0
    assert stats.throttle_threshold(None, 0.9) is None
    assert stats.is_throttled(999.0, 1000.0) and not stats.is_throttled(1000.0, 1000.0)
    assert not stats.is_throttled(None, 1000.0) and not stats.is_throttled(500.0, None)


def test_calibration_helpers_hand_computed() -> None:
    aa = stats.aa_calibration(
        ["tie", "loss", "tie", "win"],
        [stats.Interval(0.9, 1.1), stats.Interval(0.8, 0.9), stats.Interval(1, 1), stats.Interval(1.1, 1.2)],
    )
    assert (aa.n_cases, aa.false_positives, aa.false_positive_rate, aa.inconclusive) == (4, 2, 0.5, 0)
    assert math.isclose(aa.mean_ci_width, (0.2 + 0.1 + 0 + 0.1) / 4, rel_tol=1e-12)
    slow = stats.slow_calibration(["loss", "loss", "tie"])
    assert (slow.n_cases, slow.losses) == (3, 2) and math.isclose(slow.power, 2 / 3)
    assert stats.aa_calibration([], []).false_positive_rate is None
    assert stats.slow_calibration([]).power is None
    ok_aa, ok_slow = stats.aa_calibration(["tie"], [stats.Interval(1, 1)]), stats.slow_calibration(["loss"])
    assert stats.calibration_passed([ok_aa], [ok_slow], 0.05, 0.9)
    assert not stats.calibration_passed([aa], [ok_slow], 0.05, 0.9)  # 0.5 > 0.05
    assert not stats.calibration_passed([ok_aa], [slow], 0.05, 0.9)  # 0.667 < 0.9
    assert not stats.calibration_passed([stats.aa_calibration([], [])], [ok_slow], 0.05, 0.9)  # no case: no pass
    assert stats.calibration_base("aa:ctrl") == ("aa", "ctrl") and stats.calibration_base("slow:x:y") == ("slow", "x:y")
    assert stats.calibration_base("ctrl") is None


# ---------------------------------------------------------------- spread


def test_spread_per_arm_and_control_spread_warning(run_dir: Path) -> None:
    summary = _summary(run_dir)
    c1, c2 = (case["arms"] for case in summary["cases"])
    # c1 ctrl: 980, 980, 990, 990, 1000, 1000, 1010, 1010, 1020, 1020 -> p10 980, p90 1020, median 1000
    assert c1["ctrl"]["spread"] == pytest.approx(40 / 1000, rel=1e-12)
    assert c1["fast"]["spread"] == pytest.approx(40 / 800, rel=1e-12)
    assert c1["slow"]["spread"] == pytest.approx(40 / 1100, rel=1e-12)
    assert c2["ctrl"]["spread"] == 0.02  # 40 / 2000: exactly the band, so no warning
    assert c2["slow"]["spread"] is None and c2["peer"]["spread"] is None  # failed correctness, unavailable
    warnings = summary["warnings"]
    assert f"case {C1}: control run-to-run spread 4.0% exceeds the tie band 2%" in warnings
    assert not any(w.startswith(f"case {C2}: control run-to-run spread") for w in warnings)


def test_verify_catches_an_edited_spread(run_dir: Path) -> None:
    failed = _tamper(run_dir, lambda s: s["cases"][0]["arms"]["fast"].update(spread=0.01))
    assert "spread: summary 0.01 != recomputed 0.05" in failed[f"figures case={C1} arm=fast"]


def test_verify_catches_a_dropped_spread_warning(run_dir: Path) -> None:
    failed = _tamper(run_dir, lambda s: s.update(warnings=[w for w in s["warnings"] if "spread" not in w]))
    assert "control run-to-run spread 4.0% exceeds the tie band 2%" in failed["spread warnings"]


# ---------------------------------------------------------------- clocks


def _clocked(case: str, arm: str, seed: int, rnd: int) -> int | None:
    if case == C2:
        return None  # unknown clock: empty fields
    if (arm, seed, rnd) == ("fast", 0, 0):
        return 999  # below the 1000 MHz threshold: throttled
    if (arm, seed, rnd) == ("fast", 0, 1):
        return 1000  # exactly at the threshold: not throttled
    if (arm, seed, rnd) == ("ctrl", 1, 4):
        return 500
    return 1980


@pytest.fixture
def clocked_run(tmp_path: Path) -> Path:
    spec = RunSpec(sm_mhz=_clocked, clocks={"max_sm_mhz": 2000, "throttle_fraction": 0.5})
    return _written(write_run_dir(tmp_path / "run", spec))


def test_clock_figures_hand_computed(clocked_run: Path) -> None:
    summary = _summary(clocked_run)
    # rows: c1 3 timed arms x 10 units = 30 with a clock; c2 2 arms x 10 = 20 without; 2 below 1000 MHz
    assert summary["clocks"] == {
        "max_sm_mhz": 2000,
        "throttle_fraction": 0.5,
        "threshold_mhz": 1000.0,
        "samples_with_clock": 30,
        "throttled_samples": 2,
    }
    c1, c2 = (case["arms"] for case in summary["cases"])
    assert (c1["ctrl"]["throttled_samples"], c1["fast"]["throttled_samples"], c1["slow"]["throttled_samples"]) == (
        1,
        1,
        0,
    )
    assert all(entry["throttled_samples"] == 0 for entry in c2.values())
    assert (
        "2 of 50 timing samples were throttled: SM clock below 1000 MHz (0.5 x max 2000 MHz); their times may be slow"
    ) in summary["warnings"]


def test_old_and_cpu_runs_have_no_clock_readings(run_dir: Path, tmp_path: Path) -> None:
    assert _summary(run_dir)["clocks"] == {
        "max_sm_mhz": None,
        "throttle_fraction": 0.9,
        "threshold_mhz": None,
        "samples_with_clock": 0,
        "throttled_samples": 0,
    }
    # the runner's CPU rows: clock columns present but empty, plan clocks with no maximum
    spec = RunSpec(sm_mhz=lambda *_: None, clocks={"max_sm_mhz": None, "throttle_fraction": 0.9})
    cpu = _written(write_run_dir(tmp_path / "cpu", spec))
    assert "sm_mhz" in (cpu / "timings.csv").read_text().splitlines()[0]
    assert _summary(cpu)["clocks"]["samples_with_clock"] == 0
    # readings but no known maximum: counted, never flagged
    spec = RunSpec(sm_mhz=lambda *_: 100, clocks={"max_sm_mhz": None, "throttle_fraction": 0.9})
    unknown = _written(write_run_dir(tmp_path / "unknown", spec))
    assert _summary(unknown)["clocks"]["samples_with_clock"] == 50
    assert _summary(unknown)["clocks"]["throttled_samples"] == 0


@pytest.mark.parametrize(
    ("edit", "check", "text"),
    [
        (
            lambda s: s["cases"][0]["arms"]["fast"].update(throttled_samples=0),
            f"figures case={C1} arm=fast",
            "throttled_samples: summary 0 != recomputed 1",
        ),
        (lambda s: s["clocks"].update(throttled_samples=0), "clocks", "throttled_samples: summary 0 != recomputed 2"),
        (
            lambda s: s["clocks"].update(samples_with_clock=50),
            "clocks",
            "samples_with_clock: summary 50 != recomputed 30",
        ),
        (
            lambda s: s["clocks"].update(threshold_mhz=900.0),
            "clocks",
            "threshold_mhz: summary 900.0 != recomputed 1000.0",
        ),
        (
            lambda s: s.update(warnings=[w for w in s["warnings"] if "throttled" not in w]),
            "clocks",
            "do not say 2 of 50 samples were throttled below 1000 MHz",
        ),
    ],
)
def test_verify_catches_edited_clock_figures(clocked_run: Path, edit, check: str, text: str) -> None:
    assert text in _tamper(clocked_run, edit)[check]


def test_verify_catches_an_edited_clock_reading(clocked_run: Path) -> None:
    # un-throttle the 999 MHz sample and re-hash it into the summary: the figures still disagree
    path = clocked_run / "timings.csv"
    lines = path.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(f"{C1},0,0,") and ",fast," in line)
    assert lines[row].endswith(",999,2619")
    lines[row] = lines[row].replace(",999,2619", ",1980,2619")
    path.write_text("\n".join(lines) + "\n")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    failed = _tamper(clocked_run, lambda s: s["inputs_sha256"].update({"timings.csv": digest}))
    assert "throttled_samples: summary 1 != recomputed 0" in failed[f"figures case={C1} arm=fast"]
    assert "throttled_samples: summary 2 != recomputed 1" in failed["clocks"]


# ---------------------------------------------------------------- per-case rounds

NOISE_RULE = {"target_ci_width": 0.01, "max_rounds": 8, "time_budget_s": 60.0}


def test_per_case_rounds_set_expected_rows_and_units(tmp_path: Path) -> None:
    path = _written(write_run_dir(tmp_path / "run", RunSpec(case_rounds={C1: 7, C2: 5}, noise_rule=NOISE_RULE)))
    summary = _summary(path)
    c1, c2 = summary["cases"]
    assert (c1["rounds"], c1["units_planned"], c1["arms"]["fast"]["n_samples"]) == (7, 14, 14)  # 2 seeds x 7
    assert (c2["rounds"], c2["units_planned"], c2["arms"]["fast"]["n_samples"]) == (5, 10, 10)
    assert summary["noise_rule"] == NOISE_RULE
    assert not any("planned" in w for w in summary["warnings"])
    detail = next(c.detail for c in verify_run_dir(path).checks if c.name == "rounds per case")
    assert detail == f"rounds per case: {C1} 7, {C2} 5"
    # a round the noise rule added is an expected row: dropping one is caught
    lines = (path / "timings.csv").read_text().splitlines()
    kept = [line for line in lines if not (line.startswith(f"{C1},1,6,") and ",fast," in line)]
    assert len(kept) == len(lines) - 1
    (path / "timings.csv").write_text("\n".join(kept) + "\n")
    failed = {c.name: c.detail for c in verify_run_dir(path).failures}
    assert f"missing (case, seed, round, arm) rows: 1, e.g. [('{C1}', 1, 6, 'fast')]" in failed["timing rows"]


def test_old_plan_without_case_rounds_uses_plan_rounds(run_dir: Path) -> None:
    summary = _summary(run_dir)
    assert [(c["rounds"], c["units_planned"], c["injected_delay_ns"]) for c in summary["cases"]] == [(5, 10, None)] * 2
    assert summary["noise_rule"] is None


NO_RULE = f"case {C1}: 7 rounds run but only 5 planned and no noise rule (target_ci_width) allows more"


@pytest.mark.parametrize(
    ("rounds", "rule", "text", "warning"),
    [
        (7, None, f"{C1}: 7 rounds but 5 planned and no noise rule", NO_RULE),
        (7, NOISE_RULE | {"target_ci_width": None}, f"{C1}: 7 rounds but 5 planned and no noise rule", NO_RULE),
        (
            9,
            NOISE_RULE,
            f"{C1}: 9 rounds exceed the noise rule's max_rounds 8",
            f"case {C1}: 9 rounds run, more than the noise rule's max_rounds 8",
        ),
        (
            4,
            NOISE_RULE,
            f"{C1}: 4 rounds, fewer than the planned 5",
            f"case {C1}: plan.json says 4 rounds, fewer than the planned 5",
        ),
    ],
)
def test_rounds_outside_the_noise_rule_fail(
    tmp_path: Path, rounds: int, rule: dict | None, text: str, warning: str
) -> None:
    path = write_run_dir(tmp_path / "run", RunSpec(case_rounds={C1: rounds}, noise_rule=rule))
    assert warning in build_summary(path)["warnings"]
    write_summary(path)
    assert text in {c.name: c.detail for c in verify_run_dir(path).failures}["rounds per case"]


def test_verify_catches_edited_rounds(tmp_path: Path) -> None:
    path = _written(
        write_run_dir(
            tmp_path / "run", RunSpec(case_rounds={C1: 7}, noise_rule=NOISE_RULE, injected_delay_ns={C1: 30.0})
        )
    )
    failed = _tamper(path, lambda s: s["cases"][0].update(rounds=5, units_planned=10, injected_delay_ns=3.0))
    detail = failed[f"case header case={C1}"]
    assert "rounds: summary 5 != recomputed 7" in detail and "units_planned: summary 10 != recomputed 14" in detail
    assert "injected_delay_ns: summary 3.0 != recomputed 30.0" in detail


# ---------------------------------------------------------------- calibration

CALIBRATION_ARMS = [
    {"name": "ctrl", "kind": "control", "available": True, "reason": None},
    {"name": "aa:ctrl", "kind": "calibration", "available": True, "reason": None},
    {"name": "slow:ctrl", "kind": "calibration", "available": True, "reason": None},
]
CALIBRATION = {"injected_slowdown": 0.03, "max_false_positive_rate": 0.05, "min_power": 0.9}


def _mixed(case: str, arm: str, seed: int, rnd: int) -> float:
    """ctrl 1000 ns flat. aa:ctrl: c1 half its units 1000, half 1100; c2 1100 flat.
    slow:ctrl: c1 1030 (3% slower), c2 1010 (1% slower)."""
    if arm == "aa:ctrl":
        return (1100.0 if (seed * 5 + rnd) % 2 else 1000.0) if case == C1 else 1100.0
    if arm == "slow:ctrl":
        return 1030.0 if case == C1 else 1010.0
    return 1000.0


def _calibration_run(tmp_path: Path, per_call, name: str = "cal") -> Path:
    spec = RunSpec(
        arms=CALIBRATION_ARMS,
        failures=set(),
        per_call=per_call,
        gate="no_loss",
        calibration=CALIBRATION,
        injected_delay_ns={C1: 30.0, C2: 30.0},
    )
    return _written(write_run_dir(tmp_path / name, spec))


@pytest.fixture
def failing_calibration(tmp_path: Path) -> Path:
    return _calibration_run(tmp_path, _mixed)


def test_calibration_figures_hand_computed(failing_calibration: Path) -> None:
    summary = _summary(failing_calibration)
    c1, c2 = (case["arms"] for case in summary["cases"])
    # aa:ctrl in c1: every resample's control median is 1000; its own median is 1000, 1050 or 1100 with
    # probabilities ~0.38, 0.25, 0.38, so the 2.5% and 97.5% quantiles are 1000/1100 and 1000/1000.
    assert (c1["aa:ctrl"]["ci_low"], c1["aa:ctrl"]["ci_high"]) == (1000 / 1100, 1.0)
    assert c1["aa:ctrl"]["verdict"] == "tie" and c1["aa:ctrl"]["speedup"] == 1000 / 1050
    assert (c2["aa:ctrl"]["ci_low"], c2["aa:ctrl"]["ci_high"], c2["aa:ctrl"]["verdict"]) == (
        1000 / 1100,
        1000 / 1100,
        "loss",
    )
    assert c1["slow:ctrl"]["verdict"] == "loss"  # 1000/1030 = 0.971 < 0.98
    assert c2["slow:ctrl"]["verdict"] == "tie"  # 1000/1010 = 0.990
    calibration = summary["calibration"]
    assert calibration["arms"] == {
        "aa:ctrl": {
            "kind": "aa",
            "base": "ctrl",
            "n_cases": 2,
            "not_tie": 1,
            "false_positive_rate": 0.5,
            "mean_ci_width": pytest.approx((1 - 1000 / 1100 + 0) / 2, rel=1e-12),
        },
        # realized: 1030/1000 - 1 and 1010/1000 - 1; both <= 1.5 x 3%, so power at nominal is 1 loss of 2
        "slow:ctrl": {
            "kind": "slow",
            "base": "ctrl",
            "n_cases": 2,
            "losses": 1,
            "power": 0.5,
            "realized_slowdown": {C1: pytest.approx(0.03, rel=1e-12), C2: pytest.approx(0.01, rel=1e-12)},
            "realized_min": pytest.approx(0.01, rel=1e-12),
            "realized_max": pytest.approx(0.03, rel=1e-12),
            "power_at_nominal": 0.5,
        },
    }
    assert (calibration["injected_slowdown"], calibration["max_false_positive_rate"], calibration["min_power"]) == (
        0.03,
        0.05,
        0.9,
    )
    assert calibration["passed"] is False
    assert calibration["sentence"] == (
        "Calibration FAILED: A/A arm aa:ctrl was called different from its copy in 1 of 2 case(s) "
        "(false-positive rate 50%, at most 5% allowed; mean CI width 0.0455); slowed arm slow:ctrl (3% nominal, "
        "1.0-3.0% realized) was called a loss in 1 of 2 case(s) (power 50%, at least 90% required; power at nominal "
        "50% over the 2 case(s) realized at most 4.5%)."
    )
    assert not any("never as small as nominal" in w for w in summary["warnings"])
    # calibration arms are ordinary arms for the aggregates and the gate
    assert summary["aggregates"]["slow:ctrl"]["losses"] == 1 and summary["gate"]["passed_arms"] == []


def test_calibration_that_passes(tmp_path: Path) -> None:
    path = _calibration_run(tmp_path, lambda case, arm, seed, rnd: 1030.0 if arm == "slow:ctrl" else 1000.0)
    calibration = _summary(path)["calibration"]
    assert calibration["arms"]["aa:ctrl"] == {
        "kind": "aa",
        "base": "ctrl",
        "n_cases": 2,
        "not_tie": 0,
        "false_positive_rate": 0.0,
        "mean_ci_width": 0.0,
    }
    assert calibration["arms"]["slow:ctrl"]["power"] == 1.0
    assert calibration["passed"] is True and calibration["sentence"].startswith("Calibration passed: ")


def test_no_calibration_section_without_calibration_arms(run_dir: Path) -> None:
    assert "calibration" not in _summary(run_dir)
    failed = _tamper(run_dir, lambda s: s.update(calibration={"passed": True}))
    assert "plan.json has no aa:/slow: arm" in failed["calibration"]


def test_calibration_defaults_and_an_arm_not_based_on_the_control(tmp_path: Path) -> None:
    spec = RunSpec(
        arms=[*RunSpec().arms, {"name": "aa:fast", "kind": "calibration", "available": True, "reason": None}]
    )
    path = _written(write_run_dir(tmp_path / "run", spec))  # no plan `calibration`: the defaults apply
    summary = _summary(path)
    calibration = summary["calibration"]
    assert (calibration["max_false_positive_rate"], calibration["min_power"]) == (0.05, 0.9)
    # aa:fast times like ctrl (BASE_NS has no entry: 1000 ns), wobble shifted by its name length
    assert list(calibration["arms"]) == ["aa:fast"] and calibration["arms"]["aa:fast"]["base"] == "fast"
    assert any(
        w.startswith("calibration arm aa:fast is compared with the control ctrl, not with fast")
        for w in summary["warnings"]
    )


@pytest.mark.parametrize(
    ("edit", "text"),
    [
        (
            lambda c: c["arms"]["aa:ctrl"].update(false_positive_rate=0.0),
            "false_positive_rate: summary 0.0 != recomputed 0.5",
        ),
        (
            lambda c: c["arms"]["aa:ctrl"].update(mean_ci_width=0.01),
            "mean_ci_width: summary 0.01 != recomputed 0.04545",
        ),
        (lambda c: c["arms"]["aa:ctrl"].update(not_tie=0), "not_tie: summary 0 != recomputed 1"),
        (lambda c: c["arms"]["slow:ctrl"].update(power=1.0), "power: summary 1.0 != recomputed 0.5"),
        (lambda c: c["arms"]["slow:ctrl"].update(losses=2), "losses: summary 2 != recomputed 1"),
        (lambda c: c.update(passed=True, sentence="Calibration passed."), "passed: summary True != recomputed False"),
        (lambda c: c.update(sentence="Calibration passed: all good."), "does not start 'Calibration FAILED'"),
        (lambda c: c.update(min_power=0.5), "min_power: summary 0.5 != recomputed 0.9"),
        (lambda c: c["arms"].pop("slow:ctrl"), "calibration slow:ctrl power: summary None != recomputed 0.5"),
        (
            lambda c: c["arms"]["slow:ctrl"].update(kind="aa"),
            "calibration slow:ctrl kind: summary 'aa' != recomputed 'slow'",
        ),
        (lambda c: c["arms"].update({"aa:ghost": {}}), "not aa:/slow: arms of plan.json: ['aa:ghost']"),
    ],
)
def test_verify_catches_edited_calibration_figures(failing_calibration: Path, edit, text: str) -> None:
    assert text in _tamper(failing_calibration, lambda s: edit(s["calibration"]))["calibration"]


# ---------------------------------------------------------------- realized slowdown of slow: arms


def _launch_gap(case: str, arm: str, seed: int, rnd: int) -> float:
    """ctrl 1000 ns in C1, 2000 ns in C2; aa:ctrl the same; slow:ctrl pays its delay kernel's launch
    gap too: +100 ns in both, so realized 10% in C1 and 5% in C2 where 3% was nominal."""
    base = 1000.0 if case == C1 else 2000.0
    return base + 100.0 if arm == "slow:ctrl" else base


def test_realized_slowdown_far_above_nominal_is_reported_and_warned(tmp_path: Path) -> None:
    summary = _summary(_calibration_run(tmp_path, _launch_gap))
    calibration = summary["calibration"]
    slow = calibration["arms"]["slow:ctrl"]
    # 1100/1000 - 1 = 0.10 and 2100/2000 - 1 = 0.05, both losses (speedups 0.909 and 0.952 < 0.98)
    assert slow["realized_slowdown"] == {C1: pytest.approx(0.10, rel=1e-12), C2: pytest.approx(0.05, rel=1e-12)}
    assert (slow["realized_min"], slow["realized_max"]) == (
        pytest.approx(0.05, rel=1e-12),
        pytest.approx(0.10, rel=1e-12),
    )
    assert (slow["losses"], slow["power"]) == (2, 1.0)
    assert slow["power_at_nominal"] is None  # no case realized <= 4.5%
    assert calibration["passed"] is True  # `passed` keeps its definition: A/A rate and power
    assert calibration["sentence"].endswith(
        "slowed arm slow:ctrl (3% nominal, 5.0-10.0% realized) was called a loss in 2 of 2 case(s) (power 100%, "
        "at least 90% required; power at nominal n/a over the 0 case(s) realized at most 4.5%)."
    )
    assert (
        "calibration arm slow:ctrl: the injected slowdown was never as small as nominal (5.0-10.0% realized, "
        "3% nominal): power at nominal is not demonstrated"
    ) in summary["warnings"]


def test_power_at_nominal_counts_only_cases_near_nominal(tmp_path: Path) -> None:
    # C1: slow 1010 vs 1000, realized 1%, a tie (0.990); C2: slow 2200 vs 2000, realized 10%, a loss (0.909)
    def per_call(case: str, arm: str, seed: int, rnd: int) -> float:
        if arm == "slow:ctrl":
            return 1010.0 if case == C1 else 2200.0
        return 1000.0 if case == C1 else 2000.0

    slow = _summary(_calibration_run(tmp_path, per_call))["calibration"]["arms"]["slow:ctrl"]
    assert (slow["power"], slow["power_at_nominal"]) == (0.5, 0.0)  # 1 loss of 2; 0 losses of the 1 near case
    assert stats.slow_calibration(["tie", "loss"], [0.01, 0.10], 0.03) == stats.SlowCalibration(
        2, 1, 0.5, realized_min=0.01, realized_max=0.10, nominal_cases=1, power_at_nominal=0.0
    )
    # the boundary is inclusive: 4.5% counts at 3% nominal
    assert stats.slow_calibration(["loss"], [0.045], 0.03).power_at_nominal == 1.0


@pytest.mark.parametrize(
    ("edit", "text"),
    [
        (lambda c: c["arms"]["slow:ctrl"]["realized_slowdown"].update({C1: 0.02}), "realized_slowdown: summary"),
        (lambda c: c["arms"]["slow:ctrl"].pop("realized_slowdown"), "realized_slowdown: summary None"),
        (lambda c: c["arms"]["slow:ctrl"].update(realized_min=0.06), "realized_min: summary 0.06 != recomputed 0.05"),
        (lambda c: c["arms"]["slow:ctrl"].update(realized_max=0.2), "realized_max: summary 0.2 != recomputed 0.1"),
        (
            lambda c: c["arms"]["slow:ctrl"].update(power_at_nominal=1.0),
            "power_at_nominal: summary 1.0 != recomputed None",
        ),
        (lambda c: c.update(sentence=c["sentence"].replace("5.0-10.0%", "3.0%")), "does not state"),
    ],
)
def test_verify_recomputes_the_realized_slowdown(tmp_path: Path, edit, text: str) -> None:
    path = _calibration_run(tmp_path, _launch_gap)
    assert text in _tamper(path, lambda s: edit(s["calibration"]))["calibration"]


def test_verify_requires_the_never_nominal_warning(tmp_path: Path) -> None:
    path = _calibration_run(tmp_path, _launch_gap)
    failed = _tamper(path, lambda s: s.update(warnings=[w for w in s["warnings"] if "never as small" not in w]))
    assert "injected slowdown was never as small as nominal (realized at least 5.0%" in failed["calibration"]


def _as_schema_2(summary: dict[str, Any]) -> None:
    """What a summary written before the realized slowdown looked like (e.g. results/archive/h200/calibration)."""
    summary["schema"] = "kerneltrial.summary/2"
    for figures in summary.get("calibration", {}).get("arms", {}).values():
        for key in ("realized_slowdown", "realized_min", "realized_max", "power_at_nominal"):
            figures.pop(key, None)
    summary["warnings"] = [w for w in summary["warnings"] if "never as small" not in w]


def test_schema_2_summary_verifies_without_realized_slowdown(tmp_path: Path) -> None:
    path = _calibration_run(tmp_path, _launch_gap)
    assert _tamper(path, _as_schema_2) == {}
    failed = _tamper(path, lambda s: s.update(schema="kerneltrial.summary/3"))  # now claims the new fields
    assert "realized_min: summary None != recomputed 0.05" in failed["calibration"]


def test_committed_calibration_realized_slowdown() -> None:
    """results/archive/h200/calibration: realized = the committed per-case medians' ratio - 1, never near 3%."""
    run = Path(__file__).resolve().parents[2] / "results" / "archive" / "h200" / "calibration"
    committed = _summary(run)
    summary = build_summary(run)
    slow = summary["calibration"]["arms"]["slow:control"]
    expected = {
        c["case"]: c["arms"]["slow:control"]["median_ns_per_call"] / c["arms"]["control"]["median_ns_per_call"] - 1
        for c in committed["cases"]
    }
    assert slow["realized_slowdown"] == pytest.approx(expected, rel=1e-12)
    assert min(expected.values()) > 0.045 and slow["power_at_nominal"] is None
    assert "(3% nominal, 4.8-37.7% realized)" in summary["calibration"]["sentence"]
    assert any("never as small as nominal" in w for w in summary["warnings"])


def test_verify_catches_a_dropped_calibration_section(failing_calibration: Path) -> None:
    failed = _tamper(failing_calibration, lambda s: s.pop("calibration"))
    assert "no calibration section" in failed["calibration"]


# ---------------------------------------------------------------- old summaries and the report


def _as_schema_1(summary: dict[str, Any]) -> None:
    """What a summary written before this change looked like."""
    summary["schema"] = "kerneltrial.summary/1"
    for key in ("clocks", "noise_rule", "calibration"):
        summary.pop(key, None)
    for case in summary["cases"]:
        for key in ("rounds", "injected_delay_ns"):
            case.pop(key)
        for entry in case["arms"].values():
            entry.pop("throttled_samples")
            entry.pop("spread")
    summary["warnings"] = [w for w in summary["warnings"] if "spread" not in w and "throttled" not in w]


def test_schema_1_summary_of_an_old_run_still_verifies_and_renders(run_dir: Path) -> None:
    assert _tamper(run_dir, _as_schema_1) == {}
    report = write_report(run_dir).read_text()
    assert "spread" not in report and "Calibration" not in report and "clocks:" not in report


@pytest.mark.parametrize("which", ["clocked", "calibration", "rounds"])
def test_schema_1_cannot_hide_newer_raw_fields(tmp_path: Path, which: str) -> None:
    if which == "clocked":
        path = _written(write_run_dir(tmp_path / "run", RunSpec(sm_mhz=_clocked, clocks={"max_sm_mhz": 2000})))
    elif which == "calibration":
        path = _calibration_run(tmp_path, _mixed)
    else:
        path = _written(write_run_dir(tmp_path / "run", RunSpec(case_rounds={C1: 7}, noise_rule=NOISE_RULE)))
    failed = _tamper(path, _as_schema_1)
    assert "summary lacks the figures for raw data it must cover" in failed["summary schema"]


def test_unknown_schema_fails(run_dir: Path) -> None:
    assert "is not kerneltrial.summary/3" in _tamper(run_dir, lambda s: s.update(schema="x/3"))["summary schema"]


def test_report_shows_clocks_spread_and_throttled_counts(clocked_run: Path) -> None:
    report = write_report(clocked_run).read_text()
    assert (
        "- clocks: 30 samples with an SM clock reading; 2 throttled (SM clock below 1000 MHz = 0.5 x max 2000 MHz)"
    ) in report
    assert "| spread p10–p90 | throttled samples |" in report
    assert f"| `{C1}` | `fast` | 0.80 | 1.250 [" in report
    assert "| 5.0% | 1 of 10 |" in report  # fast in c1: spread 40/800, one throttled sample of ten
    assert f"| `{C2}` | `slow` |" in report and "| – | – |" in report  # failed correctness: no spread, no samples


def test_report_without_throttling_has_no_throttled_column(run_dir: Path) -> None:
    report = write_report(run_dir).read_text()
    assert "- clocks: no SM clock recorded per sample (no NVML); throttling not checked" in report
    assert "| spread p10–p90 |" in report and "throttled samples" not in report
    assert "| 4.0% |" in report


def test_report_shows_calibration_and_rounds(failing_calibration: Path, tmp_path: Path) -> None:
    report = write_report(failing_calibration).read_text()
    assert "## Calibration: **FAILED**" in report
    assert "Calibration FAILED: A/A arm aa:ctrl was called different" in report
    assert "| `aa:ctrl` | A/A copy | `ctrl` | 1 of 2 not tie | 0.50 | ≤ 0.05 | 0.0455 |" in report
    assert "| `slow:ctrl` | +3% delay (1.0–3.0% realized) | `ctrl` | 1 of 2 loss | 0.50 | ≥ 0.9 | – |" in report
    assert f"Injected delay per call: `{C1}` 30.0 ns, `{C2}` 30.0 ns" in report
    rounds = _written(write_run_dir(tmp_path / "rounds", RunSpec(case_rounds={C1: 7}, noise_rule=NOISE_RULE)))
    assert (
        f"- rounds per case: `{C1}` 7, `{C2}` 5 (noise rule: rounds added until the CI width is at most 0.01, "
        "up to 8 rounds or 60.0 s)"
    ) in write_report(rounds).read_text()


def test_numpy_quantile_is_the_spread_rule() -> None:
    # the contract says numpy's default quantile method; both implementations follow it
    rng = np.random.default_rng(3)
    values = list(rng.uniform(900, 1100, size=37))
    p10, p90 = np.quantile(values, [0.1, 0.9])
    expected = (p90 - p10) / np.median(values)
    assert math.isclose(stats.relative_spread(values), expected, rel_tol=1e-12)
    assert math.isclose(spread(values), expected, rel_tol=1e-12)
