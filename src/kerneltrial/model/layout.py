"""The files of a model-trial run directory beside the shared ones (rundir/layout.py), and
their columns: written by model/runner.py, read by model/summary.py and model/verify.py."""

from __future__ import annotations

KERNELS = "kernels.csv"  # on a GPU: the kernels each routed region launched in the profiled call
PROFILES = "profiles"  # the profiler's table of each attributed call
INPUTS = "inputs.csv"  # schema 3: every call's fresh inputs (seed, position, digest of the ids)
CAPTURES = "captures.jsonl"  # schema 3: graph mode, one row per (case, arm) capture
COPIES = "copies.csv"  # schema 3: the copy rate the weight-read floor uses
TIMED_CHECKS = "timed_checks.jsonl"  # schema 3: the check of one call of every round and arm

TIMING_COLUMNS = ["case", "round", "position", "arm", "calls", "ns", "start_ns"]  # start_ns: since the first sample
ATTRIBUTION_COLUMNS = ["case", "arm", "region", "ns", "calls"]
KERNEL_COLUMNS = ["case", "arm", "region", "kernel", "ns", "count"]
INPUT_COLUMNS = ["case", "round", "call", "seed", "position", "ids_sha256"]  # position: -1 for prefill
COPY_COLUMNS = ["sample", "bytes", "ns"]  # bytes: read + written

TIMING_LABEL_GPU = "host clock between device synchronisations: what a caller waits for (host and GPU)"
TIMING_LABEL_CPU = "host clock, Triton interpreter on a CPU: NOT GPU performance"
GRAPH_CUDA = "CUDA graph per case and arm, replayed"
GRAPH_IDENTITY = "CPU stand-in for a CUDA graph (the Python call replayed): NOT a CUDA graph"
