"""The model-level correctness gate: every arm teacher-forced on one token sequence, against
the float32 model (spec.Correctness states the rule).

The sequence is the gate's prompts followed by the tokens the float32 copy of the model
chooses greedily; every arm computes each step's logits from that same prefix
(`build.teacher_forced`), so a near-tie where two arms pick different tokens changes one
step's top-1, never the steps after it. Each correctness.jsonl row keeps the numbers the
rule reads (distance, top-1 agreement, the arm's top-1 tokens, eager's and the limits), so
verify re-derives every verdict.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from kerneltrial.model.build import OPS, Router, expected_calls, greedy, teacher_forced
from kerneltrial.model.spec import BASELINE, Correctness


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| over all the logits given."""
    return float((got.float() - want.float()).abs().max()) / max(float(want.float().abs().max()), 1e-30)


@dataclass(frozen=True)
class Oracle:
    """The float32 copy of the unpatched model (kept for the run: the timed checks compare with
    it too), its greedy tokens [prompts, steps] and their logits [prompts, steps, vocab]."""

    model: torch.nn.Module
    tokens: torch.Tensor
    logits: torch.Tensor


def oracle_of(model: torch.nn.Module, prompts: torch.Tensor, steps: int) -> Oracle:
    """Call before patching: the copy must run the model's own code."""
    exact = copy.deepcopy(model).float()
    tokens, logits = greedy(exact, prompts, steps)
    return Oracle(model=exact, tokens=tokens, logits=logits.float())


@dataclass(frozen=True)
class Reference:
    """Eager's teacher-forced logits and its own distance and agreement: the scale of the rule."""

    logits: torch.Tensor
    distance: float
    top1: float


def check_arm(
    model: torch.nn.Module,
    router: Router,
    arm: str,
    rule: Correctness,
    oracle: Oracle,
    reference: Reference | None,
    prompts: torch.Tensor,
) -> tuple[dict[str, Any], Reference]:
    """The arm's correctness row (eager's when `reference` is None), and the reference it makes."""
    router.arm = arm
    router.counts.clear()
    logits = teacher_forced(model, prompts, oracle.tokens)
    forwards = oracle.tokens.shape[1]  # one forward per step
    counts = {op: router.counts[op] // forwards for op in OPS}
    expected = expected_calls(int(model.config.num_hidden_layers), eager=(arm == BASELINE))
    chosen = logits.argmax(-1)
    distance = relative_error(logits, oracle.logits)
    top1 = float((chosen == oracle.tokens).float().mean())
    row: dict[str, Any] = {
        "arm": arm,
        "calls_per_forward": counts,
        "expected_calls_per_forward": expected,
        "oracle_rel_error": distance,
        "top1_agreement": top1,
        "top1_tokens": chosen.tolist(),
        "passed": True,
        "message": "",
    }
    problems = []
    if counts != expected or any(router.counts[op] % forwards for op in OPS):
        problems.append(
            f"routed calls per forward {counts} differ from the model's {expected}: the arm's operators did not all run"
        )
    if reference is None:
        row["float32_tokens"] = oracle.tokens.tolist()
    else:
        row |= {
            "logits_rel_diff": relative_error(logits, reference.logits),
            "oracle_rel_error_limit": rule.oracle_factor * reference.distance,
            "top1_limit": reference.top1 - rule.top1_margin,
        }
        problems += rule_problems(row, rule, reference)
    if problems:
        row["passed"] = False
        row["message"] = "; ".join(problems)
    return row, Reference(logits=logits, distance=distance, top1=top1)


def rule_problems(row: dict[str, Any], rule: Correctness, reference: Reference) -> list[str]:
    """The teacher-forced rule's named failures of one arm's row."""
    problems = []
    if row["oracle_rel_error"] > row["oracle_rel_error_limit"]:
        problems.append(
            f"teacher-forced logits are {row['oracle_rel_error']:.3g} of their max from the float32 model, more than "
            f"{rule.oracle_factor} x eager's {reference.distance:.3g}"
        )
    if row["top1_agreement"] < row["top1_limit"]:
        problems.append(
            f"top-1 agreement with the float32 model {row['top1_agreement']:.3f} is below eager's "
            f"{reference.top1:.3f} minus the margin {rule.top1_margin}"
        )
    return problems
