"""The organisers' benchmark client, reproduced (issue 26): `--client official`.

The official FlagOS throughput script, vllm-plugin-FL `benchmarks/benchmark_throughput_flagos.py`
(the snapshot this project tests against; its README says to edit SERVED_MODEL_NAME and the
tokenizer), runs for each scenario (name, input_len, output_len, concurrency), NUM_RUNS = 4 times:

    vllm bench serve --host HOST --port PORT --backend openai-chat --model SERVED_MODEL_NAME
        --tokenizer TOKENIZER --dataset-name random --endpoint /v1/chat/completions --ignore-eos
        --trust-remote-code --random-input-len I --random-output-len O --num-prompts C
        --max-concurrency C

(no --seed: every run uses the client's default seed 0). `bench.official_argv` is that argv with
the site's host, port, model id and tokenizer, and `--num-prompts` from the case (the script's
scenarios set it to the concurrency). kerneltrial appends `bench.recording` options, which change
what the client saves and prints, not the requests it sends: the per-request JSON
(`--save-result --save-detailed`, where), the percentiles it computes, no progress bar; and, for
a launched server, `--served-model-name NONCE` (the model name in each request: only that
launch's server answers to it; serving/launcher.py). tests/serving/test_official_client.py
parses the vendored script and compares.

Two case sets are built in, each labelled: `seed`, the Track 2 seed's cases (kerneltrial's
MiniCPM5-2B reference cases, protocols/serving/minicpm5-2b-t2.toml), and `script`, the script's
SCENARIOS with --num-prompts = concurrency as it sends them.
"""

from __future__ import annotations

from kerneltrial.serving.bench import Case

SCRIPT = "vllm-plugin-FL benchmarks/benchmark_throughput_flagos.py"
SCRIPT_RUNS = 4  # NUM_RUNS: runs per scenario (benchmark_throughput_flagos_statistics.py drops the first)
# SCENARIOS of the script: (name, input_len, output_len, concurrency)
SCRIPT_SCENARIOS: tuple[tuple[str, int, int, int], ...] = (
    ("p128d128", 128, 128, 100),
    ("p6144d128", 6144, 128, 100),
    ("p30720d128", 30720, 128, 100),
    ("p128d6144", 128, 6144, 100),
    ("p6144d6144", 6144, 6144, 100),
    ("p30720d6144", 30720, 6144, 100),
    ("p4096d2048", 4096, 2048, 64),
    ("p6144d1024", 6144, 1024, 100),
    ("p4096d1024", 4096, 1024, 100),
    ("p2048d1024", 2048, 1024, 100),
    ("p1024d1024", 1024, 1024, 100),
)
SEED_CASES = ((4096, 1024, 64, 256), (16384, 1024, 64, 128))
CASE_SETS: dict[str, tuple[Case, ...]] = {
    "seed": tuple(Case(*c, label=f"seed {i + 1}") for i, c in enumerate(SEED_CASES)),
    "script": tuple(Case(i, o, c, c, label=f"script {name}") for name, i, o, c in SCRIPT_SCENARIOS),
}
