"""The warnings that say a run's verdict rests on less than the whole isolation (issue 35, item 4):
a `user:` arm left in kerneltrial's process, isolated arms without a piece of the sandbox, and an
isolated arm's claim far inside the harness's wall bound; and the reason an isolated arm's claim
below the harness's floor is implausible. The summary writes them (kernel/bounds.py),
verify recomputes them from plan.json and timings.csv, and report.md, `performance` and `compare`
show every warning that starts with one of `PREFIXES`."""

from __future__ import annotations

from typing import Any

from kerneltrial.rundir.documents import FloorRule

IN_PROCESS = "not isolated: "
SANDBOX = "partial sandbox: "
PREFIXES = (IN_PROCESS, SANDBOX)

# A claim below 1/FAR_INSIDE of the harness's bound is warned about: most of what the harness saw is
# then outside the arm's figure. A convention; what honest arms read (docs/NOTES.md, "Isolation"):
# on a loaded 2-core CPU machine, interpreted Triton kernels (tens of ms per call) 1.01-1.04x, torch
# arms of ~80 us per call 2.9-23x (the round trip and the copies of the outputs dominate); on a GPU
# the round trip alone (tens of microseconds) puts every short kernel far inside.
FAR_INSIDE = 2.0


def far_inside_warning(case: str, arm: str, claimed: float, bound: float) -> str:
    return (
        f"case {case}: isolated arm {arm} claims {claimed / 1e3:.4g} us per call, {bound / claimed:.1f}x inside "
        f"the harness's wall bound of {bound / 1e3:.4g} us: the figure rests on the arm's own clock"
    )


# The floor of one sample of an isolated arm (kernel/bounds.py) is (1 - tie_band - WALL_SLACK) x its
# wall clock less the case's round trip: the median of the case's reference round trips plus
# ROUNDTRIP_SPREADS median absolute deviations, so that no single sample (a stall of the reference,
# planted or not) sets it. An honest arm's sample costs more beside its calls than the reference's,
# more the longer its calls and the busier the host (wake-ups of the harness and of the worker, the
# copies between calls): on a 2-core machine (docs/NOTES.md, session 19) an honest arm of ~4 ms per
# call (tests/fixtures/slow_rmsnorm.py, 8 calls, 30-50 ms per sample) left 0.6-1.2 ms of each idle
# sample outside its clock where the reference left 0.2-0.5 ms (its round trip with the spreads:
# 0.6-0.8 ms), so the tie band alone (2%: 0.6 ms) left no margin; under two busy loops, 2 or 3 of its 6
# samples left 2.6-8.5 ms (7-21% of their wall clock). WALL_SLACK covers the first and most of the
# second; the planted shaves_its_clock (55% reported) stays far below. An arm is implausible when its
# median claim per call, the published figure, is below its median floor per call and at least
# MIN_UNDER of its samples (all, with fewer) claim less than their own floor (`implausibly_under`). One
# sample stalled outside the arm's clock raises that sample's floor alone: with two samples that was
# enough to call an honest interpreted arm implausible (1 of 2 under). Requiring half of the samples
# instead was tried and dropped (session 19's review): an arm that shaves one sample fewer than half
# to nothing and claims the rest just above their floors moved its median to 75% of its honest one,
# unseen. So on the host clock an arm may shave up to the tie band, WALL_SLACK and the round trip,
# and move its median by one sample's rank (shaving one sample), undetected (docs/CHECKS.md).
WALL_SLACK = 0.10
ROUNDTRIP_SPREADS = 3.0
MIN_UNDER = 2


# plan.json `floor_rule`: verify refuses a run that records another rule than its own (`floor_rule_problems`)
FLOOR_RULE = FloorRule(wall_slack=WALL_SLACK, roundtrip_spreads=ROUNDTRIP_SPREADS, min_under=MIN_UNDER)


def floor_rule_problems(plan: dict[str, Any]) -> list[str]:
    """plan.json `floor_rule` against FLOOR_RULE (none where the plan has no such key: an older run,
    which `no downgrade` tells from a deletion)."""
    if "floor_rule" not in plan or plan["floor_rule"] == FLOOR_RULE.model_dump():
        return []
    return [
        f"plan.json floor_rule {plan['floor_rule']!r} is not this kerneltrial's {FLOOR_RULE.model_dump()}: the floors and "
        "implausible verdicts are recomputed under this rule only; verify the run with the kerneltrial of its commit"
    ]


def floor_share(tie_band: float) -> float:
    """The share of an isolated sample's wall clock under its floor, before the round trip."""
    return 1 - tie_band - WALL_SLACK


def implausibly_under(claimed: float, floor: float, under: int, samples: int) -> bool:
    """Whether an isolated arm's median claim per call is implausible against the harness's floor."""
    return claimed < floor and under >= min(MIN_UNDER, samples)


def under_claim_reason(under: int, samples: int, claimed: float, floor: float, roundtrip_ns: float) -> str:
    """Why an isolated arm's claims are implausible: below the harness's floor (kernel/bounds.py)."""
    return (
        f"implausible: its worker's median claim, {claimed / 1e3:.4g} us per call, is below the harness's median "
        f"floor of {floor / 1e3:.4g} us (the wall clock around each sample less the tie band, {WALL_SLACK:.0%} of it and "
        f"the reference worker's round trip in this case, {roundtrip_ns / 1e3:.4g} us per sample; {under} of {samples} samples "
        "below their floor): the arm's own clock under-reports its calls"
    )


def in_process_warning(arm: str) -> str:
    return (
        f"{IN_PROCESS}arm {arm} ran in kerneltrial's process (`isolate` leaves it there): nothing stopped its code from "
        "patching the harness, so its verdict rests on its good faith"
    )


def sandbox_warning(missing: dict[str, str]) -> str:
    pieces = "; ".join(f"{piece} ({why})" for piece, why in missing.items())
    return f"{SANDBOX}isolated arms ran without these sandbox pieces: {pieces}"


def integrity_warnings(plan: dict[str, Any]) -> list[str]:
    """The warnings plan.json calls for: every `user:` arm not in `isolated`, then the sandbox's
    missing pieces (plan `sandbox`)."""
    isolated = set(plan.get("isolated") or [])
    names = [str(a.get("name")) for a in plan.get("arms", []) if isinstance(a, dict)]
    found = [in_process_warning(n) for n in names if n.startswith("user:") and n not in isolated]
    sandbox = plan.get("sandbox") or {}
    if sandbox.get("missing"):
        found.append(sandbox_warning(dict(sandbox["missing"])))
    return found


def integrity_lines(warnings: list[str]) -> list[str]:
    """The warnings of a summary that are about isolation, for pages that show a verdict."""
    return [w for w in warnings if w.startswith(PREFIXES)]
