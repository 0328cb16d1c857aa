"""`kerneltrial serve calibrate` and a trial that requires a passed calibration (issue 14), with
power (issue 26): it passes only when a trial of the protocol's rounds would have interval
half-widths below the noise band and enough A/A comparisons exist; against the fake server with
the synthetic benchmark client of test_acceptance."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import sys
from pathlib import Path

import pytest
from scipy import stats

from kerneltrial.serving import trial
from kerneltrial.serving.acceptance import Rule
from kerneltrial.serving.calibration import (
    ARM_A,
    ARM_A_PRIME,
    CALIBRATION,
    Binding,
    launches_needed,
    read_calibration,
)
from kerneltrial.serving.calibration_host import HostFingerprint, compare_hosts, describe_host, this_host
from kerneltrial.serving.verify import verify_serving_run
from kerneltrial.serving.verify_plan import short
from tests.kt import run_cli, write_protocol

from .test_acceptance import CASE, synthetic_bench, trial_text, wobble

# one xdist worker for the whole module: its module-scoped fixtures (calibrated and unpowered) are built
# once, not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("serving/test_calibration")


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
    assert json.loads((cal / CALIBRATION).read_text())["schema"] == "kerneltrial.serving-calibration/4"
    assert rec.host == this_host(None)  # measured here (the fake server's protocol has no server.model)
    assert rec.binding.repeats == 2 and rec.binding.client == "completions" and rec.binding.trial_rounds == 4
    assert rec.binding_sha256 == rec.binding.sha256()
    found = next(c for c in verify_serving_run(cal).checks if c.name == "calibration")
    assert found.ok and found.detail == (
        f"calibration.json recomputed from its run, bound by hash; measured on {describe_host(this_host(None))}"
    )


@pytest.fixture(scope="module")
def unpowered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A protocol of 2 rounds and its failed calibration (--launches 2, +-20% launch noise), and the
    command's output."""
    root = tmp_path_factory.mktemp("unpowered")
    proto = write_protocol(root / "trial.toml", trial_text(rounds=2))
    noisy = {0: 1.0, 1: 1.3, 2: 0.8, 3: 1.1}  # +-20% from launch to launch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (noisy[L], 1.0 / noisy[L])))
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
            str(root / "cal"),
        )
    assert r.exit_code == 1, r.output
    return proto, root / "cal", r.output


def test_a_calibration_without_power_fails_and_says_how_many_launches_it_needs(unpowered):
    """The issue's case: --launches 2 "passed" with a gain interval of +-7,453% on the fake server."""
    _, out, output = unpowered
    rec = read_calibration(out)
    assert not rec.passed and len(rec.comparisons) == 2 and rec.comparisons_needed == 20
    [noise] = rec.noise
    assert noise.gain_half_width > 1 and not noise.powered and noise.launches_needed > 2
    # the noise of 2 rounds is itself uncertain: its upper 95% bound (chi-square, 1 degree of freedom) is
    # sd * sqrt(1 / chi2(0.05, 1)), 16 times the sd, and asks for about 250 times the launches
    factor = math.sqrt(1 / stats.chi2.ppf(0.05, 1))
    rule = Rule(noise_band=0.01, ttft_ratio_max=1.01, confidence=0.95)
    assert noise.launches_needed_high == launches_needed(noise.gain_sd * factor, noise.ttft_sd * factor, rule)
    assert noise.launches_needed_high > 100 * noise.launches_needed
    assert rec.reasons == [
        f"{CASE}: a trial of 2 launches per arm has a gain interval of +-{noise.gain_half_width:.2%} and a TTFT interval "
        f"of +-{noise.ttft_half_width:.2%} (per-round log-ratio sd {noise.gain_sd:.2%} and {noise.ttft_sd:.2%} over 2 "
        f"rounds), not below the noise band 1.00% and ttft_ratio_max 1.01 - 1: the observed noise needs "
        f"{noise.launches_needed} launches per arm (rounds = {noise.launches_needed}; "
        f"{noise.launches_needed_high} at the 95% upper bound of the noise)",
        "2 A/A comparison(s) cannot estimate a false-acceptance rate of 0.05 (at least 20 are needed: each 2-round "
        "subset of the calibration's rounds, each case, both directions); pass --launches 6",
    ]
    assert "Calibration FAILED for trials of 2 launches per arm" in output and rec.reasons[0] in output
    assert verify_serving_run(out).problems == []  # a failed calibration is still the record of its run


def run_with(proto: Path, tmp_path: Path, text: str, monkeypatch, *options: str) -> tuple[int, str, Path]:
    # beside the protocol: `calibration = "cal"` is relative to it
    p = write_protocol(proto.parent / f"{tmp_path.name}.toml", text)
    out = tmp_path / "run"
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (1.2 if arm == "B" else 1.0, 1.0)))
    r = run_cli("serve", "trial", str(p), "--vllm", sys.executable, "-q", "--out", str(out), *options)
    return r.exit_code, r.output, out


def test_a_trial_runs_with_its_passed_calibration(calibrated, tmp_path, monkeypatch):
    proto, cal = calibrated
    code, output, out = run_with(proto, tmp_path, proto.read_text(), monkeypatch)
    assert code == 0, output
    assert json.loads((out / "summary.json").read_text())["acceptance"]["verdict"] == "ACCEPTED"
    # the trial records the calibration it rested on, and verify binds it to the trial's own protocol
    prov = json.loads((out / "provenance.json").read_text())
    rec = read_calibration(cal)
    assert prov["calibration"] == {
        "dir": "cal",
        "path": Path(os.path.relpath(cal, out)).as_posix(),
        "binding_sha256": rec.binding_sha256,
        "sha256": hashlib.sha256((cal / CALIBRATION).read_bytes()).hexdigest(),
        "passed": True,
        "host": this_host(None).model_dump(mode="json"),  # the trial's own host, as the gate compared it
        "host_warnings": compare_hosts(rec.host, this_host(None)).warnings,
    }
    used = next(c for c in verify_serving_run(out).checks if c.name == "calibration used")
    assert used.ok and used.applicable, used.problems
    assert used.detail.endswith("opened again and verified")
    want = [  # the first words of each problem, in order
        "provenance.json calibration has no path: the calibration the trial rested on cannot be opened again",
        "the calibration the trial rested on is not at nowhere (relative to the run directory): keep the trial",
        "forged/calibration.json has sha256 ",
        "forged does not verify (2 problem(s); first: calibration.json passed is false, its run (protocol.toml, "
        "summary.json) gives true)",
        "forged/calibration.json did not pass: planted",
    ]
    problems = planted_calibrations(out, cal, prov)
    assert [p[: len(w)] for p, w in zip(problems, want, strict=True)] == want
    # planted: the trial's recorded host on another CPU than its calibration was measured on
    other_cpu = {**prov["calibration"], "host": {**prov["calibration"]["host"], "cpu_model": "Forged CPU"}}
    (out / "provenance.json").write_text(json.dumps({**prov, "calibration": other_cpu}))
    [problem] = next(c for c in verify_serving_run(out).checks if c.name == "calibration used").problems
    assert problem == (
        f"{Path(os.path.relpath(cal, out)).as_posix()}/calibration.json was measured on another host than the "
        f"trial ran on: cpu_model {rec.host.cpu_model!r} in calibration.json, 'Forged CPU' in the trial's record; "
        "calibrate on the trial's host"
    )

    # planted: the calibration rewritten as /3, without its host, and its hash put in the trial's provenance
    def older(rec: dict) -> None:
        rec.update(schema="kerneltrial.serving-calibration/3")
        del rec["host"]

    old = copied(cal, tmp_path, older)
    sha = hashlib.sha256((old / CALIBRATION).read_bytes()).hexdigest()
    rel = Path(os.path.relpath(old, out)).as_posix()
    (out / "provenance.json").write_text(
        json.dumps({**prov, "calibration": {**prov["calibration"], "path": rel, "sha256": sha}})
    )
    [problem] = next(c for c in verify_serving_run(out).checks if c.name == "calibration used").problems
    assert problem.startswith(f"{rel}/calibration.json records no host (schema /3): a trial refuses such")
    # planted: another trial's calibration named (its binding hash), then none at all
    prov["calibration"]["binding_sha256"] = "f" * 64
    (out / "provenance.json").write_text(json.dumps(prov))
    [problem] = next(c for c in verify_serving_run(out).checks if c.name == "calibration used").problems
    assert problem.startswith("provenance.json calibration binding_sha256 is ffffffffffff..., this trial's binding")
    assert problem.endswith("it rested on a calibration of another trial")
    prov["calibration"] = None
    (out / "provenance.json").write_text(json.dumps(prov))
    [problem] = next(c for c in verify_serving_run(out).checks if c.name == "calibration used").problems
    assert problem.startswith("provenance.json records no calibration, though protocol.toml requires")


def used_problems(out: Path, prov: dict) -> list[str]:
    """verify's `calibration used` problems with the trial `out` once its provenance.json is `prov`."""
    (out / "provenance.json").write_text(json.dumps(prov))
    return list(next(c for c in verify_serving_run(out).checks if c.name == "calibration used").problems)


def test_verify_applies_the_gates_identity_rule_to_the_trials_host(calibrated, tmp_path, monkeypatch):
    """Review item 2: verify compared only the hostname and the GPUs' names and drivers. It now applies the
    gate's rule (compare_hosts) to the host the trial recorded (provenance.json calibration.host: CPU,
    memory, GPU UUIDs, CUDA_VISIBLE_DEVICES, weights), or an older trial's provenance.json."""
    proto, cal = calibrated
    code, output, out = run_with(proto, tmp_path, proto.read_text(), monkeypatch)
    assert code == 0, output
    prov = json.loads((out / "provenance.json").read_text())
    used, rel = prov["calibration"], Path(os.path.relpath(cal, out)).as_posix()
    assert used_problems(out, prov) == []
    # the trial's record edited: its hostname is not the provenance.json's, and the rule's warnings change
    forged = {**prov, "calibration": {**used, "host": {**used["host"], "hostname": "forged"}}}
    renamed = compare_hosts(read_calibration(cal).host, HostFingerprint.model_validate(forged["calibration"]["host"]))
    assert used_problems(out, forged) == [
        "provenance.json calibration.host differs from the trial's provenance.json: hostname 'forged' in "
        f"calibration.host, {prov['hostname']!r} in provenance.json: the host was edited",
        f"provenance.json calibration.host_warnings is {short(used['host_warnings'])}, the identity rule "
        f"gives {short(renamed.warnings)}: the record was edited",
    ]
    # an older trial (no calibration.host): CUDA_VISIBLE_DEVICES as its provenance.json environment records it
    older = {k: v for k, v in used.items() if k not in ("host", "host_warnings")}
    moved = {**prov, "calibration": older, "environment": {**prov["environment"], "CUDA_VISIBLE_DEVICES": "3"}}
    [problem] = used_problems(out, moved)
    assert problem.startswith(f"{rel}/calibration.json was measured on another host than the trial ran on: the ")
    assert "the trial sees CUDA_VISIBLE_DEVICES=3 (not among the GPUs read): the calibration's noise belongs" in problem
    # GPU UUIDs: the calibration's GPU is not the trial's, though both are the same model and driver
    listed = [{"name": SMI_VALUES["name"], "driver_version": SMI_VALUES["driver_version"]}]
    other = copied(cal, tmp_path, lambda rec: rec["host"].update(gpus=[smi_gpu("GPU-cal")], gpus_unread=None))
    other_prov = json.loads((other / "provenance.json").read_text())
    (other / "provenance.json").write_text(json.dumps({**other_prov, "gpu": listed}))
    host = {**used["host"], "gpus": [smi_gpu("GPU-trial")], "gpus_unread": None}
    warnings = compare_hosts(read_calibration(other).host, HostFingerprint.model_validate(host)).warnings
    record = {
        **used,
        "path": Path(os.path.relpath(other, out)).as_posix(),
        "sha256": hashlib.sha256((other / CALIBRATION).read_bytes()).hexdigest(),
        "host": host,
        "host_warnings": warnings,
    }
    assert used_problems(out, {**prov, "gpu": listed, "calibration": record}) == [
        f"{record['path']}/calibration.json was measured on another host than the trial ran on: gpus UUIDs "
        "['GPU-cal'] in calibration.json, ['GPU-trial'] in the trial's record; calibrate on the trial's host"
    ]


def planted_calibrations(out: Path, cal: Path, prov: dict) -> list[str]:
    """verify's problems with the trial `out` whose provenance.json names, in turn, no calibration
    path, a path to nothing, and a copy of `cal` whose calibration.json says it failed (the trial's
    recorded hash left as it was): the calibration is opened again, not taken on the trial's word."""
    forged = out / "forged"
    shutil.copytree(cal, forged)
    record = json.loads((forged / CALIBRATION).read_text())
    (forged / CALIBRATION).write_text(json.dumps({**record, "passed": False, "reasons": ["planted"]}))
    problems = []
    for path in (None, "nowhere", "forged"):
        used = {k: v for k, v in prov["calibration"].items() if k != "path"} | ({"path": path} if path else {})
        (out / "provenance.json").write_text(json.dumps({**prov, "calibration": used}))
        problems += next(c for c in verify_serving_run(out).checks if c.name == "calibration used").problems
    (out / "provenance.json").write_text(json.dumps(prov))
    shutil.rmtree(forged)
    return problems


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
        (lambda t: t.replace("repeats = 2", "repeats = 3"), "calibrated repeats 2, this trial has 3 (binding sha256"),
        (
            lambda t: t + '[pins]\nvllm = "0.32.0"\n',
            'calibrated pins.vllm null, this trial has "0.32.0" (binding sha256',
        ),
        (
            lambda t: t.replace('model_id = "tiny"', 'model_id = "tiny"\ntokenizer = "/elsewhere"'),
            'calibrated tokenizer null, this trial has "/elsewhere"',
        ),
    ],
    ids=["other-argv", "other-cases", "other-model", "missing", "other-rounds", "other-repeats", "pins", "tokenizer"],
)
def test_a_trial_is_refused_before_any_launch_when_the_calibration_does_not_match(
    calibrated, tmp_path, monkeypatch, edit, message
):
    proto, _ = calibrated
    code, output, out = run_with(proto, tmp_path, edit(proto.read_text()), monkeypatch)
    assert code == 2 and message in output, output
    assert len(output.strip().splitlines()) == 1 and not out.exists()  # one line, nothing launched or written


def test_a_calibration_made_with_another_client_is_refused(calibrated, tmp_path, monkeypatch):
    """The issue: a calibration of another client was accepted; `serve trial --client` is applied
    before the calibration is checked."""
    proto, _ = calibrated
    code, output, out = run_with(proto, tmp_path, proto.read_text(), monkeypatch, "--client", "flagos-chat")
    assert code == 2 and 'calibrated client "completions", this trial has "flagos-chat"' in output, output
    assert not out.exists()


def test_a_calibration_that_did_not_pass_refuses_the_trial(unpowered, tmp_path, monkeypatch):
    proto, cal, _ = unpowered
    text = proto.read_text().replace("[acceptance]\n", '[acceptance]\ncalibration = "cal"\n')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    reason = read_calibration(cal).reasons[0]
    assert code == 2 and f"acceptance.calibration 'cal' did not pass: {reason}" in output and not out.exists()


def copied(cal: Path, tmp_path: Path, change) -> Path:
    """A copy of the calibration run beside its protocol, its calibration.json changed by `change`."""
    bad = cal.parent / f"bad-{tmp_path.name}"
    shutil.copytree(cal, bad)
    rec = json.loads((bad / CALIBRATION).read_text())
    change(rec)
    (bad / CALIBRATION).write_text(json.dumps(rec))
    return bad


def test_a_calibration_flipped_to_passed_is_refused(unpowered, tmp_path, monkeypatch):
    """The issue's forgery: `passed` set to true (and its reasons emptied) in calibration.json was
    accepted by `serve trial`; the record is recomputed from its run, which says it failed."""
    proto, cal, _ = unpowered
    bad = copied(cal, tmp_path, lambda rec: rec.update(passed=True, reasons=[]))
    found = next(c for c in verify_serving_run(bad).checks if c.name == "calibration")
    gives = "its run (protocol.toml, summary.json) gives"
    assert f"calibration.json passed is true, {gives} false" in found.problems, found.problems
    assert any(p.startswith(f"calibration.json reasons is [], {gives} [") for p in found.problems)
    text = proto.read_text().replace("[acceptance]\n", f'[acceptance]\ncalibration = "{bad.name}"\n')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and f"acceptance.calibration '{bad.name}' does not verify (" in output, output
    assert "calibration.json passed is true" in output and not out.exists()


def test_an_older_calibration_schema_is_refused(calibrated, tmp_path, monkeypatch):
    proto, cal = calibrated
    for schema, lacks in (
        ("kerneltrial.serving-calibration/1", "from before its power check (issue 26)"),
        ("kerneltrial.serving-calibration/2", "from before its binding to what it calibrates (issue 36)"),
    ):
        bad = copied(cal, tmp_path / schema[-1], lambda rec, s=schema: rec.update(schema=s))
        text = proto.read_text().replace('calibration = "cal"', f'calibration = "{bad.name}"')
        code, output, _ = run_with(proto, tmp_path, text, monkeypatch)
        assert code == 2 and f"{lacks}; calibrate again" in output, output


FOREIGN_GPU = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0f0f", "driver_version": "550.54.15"}
FOREIGN_WEIGHTS = {"files": 3, "total_bytes": 10, "listing_sha256": "a" * 64, "config_sha256": "b" * 64}
# what a fake nvidia-smi prints for each queried field (serving/trial.py asks for others than the fingerprint)
SMI_VALUES = {
    "name": "NVIDIA H100 80GB HBM3",
    "driver_version": "550.54.15",
    "memory.total": "81559 MiB",
    "clocks.max.sm": "1980 MHz",
    "clocks.sm": "345 MHz",
    "power.limit": "700.00 W",
    "pci.bus_id": "00000000:18:00.0",
}
SMI_FAILED = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def fake_nvidia_smi(folder: Path, uuids: list[str] | None) -> Path:
    """A folder holding an nvidia-smi that lists one GPU per uuid (the fields --query-gpu asks for) or,
    with None, fails as it does when it cannot reach the driver (exit 9)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\nuuids = {uuids!r}\nvalues = {SMI_VALUES!r}\n"
        f"if uuids is None:\n    print({SMI_FAILED!r})\n    sys.exit(9)\n"
        "query = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--query-gpu='))\n"
        "for uuid in uuids:\n"
        "    print(', '.join(uuid if f == 'uuid' else values.get(f, '[N/A]') for f in query.split(',')))\n"
    )
    exe.chmod(0o755)
    return folder


def smi_gpu(uuid: str) -> dict[str, str]:
    return {"name": SMI_VALUES["name"], "uuid": uuid, "driver_version": SMI_VALUES["driver_version"]}


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("cpu_model", "Forged CPU", "cpu_model 'Forged CPU' there, {here!r} here"),
        ("cpu_count", 512, "cpu_count 512 there, {here!r} here"),
        ("memory_gib", 4096, "memory_gib 4096 there, {here!r} here (beyond the 2% tolerance)"),
        (
            "weights",
            FOREIGN_WEIGHTS,
            "weights 3 files, 10 bytes, config.json sha256 bbbbbbbbbbbb... there, none (server.model unset, or a hub "
            "id in a calibration from before that was recorded) here",
        ),
    ],
    ids=["cpu-model", "cpu-count", "memory", "weights"],
)
def test_a_calibration_measured_on_another_host_is_refused(calibrated, tmp_path, monkeypatch, field, value, named):
    """Review A5: a calibration taken on another (quieter) machine or other weights was accepted: its noise
    band is not this host's. One field of its fingerprint planted; refused before any launch, the field
    and both values named, and the fix."""
    proto, cal = calibrated
    bad = copied(cal, tmp_path, lambda rec: rec["host"].update({field: value}))
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{bad.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    message = named.format(here=this_host(None).model_dump()[field])
    assert code == 2 and f"acceptance.calibration '{bad.name}' was measured on another host ({message}" in output
    assert "its noise band is not this host's; calibrate again on this host (`kerneltrial serve calibrate" in output
    assert len(output.strip().splitlines()) == 1 and not out.exists()


def test_a_new_hostname_alone_does_not_refuse_the_trial(calibrated, tmp_path, monkeypatch):
    """Review item 1a: a container renamed on every start (the same CPU, memory and GPUs) was refused.
    The trial runs, prints the warning and records it; verify applies the same rule and passes."""
    proto, cal = calibrated
    calibrated_on = read_calibration(cal).host
    assert calibrated_on is not None
    monkeypatch.setattr(socket, "gethostname", lambda: "ct-renamed")
    code, output, out = run_with(proto, tmp_path, proto.read_text(), monkeypatch)
    assert code == 0, output
    renamed = (
        f"hostname {calibrated_on.hostname!r} there, 'ct-renamed' here, on the same hardware: taken as the same "
        "machine under a new name (a container gets one on every start)"
    )
    assert f"warning: acceptance.calibration 'cal': {renamed} (recorded in provenance.json" in output
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["hostname"] == prov["calibration"]["host"]["hostname"] == "ct-renamed"
    assert prov["calibration"]["host_warnings"][0] == renamed
    assert verify_serving_run(out).problems == []
    # an older trial (no calibration.host): its provenance.json's hostname is no longer "another host" either
    older = {
        **prov,
        "calibration": {k: v for k, v in prov["calibration"].items() if k not in ("host", "host_warnings")},
    }
    (out / "provenance.json").write_text(json.dumps(older))
    assert verify_serving_run(out).problems == []


def test_gpus_that_cannot_be_read_are_unknown_not_another_host(calibrated, tmp_path, monkeypatch):
    """Review item 1b: nvidia-smi failing at trial time (or at calibration time) was read as another host.
    Refused (the GPUs are not shown to be the ones calibrated), saying they could not be read, why, and
    how to proceed."""
    proto, cal = calibrated
    with_gpu = copied(cal, tmp_path / "gpu", lambda rec: rec["host"].update(gpus=[FOREIGN_GPU], gpus_unread=None))
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'broken', None)}:{os.environ['PATH']}")
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{with_gpu.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and not out.exists() and "measured on another host" not in output, output
    assert (
        f"acceptance.calibration '{with_gpu.name}' cannot be matched to this host: could not read the GPUs here: "
        f"nvidia-smi exited 9: {SMI_FAILED} (there: [NVIDIA H100 80GB HBM3 GPU-0f0f]); an unread GPU is not shown "
        "to be the one calibrated: make `nvidia-smi -L` list the GPUs and run the trial again"
    ) in output
    # the other way: the calibration could not read its GPUs, this host can
    unread = copied(cal, tmp_path / "unread", lambda rec: rec["host"].update(gpus=None, gpus_unread="planted reason"))
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'smi', ['GPU-0f0f'])}:{os.environ['PATH']}")
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{unread.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and not out.exists() and "measured on another host" not in output, output
    assert (
        f"acceptance.calibration '{unread.name}' cannot be matched to this host: could not read the GPUs there: "
        "planted reason (here: [NVIDIA H100 80GB HBM3 GPU-0f0f]); the calibration cannot show which GPUs its noise "
        "is of: calibrate again on this host with `nvidia-smi -L` listing the GPUs"
    ) in output


def test_other_cuda_visible_devices_name_the_gpus_each_side_saw(calibrated, tmp_path, monkeypatch):
    """Review item 1c: the refusal said only "cuda_visible_devices '0' there, '1' here"."""
    proto, cal = calibrated
    gpus = [smi_gpu("GPU-aaaa"), smi_gpu("GPU-bbbb")]
    bad = copied(cal, tmp_path, lambda rec: rec["host"].update(gpus=gpus, gpus_unread=None, cuda_visible_devices="0"))
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'smi', ['GPU-aaaa', 'GPU-bbbb'])}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{bad.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and not out.exists(), output
    assert (
        f"acceptance.calibration '{bad.name}' was measured on another host (the calibration saw "
        "CUDA_VISIBLE_DEVICES=0 (NVIDIA H100 80GB HBM3 GPU-aaaa), the trial sees CUDA_VISIBLE_DEVICES=1 (NVIDIA "
        "H100 80GB HBM3 GPU-bbbb): the calibration's noise belongs to the GPUs it ran on; run the trial with "
        "CUDA_VISIBLE_DEVICES=0, or calibrate again with this setting"
    ) in output


def test_a_host_edited_in_calibration_json_fails_verify(calibrated, tmp_path):
    """The fingerprint cannot be derived from the run; its hostname and GPUs are the run's provenance.json's."""
    _, cal = calibrated
    bad = copied(cal, tmp_path, lambda rec: rec["host"].update(hostname="quieter-host", gpus=[FOREIGN_GPU]))
    found = next(c for c in verify_serving_run(bad).checks if c.name == "calibration")
    here = this_host(None).hostname
    assert list(found.problems) == [
        f"calibration.json host differs from its run's provenance.json: hostname 'quieter-host' in calibration.json, "
        f"{here!r} in provenance.json: the host was edited",
        "calibration.json host differs from its run's provenance.json: GPUs (name, driver) [('NVIDIA H100 80GB HBM3', "
        "'550.54.15')] in calibration.json, [] in provenance.json: the host was edited",
    ]
    missing = copied(cal, tmp_path / "null", lambda rec: rec.update(host=None))
    [problem] = next(c for c in verify_serving_run(missing).checks if c.name == "calibration").problems
    assert problem.endswith(
        "calibration.json: host is missing or null, and a kerneltrial.serving-calibration/4 "
        "calibration records the host it was measured on; calibrate again on this host "
        "(`kerneltrial serve calibrate PROTOCOL --out DIR`)"
    )


def test_a_calibration_from_before_the_host_verifies_but_no_trial_rests_on_it(calibrated, tmp_path, monkeypatch):
    """A schema /3 calibration.json (no host) is still the record of its run; a trial refuses it, saying
    how to calibrate again."""
    proto, cal = calibrated

    def older(rec: dict) -> None:
        rec.update(schema="kerneltrial.serving-calibration/3")
        del rec["host"]

    old = copied(cal, tmp_path, older)
    assert verify_serving_run(old).problems == []
    text = proto.read_text().replace('calibration = "cal"', f'calibration = "{old.name}"')
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert code == 2 and not out.exists(), output
    assert (
        f"acceptance.calibration '{old.name}' is a kerneltrial.serving-calibration/3 calibration, from before its "
        "binding to the host it was measured on (issue 36, review A5): it records no host, so its noise band may be "
        "another machine's; calibrate again on this host (`kerneltrial serve calibrate PROTOCOL --out DIR`, then "
        "name DIR in [acceptance] calibration)"
    ) in output


def test_a_binding_rewritten_to_fit_another_trial_is_refused(calibrated, tmp_path, monkeypatch):
    """A careful forger rewrites the binding to the trial's repeats and its hash: the binding then
    matches, but the record is not the one its run gives."""
    proto, cal = calibrated

    def refit(rec: dict) -> None:
        rec["binding"]["repeats"] = 4
        rec["binding_sha256"] = Binding.model_validate(rec["binding"]).sha256()

    bad = copied(cal, tmp_path, refit)
    text = (
        proto.read_text()
        .replace('calibration = "cal"', f'calibration = "{bad.name}"')
        .replace("repeats = 2", "repeats = 4")
    )
    code, output, out = run_with(proto, tmp_path, text, monkeypatch)
    assert (
        code == 2 and "calibration.json binding.repeats is 4, its run (protocol.toml, summary.json) gives 2" in output
    )
    edited = copied(cal, tmp_path / "hash", lambda rec: rec["binding"].update(repeats=4))
    found = next(c for c in verify_serving_run(edited).checks if c.name == "calibration")
    assert found.problems[0].startswith("calibration.json binding_sha256 is "), found.problems
    assert found.problems[0].endswith("...: the binding or its hash was edited")


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


def test_a_pilot_that_already_asks_for_more_launches_stops_the_calibration(tmp_path, monkeypatch):
    """Issue 36 item 4: the launches a calibration needs are estimated from a pilot that runs first
    (its first 4 rounds), before the rest are spent; the message and the decision use one number."""
    proto = write_protocol(tmp_path / "trial.toml", trial_text(rounds=2))  # default launches: 6 per arm
    noisy = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 0.85, 1.2, 1.0, 0.8, 1.3, 0.9]  # +-20% from launch to launch
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (noisy[L], 1.0 / noisy[L])))
    out = tmp_path / "cal"
    r = run_cli("serve", "calibrate", str(proto), "--vllm", sys.executable, "-q", "--out", str(out))
    assert r.exit_code == 1, r.output
    launches = (out / "launches.jsonl").read_text().splitlines()
    assert len(launches) == 8  # the pilot's 4 rounds of both arms, not the 12 launches of 6 rounds
    rec = read_calibration(out)
    assert not rec.passed and rec.launches_per_arm == 6
    pilot = rec.reasons[0]
    need = int(pilot.split("at least ")[1].split(" ")[0])
    assert need > 2 and pilot.startswith(f"{CASE}: the pilot's 4 rounds give a trial at least {need} launches")
    assert pilot.endswith(f"4 of 6 launches per arm; set rounds >= {need} in the protocol and calibrate again")
    assert not any("did not complete every case" in x for x in rec.reasons)  # the pilot says what to change
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["status"] == "failed" and prov["error"] == pilot and pilot in r.output
    assert verify_serving_run(out).problems == []  # the decision recomputed from runs.jsonl
    # planted: the pilot's reason deleted (a calibration that reads as merely incomplete)
    doc = json.loads((out / CALIBRATION).read_text())
    doc["reasons"] = doc["reasons"][1:]
    (out / CALIBRATION).write_text(json.dumps(doc))
    found = next(c for c in verify_serving_run(out).checks if c.name == "calibration")
    assert any(
        p.startswith("calibration.json reasons[0] is ") or p.startswith("calibration.json reasons is ")
        for p in found.problems
    ), found.problems
