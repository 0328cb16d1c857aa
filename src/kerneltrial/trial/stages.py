"""Two stages of a kernel run (trial/runner.py): the ceilings (stage 2: copy and read bandwidth,
the launch floors, a copy of each case's traffic; ceilings.csv) and the host cost (stage 5: host
time per call of every arm timed to the end of its case; host.csv). Rows on disk are kept (resume)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kerneltrial.kernel.summary_inputs import CEILING_COLUMNS, HOST_COLUMNS  # the columns the summary reads
from kerneltrial.ops.registry import Case, Impl, Operator
from kerneltrial.rundir.files import csv_appender, read_csv, read_jsonl
from kerneltrial.rundir.layout import COPY_MATCHED, TRITON_LAUNCH, RunDir
from kerneltrial.trial import gate, timed
from kerneltrial.trial.calibration import Delay
from kerneltrial.trial.floor import triton_launch
from kerneltrial.trial.timing import Timer, host_sample

CEILING_SAMPLES = 10


def run_ceilings(run: RunDir, timer: Timer, device: torch.device, traffic: Sequence[int] = ()) -> None:
    """Copy and read-only stream bandwidth on this device, and two launch floors, CEILING_SAMPLES
    samples each: `launch` (torch's add of 0 to one element; plausibility judges against it) and
    `triton_launch` (a one-element Triton kernel: what an entry point's launch costs at least).
    Then `copy_matched`: a copy of each case's traffic (`traffic`, bytes moved per call; an odd
    count rounded down to even), timed the same way as the cases: a copy of a few MB reaches a
    fraction of the 1 GiB copy's rate (results/h200-midsize: 18% at 4 MB under a cold L2), so a
    case's bandwidth is also judged against the copy of its own bytes."""
    have = {(r["kind"], int(r["sample"]), int(r["bytes"])) for r in read_csv(run.ceilings)}
    nbytes = (1 << 30) if device.type == "cuda" else (16 << 20)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    one = torch.zeros(1, device=device)
    streams = {
        "copy": (lambda: dst.copy_(src), 2 * nbytes),
        "read": (lambda: src.sum(), nbytes),
        "launch": (lambda: one.add_(0), 0),
        TRITON_LAUNCH: (lambda: triton_launch(one), 0),
    }
    with csv_appender(run.ceilings, CEILING_COLUMNS) as append:
        for kind, (call, moved) in streams.items():
            _ceiling_samples(append, have, timer, kind, call, moved)
        for moved in sorted({b - b % 2 for b in traffic if b >= 2}):
            half = torch.empty(moved // 2, dtype=torch.uint8, device=device)
            out = torch.empty_like(half)
            _ceiling_samples(append, have, timer, COPY_MATCHED, lambda h=half, o=out: o.copy_(h), moved)


def _ceiling_samples(
    append: Callable[[list[object]], None],
    have: set[tuple[str, int, int]],
    timer: Timer,
    kind: str,
    call: Callable[[], object],
    moved: int,
) -> None:
    """CEILING_SAMPLES samples of one call of `call`, those not already in ceilings.csv."""
    call()
    for sample in range(CEILING_SAMPLES):
        if (kind, sample, moved) not in have:
            append([kind, sample, moved, timer.sample(call, 1)])
    timer.release()  # a captured graph belongs to this stream only


def run_host(
    run: RunDir,
    op: Operator,
    plan: dict[str, Any],
    cases: list[Case],
    timed_arms: dict[str, list[Impl]],
    seed: int,
    warmup: int,
    device: torch.device,
    delay: Delay,
    progress: Any,
) -> None:
    """Host time per call of every arm timed to the end of its case (an arm that raised while
    timed is not called again): plan.json `host` samples of `host.calls` calls each, on inputs
    of the first seed, after `warmup` untimed calls. Rows on disk are kept (resume)."""
    samples, calls = int(plan["host"]["samples"]), int(plan["host"]["calls"])
    done = {(r["case"], r["arm"], int(r["sample"])) for r in read_csv(run.host)}
    raised = {(r["case"], r["arm"]) for r in read_jsonl(run.timed_checks) if r["message"].startswith(timed.RAISED)}
    planned = {c["case"]: c for c in plan["cases"]}
    specs = {c.id: c for c in cases}
    # the host cost of an arm in a worker would be its own clock's claim: not measured
    isolated = set(plan.get("isolated", []))
    todo = [
        (case_id, impl)
        for case_id, arms in timed_arms.items()
        for impl in arms
        if (case_id, impl.name) not in raised
        and impl.name not in isolated
        and any((case_id, impl.name, s) not in done for s in range(samples))
    ]
    task = progress.add_task("host cost", total=len(todo))
    with csv_appender(run.host, HOST_COLUMNS) as append:
        for case_id, impl in todo:
            delay.ns = planned[case_id].get("delay_spin_ns", planned[case_id].get("injected_delay_ns", 0.0))
            # a timed call, as in the rounds: the inputs' version counters are bumped before each
            # call, so a cache keyed on (pointer, version) cannot skip work here either
            arm = timed.TimedArm.make(impl, op.make_inputs(specs[case_id], seed, device))
            for _ in range(warmup):
                arm.call()
            for sample in range(samples):
                if (case_id, impl.name, sample) not in done:
                    ns, behind = host_sample(arm.call, calls, bool(plan["is_gpu"]))
                    append([case_id, impl.name, sample, calls, ns, int(behind)])
            gate.settle(device)  # before the next arm's inputs are allocated
            progress.advance(task)
