"""The organisers' benchmark client (issue 36, item 7): `--client official`.

The upstream throughput script of vllm-plugin-FL, `benchmarks/benchmark_throughput_serve.py`
(flagos-ai/vllm-plugin-FL, vendored byte-exact at ../shared/vendor/flagos-benchmarks/; the Track 2
brief quotes its conventions), runs each case (input_len, output_len, concurrency, num_prompts)
RUNS = 4 times as

    vllm bench serve --backend vllm --model MODEL --endpoint /v1/completions --host localhost
        --port 8000 --dataset-name random --ignore-eos --random-input-len I --random-output-len O
        --max-concurrency C --num-prompts N

(no --seed: every run uses the client's default seed 0), marks a run SUCCESS when its successful
requests equal num_prompts, else FAILED, appends it to `raw_runs_<timestamp>.csv`, drops the first
SKIP_FIRST runs, and appends the mean of the rest to `summary_<timestamp>.csv` unless a counted run
FAILED. `bench.official_argv` is that argv with the site's model id, host and port (MODEL, localhost and
8000 are the values the script's header says to adjust). kerneltrial appends `--tokenizer` when the
model id is not the tokenizer's path (the script's MODEL is both) and its recording options
(bench.recording), which change what the client saves and prints, not the requests it sends.
tests/serving/test_official_client.py parses the vendored script and compares the argv, the
constants, the case table and the CSV columns with these; serving/script_csv.py writes the CSVs.
"""

from __future__ import annotations

SCRIPT = "vllm-plugin-FL benchmarks/benchmark_throughput_serve.py"
RUNS = 4  # total runs of each case
SKIP_FIRST = 1  # runs dropped before the mean (the warm-up)
BACKEND, ENDPOINT = "vllm", "/v1/completions"
SUCCESS, FAILED = "SUCCESS", "FAILED"  # a run's "Run Status" in raw_runs_<timestamp>.csv
# (random_input_len, random_output_len, max_concurrency, num_prompts): DEFAULT_TEST_CASES, and the
# six more of ALL_TEST_CASES (--enable-all)
DEFAULT_CASES: tuple[tuple[int, int, int, int], ...] = (
    (1024, 1024, 64, 256),
    (4096, 1024, 64, 256),
    (16384, 1024, 64, 256),
    (65536, 1024, 64, 256),
)
ALL_CASES: tuple[tuple[int, int, int, int], ...] = (
    *DEFAULT_CASES,
    (4096, 1024, 1, 256),
    (4096, 1024, 4, 256),
    (4096, 1024, 16, 256),
    (4096, 1024, 256, 256),
    (131072, 1024, 64, 64),
    (262144, 1024, 64, 64),
)
CASE_COLUMNS = ("Prefill", "Decode", "Conc", "Num Prompts")
METRIC_COLUMNS = (
    "Benchmark Duration (s)",
    "Total Input Tokens",
    "Total Output Tokens",
    "Req/s",
    "Output tok/s",
    "Peak Output tok/s",
    "Total tok/s",
    "Mean TTFT (ms)",
    "Median TTFT (ms)",
    "P99 TTFT (ms)",
    "Mean TPOT (ms)",
    "Median TPOT (ms)",
    "P99 TPOT (ms)",
    "Mean ITL (ms)",
    "Median ITL (ms)",
    "P99 ITL (ms)",
)
RAW_COLUMNS = (*CASE_COLUMNS, "Successful Requests", "Run Status", *METRIC_COLUMNS)
SUMMARY_COLUMNS = (*CASE_COLUMNS, *METRIC_COLUMNS)
