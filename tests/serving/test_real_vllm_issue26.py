"""Issue 26 against a real vLLM CPU server (the tiny model): the two-trials-one-port race refused;
a calibration without power fails with its reason; an official-client run whose recorded argv
is the organisers' vendored script's and whose CSVs are in its format. Needs `bash .ci/serving-setup.sh` (skips cleanly otherwise).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from kerneltrial.serving.bench import Case
from kerneltrial.serving.calibration import read_calibration
from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.lifecycle import read_record
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .conftest import official_script
from .scripts_ast import Upstream
from .test_official_client import check_official
from .test_who_answers import hold_in_another_kerneltrial, refused_while_unbound

pytestmark = [pytest.mark.serving, pytest.mark.slow]


def test_two_trials_one_port_refused_while_the_first_vllm_has_not_bound(vllm_server_cmd, tmp_path: Path):
    """The issue's race: the first kerneltrial's vLLM is starting (tens of seconds before it binds);
    a second launch on its port is refused at once, not let in because nothing listens yet."""
    make, env, _ = vllm_server_cmd
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)  # the first kerneltrial passes its environment to its vLLM
        first = hold_in_another_kerneltrial(port, tmp_path / "first", *make(port))
    try:
        refused_while_unbound(port, tmp_path, make(port), tmp_path / "first")
    finally:
        first.send_signal(signal.SIGTERM)  # kerneltrial stops its vLLM (SIGINT to the group, ...) and exits 130
        assert first.wait(timeout=120) == 130
    assert read_record(port) is None


@pytest.fixture(scope="module")
def official_calibration(vllm_server_cmd, vllm_client, tmp_path_factory) -> tuple[Path, str, object]:
    """One `serve calibrate --launches 2` of a 2-round protocol with the official client: 4 real vLLM
    launches, shared by the two tests below (the suite's time budget)."""
    make, env, model = vllm_server_cmd
    root = tmp_path_factory.mktemp("official-cal")
    lines = [
        'name = "tiny-official"',
        "rounds = 2",
        "repeats = 4",  # the organisers' script's RUNS, which client official requires
        "[server]",
        'model_id = "tiny"',
        f"port = {free_port()}",
        f"tokenizer = {json.dumps(model)}",
        "ready_timeout_s = 300",
        "[bench]",
        "cases = [[32, 8, 2, 2]]",
        'client = "official"',
        "[[arms]]",
        'name = "E0"',
        'role = "baseline"',
        f"argv = {json.dumps(make('{port}'))}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
    ]
    proto = write_protocol(root / "official.toml", "\n".join(lines) + "\n")
    out = root / "cal"
    args = ["calibrate", str(proto), "--launches", "2", "--vllm", vllm_client, "--quiet", "--out", str(out)]
    r = run_cli("serve", *args)
    return out, r.output, r.exit_code


def test_a_calibration_without_power_fails_with_its_reason(official_calibration):
    """The issue: `serve calibrate --launches 2` against real vLLM said "Calibration passed" with a gain
    interval of +-2,391,912%. Two launches per arm cannot have the power a 1% band needs."""
    out, output, code = official_calibration
    assert code == 1, output
    rec = read_calibration(out)
    assert rec.status == "ok" and not rec.passed and rec.trial_rounds == 2 and rec.launches_per_arm == 2
    [noise] = rec.noise
    assert not noise.powered and noise.launches_needed is not None and noise.launches_needed > 2
    assert rec.reasons[0].startswith("in32-out8-c2-n2: a trial of 2 launches per arm has a gain interval of +-")
    assert f"the observed noise needs {noise.launches_needed} launches per arm" in rec.reasons[0]
    assert "2 A/A comparison(s) cannot estimate a false-acceptance rate of 0.05" in rec.reasons[1]
    assert "Calibration FAILED for trials of 2 launches per arm" in output
    assert verify_serving_run(out).problems == []


def test_an_official_client_run_records_the_scripts_argv(official_calibration, vllm_server_cmd, vllm_client):
    out, output, _ = official_calibration
    _, _, model = vllm_server_cmd
    script = Upstream.read(official_script())
    plan = json.loads((out / "plan.json").read_text())
    port = str(plan["base_url"].rsplit(":", 1)[1])
    site = {"--model": "tiny", "--host": "127.0.0.1", "--port": port}
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    launches = {L["launch"]: L for L in (json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines())}
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows), output
    for row in rows:
        argv = row["client_argv"]
        check_official(argv, script, site, Case(32, 8, 2, 2))  # the script's argv, then only the recording
        assert argv[argv.index("--tokenizer") + 1] == model  # the model id "tiny" is not the tokenizer's path
        assert argv[0] == vllm_client and argv[-2:] == ["--served-model-name", launches[row["launch"]]["nonce"]]
        raw = json.loads((out / row["raw"]).read_text())
        assert raw["completed"] == 2 and row["total_token_throughput"] == pytest.approx(raw["total_token_throughput"])
    # every launch wrote the script's CSVs: a SUCCESS row per run, the case in the summary
    for launch in launches:
        [raw_csv] = (out / "benchmark_results").glob(f"{launch:02d}-*/raw_runs_*.csv")
        lines = raw_csv.read_text().splitlines()
        assert lines[0].split(",") == script.constants["RAW_CSV_COLUMNS"] and len(lines) == 1 + 4
        assert all(",SUCCESS," in x for x in lines[1:])
        summary = raw_csv.with_name(raw_csv.name.replace("raw_runs_", "summary_")).read_text().splitlines()
        assert summary[0].split(",") == script.constants["SUMMARY_CSV_COLUMNS"] and summary[1].startswith("32,8,2,2,")
