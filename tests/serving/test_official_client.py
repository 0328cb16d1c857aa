"""`--client official` (issue 26, item 3): the organisers' `vllm bench serve` argv, diffed against the
vendored official script, which is parsed (never copied); its scenarios and the seed's cases as
labelled case sets; verify checks every run's argv against the plan's client."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving import trial
from kerneltrial.serving.bench import Case, bench_argv
from kerneltrial.serving.official import CASE_SETS, SCRIPT_RUNS, SCRIPT_SCENARIOS, SEED_CASES
from kerneltrial.serving.protocol import ProtocolError, parse_protocol
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .conftest import FAKE, official_script
from .test_acceptance import synthetic_bench, trial_text

# the values the script's README tells a user to edit, by flag, and kerneltrial's recording options
SITE_FLAGS = ("--host", "--port", "--model", "--tokenizer")
RECORDING = ("--save-result", "--save-detailed", "--result-dir", "--result-filename", "--percentile-metrics")
RECORDING += ("--metric-percentiles", "--disable-tqdm", "--served-model-name")


class Script:
    """What the vendored script runs, read from its syntax tree: module constants, the scenarios, the
    runs per scenario and the argv template of run_benchmark (its parameters left as names)."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            pytest.skip(f"official script not found at {path} (set KERNELTRIAL_SHARED to the shared folder)")
        tree = ast.parse(path.read_text())
        self.constants: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                try:
                    self.constants[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_benchmark")
        cmd = next(n for n in ast.walk(func) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "cmd")
        assert isinstance(cmd.value, ast.List)
        self.template = [self._value(e) for e in cmd.value.elts]
        prompts = next(n for n in func.body if isinstance(n, ast.Assign) and n.targets[0].id == "num_prompts")
        self.num_prompts_from = prompts.value.id  # type: ignore[attr-defined]

    def _value(self, e: ast.expr) -> str:
        if isinstance(e, ast.Constant):
            return str(e.value)
        if isinstance(e, ast.Name):
            return str(self.constants[e.id]) if e.id in self.constants else "{" + e.id + "}"
        if isinstance(e, ast.Call) and getattr(e.func, "id", "") == "str":
            return self._value(e.args[0])
        raise AssertionError(f"unexpected element in the script's argv: {ast.dump(e)}")

    def argv(self, vllm: str, site: dict[str, str], case: Case) -> list[str]:
        """The script's argv for a case at a site: its own values for the site's flags replaced."""
        fill = {"{input_len}": case.input_len, "{output_len}": case.output_len, "{concurrency}": case.concurrency}
        fill["{num_prompts}"] = case.num_requests
        out = [str(fill.get(x, x)) for x in self.template]
        for flag, value in site.items():
            out[out.index(flag) + 1] = value
        return [vllm, *out[1:]]


@pytest.fixture(scope="module")
def script() -> Script:
    return Script(official_script())


def check_official(argv: list[str], script: Script, site: dict[str, str], case: Case) -> None:
    """argv is the script's for this case, then only kerneltrial's recording options."""
    want = script.argv(argv[0], site, case)
    assert argv[: len(want)] == want
    tail = argv[len(want) :]
    assert [x for x in tail if x.startswith("--")] == [x for x in RECORDING if x in tail]
    assert "--seed" not in argv and "--base-url" not in argv


def test_the_official_client_argv_is_the_scripts(script: Script):
    assert script.constants["NUM_RUNS"] == SCRIPT_RUNS and script.num_prompts_from == "concurrency"
    assert tuple(tuple(s) for s in script.constants["SCENARIOS"]) == SCRIPT_SCENARIOS
    site = {"--host": "127.0.0.1", "--port": "8123", "--model": "minicpm5-2b", "--tokenizer": "/models/m"}
    for case in (*CASE_SETS["script"], *CASE_SETS["seed"]):
        argv = bench_argv(
            "vllm", "http://127.0.0.1:8123", "minicpm5-2b", "/models/m", case, Path("r"), "x.json", 0, (50, 99),
            "kt-0123456789abcdef", "official",
        )  # fmt: skip
        check_official(argv, script, site, case)
        assert argv[-2:] == ["--served-model-name", "kt-0123456789abcdef"]
    # the script's scenarios send --num-prompts = concurrency; the seed's cases keep their own counts
    assert all(c.num_requests == c.concurrency for c in CASE_SETS["script"])
    assert [c.label for c in CASE_SETS["script"]][:2] == ["script p128d128", "script p6144d128"]
    assert [(c.as_list(), c.label) for c in CASE_SETS["seed"]] == [
        (list(SEED_CASES[0]), "seed 1"),
        (list(SEED_CASES[1]), "seed 2"),
    ]


def test_the_completions_client_stays_kerneltrials():
    argv = bench_argv("vllm", "http://h:1", "m", None, Case(8, 4, 1, 2), Path("r"), "x.json", 3)
    assert argv[argv.index("--backend") + 1] == "vllm" and argv[argv.index("--endpoint") + 1] == "/v1/completions"
    assert argv[argv.index("--seed") + 1] == "3" and "--trust-remote-code" not in argv


def test_case_sets_are_labelled_and_the_official_client_sends_no_seed():
    base = '[server]\nmodel_id = "m"\n[bench]\n{bench}\n[[arms]]\nname = "a"\nargv = ["x"]\n'
    p = parse_protocol(base.format(bench='cases = "script"\nclient = "official"'))
    assert p.bench.client == "official" and len(p.bench.cases) == len(SCRIPT_SCENARIOS)
    assert parse_protocol(base.format(bench='cases = "seed"')).bench.cases == list(CASE_SETS["seed"])
    with pytest.raises(ProtocolError, match="client official sends no --seed, as the official script does"):
        parse_protocol(base.format(bench='cases = "seed"\nclient = "official"\nseeding = "per_run"'))
    with pytest.raises(ProtocolError, match="--client official: bench: client official sends no --seed"):
        parse_protocol(base.format(bench='cases = "seed"\nseed = 5')).with_client("official")


def test_a_trial_with_the_official_client_records_and_verifies_its_argv(tmp_path, monkeypatch, script: Script):
    seen: list[list[str]] = []
    base = synthetic_bench(lambda arm, L: (1.0, 1.0))

    def bench(argv, json_path, log_path, timeout_s, server=None):
        seen.append(argv)
        return base(argv, json_path, log_path, timeout_s, server)

    text = trial_text(rounds=1)
    monkeypatch.setattr(trial, "run_bench", bench)
    proto = write_protocol(tmp_path / "trial.toml", text)
    out = tmp_path / "run"
    r = run_cli(
        "serve",
        "trial",
        str(proto),
        "--client",
        "official",
        "--vllm",
        sys.executable,
        "-q",
        "--out",
        str(out),
    )
    assert r.exit_code == 1 and "INCONCLUSIVE" in r.output, r.output  # one launch per arm
    plan = json.loads((out / "plan.json").read_text())
    assert plan["client"] == "official"
    port = parse_protocol(text).server.port
    site = {"--host": "127.0.0.1", "--port": str(port), "--model": "tiny", "--tokenizer": "tiny"}
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [row["client_argv"] for row in rows] == seen
    for row in rows:
        check_official(row["client_argv"], script, site, Case(8, 4, 1, 2))
    assert verify_serving_run(out).problems == []
    # tampering: one run's argv says it went down the completions path
    rows[0]["client_argv"][rows[0]["client_argv"].index("--backend") + 1] = "vllm"
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
    args = ["bench", "--launch", "--client", "official", "--cases", "seed", "-r", "2", "--tokenizer", str(tmp_path)]
    args += ["--model-id", "tiny", "--vllm", sys.executable, "-q", "--out", str(out), "--port", str(port)]
    r = run_cli("serve", *args, "--", sys.executable, str(FAKE), "--port", "{port}")
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "plan.json").read_text())
    assert [(c["case"], c["label"]) for c in plan["cases"]] == [
        ("in4096-out1024-c64-n256", "seed 1"),
        ("in16384-out1024-c64-n128", "seed 2"),
    ]
    assert plan["client"] == "official" and 'cases = "seed"' in (out / "protocol.toml").read_text()
    assert all(a[a.index("--backend") + 1] == "openai-chat" for a in seen) and len(seen) == 4
