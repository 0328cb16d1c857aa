"""Build summary.json of a kernel run directory: every figure the report shows.

Reads plan.json, protocol.toml, correctness.jsonl, timings.csv, ceilings.csv and, in runs
with timed checks, timed_checks.jsonl (the contract in docs/VERIFY.md; the files in
docs/RUNDIR.md) and computes the figures with `kerneltrial.stats`. The runner calls
`write_summary(run_dir)` at the end of a run. The summary is built as the typed document
rundir/summary_doc.py reads (`Summary`) and written by its `summary_json`, in its version's shape:
the parsed inputs are kernel/summary_inputs.py, the cases, aggregates and gate
kernel/summary_cases.py, the calibration kernel/summary_calibration.py.

plan.json `checks`, `host`, `floor` and `isolated` pick the schema, one adapter each (`SchemaV3`
to `SchemaV7`, kernel/summary_schemas.py): a run without `checks` (every run before issue 10) gets `kerneltrial.summary/3`,
unchanged; `"checks": 1` or 2 gets `kerneltrial.summary/4`, with `host` (issue 16)
`kerneltrial.summary/5`, and with `floor` too (issue 27) `kerneltrial.summary/6`; `"checks": 3`
(isolated arms, issue 24; with `host` and `floor`) `kerneltrial.summary/7`, each described after
the schema-3 fields.

summary.json (schema `kerneltrial.summary/3`):
  schema, protocol_sha256, backend, is_gpu, l2, op, label (plan's timing_label if given),
  control, tie_band, bootstrap, arms (copied from plan.json), noise_rule (plan's, or null),
  ceilings: {copy_gbps, copy_samples, read_gbps, read_samples},
  clocks: {max_sm_mhz, throttle_fraction, threshold_mhz, samples_with_clock, throttled_samples},
  cases: [{case, shape, layout, dtype, bytes, calls, rounds, units_planned, injected_delay_ns,
           arms: {name: {kind, status, median_ns_per_call, n_samples, ci_units, speedup,
                         ci_low, ci_high, verdict, gbps, pct_of_copy_ceiling, throttled_samples,
                         spread, messages, reason}}}],
  aggregates: {arm: {n_cases, geomean, geomean_ci_low, geomean_ci_high, mean, worst,
                     worst_case, wins, ties, losses, failed_correctness}},
  gate: {rule, arms: {arm: {passed, reasons}}, passed_arms},
  calibration (only when an `aa:`/`slow:` arm exists): {injected_slowdown,
      max_false_positive_rate, min_power,
      arms: {arm: {kind: "aa", base, n_cases, not_tie, false_positive_rate, mean_ci_width}
                  or {kind: "slow", base, n_cases, losses, power, realized_slowdown: {case: float},
                      realized_min, realized_max, power_at_nominal}}, passed, sentence},
  warnings: [str],
  inputs_sha256: {file: sha256} of plan.json, correctness.jsonl, timings.csv, ceilings.csv
`status` is `timed`, `failed correctness`, `unavailable` or `not timed` (no correctness check
or no timing rows: an incomplete run). `ci_units` is the number of (seed, round) units shared
with the control and used by the CI. Figures that do not apply (the control's own speedup,
an untimed arm) are null. Medians are ns per call; GB/s is bytes per ns.
`rounds` is the case's `rounds` in plan.json (the preregistered noise rule may have added
rounds), else plan `rounds`. `spread` is (p90 - p10) / median of the arm's per-sample times;
`throttled_samples` counts its samples whose SM clock was below `clocks.threshold_mhz`. The
top-level clock counts are over every row of timings.csv. Schema 1 summaries (written before
clocks, per-case rounds and calibration arms existed) lack these fields; schema 2 summaries lack
the realized slowdown of `slow:` arms (`realized_slowdown`, `realized_min`, `realized_max`,
`power_at_nominal`).

Schema `kerneltrial.summary/4` (plan.json `"checks": 1`) adds, over schema 3:
  statuses `failed while timed` (a timed check of the (case, arm) failed; `messages` are the
  failing rows' messages, figures null) and `implausible` (figures kept, speedup, CI and
  verdict null, `reason` says why); verdict `inconclusive` (a CI straddling a band edge);
  exact (plan's), frozen_at (plan's; null: not frozen, and a warning says so),
  plausibility: {bandwidth_margin, launch_floor_fraction, applied, bandwidth_limit_gbps,
                 time_limit_ns},
  timed_checks: {rows, failed},
  ceilings gain launch_floor_ns, launch_samples;
  aggregates gain inconclusive, failed_while_timed, implausible (cases) and ulp_hist (the
  element-wise sum of the arm's correctness `ulp_hist` rows, null when none has one);
  gate reasons name each disqualification's count and first case;
  calibration `aa:` arms: false_positives (win or loss) and inconclusive instead of not_tie;
  inputs_sha256 also covers timed_checks.jsonl.

Schema `kerneltrial.summary/5` (plan.json `host`, host.csv) adds, over schema 4:
  host: {samples, calls, rows} (plan's samples and calls per sample; rows of host.csv),
  and in every case's arm entry host_ns_per_call (median over the arm's host.csv samples of
  ns / calls; null without rows), host_samples (its rows) and host_behind (its samples whose
  device was still busy at the end: device-bound, see trial/timing.py `host_sample`);
  inputs_sha256 also covers host.csv.

Schema `kerneltrial.summary/6` (plan.json `floor`, issue 27) adds, over schema 5:
  every case floor_ns (the speed-of-light floor: the Triton launch floor + bytes / copy_gbps,
  kernel/floor.py; null without `triton_launch` or `copy` rows) and in every arm entry
  fraction_of_floor (floor_ns / median_ns_per_call; null where either is null).

Schema `kerneltrial.summary/7` (plan.json `"checks": 3`, isolated arms, issue 24) adds, over schema 6:
  isolation: {arms (plan's `isolated`), far_inside, bounds: [{case, arm, samples,
  claimed_ns_per_call, bound_ns_per_call, ratio}]}: per timed (case, isolated arm) the median
  ns / calls the arm's worker claimed and the median wall_ns / calls the harness measured around
  the same samples (kernel/bounds.py); a warning for each claim more than `far_inside` times
  inside its bound. Isolated arms have no host.csv rows (host figures null).

Any schema (issue 40, kernel/summary_throughput.py): a plan.json case with `flops` (FLOPs per call,
ops/flops.py) gives the case `flops` and every arm entry `tflops` (flops / median ns per call /
1000; null without a median); a plan.json with `peak_memory` gives every arm entry `peak_bytes` (the
largest timings.csv `peak_bytes` of its samples; null where not measured). Neither is written
where the plan lacks it.

Any schema: when ceilings.csv has `triton_launch` rows (a one-element Triton kernel, measured
from issue 16 on, trial/floor.py), `ceilings` gains triton_launch_floor_ns (their median) and
triton_launch_samples (their count); summaries of runs without such rows have neither key.
Likewise `copy_matched` rows (a copy of each case's traffic, trial/runner.py `run_ceilings`) give
every case matched_copy_gbps: the median GB/s of the copy of its bytes (rounded down to even).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from kerneltrial import stats
from kerneltrial.kernel.summary_calibration import calibration
from kerneltrial.kernel.summary_cases import CaseInputs, aggregates_and_gate, case_summary
from kerneltrial.kernel.summary_inputs import (
    RunFiles,
    control_arm,
    correctness_by_case_arm,
    load_run,
    matched_copies,
    timing_label,
    unit_series,
)
from kerneltrial.kernel.summary_schemas import SchemaV3, schema_of
from kerneltrial.kernel.summary_throughput import peaks_of
from kerneltrial.rundir.documents import Bootstrap
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import write_json
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import PLAN, SUMMARY, TRITON_LAUNCH
from kerneltrial.rundir.summary_doc import Ceilings, Clocks, Summary, summary_json


def _ceiling(frame: pd.DataFrame, kind: str) -> tuple[float | None, int]:
    rows = frame[frame["kind"] == kind]
    return stats.ceiling_gbps(rows["bytes"].to_numpy(), rows["ns"].to_numpy()), len(rows)


def _ceilings(frame: pd.DataFrame, schema: SchemaV3) -> Ceilings:
    """The run's ceilings; the Triton launch floor's figures are unset (not written) for a run from
    before it was measured."""
    copy_gbps, copy_n = _ceiling(frame, "copy")
    read_gbps, read_n = _ceiling(frame, "read")
    launches = frame[frame["kind"] == TRITON_LAUNCH]["ns"].to_numpy(dtype=float)
    triton = {"triton_launch_floor_ns": stats.launch_floor(launches), "triton_launch_samples": len(launches)}
    launch_ns, launch_n = schema.launch_ceiling()
    return Ceilings(
        copy_gbps=copy_gbps,
        copy_samples=copy_n,
        read_gbps=read_gbps,
        read_samples=read_n,
        **({"launch_floor_ns": launch_ns, "launch_samples": launch_n} if launch_n is not None else {}),
        **(triton if len(launches) else {}),
    )


def _clock_figures(plan: dict[str, Any], timings: pd.DataFrame, warnings: list[str]) -> tuple[Clocks, pd.Series]:
    """Top-level `clocks` figures and a per-row throttled flag (over every row of timings.csv)."""
    clocks = plan.get("clocks") or {}
    max_sm = clocks.get("max_sm_mhz")
    fraction = float(clocks.get("throttle_fraction", 0.9))
    threshold = stats.throttle_threshold(max_sm, fraction)
    sm = timings["sm_mhz"]
    flags = pd.Series(
        [stats.is_throttled(None if pd.isna(v) else float(v), threshold) for v in sm], index=timings.index, dtype=bool
    )
    figures = Clocks(
        max_sm_mhz=max_sm,
        throttle_fraction=fraction,
        threshold_mhz=threshold,
        samples_with_clock=int(sm.notna().sum()),
        throttled_samples=int(flags.sum()),
    )
    if figures.throttled_samples:
        warnings.append(
            f"{figures.throttled_samples} of {len(timings)} timing samples were throttled: SM clock "
            f"below {threshold:g} MHz ({fraction:g} x max {max_sm} MHz); their times may be slow"
        )
    return figures, flags


def _case_inputs(
    run: RunFiles, schema: SchemaV3, rule: stats.BootstrapRule, copy_gbps: float | None, warnings: list[str]
) -> tuple[CaseInputs, Clocks]:
    """What the cases' figures are computed from, and the run's clock figures (whose warning comes first)."""
    clocks, flags = _clock_figures(run.plan, run.timings, warnings)
    throttled = run.timings.assign(throttled=flags).groupby(["case", "arm"], sort=False)["throttled"].sum()
    inputs = CaseInputs(
        plan=run.plan,
        series=unit_series(run.timings),
        throttled={(str(case), str(arm)): int(n) for (case, arm), n in throttled.items()},
        checks=correctness_by_case_arm(run.correctness),
        control=control_arm(run.plan),
        copy_ceiling=copy_gbps,
        matched=matched_copies(run.ceilings),
        rule=rule,
        schema=schema,
        warnings=warnings,
        peaks=peaks_of(run.plan, run.timings),
    )
    return inputs, clocks


def _load(run_dir: Path) -> RunFiles:
    run = load_run(run_dir)
    recorded = run.plan.get("protocol_sha256")
    if recorded != run.protocol_sha256:
        raise RunDirError(
            f"{run_dir}: plan.json protocol_sha256 {recorded!r} does not match "
            f"protocol.toml ({run.protocol_sha256}); the protocol was changed after the run started"
        )
    return run


def build_document(run_dir: Path) -> Summary:
    """Compute every figure of a kernel run directory as the typed summary (does not write anything)."""
    run_dir = Path(run_dir)
    run = _load(run_dir)
    plan = run.plan
    control = control_arm(plan)
    bootstrap = plan["bootstrap"]
    rule = stats.BootstrapRule(int(bootstrap["resamples"]), int(bootstrap["seed"]), float(bootstrap["confidence"]))
    warnings: list[str] = []
    label = plan.get("timing_label") or timing_label(plan["backend"], bool(plan["is_gpu"]))
    if not plan["is_gpu"]:
        warnings.append(f"{label}; do not quote these figures as GPU timings")
    copy_gbps, read_gbps = _ceiling(run.ceilings, "copy")[0], _ceiling(run.ceilings, "read")[0]
    if copy_gbps is None:
        warnings.append("ceilings.csv has no copy samples; % of copy ceiling is not available")
    schema = schema_of(run, copy_gbps, read_gbps)
    inputs, clocks = _case_inputs(run, schema, rule, copy_gbps, warnings)
    cases = [case_summary(inputs, case) for case in plan["cases"]]
    aggregates, gate = aggregates_and_gate(cases, plan, control, rule, schema)
    found = calibration(plan, cases, control, schema, warnings)
    contract = schema.contract(warnings)
    isolation = schema.isolation(warnings)  # its warnings after the contract's
    try:
        return Summary(
            schema=schema.schema,
            protocol_sha256=run.protocol_sha256,
            backend=plan["backend"],
            is_gpu=bool(plan["is_gpu"]),
            l2=plan.get("l2"),
            op=plan.get("op"),
            label=label,
            control=control,
            tie_band=plan["tie_band"],
            bootstrap=Bootstrap(resamples=rule.resamples, seed=rule.seed, confidence=rule.confidence),
            arms=plan["arms"],
            noise_rule=plan.get("noise_rule"),
            ceilings=_ceilings(run.ceilings, schema),
            clocks=clocks,
            cases=cases,
            aggregates=aggregates,
            gate=gate,
            exact=contract.exact,
            frozen_at=contract.frozen_at,
            plausibility=contract.plausibility,
            timed_checks=contract.timed_checks,
            host=schema.host_counts(),
            isolation=isolation,
            warnings=warnings,
            inputs_sha256={name: sha256_file(run_dir / name) for name in schema.input_files},
            **({"calibration": found} if found is not None else {}),
        )
    except ValidationError as error:
        raise RunDirError(
            f"{run_dir / PLAN}: not a kernel run's plan ({error.error_count()} problem(s)): {error}"
        ) from error


def build_summary(run_dir: Path) -> dict[str, Any]:
    """summary.json's document of a kernel run directory: `build_document` in its version's shape."""
    return summary_json(build_document(run_dir))


def write_summary(run_dir: Path, overwrite: bool = False) -> Path:
    """Write `run_dir/summary.json` and return its path. Refuses to replace one unless `overwrite`."""
    run_dir = Path(run_dir)
    path = run_dir / SUMMARY
    if path.exists() and not overwrite:
        raise RunDirError(f"{path} already exists; a finished run directory is not overwritten (pass overwrite=True)")
    write_json(path, build_summary(run_dir))
    return path
