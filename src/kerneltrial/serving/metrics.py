"""Metric math for one `vllm bench serve --save-detailed` result, and the warm-up rule.

Pure functions on plain data, matching vllm/benchmarks/serve.py (vLLM 0.32,
`calculate_metrics` and `process_one_metric`) formula for formula:

- a request succeeded when its `errors` entry is empty and its latency is > 0;
- completed = number of successful requests; failed = the rest;
- total_input_tokens = sum of `input_lens` over successful requests;
- total_output_tokens = sum of `output_lens` (failed requests count 0);
- request_throughput = completed / duration; output_throughput = total_output / duration;
  total_token_throughput = (total_input + total_output) / duration;
- TTFT = `ttfts[i]`, E2E = `latencies[i]` over successful requests;
- TPOT_i = (latency_i - ttft_i) / (output_len_i - 1), only for successful requests with
  output_len_i > 1;
- ITL = all entries of `itls[i]` of successful requests, pooled;
- for each: mean (numpy.mean), median, std (population, numpy.std), percentiles with
  numpy.percentile (linear), all x 1000 (ms); an empty list gives 0 (vLLM's `x or 0`);
- max_output_tokens_per_s, printed as "Peak output token throughput (tok/s)": the successful
  requests' tokens (the first at start + ttft, each next one ITL later) counted in one-second
  buckets from the earliest successful start; the fullest bucket. Needs `start_times`, which
  `--save-detailed` writes (absent: the figure is left out, never guessed);
- request_goodput (with `--goodput` SLOs in ms): successful requests whose TTFT, TPOT (0 for a
  one-token output) and E2E each meet their SLO, per second of the run's duration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kerneltrial.rundir.serving_summary_doc import FIGURE_KEYS

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_KEYS = ("ttft", "tpot", "e2el")  # the SLOs `vllm bench serve --goodput` takes (ms)
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
SUMMARY_KEYS = FIGURE_KEYS  # the figures summary.json averages (rundir/serving_summary_doc.py)


def percentile_word(p: float) -> str:
    """vLLM's key spelling: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


def success_flags(raw: Mapping[str, Any]) -> list[bool]:
    errors = raw.get("errors") or []
    latencies = raw.get("latencies") or []
    n = len(raw.get("input_lens") or [])
    if len(errors) != n or len(latencies) != n:
        raise ValueError("bench JSON lacks per-request arrays (errors/latencies); was it saved with --save-detailed?")
    return [(not errors[i]) and float(latencies[i]) > 0.0 for i in range(n)]


def tpots(raw: Mapping[str, Any], ok: Sequence[bool]) -> list[float]:
    out: list[float] = []
    for i, good in enumerate(ok):
        n_out = int(raw["output_lens"][i])
        if good and n_out > 1:
            out.append((float(raw["latencies"][i]) - float(raw["ttfts"][i])) / (n_out - 1))
    return out


def describe_ms(name: str, values: Sequence[float], percentiles: Iterable[float]) -> dict[str, float]:
    """mean/median/std/pXX of `values` (seconds) in ms, keys as vLLM writes them."""
    arr: Any = list(values) or 0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)) * 1000,
        f"median_{name}_ms": float(np.median(arr)) * 1000,
        f"std_{name}_ms": float(np.std(arr)) * 1000,
    }
    for p in percentiles:
        out[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(arr, p)) * 1000
    return out


def peak_output_tokens_per_s(raw: Mapping[str, Any], ok: Sequence[bool]) -> float:
    """vLLM's max_output_tokens_per_s (calculate_metrics, serve.py): tokens per one-second bucket, the maximum."""
    good = [i for i, g in enumerate(ok) if g]
    if not good:
        return 0.0
    starts = [float(raw["start_times"][i]) for i in good]
    t0 = min(starts)
    end = max(s + float(raw["latencies"][i]) for s, i in zip(starts, good, strict=True))
    buckets = np.zeros(int(np.ceil(end - t0)) + 1)
    for s, i in zip(starts, good, strict=True):
        t = s + float(raw["ttfts"][i])
        times = [t]
        for gap in raw["itls"][i]:
            t += float(gap)
            times.append(t)
        for t in times:
            b = int(t - t0)
            if 0 <= b < len(buckets):
                buckets[b] += 1
    return float(np.max(buckets))


def goodput(raw: Mapping[str, Any], ok: Sequence[bool], slos: Mapping[str, float], duration: float) -> float:
    """vLLM's request_goodput (calculate_metrics, serve.py): successful requests that meet every SLO
    (ms; a request of one output token has TPOT 0), per second of the run."""
    good = 0
    for i, g in enumerate(ok):
        if not g:
            continue
        n_out, lat, ttft = int(raw["output_lens"][i]), float(raw["latencies"][i]), float(raw["ttfts"][i])
        value = {"ttft": ttft, "tpot": (lat - ttft) / (n_out - 1) if n_out > 1 else 0.0, "e2el": lat}
        good += all(value[k] <= ms / 1000 for k, ms in slos.items())
    return good / duration


def run_metrics(
    raw: Mapping[str, Any],
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    slos: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Every figure of one bench run, recomputed from its per-request arrays (request_goodput with SLOs)."""
    ok = success_flags(raw)
    duration = float(raw["duration"])
    if duration <= 0:
        raise ValueError("bench JSON has a non-positive duration")
    completed = sum(ok)
    total_input = sum(int(raw["input_lens"][i]) for i, g in enumerate(ok) if g)
    total_output = sum(int(x) for x in raw["output_lens"])
    ttft = [float(raw["ttfts"][i]) for i, g in enumerate(ok) if g]
    e2el = [float(raw["latencies"][i]) for i, g in enumerate(ok) if g]
    itl = [float(x) for i, g in enumerate(ok) if g for x in raw["itls"][i]]
    pct = list(percentiles)
    out: dict[str, float] = {
        "completed": completed,
        "failed": len(ok) - completed,
        "duration": duration,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
    }
    if raw.get("start_times") is not None:
        out["max_output_tokens_per_s"] = peak_output_tokens_per_s(raw, ok)
    if slos:
        out["request_goodput"] = goodput(raw, ok, slos, duration)
    out.update(describe_ms("ttft", ttft, pct))
    out.update(describe_ms("tpot", tpots(raw, ok), pct))
    out.update(describe_ms("itl", itl, pct))
    out.update(describe_ms("e2el", e2el, pct))
    return out


def warmup_mean(values: Sequence[float], drop_first: int = 1) -> float:
    """The official warm-up rule: drop the first run(s), arithmetic mean of the rest."""
    kept = list(values)[drop_first:]
    if not kept:
        raise ValueError(f"need more than {drop_first} run(s) to apply the warm-up rule")
    return math.fsum(kept) / len(kept)


def summarise_case(runs: Sequence[Mapping[str, float]], drop_first: int = 1) -> dict[str, float]:
    """Mean of SUMMARY_KEYS over the runs of one launch after dropping the warm-up run(s)."""
    return {k: warmup_mean([float(r[k]) for r in runs], drop_first) for k in SUMMARY_KEYS if all(k in r for r in runs)}


def pooled_mean(per_launch: Sequence[float]) -> float:
    """Mean of a figure over launches (each already warm-up-summarised), equal weights."""
    return math.fsum(per_launch) / len(per_launch)


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (scipy's, no continuity correction); (0, 1) for n = 0."""
    if n <= 0:
        return (0.0, 1.0)
    from scipy.stats import binomtest  # here: importing metrics stays light

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))
