"""The warnings that say a run's verdict rests on less than the whole isolation (issue 35, item 4):
a `user:` arm left in kerneltrial's process, isolated arms without a piece of the sandbox, and an
isolated arm's claim far inside the harness's wall bound; and the reason an isolated arm's claim
below the harness's floor is implausible. The summary writes them (kernel/bounds.py),
verify recomputes them from plan.json and timings.csv, and report.md, `performance` and `compare`
show every warning that starts with one of `PREFIXES`."""

from __future__ import annotations

from typing import Any

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


# The round trip under an isolated arm's floor (kernel/bounds.py): the median of the case's reference
# round trips plus ROUNDTRIP_SPREADS median absolute deviations, so that no single sample (a stall of
# the reference, planted or not) sets it. On the loaded 2-core CI machine the reference's round trips
# at 4x64 with 8 calls were 0.33-0.79 ms per sample with one of 3.9 ms, the honest arms' 0.45-1.97 ms
# (docs/NOTES.md, "The harness's floor"); an arm is implausible when its median claim per call, the
# published figure, is below its median floor per call and at least MIN_UNDER of its samples (all, with
# fewer) claim less than their own floor. One sample stalled outside the arm's clock (the host
# descheduling the worker or the harness) raises that sample's floor alone: with two samples that was
# enough to call an honest interpreted arm implausible on the loaded CI machine (1 of 2 under, median
# claim 13.3 ms, median floor 14.9 ms). An arm that moves its median with its clock must shave at least
# half of its samples, 2 or more from 3 samples on; with 2 samples, one shaved sample escapes (docs/CHECKS.md).
ROUNDTRIP_SPREADS = 3.0
MIN_UNDER = 2


def implausibly_under(claimed: float, floor: float, under: int, samples: int) -> bool:
    """Whether an isolated arm's median claim per call is implausible against the harness's floor."""
    return claimed < floor and under >= min(MIN_UNDER, samples)


def under_claim_reason(under: int, samples: int, claimed: float, floor: float, roundtrip_ns: float) -> str:
    """Why an isolated arm's claims are implausible: below the harness's floor (kernel/bounds.py)."""
    return (
        f"implausible: its worker's median claim, {claimed / 1e3:.4g} us per call, is below the harness's median "
        f"floor of {floor / 1e3:.4g} us (the wall clock around each sample less the tie band and the reference "
        f"worker's round trip in this case, {roundtrip_ns / 1e3:.4g} us per sample; {under} of {samples} samples "
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
