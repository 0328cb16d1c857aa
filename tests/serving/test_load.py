"""Realistic load (issue 26, item 7): a case's request rate and burstiness, and goodput SLOs, pass
through to `vllm bench serve`; a case may sweep concurrency; each is recorded in plan.json and
every run's argv, goodput is recomputed from the per-request arrays, and verify checks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerneltrial.serving.bench import Case, bench_argv, parse_cases
from kerneltrial.serving.metrics import run_metrics
from kerneltrial.serving.protocol import ProtocolError, parse_protocol
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli

from .test_acceptance import run_trial, synthetic_bench, trial_text

SWEEP = (
    "[{ input_len = 8, output_len = 4, concurrency = [1, 2], num_requests = 2, request_rate = 4, burstiness = 0.5 }]"
)


def test_a_case_table_sweeps_concurrency_and_carries_its_arrival_process():
    cases = parse_cases(
        [{"input_len": 8, "output_len": 4, "concurrency": [1, 2, 4], "num_requests": 8, "request_rate": 2.5}]
    )
    assert [c.id for c in cases] == ["in8-out4-c1-n8-r2.5", "in8-out4-c2-n8-r2.5", "in8-out4-c4-n8-r2.5"]
    assert cases[0].as_toml() == {
        "input_len": 8,
        "output_len": 4,
        "concurrency": 1,
        "num_requests": 8,
        "request_rate": 2.5,
    }
    with pytest.raises(ValueError, match="burstiness shapes the gaps of a request_rate; set request_rate too"):
        parse_cases([{"input_len": 8, "output_len": 4, "concurrency": 1, "num_requests": 8, "burstiness": 2}])
    with pytest.raises(ValueError, match="request_rate must be a positive number, got 0"):
        parse_cases([{"input_len": 8, "output_len": 4, "concurrency": 1, "num_requests": 8, "request_rate": 0}])
    with pytest.raises(ValueError, match="needs keys input_len, output_len, concurrency, num_requests"):
        parse_cases([{"input_len": 8, "output_len": 4, "concurrency": 1, "num_requests": 8, "rate": 1}])


@pytest.mark.parametrize("client", ["completions", "official", "flagos-chat"])
def test_rate_burstiness_and_goodput_pass_through_either_client(client: str):
    case = Case(8, 4, 2, 2, request_rate=4.0, burstiness=0.5)
    argv = bench_argv(
        "vllm", "http://h:1", "m", "t", case, Path("r"), "x.json", 0, (50,), None, client, {"ttft": 500, "tpot": 50}
    )
    i = argv.index("--request-rate")
    assert argv[i : i + 7] == ["--request-rate", "4", "--burstiness", "0.5", "--goodput", "ttft:500", "tpot:50"]
    plain = bench_argv("vllm", "http://h:1", "m", "t", Case(8, 4, 2, 2), Path("r"), "x.json", 0, (50,), None, client)
    assert not {"--request-rate", "--burstiness", "--goodput"} & set(plain)  # the default: all at once, no SLO


def test_goodput_is_vllms_count_of_requests_meeting_every_slo():
    raw = {
        "duration": 2.0,
        "input_lens": [8, 8, 8, 8],
        "output_lens": [5, 5, 1, 5],
        "errors": ["", "", "", "boom"],
        "ttfts": [0.1, 0.3, 0.05, 0.0],
        "latencies": [0.5, 0.7, 0.05, 0.0],
        "itls": [[0.1] * 4, [0.1] * 4, [], []],
    }
    # request 0: ttft 100 ms, tpot 100 ms; 1: ttft 300 ms; 2: one token, tpot 0; 3 failed
    assert run_metrics(raw, (50,), {"ttft": 200})["request_goodput"] == 2 / 2.0
    assert run_metrics(raw, (50,), {"ttft": 200, "tpot": 99})["request_goodput"] == 1 / 2.0
    assert run_metrics(raw, (50,), {"e2el": 1000})["request_goodput"] == 3 / 2.0
    assert "request_goodput" not in run_metrics(raw, (50,))


def test_slos_are_checked_by_the_loader():
    base = trial_text(rounds=1)
    with pytest.raises(ProtocolError, match="itl = 5.0: SLOs are ttft, tpot or e2el with a positive number of ms"):
        parse_protocol(base.replace("[acceptance]", "goodput = { itl = 5 }\n[acceptance]"))


def test_a_trial_with_a_rate_sweep_and_slos_records_and_verifies_them(tmp_path, monkeypatch):
    text = trial_text(rounds=1).replace(
        "cases = [[8, 4, 1, 2]]", f"cases = {SWEEP}\ngoodput = {{ ttft = 150, e2el = 1000 }}"
    )
    code, output, out = run_trial(
        tmp_path, monkeypatch, text, synthetic_bench(lambda a, L: (1.0, 1.0 if a == "A" else 2.0))
    )
    assert code == 1, output  # one launch per arm: INCONCLUSIVE
    plan = json.loads((out / "plan.json").read_text())
    assert plan["goodput"] == {"ttft": 150, "e2el": 1000}
    assert [(c["case"], c["request_rate"], c["burstiness"]) for c in plan["cases"]] == [
        ("in8-out4-c1-n2-r4-b0.5", 4.0, 0.5),
        ("in8-out4-c2-n2-r4-b0.5", 4.0, 0.5),
    ]
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    for r in rows:
        argv = r["client_argv"]
        assert argv[argv.index("--request-rate") + 1] == "4" and argv[argv.index("--burstiness") + 1] == "0.5"
        assert argv[argv.index("--goodput") + 1 : argv.index("--goodput") + 3] == ["ttft:150", "e2el:1000"]
        # the synthetic client's TTFT is 100 ms for A and 200 ms for B: A's requests are good, B's are not
        assert r["request_goodput"] == (r["completed"] / r["duration"] if r["arm"] == "A" else 0.0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["A"]["in8-out4-c1-n2-r4-b0.5"]["request_goodput"] > 0
    assert verify_serving_run(out).problems == []
    r = run_cli("report", str(out))
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    assert "| goodput req/s |" in md and "ttft <= 150 ms, e2el <= 1000 ms" in md and (out / "goodput.png").is_file()
    # tampering: a run's goodput, then a run's rate
    forged = [dict(rows[0], request_goodput=9.0), *rows[1:]]
    (out / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in forged))
    assert any("request_goodput is 9.0 in runs.jsonl, recomputed" in p for p in verify_serving_run(out).problems)
    rows[0]["client_argv"][rows[0]["client_argv"].index("--request-rate") + 1] = "40"
    (out / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert any(
        "differs from the completions client's for its case in --request-rate" in p
        for p in verify_serving_run(out).problems
    )
