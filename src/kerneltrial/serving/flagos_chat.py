"""A fork's chat benchmark client (issue 26, renamed in issue 36): `--client flagos-chat`.

Not the organisers' script (that one is `--client official`, serving/official.py): the chat script
`benchmarks/benchmark_throughput_flagos.py` of the fork xin2an/vllm-plugin-FL (the snapshot in
../shared/vendor/vllm-plugin-FL; its README says to edit SERVED_MODEL_NAME and the tokenizer) runs,
for each scenario (name, input_len, output_len, concurrency), NUM_RUNS = 4 times:

    vllm bench serve --host HOST --port PORT --backend openai-chat --model SERVED_MODEL_NAME
        --tokenizer TOKENIZER --dataset-name random --endpoint /v1/chat/completions --ignore-eos
        --trust-remote-code --random-input-len I --random-output-len O --num-prompts C
        --max-concurrency C

(no --seed: every run uses the client's default seed 0). `bench.flagos_chat_argv` is that argv with the
site's host, port, model id and tokenizer, and `--num-prompts` from the case (the script's
scenarios set it to the concurrency); kerneltrial appends its recording options (bench.recording).
tests/serving/test_official_client.py parses the vendored fork script and compares.
"""

from __future__ import annotations

SCRIPT = "xin2an/vllm-plugin-FL (a fork) benchmarks/benchmark_throughput_flagos.py"
SCRIPT_RUNS = 4  # NUM_RUNS: runs per scenario (benchmark_throughput_flagos_statistics.py drops the first)
BACKEND, ENDPOINT = "openai-chat", "/v1/chat/completions"
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
