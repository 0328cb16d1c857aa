"""Independent verification of a run directory: rebuild every figure from the raw rows.

This package deliberately does NOT import `kerneltrial.stats` or `kernel.summary`: it reads
the files with the csv/json modules and recomputes each figure with its own code (own
median, own quantile interpolation), following only the contract in docs/VERIFY.md. The
one thing shared by necessity is numpy's generator, because the contract defines the
bootstrap resamples as `numpy.random.default_rng(seed).integers(0, n, size=(resamples, n))`.

Checks: protocol hash in provenance/plan/summary; plan.json against protocol.toml (arms,
case ids, seeds, rounds, tie band, gate, bootstrap, L2 and the noise settings plan.json
carries); one timing row per expected
(case, seed, round, arm) and nothing else, with each case's own rounds (which only the
preregistered noise rule may raise above plan `rounds`); correctness coverage and
consistency; within each (case, seed, round) unit, positions 0..k-1 for the k timed arms,
and, when plan.json has `order_seed`, the seeded order itself; every figure in summary.json
(floats to a relative 1e-9), including the clock counts, run-to-run spreads, calibration
figures (realized slowdown of `slow:` arms too) and the warnings those must raise.
A schema-1 summary (written before clocks, per-case rounds and calibration arms existed) is
accepted without those figures only when the raw files have none of those fields either; a
schema-2 summary is accepted without the realized-slowdown figures of `slow:` arms.

A run whose plan.json has `"checks": 1` (issue 10: what is timed is what was checked) needs a
schema-4 summary and gets more checks: every timing sample has its timed check (an arm that
raised has none after), the seeded order over the arms still in each unit, the statuses
`failed while timed` and `implausible`, the `inconclusive` verdict, the new aggregates and gate
reasons, the ulp histograms, frozen_at, and the file integrity of kernel/integrity.py
(manifest, source archive, provenance, freeze). For older runs these checks are listed as not
applicable.

A run whose plan.json has `"checks": 3` (issue 24, isolated arms) needs a schema-6 summary and gets
the check `isolation bounds` (kernel/verify/isolation.py): plan `isolated` is what the protocol
names, every timing row of an isolated arm claims no more than the harness's wall bound beside it
(and no other row has one), the summary's bounds and far-inside warnings follow; isolated arms
have no host.csv rows.

A run whose plan.json has `host` (issue 16) needs a schema-5 summary: host.csv holds exactly
`host.samples` rows (samples 0..n-1, `host.calls` calls each) for every (case, arm) that passed
correctness and did not raise while timed, and nothing else; each arm entry's host_ns_per_call
(median of ns / calls), host_samples and host_behind are recomputed from them.

Any run whose ceilings.csv has `triton_launch` rows (the Triton launch floor, issue 16) gets the
check `triton launch floor`: each row has bytes 0, ns > 0 and its own sample number, and the
summary's ceilings triton_launch_floor_ns / triton_launch_samples are their median and count.
Runs without such rows (every run before it) list the check as not applicable, and their
summary must not claim a Triton floor.
Likewise `copy_matched` rows (a copy of each case's traffic) get the check `size-matched copies`:
well-formed rows, exactly one size per case's bytes (rounded down to even), and every case's
matched_copy_gbps their median GB/s.

A run whose plan.json has `floor` (issue 27) needs a schema-6 summary and gets the check
`speed-of-light floor`: plan.json names the model this code knows (rundir/layout.py
FLOOR_MODEL), every case's floor_ns is the median `triton_launch` ns + its bytes / the median
`copy` GB/s, and every arm's fraction_of_floor is that floor / its median ns per call, recomputed
from timings.csv. Older runs list the check as not applicable and must claim no floor figure.
Every kernel run gets `achieved TFLOPS` and `peak memory` (kernel/verify/throughput.py, issue 40):
where plan.json cases have `flops`, every arm's tflops is those flops / its median ns per call
recomputed from timings.csv / 1000; where plan.json has `peak_memory`, every arm's peak_bytes is the
largest timings.csv `peak_bytes` of its samples, and a row has one exactly where the run measured
it (a GPU run of CUDA events, an arm in kerneltrial's process). Without them, not applicable, and
the summary must claim no such figure.
Every kernel run also gets `required files` and `no downgrade` (kernel/schema_requirements.py:
the declared contract's files and keys are present, and no witness shows a later contract than
the one declared), `source commit` and `device` (kernel/provenance_checks.py), and `report.md`
and `ERRATA.md` (kernel/derived.py: the page is the rendering of the directory; the hand-written
errata's machine-read lines are well formed), and each figure a command added (speedup.png, ...,
size.png: drawn again and compared byte for byte where this matplotlib is the one that drew it, else
listed as not checked with both versions).

One module per check family, on one contract record per summary schema (contract.py: which
schema a run is verified under, and what each requires; the checks read it, never the schema
string; Check and VerifyResult are rundir/checks.py's, every verifier's): arithmetic.py (own median, quantiles, bootstrap),
rows.py (the raw rows read), run.py (the order of the checks), plan.py (plan against protocol,
confirmation links), timings.py (correctness coverage, timing rows, interleaving order),
timed.py (timed checks, dropped arms, file integrity), host.py, ceilings.py (ceilings, launch
floors, size-matched copies, speed-of-light floor, plausibility), figures.py (per-arm figures,
clocks), throughput.py (TFLOPS, peak memory), calibration.py, gate.py (aggregates and the gate), isolation.py.
"""

from kerneltrial.kernel.verify.contract import CHECKED_RUN_CHECKS
from kerneltrial.kernel.verify.run import check_written_after, kernel_page, member_checks, verify_run_dir

__all__ = [
    "CHECKED_RUN_CHECKS",
    "check_written_after",
    "kernel_page",
    "member_checks",
    "verify_run_dir",
]
