"""The `--json` documents of `check`, `run`, `verify`, `compare` (kernel or serving runs) and `suite`: one per command.

Each is printed alone on stdout (human output goes to stderr) and names itself in `schema`
("kerneltrial.<command>-result/<version>"); a change that breaks a reader bumps the version.
Exit codes are those of the plain command. These are the CLI's contract with scripts, kept
apart from the library's internal types so that those can change without breaking readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DrawnInputs:
    """What a check's checked call ran on (trial/gate.py `Drawn`)."""

    offsets: dict[str, int]  # storage offset of each input tensor, bytes
    scalars: dict[str, float]  # eps, cap, ...
    nonfinite: int  # NaN and +-Inf input elements
    absmax: float  # the largest finite |input|
    other_offset: int | None  # the repeated call's storage offset, bytes
    extra: list[str]  # the extra shapes checked


@dataclass(frozen=True)
class CheckedCall:
    """One correctness check (as in correctness.jsonl, with the operator)."""

    op: str
    case: str
    seed: int
    arm: str
    passed: bool
    max_abs: float
    max_rel: float
    ulp: float
    message: str
    ulp_hist: list[int]
    inputs_seed: int | None  # the inputs seed of the command (ops/inputs.py)
    drawn: DrawnInputs | None


def checked_call(op: str, row: dict[str, Any]) -> CheckedCall:
    """A correctness.jsonl row of `op` (trial/gate.py `CheckResult.row`) as a CheckedCall."""
    drawn = row.get("drawn")
    return CheckedCall(op=op, **{**row, "drawn": DrawnInputs(**drawn) if drawn else None})


@dataclass(frozen=True)
class CheckResult:
    schema: str = field(default="kerneltrial.check-result/1", init=False)
    device: str
    interpreted: bool  # Triton interpreter on the CPU
    inputs_seed: int  # every check's inputs were drawn from it (check --inputs-seed reproduces them)
    passed: int
    failed: int
    failing_arms: list[str]  # "op/arm" of every arm with a failed check
    checks: list[CheckedCall]
    skipped: list[str]  # "op/arm: reason" for arms unavailable here


@dataclass(frozen=True)
class ArmVerdict:
    arm: str
    passed: bool
    reasons: list[str]


@dataclass(frozen=True)
class UnavailableArm:
    arm: str
    reason: str


@dataclass(frozen=True)
class RunResult:
    schema: str = field(default="kerneltrial.run-result/1", init=False)
    run_dir: str
    timing: str  # what the times are (GPU events, or the interpreter on a host clock)
    gate_rule: str
    passed_arms: list[str]
    arms: list[ArmVerdict]
    unavailable_arms: list[UnavailableArm]


@dataclass(frozen=True)
class VerifyCheck:
    name: str
    ok: bool
    applicable: bool  # False: the run is too old to have what this check needs
    detail: str


@dataclass(frozen=True)
class VerifiedRun:
    run_dir: str
    ok: bool
    checks: list[VerifyCheck]


@dataclass(frozen=True)
class VerifyResult:
    schema: str = field(default="kerneltrial.verify-result/1", init=False)
    ok: bool
    runs: list[VerifiedRun]


@dataclass(frozen=True)
class Speedup:
    value: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class ComparedArm:
    case: str
    arm: str
    median_a_ns: float | None
    median_b_ns: float | None
    ratio_b_over_a: float | None
    speedup_a: Speedup | None  # over run A's control, with its CI
    speedup_b: Speedup | None
    verdict_a: str
    verdict_b: str
    change: Change | None  # B against A from both runs' samples; null where either did not time it


@dataclass(frozen=True)
class Change:
    """B's speedup over A (median(A) / median(B)), its unpaired bootstrap interval, and the call:
    FAST, SLOW, SAME or UNSURE."""

    speedup: float
    ci_low: float
    ci_high: float
    call: str


@dataclass(frozen=True)
class CompareResult:
    schema: str = field(default="kerneltrial.compare-result/2", init=False)
    run_a: str
    run_b: str
    timing_a: str
    timing_b: str
    notes: list[str]
    rows: list[ComparedArm]
    only_in_a: list[str]
    only_in_b: list[str]
    changes: dict[str, int]  # how many (case, arm) pairs of each call
    noise_rule: str  # what called them, in words


@dataclass(frozen=True)
class LaunchInterval:
    """Mean over launches and its 95% Student-t interval across them (None below two launches)."""

    mean: float
    low: float | None
    high: float | None
    launches: int


@dataclass(frozen=True)
class ComparedServingCase:
    arm: str
    case: str
    status_a: str
    status_b: str
    total_token_throughput_a: LaunchInterval | None
    total_token_throughput_b: LaunchInterval | None
    throughput_ratio_b_over_a: float | None
    mean_ttft_ms_a: LaunchInterval | None
    mean_ttft_ms_b: LaunchInterval | None
    ttft_ratio_b_over_a: float | None


@dataclass(frozen=True)
class ServingCompareResult:
    """`compare` on two serving run directories."""

    schema: str = field(default="kerneltrial.serving-compare-result/1", init=False)
    run_a: str
    run_b: str
    notes: list[str]
    rows: list[ComparedServingCase]
    only_in_a: list[str]
    only_in_b: list[str]


@dataclass(frozen=True)
class SuiteRunStatus:
    protocol: str
    run_dir: str
    status: str  # finished, failed (or pending / running in a suite that stopped)
    exit_code: int | None


@dataclass(frozen=True)
class SuiteResult:
    schema: str = field(default="kerneltrial.suite-result/1", init=False)
    suite_dir: str
    name: str
    tag: str
    complete: bool  # every protocol ran to a summary (whatever its gate)
    runs: list[SuiteRunStatus]
