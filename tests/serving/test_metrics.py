"""Metric math against hand-computed values (no server)."""

from __future__ import annotations

import math

import pytest

from kerneltrial.serving import metrics

RAW = {
    # 3 requests: two succeed, one fails (error text, latency 0)
    "duration": 2.0,
    "input_lens": [10, 20, 30],
    "output_lens": [4, 1, 0],
    "ttfts": [0.1, 0.3, 0.0],
    "itls": [[0.2, 0.2, 0.5], [], []],
    "latencies": [1.0, 0.3, 0.0],
    "errors": ["", "", "boom"],
}


def test_run_metrics_hand_computed():
    m = metrics.run_metrics(RAW, percentiles=(50, 99))
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["total_input_tokens"] == 30  # failed request's input not counted
    assert m["total_output_tokens"] == 5
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(2.5)
    assert m["total_token_throughput"] == pytest.approx(17.5)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(100.0)  # population std of [0.1, 0.3]
    assert m["p99_ttft_ms"] == pytest.approx(298.0)  # 0.1 + 0.99 * 0.2
    # TPOT only for output_len > 1: (1.0 - 0.1) / 3
    assert m["mean_tpot_ms"] == pytest.approx(300.0)
    # ITL pooled: [0.2, 0.2, 0.5]
    assert m["mean_itl_ms"] == pytest.approx(300.0)
    assert m["median_itl_ms"] == pytest.approx(200.0)
    assert m["p50_itl_ms"] == pytest.approx(200.0)
    assert m["mean_e2el_ms"] == pytest.approx(650.0)


def test_peak_output_tokens_per_s_hand_computed():
    # request 0 starts at 0.0: tokens at 0.1, 0.3, 0.5, 1.0; request 1 at 0.5: one token at 0.8; request 2 failed
    m = metrics.run_metrics(dict(RAW, start_times=[0.0, 0.5, 0.2]))
    assert m["max_output_tokens_per_s"] == 4.0  # second 0 holds 4 tokens, second 1 one
    # the buckets start at the earliest successful request: moving the failed one changes nothing
    assert metrics.run_metrics(dict(RAW, start_times=[0.0, 0.5, -5.0]))["max_output_tokens_per_s"] == 4.0
    # spread over time, the same tokens make a lower peak
    assert metrics.run_metrics(dict(RAW, start_times=[0.0, 3.0, 0.0]))["max_output_tokens_per_s"] == 3.0
    assert "max_output_tokens_per_s" not in metrics.run_metrics(RAW)  # no start_times: left out, not guessed
    none_ok = dict(RAW, errors=["x", "y", "z"], start_times=[0.0, 0.0, 0.0])
    assert metrics.run_metrics(none_ok)["max_output_tokens_per_s"] == 0.0


def test_empty_latency_lists_are_zero_like_vllm():
    raw = dict(RAW, errors=["x", "y", "z"], latencies=[0.0, 0.0, 0.0], output_lens=[0, 0, 0])
    m = metrics.run_metrics(raw)
    assert m["completed"] == 0 and m["mean_ttft_ms"] == 0.0 and m["p99_itl_ms"] == 0.0


def test_missing_detailed_arrays_is_an_error():
    with pytest.raises(ValueError, match="save-detailed"):
        metrics.run_metrics({"duration": 1.0, "input_lens": [1]})


def test_warmup_rule_drops_first_and_averages():
    assert metrics.warmup_mean([100.0, 10.0, 20.0, 30.0]) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        metrics.warmup_mean([5.0])
    runs = [{k: 1000.0 for k in metrics.SUMMARY_KEYS}, *({k: float(v) for k in metrics.SUMMARY_KEYS} for v in (2, 4))]
    s = metrics.summarise_case(runs)
    assert s["total_token_throughput"] == pytest.approx(3.0)


def test_wilson_interval_known_values():
    lo, hi = metrics.wilson_interval(8, 10, 0.95)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = metrics.wilson_interval(0, 5)
    assert lo == 0.0 and 0.4 < hi < 0.45
    assert metrics.wilson_interval(0, 0) == (0.0, 1.0)


def test_percentile_word():
    assert metrics.percentile_word(99.0) == "99" and metrics.percentile_word(99.9) == "99.9"
    assert not math.isnan(metrics.describe_ms("x", [1.0], [50])["p50_x_ms"])
