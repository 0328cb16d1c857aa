"""`--client official` is the organisers' benchmark_throughput_serve.py (issue 36, item 7), and
`--client flagos-chat` the fork's chat script (issue 26): their argv, constants and case tables diffed
against the vendored scripts, which are parsed (never imported, run or copied into the project), with
planted drifts on either side caught; verify checks every run's argv against the plan's client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kerneltrial.serving import official, trial
from kerneltrial.serving.bench import CASE_SETS, SEED_CASES, Case, bench_argv
from kerneltrial.serving.flagos_chat import SCRIPT_RUNS, SCRIPT_SCENARIOS
from kerneltrial.serving.protocol import ProtocolError, parse_protocol
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .conftest import FAKE, flagos_chat_script, official_script
from .scripts_ast import ForkChat, Upstream, argv_differences
from .test_acceptance import synthetic_bench, trial_text

# kerneltrial's recording options (bench.recording) and the site's tokenizer: what may follow a script's argv
RECORDING = ("--save-result", "--save-detailed", "--result-dir", "--result-filename", "--percentile-metrics")
RECORDING += ("--metric-percentiles", "--disable-tqdm", "--served-model-name", "--tokenizer")
NONCE = "kt-0123456789abcdef"
SITE = {"--model": "minicpm5-2b", "--host": "127.0.0.1", "--port": "8123"}


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    return Upstream.read(official_script())


@pytest.fixture(scope="module")
def fork() -> ForkChat:
    return ForkChat.read(flagos_chat_script())


def ours(case: Case, client: str = "official", tokenizer: str | None = None) -> list[str]:
    return bench_argv(
        "vllm", "http://127.0.0.1:8123", "minicpm5-2b", tokenizer, case, Path("r"), "x.json", 0, (50, 99), NONCE, client
    )


def check_official(argv: list[str], script: Upstream, site: dict[str, str], case: Case) -> None:
    """argv is the organisers' script's for this case, then only kerneltrial's recording options."""
    assert argv_differences(argv, script.argv(argv[0], site, case), RECORDING) == []
    assert "--seed" not in argv and "--base-url" not in argv


def test_the_official_client_runs_the_organisers_script(upstream: Upstream):
    c = upstream.constants
    assert (c["RUNS"], c["SKIP_FIRST"]) == (official.RUNS, official.SKIP_FIRST) == (4, 1)
    assert tuple(tuple(x) for x in c["DEFAULT_TEST_CASES"]) == official.DEFAULT_CASES
    assert tuple(tuple(x) for x in c["ALL_TEST_CASES"]) == official.ALL_CASES
    assert [x.as_list() for x in CASE_SETS["official"]] == [list(x) for x in official.DEFAULT_CASES]
    assert [x.as_list() for x in CASE_SETS["official-all"]] == [list(x) for x in official.ALL_CASES]
    assert CASE_SETS["official"][0].label == "official 1024_1024_c64"
    for case in (*CASE_SETS["official-all"], *CASE_SETS["seed"]):
        argv = ours(case)
        check_official(argv, upstream, SITE, case)
        assert argv[-2:] == ["--served-model-name", NONCE]
    # a tokenizer other than the model id follows the script's argv (its MODEL is both)
    argv = ours(CASE_SETS["official"][0], tokenizer="/models/m")
    check_official(argv, upstream, SITE, CASE_SETS["official"][0])
    assert argv[len(upstream.template) : len(upstream.template) + 2] == ["--tokenizer", "/models/m"]
    assert "--tokenizer" not in ours(CASE_SETS["official"][0], tokenizer="minicpm5-2b")


def test_a_drifted_argv_is_caught(upstream: Upstream):
    """Planted: our argv changed in each way the comparison must see."""
    case = CASE_SETS["official"][1]
    script = upstream.argv("vllm", SITE, case)
    good = ours(case)
    chat = [("/v1/chat/completions" if x == "/v1/completions" else x) for x in good]
    assert argv_differences(chat, script, RECORDING) == [
        "--endpoint: '/v1/chat/completions' where the script has '/v1/completions'"
    ]
    assert argv_differences([*good, "--seed", "0"], script, RECORDING) == [
        "--seed: not in the script's argv nor a recording option"
    ]
    no_eos = [x for x in good if x != "--ignore-eos"]
    assert (
        argv_differences(no_eos, script, RECORDING)[0]
        == "--ignore-eos: '--random-input-len' where the script has '--ignore-eos'"
    )
    swapped = good.copy()
    i, j = swapped.index("--max-concurrency"), swapped.index("--num-prompts")
    swapped[i : i + 2], swapped[j : j + 2] = swapped[j : j + 2], swapped[i : i + 2]
    assert any(d.startswith("--max-concurrency: '--num-prompts'") for d in argv_differences(swapped, script, RECORDING))


def test_a_drifted_script_is_caught(tmp_path: Path):
    """Planted: a copy of the script (in the test's temporary folder) changed upstream: other RUNS, another
    endpoint, a case more, a column renamed. Each shows up against ours."""
    path = official_script()
    if not path.is_file():
        pytest.skip(f"vendored script not found at {path}")
    text = path.read_text()
    edits = [
        ("RUNS = 4", "RUNS = 5"),
        ('"/v1/completions"', '"/v1/chat/completions"'),
        ("    (65536, 1024, 64, 256),\n]", "    (65536, 1024, 64, 256),\n    (8, 8, 8, 8),\n]"),
        ('"Run Status",', '"Status",'),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (tmp_path / "drifted.py").write_text(text)
    drifted = Upstream.read(tmp_path / "drifted.py")
    assert drifted.constants["RUNS"] != official.RUNS
    assert tuple(tuple(x) for x in drifted.constants["DEFAULT_TEST_CASES"]) != official.DEFAULT_CASES
    assert tuple(drifted.constants["RAW_CSV_COLUMNS"]) != official.RAW_COLUMNS
    case = CASE_SETS["official"][0]
    assert argv_differences(ours(case), drifted.argv("vllm", SITE, case), RECORDING) == [
        "--endpoint: '/v1/completions' where the script has '/v1/chat/completions'"
    ]


def test_the_flagos_chat_client_is_the_forks_script(fork: ForkChat):
    assert fork.constants["NUM_RUNS"] == SCRIPT_RUNS and fork.num_prompts_from == "concurrency"
    assert tuple(tuple(s) for s in fork.constants["SCENARIOS"]) == SCRIPT_SCENARIOS
    site = SITE | {"--tokenizer": "/models/m"}
    for case in (*CASE_SETS["flagos-chat"], *CASE_SETS["seed"]):
        argv = ours(case, "flagos-chat", "/models/m")
        assert argv_differences(argv, fork.argv("vllm", site, case), RECORDING) == []
        assert "--seed" not in argv and argv[-2:] == ["--served-model-name", NONCE]
    # the fork's scenarios send --num-prompts = concurrency; the seed's cases keep their own counts
    assert all(c.num_requests == c.concurrency for c in CASE_SETS["flagos-chat"])
    assert [c.label for c in CASE_SETS["flagos-chat"]][:2] == ["flagos-chat p128d128", "flagos-chat p6144d128"]
    assert [(c.as_list(), c.label) for c in CASE_SETS["seed"]] == [
        (list(SEED_CASES[0]), "seed 1"),
        (list(SEED_CASES[1]), "seed 2"),
    ]


def test_the_completions_client_stays_kerneltrials():
    argv = bench_argv("vllm", "http://h:1", "m", None, Case(8, 4, 1, 2), Path("r"), "x.json", 3)
    assert argv[argv.index("--backend") + 1] == "vllm" and argv[argv.index("--endpoint") + 1] == "/v1/completions"
    assert argv[argv.index("--seed") + 1] == "3" and "--trust-remote-code" not in argv
    with pytest.raises(ValueError, match="client 'chat' is not one of completions, official, flagos-chat"):
        bench_argv("vllm", "http://h:1", "m", None, Case(8, 4, 1, 2), Path("r"), "x.json", 3, client="chat")


BASE = '[server]\nmodel_id = "m"\n[bench]\n{bench}\n[[arms]]\nname = "a"\nargv = ["x"]\n'


def test_case_sets_are_labelled_and_the_script_clients_send_no_seed():
    p = parse_protocol(BASE.format(bench='cases = "official-all"\nclient = "official"'))
    assert p.bench.client == "official" and len(p.bench.cases) == len(official.ALL_CASES) and p.repeats == 4
    p = parse_protocol(BASE.format(bench='cases = "flagos-chat"\nclient = "flagos-chat"'))
    assert len(p.bench.cases) == len(SCRIPT_SCENARIOS)
    assert parse_protocol(BASE.format(bench='cases = "seed"')).bench.cases == list(CASE_SETS["seed"])
    for client in ("official", "flagos-chat"):
        with pytest.raises(ProtocolError, match=f"client {client} sends no --seed, as its script does"):
            parse_protocol(BASE.format(bench=f'cases = "seed"\nclient = "{client}"\nseeding = "per_run"'))
    with pytest.raises(ProtocolError, match="--client official: bench: client official sends no --seed"):
        parse_protocol(BASE.format(bench='cases = "seed"\nseed = 5')).with_client("official")


def test_the_official_client_runs_each_case_the_scripts_four_times():
    with pytest.raises(ProtocolError, match="repeats = 3: client official runs each case RUNS = 4 times, the first 1"):
        parse_protocol("repeats = 3\n" + BASE.format(bench='cases = "seed"\nclient = "official"'))
    with pytest.raises(ProtocolError, match="set repeats = 4 or use client"):
        parse_protocol("repeats = 2\n" + BASE.format(bench='cases = "seed"')).with_client("official")
    assert parse_protocol("repeats = 2\n" + BASE.format(bench='cases = "seed"\nclient = "flagos-chat"')).repeats == 2


def test_a_trial_with_the_official_client_records_and_verifies_its_argv(tmp_path, monkeypatch, upstream: Upstream):
    seen: list[list[str]] = []
    base = synthetic_bench(lambda arm, L: (1.0, 1.0))

    def bench(argv, json_path, log_path, timeout_s, server=None):
        seen.append(argv)
        return base(argv, json_path, log_path, timeout_s, server)

    text = trial_text(rounds=1).replace("repeats = 2", "repeats = 4")
    monkeypatch.setattr(trial, "run_bench", bench)
    proto = write_protocol(tmp_path / "trial.toml", text)
    out = tmp_path / "run"
    r = run_cli("serve", "trial", str(proto), "--client", "official", "--vllm", sys.executable, "-q", "--out", str(out))
    assert r.exit_code == 1 and "INCONCLUSIVE" in r.output, r.output  # one launch per arm
    plan = json.loads((out / "plan.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert plan["client"] == "official" and plan["repeats"] == upstream.constants["RUNS"]
    skip = upstream.constants[upstream.counted_from]  # the script's SKIP_FIRST is our warm-up rule
    assert plan["warmup"]["drop_first"] == summary["warmup"]["drop_first"] == skip
    port = parse_protocol(text).server.port
    site = {"--model": "tiny", "--host": "127.0.0.1", "--port": str(port)}
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [row["client_argv"] for row in rows] == seen and len(rows) == 8
    for row in rows:
        check_official(row["client_argv"], upstream, site, Case(8, 4, 1, 2))
    assert verify_serving_run(out).problems == []
    # tampering: one run's argv says it went down the chat path
    rows[0]["client_argv"][rows[0]["client_argv"].index("--backend") + 1] = "openai-chat"
    (out / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert any(
        "differs from the official client's for its case in --backend" in p for p in verify_serving_run(out).problems
    )


def test_serve_bench_takes_a_case_set_and_the_client(tmp_path, monkeypatch, port):
    seen: list[list[str]] = []

    def bench(argv, json_path, log_path, timeout_s, server=None):
        seen.append(argv)
        return synthetic_bench(lambda arm, L: (1.0, 1.0))(argv, json_path, log_path, timeout_s, server)

    monkeypatch.setattr(trial, "run_bench", bench)
    out = tmp_path / "run"
    args = ["bench", "--launch", "--client", "flagos-chat", "--cases", "seed", "-r", "2", "--tokenizer", str(tmp_path)]
    args += ["--model-id", "tiny", "--vllm", sys.executable, "-q", "--out", str(out), "--port", str(port)]
    r = run_cli("serve", *args, "--", sys.executable, str(FAKE), "--port", "{port}")
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "plan.json").read_text())
    assert [(c["case"], c["label"]) for c in plan["cases"]] == [
        ("in4096-out1024-c64-n256", "seed 1"),
        ("in16384-out1024-c64-n128", "seed 2"),
    ]
    assert plan["client"] == "flagos-chat" and 'cases = "seed"' in (out / "protocol.toml").read_text()
    assert all(a[a.index("--backend") + 1] == "openai-chat" for a in seen) and len(seen) == 4
    r = run_cli("serve", "bench", "--base-url", "http://h:1", "--client", "chat", "--cases", "seed")
    assert r.exit_code == 2 and "--client 'chat' is not one of completions, official, flagos-chat" in r.output
