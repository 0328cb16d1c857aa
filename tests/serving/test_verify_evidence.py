"""`verify` rebuilds the evidence of a serving run (issue 14, item 5): every planted defect
below is one a consistency check alone let through, each caught by its named invariant.

The run directory comes from a real run_protocol against the fake server (tests/serving/
fake_server.py), with the benchmark client replaced by a synthetic one that writes what
`vllm bench serve --save-detailed` writes: per-request start times of a closed loop at the
case's concurrency, TTFT + inter-token gaps = latency, a duration just over the requests'
span, and vLLM's own run-level figures.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.rundir.serving_summary_doc import ArmAccuracy
from kerneltrial.serving import accuracy, metrics, script_csv, trial
from kerneltrial.serving import summary as summary_mod
from kerneltrial.serving.bench import request_rows
from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.verify import verify_serving_run
from kerneltrial.serving.verify_evidence import (
    client_figure_problems,
    concurrency_problems,
    duration_problems,
    request_time_problems,
)
from tests.kt import run_cli

from .conftest import FAKE, answer_as_served

# arm -> seconds per output token: B is 10% faster than A
TOKEN_S = {"A": 0.010, "B": 0.009}
TTFT_S = 0.05
SETUP_S = 0.003  # the client's own time before its first request and after its last (3 ms measured)
ANSWERS = ["42", "7", "42"]  # the fake server answers \boxed{42}: correct, wrong, correct


def synthetic_raw(n: int, n_in: int, n_out: int, concurrency: int, token_s: float) -> dict[str, Any]:
    """A closed loop at `concurrency`: each request starts when a slot frees."""
    latency = TTFT_S + token_s * (n_out - 1)
    free = [1000.0 + SETUP_S] * concurrency  # perf_counter seconds when each slot frees
    starts = []
    for i in range(n):
        slot = i % concurrency
        starts.append(free[slot])
        free[slot] += latency + 0.0005  # the client reads [DONE] before the slot frees
    raw: dict[str, Any] = {
        "duration": max(s + latency for s in starts) - 1000.0 + SETUP_S,
        "input_lens": [n_in] * n,
        "output_lens": [n_out] * n,
        "errors": [""] * n,
        "ttfts": [TTFT_S] * n,
        "itls": [[token_s] * (n_out - 1)] * n,
        "latencies": [latency] * n,
        "start_times": starts,
    }
    return raw | metrics.run_metrics(raw)  # vLLM's own figures, computed from the same arrays


def fake_bench(argv: list[str], json_path: Path, log_path: Path, timeout_s: float, server: Any = None) -> dict:
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    arm = json_path.parent.parent.name.split("-", 1)[1]
    raw = synthetic_raw(
        int(opt["--num-prompts"]),
        int(opt["--random-input-len"]),
        int(opt["--random-output-len"]),
        int(opt["--max-concurrency"]),
        TOKEN_S[arm],
    )
    answer_as_served(server, int(opt["--num-prompts"]))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(raw))
    log_path.write_text("synthetic bench\n")
    return raw


def protocol_text(data: Path) -> str:
    argv = json.dumps([sys.executable, str(FAKE), "--port", "{port}"])
    arms = "".join(f'[[arms]]\nname = "{n}"\nargv = {argv}\n' for n in TOKEN_S)
    return (
        f'name = "evidence"\nseed = 3\nrounds = 2\nrepeats = 2\n[server]\nmodel_id = "tiny"\nport = {free_port()}\n'
        f"ready_timeout_s = 30\nstop_grace_s = 5\n[bench]\ncases = [[16, 8, 2, 6]]\n"
        f'[accuracy]\ndata = "{data}"\nlimit = {len(ANSWERS)}\nconcurrency = 2\n{arms}'
    )


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("evidence")
    data = base / "math.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"p{i}", "answer": a, "level": 3, "unique_id": f"u{i}"}) + "\n"
            for i, a in enumerate(ANSWERS)
        )
    )
    text = protocol_text(data)
    out = base / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", fake_bench)
        trial.run_protocol(parse_protocol(text), text.encode(), out, vllm=sys.executable, argv=["test"])
    return out


@pytest.fixture
def run(clean_run: Path, tmp_path: Path) -> Path:
    """A copy of the clean run to plant a defect in."""
    return Path(shutil.copytree(clean_run, tmp_path / "run"))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_clean_run_verifies_with_its_grader_recorded(clean_run: Path) -> None:
    assert verify_serving_run(clean_run).problems == []
    summary = json.loads((clean_run / "summary.json").read_text())
    assert summary["accuracy"]["B"]["grader"] == accuracy.grader_version()
    stored = json.loads((clean_run / "accuracy" / "B" / "accuracy.json").read_text())
    assert stored["grader"]["rule"] == accuracy.GRADE_RULE and stored["grader"]["math-verify"]
    assert summary["accuracy"]["B"]["correct"] == 2  # 42, 7, 42 against an answer of 42
    r = run_cli("verify", clean_run)
    assert r.exit_code == 0 and "FAIL" not in r.output and "n/a  accuracy grades" not in r.output, r.output


# ---------------------------------------------------------------- grades


def test_flipped_grades_with_a_matching_summary_fail_verify(run: Path) -> None:
    """A careful cheater marks the wrong answer correct and rewrites the summary to match
    (count, accuracy, interval, gate) and accuracy.json: every count agrees with the flags.
    Caught by re-grading every stored answer with the recorded grader version."""
    records_path = run / "accuracy" / "B" / "records.jsonl"
    records = _jsonl(records_path)
    assert [r["correct"] for r in records if r["unique_id"] == "u1"] == [False]
    for r in records:
        r["correct"] = True
    _write_jsonl(records_path, records)
    spec = accuracy.AccuracySpec.model_validate(json.loads((run / "plan.json").read_text())["accuracy"])
    forged = accuracy.summarise([accuracy.Record(**r) for r in records], spec)
    summary = json.loads((run / "summary.json").read_text())
    summary["accuracy"]["B"].update({k: forged[k] for k in ("correct", "accuracy", "ci_low", "ci_high", "passed")})
    (run / "summary.json").write_text(json.dumps(summary))
    assert verify_serving_run(run, regrade=False).problems == []  # consistent: only re-grading can tell
    problems = verify_serving_run(run).problems
    assert problems == [
        "accuracy B: problem u1 sample 0 is stored correct=True, re-graded False",
        "accuracy B: summary correct = 3, re-graded 2 of 3 samples",
    ]
    r = run_cli("verify", run)
    assert r.exit_code == 1 and "re-graded False" in r.output
    trusted = run_cli("verify", run, "--no-regrade")  # says what it did not do
    assert trusted.exit_code == 0, trusted.output
    assert "n/a  accuracy grades: not re-graded (--no-regrade): the stored correct flags are trusted" in trusted.output


def test_a_run_graded_by_another_grader_version_is_refused(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary["accuracy"]["A"]["grader"]["math-verify"] = "0.0.1"
    (run / "summary.json").write_text(json.dumps(summary))
    [problem] = verify_serving_run(run).problems
    assert problem.startswith("accuracy A: graded by {") and "'math-verify': '0.0.1'" in problem
    assert "install the recorded versions, or pass --no-regrade" in problem
    assert verify_serving_run(run, regrade=False).problems == []
    del summary["accuracy"]["A"]["grader"]  # a run from before the grader was recorded
    (run / "summary.json").write_text(json.dumps(summary))
    [problem] = verify_serving_run(run).problems
    assert "graded by a grader whose version the run did not record" in problem


def test_without_math_verify_verify_cannot_regrade_and_fails(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` raises ImportError
    [problem] = verify_serving_run(run).problems
    assert problem.startswith("cannot re-grade the accuracy answers: grading MATH-500 needs math-verify")
    assert problem.endswith("or pass --no-regrade to verify the rest")
    r = run_cli("verify", run)
    assert r.exit_code == 1 and "cannot re-grade" in r.output
    assert run_cli("verify", run, "--no-regrade").exit_code == 0


# ---------------------------------------------------------------- durations


def _forge_runs(run: Path, arm: str, edit: Any, rewrite_requests: bool = True) -> None:
    """Apply `edit` to every raw file of `arm`, then rewrite as a careful cheater would: vLLM's own
    figures in the raw file, runs.jsonl (figures and raw sha256), requests.csv and the summary's
    results, each recomputed with kerneltrial's own code from the edited arrays."""
    from kerneltrial.rundir.hashing import sha256_file

    proto = parse_protocol((run / "protocol.toml").read_text(), run)
    rows = _jsonl(run / "runs.jsonl")
    for row in rows:
        if row["arm"] != arm:
            continue
        path = run / row["raw"]
        raw = json.loads(path.read_text())
        edit(raw)
        raw |= metrics.run_metrics(raw)
        path.write_text(json.dumps(raw))
        row |= metrics.run_metrics(raw, proto.bench.percentiles) | {"raw_sha256": sha256_file(path)}
    _write_jsonl(run / "runs.jsonl", rows)
    if rewrite_requests:
        with (run / "requests.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(trial.REQUEST_FIELDS)
            for row in rows:
                raw = json.loads((run / row["raw"]).read_text())
                for rq in request_rows(raw):
                    cells = {"launch": row["launch"], "arm": row["arm"], "case": row["case"], "run": row["run"], **rq}
                    w.writerow([cells.get(f, "") for f in trial.REQUEST_FIELDS])
    summary = json.loads((run / "summary.json").read_text())
    accuracies = {arm: ArmAccuracy.model_validate(a) for arm, a in summary["accuracy"].items()}
    redone = summary_mod.summarise(proto, rows, accuracies, summary["protocol_sha256"], [], [])
    summary["results"] = redone.as_json()["results"]
    (run / "summary.json").write_text(json.dumps(summary))
    [stamp] = {f.name.removeprefix("raw_runs_").removesuffix(".csv") for f in run.glob("benchmark_results/*/raw_*")}
    shutil.rmtree(run / script_csv.RESULTS_DIR)  # the script's CSVs, rewritten from the forged rows
    script_csv.write_run(run, stamp, proto.bench.cases, proto.repeats, rows)


def _gain(run: Path) -> float:
    res = json.loads((run / "summary.json").read_text())["results"]
    case = next(iter(res["A"]))
    return res["B"][case]["total_token_throughput"] / res["A"][case]["total_token_throughput"] - 1


def test_shrunk_durations_with_recomputed_rows_fail_verify(run: Path) -> None:
    """Issue 14: A's raw durations shrunk by 20% (its per-request latencies, TTFTs and gaps with
    them), every figure, hash, table and summary recomputed: B's +10% gain becomes a loss, and
    every file agrees with every other. Caught by the client's clock: a run's duration covers its
    requests, first start_time to last start_time + latency (the start times, taken on the same
    perf_counter clock, were not shrunk: shrinking them too would need every request rescheduled)."""
    before = _gain(run)

    def shrink(raw: dict[str, Any]) -> None:
        raw["duration"] *= 0.8
        raw["latencies"] = [x * 0.8 for x in raw["latencies"]]
        raw["ttfts"] = [x * 0.8 for x in raw["ttfts"]]
        raw["itls"] = [[x * 0.8 for x in itl] for itl in raw["itls"]]

    _forge_runs(run, "A", shrink)
    assert before > 0.05 and _gain(run) < 0  # the verdict flipped
    problems = verify_serving_run(run).problems
    assert problems and all("is shorter than its requests' span" in p for p in problems), problems
    assert len(problems) == 4  # each of A's runs: 2 launches x 2 repeats
    assert problems[0].startswith("run A/in16-out8-c2-n6/launch ")
    assert run_cli("verify", run, "--no-regrade").exit_code == 1


def test_shrunk_run_duration_alone_fails_verify(run: Path) -> None:
    """Only the run-level duration shrunk (the per-request arrays untouched), everything recomputed."""
    _forge_runs(run, "A", lambda raw: raw.update(duration=raw["duration"] * 0.9))
    problems = verify_serving_run(run).problems
    assert len(problems) == 4 and all("is shorter than its requests' span" in p for p in problems), problems


def test_an_edited_raw_file_contradicts_requests_csv(run: Path) -> None:
    """A cheater who rewrites the raw file and runs.jsonl but not requests.csv: the trial's copy of
    every request, written when the run ended, no longer matches."""

    def slower_first_token(raw: dict[str, Any]) -> None:  # consistent in itself: TTFT moves, latency too
        raw["ttfts"] = [x + 0.0001 for x in raw["ttfts"]]
        raw["latencies"] = [x + 0.0001 for x in raw["latencies"]]

    _forge_runs(run, "B", slower_first_token, rewrite_requests=False)
    problems = verify_serving_run(run).problems
    assert problems[0].startswith("run B/in16-out8-c2-n6/launch ") and "requests.csv request 0 ttft_s = " in problems[0]
    assert all("requests.csv" in p for p in problems), problems


def test_requests_csv_rows_must_be_each_request_once(run: Path) -> None:
    lines = (run / "requests.csv").read_text().splitlines()
    cells = lines[2].split(",")
    assert cells[4] == "1"
    lines[2] = ",".join(cells[:4] + ["0"] + cells[5:])  # request 1's row relabelled as request 0
    (run / "requests.csv").write_text("\n".join(lines) + "\n")
    [problem] = verify_serving_run(run).problems
    assert problem.endswith("requests.csv rows are not requests 0 to 5 once each")


# ---------------------------------------------------------------- launch order


def test_a_reordered_launches_jsonl_fails_verify(run: Path) -> None:
    """Launch order is launch_order(arms, rounds, seed) of protocol.toml; rows swapped in
    launches.jsonl (or a plan.json rewritten to another order) contradict the seed."""
    rows = _jsonl(run / "launches.jsonl")
    assert rows[0]["arm"] != rows[1]["arm"] or rows[1]["arm"] != rows[2]["arm"]
    i = 0 if rows[0]["arm"] != rows[1]["arm"] else 1
    rows[i], rows[i + 1] = rows[i + 1], rows[i]
    _write_jsonl(run / "launches.jsonl", rows)
    [problem] = verify_serving_run(run).problems
    assert problem.startswith(f"launches.jsonl row {i + 1} is ")
    assert problem.endswith(
        "launch_order(arms, rounds=2, seed=3) gives " + repr(_want(run)[i]) + ": the launches were reordered"
    )
    plan = json.loads((run / "plan.json").read_text())
    plan["launches"] = [dict(x, arm={"A": "B", "B": "A"}[x["arm"]]) for x in plan["launches"]]
    (run / "plan.json").write_text(json.dumps(plan))
    assert any(p.startswith("plan.json's launch order is not launch_order(") for p in verify_serving_run(run).problems)


def test_a_relabelled_block_fails_verify(run: Path) -> None:
    """Each launch's block (rounds 2b and 2b+1, the A B / B A pair) is part of the recorded order:
    a launch moved to another block in plan.json or launches.jsonl contradicts launch_order."""
    assert [x["block"] for x in _want(run)] == [0, 0, 0, 0]
    rows = _jsonl(run / "launches.jsonl")
    _write_jsonl(run / "launches.jsonl", [dict(rows[0], block=1), *rows[1:]])
    [problem] = verify_serving_run(run).problems
    assert problem.startswith("launches.jsonl row 1 is {'launch': 0, 'round': 0, 'block': 1,")
    _write_jsonl(run / "launches.jsonl", rows)
    plan = json.loads((run / "plan.json").read_text())
    plan["launches"] = [dict(x, block=x["round"]) for x in plan["launches"]]
    (run / "plan.json").write_text(json.dumps(plan))
    derived, order = verify_serving_run(run).problems  # the plan against its protocol, then against launch_order
    assert derived == "plan.json launches[2].block is 1, protocol.toml gives 0"  # the first launch it moved
    assert order.startswith("plan.json's launch order is not launch_order(arms, rounds=2, seed=3)")


def test_a_finished_run_missing_a_launch_fails_verify(run: Path) -> None:
    rows = _jsonl(run / "launches.jsonl")
    _write_jsonl(run / "launches.jsonl", rows[:-1])
    problems = verify_serving_run(run).problems
    assert "launches.jsonl has 3 launches, launch_order(arms, rounds=2, seed=3) gives 4 for a finished run" in problems


def _want(run: Path) -> list[dict[str, Any]]:
    proto = parse_protocol((run / "protocol.toml").read_text(), run)
    return [asdict(x) for x in trial.planned_launches(proto.arms, proto.rounds, proto.seed)]


# ---------------------------------------------------------------- the client's invariants, one raw file


def test_each_client_invariant_catches_its_planted_defect() -> None:
    raw = synthetic_raw(6, 16, 8, 2, 0.01)
    where = "run X"
    assert request_time_problems(raw, where) == duration_problems(raw, where) == []
    assert concurrency_problems(raw, 2, where) == client_figure_problems(raw, metrics.run_metrics(raw), where) == []

    no_starts = {k: v for k, v in raw.items() if k != "start_times"}
    assert "lacks per-request start_times for its 6 requests" in request_time_problems(no_starts, where)[0]

    short = raw | {"latencies": [x * 0.9 for x in raw["latencies"]]}  # gaps and TTFT left as they were
    assert "inter-token gaps" in request_time_problems(short, where)[0]

    late = raw | {"ttfts": [x + 1 for x in raw["ttfts"]]}
    assert "outside [0, its latency" in request_time_problems(late, where)[0]

    padded = raw | {"duration": raw["duration"] + 5}  # a slower baseline by an inflated duration
    assert "exceeds its requests' span" in duration_problems(padded, where)[0]

    crowded = raw | {"start_times": [raw["start_times"][0]] * 6}  # all at once, at concurrency 2
    assert "6 requests were in flight at once" in concurrency_problems(crowded, 2, where)[0]

    forged = raw | {"total_token_throughput": raw["total_token_throughput"] * 1.1}
    [p] = client_figure_problems(forged, metrics.run_metrics(raw), where)
    assert p.startswith("run X: vLLM's own total_token_throughput in the raw file is ")


def test_the_limit_a_forgery_that_reschedules_every_request_passes(run: Path) -> None:
    """What verify cannot prove (docs/serving.md): every per-request time of A, start times
    included, scaled together with the duration and every file rewritten is a coherent record
    of a faster server. Only an independent re-run tells it apart."""

    def rescheduled(raw: dict[str, Any]) -> None:
        t0 = min(raw["start_times"]) - 0.003
        raw["start_times"] = [t0 + (s - t0) * 0.8 for s in raw["start_times"]]
        raw["duration"] *= 0.8
        raw["latencies"] = [x * 0.8 for x in raw["latencies"]]
        raw["ttfts"] = [x * 0.8 for x in raw["ttfts"]]
        raw["itls"] = [[x * 0.8 for x in itl] for itl in raw["itls"]]

    _forge_runs(run, "A", rescheduled)
    assert verify_serving_run(run).problems == []


def test_a_forged_peak_output_rate_fails_verify(run: Path) -> None:
    """The peak output tok/s (the official script's figure) is recomputed from the per-request
    times like every other figure: a raised peak in runs.jsonl is caught."""
    rows = _jsonl(run / "runs.jsonl")
    peak = rows[0]["max_output_tokens_per_s"]
    assert peak > 0
    _write_jsonl(run / "runs.jsonl", [dict(rows[0], max_output_tokens_per_s=peak + 10), *rows[1:]])
    problems = verify_serving_run(run).problems
    assert f"max_output_tokens_per_s is {peak + 10} in runs.jsonl, recomputed {peak}" in problems[0]
