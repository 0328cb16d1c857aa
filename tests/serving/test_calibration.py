"""`kerneltrial serve calibrate` and a trial that requires a passed calibration (issue 14), with
power (issue 26): it passes only when a trial of the protocol's rounds would have interval
half-widths below the noise band and enough A/A comparisons exist; against the fake server with
the synthetic benchmark client of test_acceptance."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from scipy import stats

from kerneltrial.serving import trial
from kerneltrial.serving.calibration import ARM_A, ARM_A_PRIME, CALIBRATION, read_calibration
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .test_acceptance import CASE, synthetic_bench, trial_text, wobble


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A protocol of 4 rounds and its passed calibration (default launches: 6 per arm, whose 4-round
    subsets give 15 x 2 directions = 30 >= 20 comparisons)."""
    root = tmp_path_factory.mktemp("cal")
    proto = write_protocol(root / "trial.toml", trial_text(rounds=4, extra='calibration = "cal"\n'))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (wobble(L), 1.0 / wobble(L))))
        r = run_cli(
            "serve",
            "calibrate",
            str(proto),
            "--vllm",
            sys.executable,
            "-q",
            "--out",
            str(root / "cal"),
        )
    assert r.exit_code == 0, r.output
    return proto, root / "cal"


def test_calibrate_writes_an_a_a_run_its_noise_and_its_false_acceptance_rate(calibrated):
    proto, cal = calibrated
    assert verify_serving_run(cal).problems == []  # an ordinary serving run directory
    plan = json.loads((cal / "plan.json").read_text())
    assert [(a["name"], a["role"]) for a in plan["arms"]] == [(ARM_A, "baseline"), (ARM_A_PRIME, "candidate")]
    assert plan["arms"][0]["argv"] == plan["arms"][1]["argv"] and plan["rounds"] == 6 and plan["accuracy"] is None
    rec = read_calibration(cal)
    assert (rec.launches_per_arm, rec.trial_rounds, rec.cases, rec.status) == (6, 4, [CASE], "ok")
    assert rec.comparisons_needed == 20 and len(rec.comparisons) == 30  # C(6, 4) subsets x 2 directions
    assert {tuple(c.rounds) for c in rec.comparisons} == set(itertools.combinations(range(6), 4))
    [noise] = rec.noise
    summary = json.loads((cal / "summary.json").read_text())
    results = summary["results"]
    rounds = {x["launch"]: x["round"] for x in plan["launches"]}
    logs = {
        arm: {rounds[g["launch"]]: math.log(g["total_token_throughput"]) for g in results[arm][CASE]["launches"]}
        for arm in (ARM_A, ARM_A_PRIME)
    }
    d = [logs[ARM_A_PRIME][r] - logs[ARM_A][r] for r in range(6)]
    assert noise.rounds == 6 and noise.gain_sd == pytest.approx(statistics.stdev(d), rel=1e-9)
    want = math.exp(stats.t.ppf(0.975, 3) * noise.gain_sd / 2) - 1  # a trial of 4 rounds
    assert noise.gain_half_width == pytest.approx(want, rel=1e-9) and noise.gain_half_width < 0.01 and noise.powered
    assert noise.launches_needed is not None and noise.launches_needed <= 4
    assert (rec.false_acceptances, rec.false_acceptance_rate, rec.passed, rec.reasons) == (0, 0.0, True, [])
    assert rec.sentence.startswith("Calibration passed for trials of 4 launches per arm: interval half-widths")
    assert "accepted 0 of 30 A/A comparison(s)" in rec.sentence
    assert json.loads((cal / CALIBRATION).read_text())["schema"] == "kerneltrial.serving-calibration/2"


def test_a_calibration_without_power_fails_and_says_how_many_launches_it_needs(tmp_path, monkeypatch):
    """The issue's case: --launches 2 "passed" with a gain interval of +-7,453% on the fake server."""
    proto = write_protocol(tmp_path / "trial.toml", trial_text(rounds=2))
    noisy = {0: 1.0, 1: 1.3, 2: 0.8, 3: 1.1}  # +-20% from launch to launch
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (noisy[L], 1.0 / noisy[L])))
    out = tmp_path / "cal"
    r = run_cli(
        "serve",
        "calibrate",
        str(proto),
        "--launches",
        "2",
        "--vllm",
        sys.executable,
        "-q",
        "--out",
        str(out),
    )
    assert r.exit_code == 1, r.output
    rec = read_calibration(out)
    assert not rec.passed and len(rec.comparisons) == 2 and rec.comparisons_needed == 20
    [noise] = rec.noise
    assert noise.gain_half_width > 1 and not noise.powered and noise.launches_needed > 2
    assert rec.reasons == [
        f"{CASE}: a trial of 2 launches per arm has a gain interval of +-{noise.gain_half_width:.2%} and a TTFT interval "
        f"of +-{noise.ttft_half_width:.2%} (per-round log-ratio sd {noise.gain_sd:.2%} and {noise.ttft_sd:.2%} over 2 "
        f"rounds), not below the noise band 1.00% and ttft_ratio_max 1.01 - 1: the observed noise needs "
        f"{noise.launches_needed} launches per arm (rounds = {noise.launches_needed})",
        "2 A/A comparison(s) cannot estimate a false-acceptance rate of 0.05 (at least 20 are needed: each 2-round "
        "subset of the calibration's rounds, each case, both directions); pass --launches 6",
    ]
    assert "Calibration FAILED for trials of 2 launches per arm" in r.output and rec.reasons[0] in r.output


def run_with(proto: Path, tmp_path: Path, text: str, monkeypatch) -> tuple[int, str, Path]:
    # beside the protocol: `calibration = "cal"` is relative to it
    p = write_protocol(proto.parent / f"{tmp_path.name}.toml", text)
    out = tmp_path / "run"
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (1.2 if arm == "B" else 1.0, 1.0)))
    r = run_cli("serve", "trial", str(p), "--vllm", sys.executable, "-q", "--out", str(out))
    return r.exit_code, r.output, out


def test_a_trial_runs_with_its_passed_calibration(calibrated, tmp_path, monkeypatch):
    proto, _ = calibrated
    code, output, out = run_with(proto, tmp_path, proto.read_text(), monkeypatch)
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
        (
            lambda t: t.replace("rounds = 4", "rounds = 2"),
            "calibrated (noise_band, ttft_ratio_max, confidence, rounds) = (0.01, 1.01, 0.95, 4), this trial has "
            "(0.01, 1.01, 0.95, 2)",
        ),
    ],
    ids=["other-argv", "other-cases", "other-model", "missing", "other-rounds"],
)
def test_a_trial_is_refused_before_any_launch_when_the_calibration_does_not_match(
    calibrated, tmp_path, monkeypatch, edit, message
):
    proto, _ = calibrated
    code, output, out = run_with(proto, tmp_path, edit(proto.read_text()), monkeypatch)
    assert code == 2 and message in output, output
    assert len(output.strip().splitlines()) == 1 and not out.exists()  # one line, nothing launched or written


def test_a_calibration_that_did_not_pass_refuses_the_trial(calibrated, tmp_path, monkeypatch):
    import shutil

    proto, cal = calibrated
    bad = proto.parent / f"bad-{tmp_path.name}"
    shutil.copytree(cal, bad)
    rec = json.loads((bad / CALIBRATION).read_text())
    reason = "the rule accepted 1 of 30 A/A comparisons"
    rec |= {"false_acceptances": 1, "passed": False, "reasons": [reason]}  # planted: one A/A accepted
    (bad / CALIBRATION).write_text(json.dumps(rec))
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{bad.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and f"did not pass: {reason}" in output and not out.exists()
    rec["schema"] = "kerneltrial.serving-calibration/1"  # a calibration from before the power check
    (bad / CALIBRATION).write_text(json.dumps(rec))
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and "from before its power check (issue 26); calibrate again" in output


def test_calibrate_refuses_a_protocol_whose_trial_has_no_interval(calibrated, tmp_path):
    proto, _ = calibrated
    one = write_protocol(tmp_path / "one.toml", proto.read_text().replace("rounds = 4", "rounds = 1"))
    r = run_cli("serve", "calibrate", str(one), "--vllm", sys.executable, "--out", str(tmp_path / "c"))
    assert r.exit_code == 2 and "the protocol's trial has 1 launch(es) per arm, which gives no interval" in r.output
    r = run_cli(
        "serve",
        "calibrate",
        str(proto),
        "--launches",
        "3",
        "--vllm",
        sys.executable,
        "--out",
        str(tmp_path / "c"),
    )
    assert r.exit_code == 2 and "--launches 3 is below the trial's 4 rounds" in r.output
    assert not (tmp_path / "c").exists()
