"""Serving trials: launch a vLLM server with fail-fast gates, run throughput cases through
`vllm bench serve`, A/B trials of server configurations, and a MATH-500 accuracy gate.

See docs/serving.md for the commands, the run-directory files and the metric formulas.
"""
