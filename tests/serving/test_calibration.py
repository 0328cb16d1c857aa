"""`kerneltrial serve calibrate` and a trial that requires a passed calibration (issue 14),
against the fake server with the synthetic benchmark client of test_acceptance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneltrial.serving import trial
from kerneltrial.serving.calibration import ARM_A, ARM_A_PRIME, CALIBRATION, read_calibration
from kerneltrial.serving.cli import app
from kerneltrial.serving.verify import verify_serving_run

from .test_acceptance import CASE, synthetic_bench, trial_text, wobble


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A protocol and its passed calibration (4 launches per arm: two A B / B A blocks)."""
    root = tmp_path_factory.mktemp("cal")
    proto = root / "trial.toml"
    proto.write_text(trial_text(rounds=1, extra='calibration = "cal"\n'))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (wobble(L), 1.0 / wobble(L))))
        r = CliRunner().invoke(
            app,
            ["calibrate", str(proto), "--launches", "4", "--vllm", sys.executable, "-q", "--out", str(root / "cal")],
        )
    assert r.exit_code == 0, r.output
    return proto, root / "cal"


def test_calibrate_writes_an_a_a_run_and_its_false_acceptance_rate(calibrated):
    proto, cal = calibrated
    assert verify_serving_run(cal) == []  # an ordinary serving run directory
    plan = json.loads((cal / "plan.json").read_text())
    assert [(a["name"], a["role"]) for a in plan["arms"]] == [(ARM_A, "baseline"), (ARM_A_PRIME, "candidate")]
    assert plan["arms"][0]["argv"] == plan["arms"][1]["argv"] and plan["rounds"] == 4 and plan["accuracy"] is None
    summary = json.loads((cal / "summary.json").read_text())
    assert summary["acceptance"]["verdict"] == "REJECTED"  # A/A: the rule accepts nothing
    rec = read_calibration(cal)
    assert rec.launches_per_arm == 4 and rec.cases == [CASE] and rec.status == "ok"
    assert [(c.arm, c.against) for c in rec.comparisons] == [(ARM_A_PRIME, ARM_A), (ARM_A, ARM_A_PRIME)]
    forward = rec.comparisons[0]
    assert forward.gain == pytest.approx(summary["acceptance"]["cases"][CASE]["gain"], rel=1e-12)
    assert forward.gain_low == pytest.approx(summary["acceptance"]["cases"][CASE]["gain_low"], rel=1e-12)
    assert 0 < forward.gain_width < 0.01 and 0 < forward.ttft_width < 0.01
    assert (rec.false_acceptances, rec.false_acceptance_rate, rec.passed) == (0, 0.0, True)
    assert rec.sentence.startswith("Calibration passed: the rule accepted 0 of 2 A/A comparison(s)")
    assert json.loads((cal / CALIBRATION).read_text())["schema"] == "kerneltrial.serving-calibration/1"


def run_with(proto: Path, tmp_path: Path, text: str, monkeypatch) -> tuple[int, str, Path]:
    p = proto.parent / f"{tmp_path.name}.toml"  # beside the protocol: `calibration = "cal"` is relative to it
    p.write_text(text)
    out = tmp_path / "run"
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (1.2 if arm == "B" else 1.0, 1.0)))
    r = CliRunner().invoke(app, ["trial", str(p), "--vllm", sys.executable, "-q", "--out", str(out)])
    return r.exit_code, r.output, out


def test_a_trial_runs_with_its_passed_calibration(calibrated, tmp_path, monkeypatch):
    proto, _ = calibrated
    text = proto.read_text().replace("rounds = 1", "rounds = 2")  # the calibration checks server and cases, not rounds
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 0, output
    assert json.loads((out / "summary.json").read_text())["acceptance"]["verdict"] == "ACCEPTED"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace('"--port", "{port}"]', '"--port", "{port}", "--max-num-seqs", "4"]'),
            "used another server: arm A differs from arm calibration in argv --max-num-seqs",
        ),
        (lambda t: t.replace("[[8, 4, 1, 2]]", "[[16, 4, 1, 2]]"), "calibrated cases ['in8-out4-c1-n2'], this trial"),
        (lambda t: t.replace('model_id = "tiny"', 'model_id = "other"'), "calibrated model None (tiny)"),
        (lambda t: t.replace('calibration = "cal"', 'calibration = "nowhere"'), "no calibration.json in"),
    ],
    ids=["other-argv", "other-cases", "other-model", "missing"],
)
def test_a_trial_is_refused_before_any_launch_when_the_calibration_does_not_match(
    calibrated, tmp_path, monkeypatch, edit, message
):
    proto, _ = calibrated
    code, output, out = run_with(proto, tmp_path, edit(proto.read_text()), monkeypatch)
    assert code == 2 and message in output, output
    assert len(output.strip().splitlines()) == 1 and not out.exists()  # one line, nothing launched or written


def test_a_calibration_that_accepted_an_a_a_comparison_refuses_the_trial(calibrated, tmp_path, monkeypatch):
    import shutil

    proto, cal = calibrated
    bad = proto.parent / f"bad-{tmp_path.name}"
    shutil.copytree(cal, bad)
    rec = json.loads((bad / CALIBRATION).read_text())
    rec |= {"false_acceptances": 1, "false_acceptance_rate": 0.5, "passed": False}  # planted: one A/A accepted
    (bad / CALIBRATION).write_text(json.dumps(rec))
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{bad.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and "false-acceptance rate 0.50 above this protocol's max_false_acceptance_rate 0.05" in output
    assert not out.exists()


def test_calibrate_needs_two_launches_per_arm(calibrated, tmp_path):
    proto, _ = calibrated
    r = CliRunner().invoke(app, ["calibrate", str(proto), "--vllm", sys.executable, "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "with 1 launch(es) per arm has no interval; pass --launches 4" in r.output
    assert not (tmp_path / "c").exists()
