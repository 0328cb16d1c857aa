"""The calibration's pilot (issue 36 item 4): its first PILOT_ROUNDS rounds decide, before the rest
of its launches are spent, whether the set-up can be calibrated for trials of the protocol's rounds.

`serve calibrate` runs L rounds of the A/A protocol (serving/calibration.py). When L exceeds
PILOT_ROUNDS, after the pilot's rounds (two A B / B A blocks) every case's noise, the sd of the
per-round log ratios of total tok/s and mean TTFT, is taken from the runs so far, and the launches
a trial needs are computed at the *lower* NOISE_LEVEL confidence bound of that noise (chi-square,
PILOT_ROUNDS - 1 degrees of freedom): the fewest launches that even the most favourable noise the
pilot allows would need. When that number exceeds the trial's rounds the calibration stops there
(its run FAILED, calibration.json not passed): the message and the decision use that one number.
`pilot_reason` is a function of runs.jsonl alone, so verify recomputes the decision
(serving/calibration_evidence.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from scipy import stats

from kerneltrial.serving import metrics
from kerneltrial.serving.acceptance import MIN_ROUNDS
from kerneltrial.serving.calibration import ARM_A, ARM_A_PRIME, NOISE_LEVEL, launches_needed
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.protocol import Protocol
from kerneltrial.serving.summary import acceptance_rule

PILOT_ROUNDS = 4  # rounds of the pilot: two A B / B A blocks, 3 degrees of freedom for the noise


class PilotStop(RuntimeError):
    """The pilot showed the calibration cannot pass; the message says why and the number."""


def _launch_figures(rows: Sequence[Mapping[str, Any]], repeats: int) -> dict[int, tuple[float, float]] | None:
    """{launch: (total tok/s, mean TTFT ms)} of one arm and case, as the summary computes them (the
    warm-up run dropped); None unless every launch has all its runs, ok."""
    launches: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        launches.setdefault(int(r["launch"]), []).append(r)
    out = {}
    for launch, runs in launches.items():
        if len(runs) != repeats or any(r.get("status") != "ok" for r in runs):
            return None
        s = metrics.summarise_case(sorted(runs, key=lambda r: r["run"]), drop_first=1)
        if "total_token_throughput" not in s or "mean_ttft_ms" not in s:
            return None
        out[launch] = (s["total_token_throughput"], s["mean_ttft_ms"])
    return out


def _sd(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def pilot_reason(proto: Protocol, rows: Sequence[Mapping[str, Any]], trial_rounds: int) -> str | None:
    """Why the calibration stops after its pilot (None: it goes on, or has no pilot, or the pilot's
    launches are not all in `rows` yet). `proto` is the calibration protocol (arms A and A-prime)."""
    if proto.rounds <= PILOT_ROUNDS:
        return None
    round_of = {x.launch: x.round for x in planned_launches(proto.arms, proto.rounds, proto.seed)}
    rule = acceptance_rule(proto)
    factor = math.sqrt((PILOT_ROUNDS - 1) / float(stats.chi2.ppf(NOISE_LEVEL, PILOT_ROUNDS - 1)))
    for case in proto.bench.cases:
        figures = []
        for arm in (ARM_A, ARM_A_PRIME):
            mine = [r for r in rows if r.get("arm") == arm and r.get("case") == case.id]
            pilot = [r for r in mine if round_of.get(int(r["launch"]), PILOT_ROUNDS) < PILOT_ROUNDS]
            per_launch = _launch_figures(pilot, proto.repeats)
            if per_launch is None or len(per_launch) < PILOT_ROUNDS:
                return None  # the pilot is not complete (or failed: the run says so itself)
            figures.append({round_of[launch]: f for launch, f in per_launch.items()})
        a, b = figures
        gain = [math.log(b[r][0] / a[r][0]) for r in range(PILOT_ROUNDS)]
        ttft = [math.log(b[r][1] / a[r][1]) for r in range(PILOT_ROUNDS)]
        need = launches_needed(_sd(gain) * factor, _sd(ttft) * factor, rule)
        if need is not None and need > max(trial_rounds, MIN_ROUNDS):
            return (
                f"{case.id}: the pilot's {PILOT_ROUNDS} rounds give a trial at least {need} launches per arm to "
                f"need (the lower {NOISE_LEVEL:.0%} confidence bound of their noise: per-round log-ratio sd "
                f"{_sd(gain):.2%} of tok/s and {_sd(ttft):.2%} of TTFT), more than the protocol's {trial_rounds} "
                f"rounds: the calibration stopped after its pilot, {PILOT_ROUNDS} of {proto.rounds} launches per "
                f"arm; set rounds >= {need} in the protocol and calibrate again"
            )
    return None
