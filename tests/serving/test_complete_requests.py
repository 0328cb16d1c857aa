"""Complete requests only (issue 36, item 3): with `--random-output-len 8 --ignore-eos` a run
recorded output lengths [1, 1, 1, 1] (streams closed mid-response), was `ok`, and verify passed.
vLLM's client counts such a request as successful, and skips an error chunk inside a stream
(serving/completeness.py). Each hole is planted in what the client records (fake data through
the fake server's launches; no vLLM): the run is FAILED with a named reason, and verify recounts
the status from the raw arrays and fails a run whose recorded status disagrees."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving.completeness import asked_output_len, judge_requests
from kerneltrial.serving.verify import verify_serving_run
from kerneltrial.serving.verify_requests import short_requests

from .test_acceptance import run_trial, synthetic_bench, trial_text

CASE = "in8-out8-c1-n4"
ITL_S = 0.01
# what vLLM's client records for a stream whose connection broke mid-body (aiohttp raises)
PAYLOAD_ERROR = (
    'Traceback (most recent call last):\n  File "endpoint_request_func.py", line 210, in '
    "async_request_openai_completions\naiohttp.client_exceptions.ClientPayloadError: Response payload is not completed"
)


def text() -> str:
    return trial_text(rounds=1).replace("cases = [[8, 4, 1, 2]]", "cases = [[8, 8, 1, 4]]")


def cut(raw: dict[str, Any], i: int, tokens: int) -> None:
    """Request i as the client records a stream that ended after `tokens` tokens without its usage
    chunk (closed, or an error chunk the client skips): success, and the text's token count."""
    raw["output_lens"][i] = tokens
    raw["itls"][i] = [ITL_S] * (tokens - 1)
    raw["latencies"][i] = raw["ttfts"][i] + ITL_S * (tokens - 1)


def broke(raw: dict[str, Any], i: int) -> None:
    """Request i as the client records a stream whose read raised: the traceback, no latency."""
    raw["errors"][i], raw["latencies"][i], raw["ttfts"][i] = PAYLOAD_ERROR, 0.0, 0.0
    raw["output_lens"][i], raw["itls"][i] = 0, []
    raw["completed"] -= 1


def planted(change: Callable[[dict[str, Any], int], None], arm: str = "B") -> Callable[..., dict[str, Any]]:
    """The synthetic client, with `change(raw, run)` applied to every run of `arm`."""
    base = synthetic_bench(lambda a, L: (1.0, 1.0))

    def bench(argv: list[str], json_path: Path, log_path: Path, timeout_s: float, server: Any = None) -> dict:
        raw = base(argv, json_path, log_path, timeout_s, server)
        if json_path.parent.parent.name.endswith(f"-{arm}"):
            raw = json.loads(json.dumps(raw))  # the synthetic arrays share their inner lists
            change(raw, int(json_path.stem.removeprefix("run")))
            json_path.write_text(json.dumps(raw))
        return raw

    return bench


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]


def write_rows(out: Path, table: list[dict[str, Any]]) -> None:
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table))


def test_the_client_records_are_judged_by_what_the_argv_asked_for():
    argv = ["vllm", "bench", "serve", "--random-output-len", "8", "--ignore-eos"]
    assert asked_output_len(argv) == 8 and asked_output_len(["--random-output-len=8", "--ignore-eos"]) == 8
    assert asked_output_len(argv[:-1]) is None  # without --ignore-eos a request may stop at EOS
    assert asked_output_len([*argv, "--random-range-ratio", "0.5"]) is None
    assert asked_output_len([*argv, "--random-range-ratio", "0"]) == 8
    raw = {
        "input_lens": [8] * 4,
        "output_lens": [8, 1, 0, 3],
        "errors": ["", "", "boom", ""],
        "latencies": [0.2, 0.1, 0.0, 0.12],
        "ttfts": [0.1] * 4,
    }
    got = judge_requests(raw, argv)
    assert [(s.request, s.output_len) for s in got.short] == short_requests(raw, 8) == [(1, 1), (3, 3)]
    assert "2 of 4 requests returned other than the 8 output tokens" in got.reason()
    assert "(request 1: 1 of 8, request 3: 3 of 8 tokens)" in got.reason()
    with pytest.raises(ValueError, match="3 output_lens for 4 requests"):
        judge_requests(dict(raw, output_lens=[8, 8, 8]), argv)


def test_truncated_streams_fail_the_run_and_the_record_verifies(tmp_path, monkeypatch):
    """The issue's run: every stream of arm B closed after its first token."""

    def every_stream_cut(raw: dict[str, Any], run: int) -> None:
        for i in range(len(raw["output_lens"])):
            cut(raw, i, 1)

    code, output, out = run_trial(tmp_path, monkeypatch, text(), planted(every_stream_cut))
    assert code == 1, output
    failed = [r for r in rows(out) if r["arm"] == "B"]
    assert failed and all(r["status"] == "FAILED" and r["incomplete_requests"] == 4 for r in failed)
    assert failed[0]["completed"] == 4  # vLLM's own count, kept: the figures are vLLM's
    assert failed[0]["reason"].startswith(
        "4 of 4 requests returned other than the 8 output tokens they asked for under --ignore-eos (request 0: 1 "
        "of 8, request 1: 1 of 8, request 2: 1 of 8, request 3: 1 of 8 tokens): a stream the server closed"
    )
    assert all(r["status"] == "ok" and r["incomplete_requests"] == 0 for r in rows(out) if r["arm"] == "A")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["results"]["B"][CASE]["status"] == "FAILED"
    assert verify_serving_run(out).problems == []  # the record of that failure verifies

    forged = rows(out)  # planted: the failed runs recorded as ok, as before issue 36
    for r in forged:
        if r["arm"] == "B":
            r.update(status="ok", incomplete_requests=0)
            r.pop("reason")
    write_rows(out, forged)
    problems = verify_serving_run(out).problems
    assert any(
        "status ok but 4 of 4 requests returned other than the 8 output tokens they asked for under --ignore-eos "
        "(request 0: 1 of 8" in p
        for p in problems
    ), problems
    assert any("incomplete_requests is 0 in runs.jsonl, recounted 4" in p for p in problems), problems


def test_an_error_inside_a_stream_fails_the_run_whichever_way_the_client_records_it(tmp_path, monkeypatch):
    """Run 0 of B: request 2's read raised (an error); run 1: its error chunk was skipped and the
    stream ended after 3 tokens (no error, a short count)."""

    def error_mid_stream(raw: dict[str, Any], run: int) -> None:
        if run == 0:
            broke(raw, 2)
        else:
            cut(raw, 2, 3)

    code, output, out = run_trial(tmp_path, monkeypatch, text(), planted(error_mid_stream))
    assert code == 1, output
    run0, run1 = [r for r in rows(out) if r["arm"] == "B"]
    assert run0["status"] == "FAILED" and run0["reason"] == (
        "completed 3 of 4 requests (request 2: aiohttp.client_exceptions.ClientPayloadError: Response payload is "
        "not completed)"
    )
    assert run1["status"] == "FAILED" and run1["incomplete_requests"] == 1
    assert run1["reason"].startswith("1 of 4 requests returned other than the 8 output tokens")
    assert "(request 2: 3 of 8 tokens)" in run1["reason"]
    assert verify_serving_run(out).problems == []


def test_verify_recounts_a_rewritten_raw_file_and_a_client_that_did_not_ignore_eos(tmp_path, monkeypatch):
    code, output, out = run_trial(tmp_path, monkeypatch, text(), synthetic_bench(lambda a, L: (1.0, 1.0)))
    assert code == 1 and verify_serving_run(out).problems == [], output  # one launch per arm: INCONCLUSIVE
    table = rows(out)
    raw_path = out / table[1]["raw"]
    raw = json.loads(raw_path.read_text())
    cut(raw, 0, 2)  # planted: a short request in a run recorded ok, its hash made to match
    raw_path.write_text(json.dumps(raw))
    table[1]["raw_sha256"] = sha256_file(raw_path)
    argv = table[2]["client_argv"]
    table[2]["client_argv"] = [x for x in argv if x != "--ignore-eos"]  # planted: EOS may end a request
    table[3].update(status="FAILED", reason="planted")  # planted: a complete run recorded failed
    write_rows(out, table)
    problems = verify_serving_run(out).problems
    where = [f"run {r['arm']}/{CASE}/launch {r['launch']}/run {r['run']}" for r in table]
    assert f"{where[1]}: status ok but 1 of 4 requests returned other than the 8 output tokens" in "\n".join(problems)
    assert any(p.startswith(f"{where[2]}: its client argv lacks --ignore-eos") for p in problems), problems
    assert f"{where[3]}: status FAILED but every one of its 4 requests completed with its 8 output tokens" in problems
