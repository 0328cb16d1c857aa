"""What ceilings.csv gives: the copy and read ceilings, the Triton launch floor, the size-matched
copies, the speed-of-light floor (schema 6 on) and the plausibility limits (schema 4 on)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kerneltrial.kernel.verify.arithmetic import diff, median_of
from kerneltrial.kernel.verify.contract import Contract
from kerneltrial.kernel.verify.plan import PLAUSIBILITY_DEFAULTS
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.layout import (
    FLOOR_MODEL,
)

UNFROZEN_WARNING = "the protocol was not frozen before the run: its settings were not preregistered"
NO_LAUNCH_WARNING = "ceilings.csv has no launch samples; the launch-floor plausibility check was not applied"
TRITON_LAUNCH = "triton_launch"  # ceilings.csv kind of the Triton launch floor; optional
TRITON_FLOOR_FIELDS = ("triton_launch_floor_ns", "triton_launch_samples")
COPY_MATCHED = "copy_matched"  # ceilings.csv kind of a copy of one case's traffic; optional


@dataclass(frozen=True)
class Limits:
    """Plausibility limits recomputed from plan.json and ceilings.csv (None: that limit does not apply)."""

    margin: float
    fraction: float
    ceiling: float | None  # the best of the copy and read ceilings, GB/s
    floor: float | None  # the launch floor, ns

    def reason(self, gbps: float, median: float) -> str | None:
        """Why figures cannot be real work (bandwidth first, joined with '; '), or None."""
        reasons = []
        if self.ceiling is not None and gbps > self.ceiling * (1 + self.margin):
            reasons.append(
                f"implausible: {gbps:.0f} GB/s is {100 * gbps / self.ceiling:.0f}% of the best ceiling "
                f"measured in this run ({self.ceiling:.0f} GB/s); more than {100 * self.margin:g}% above "
                "it cannot be real work"
            )
        if self.floor is not None and median < self.fraction * self.floor:
            reasons.append(
                f"implausible: {median:.0f} ns per call is below {self.fraction:g} x the launch floor "
                f"measured in this run ({self.floor:.0f} ns): no kernel can run that fast"
            )
        return "; ".join(reasons) or None


def limits_of(plan: dict[str, Any], ceiling_rows: list[dict[str, str]]) -> Limits:
    """Judged only in GPU runs timed with CUDA events; bandwidth only with a cold L2 (a hot L2 can beat DRAM)."""
    applied = bool(plan["is_gpu"]) and plan["backend"] == "cuda-events"
    recorded = plan.get("plausibility") if isinstance(plan.get("plausibility"), dict) else {}
    # a setting that is not a number fails `plan contract fields`; the figures use the default meanwhile
    settings = {
        key: value if isinstance(value := recorded.get(key), (int, float)) else default
        for key, default in PLAUSIBILITY_DEFAULTS.items()
    }
    ceilings = [
        c for c in (ceiling_median(ceiling_rows, "copy"), ceiling_median(ceiling_rows, "read")) if c is not None
    ]
    floor = launch_floor(ceiling_rows)
    return Limits(
        float(settings["bandwidth_margin"]),
        float(settings["launch_floor_fraction"]),
        max(ceilings) if applied and plan.get("l2") == "cold" and ceilings else None,
        floor if applied else None,
    )


def check_triton_floor(recorded: dict[str, Any], ceiling_rows: list[dict[str, str]], result: VerifyResult) -> None:
    """The Triton launch floor: its rows are well formed and the summary's figures are their median and count."""
    rows = [r for r in ceiling_rows if r["kind"] == TRITON_LAUNCH]
    name = "triton launch floor"
    if not rows:
        claimed = [key for key in TRITON_FLOOR_FIELDS if key in recorded]
        if claimed:
            result.add(name, [f"summary ceilings has {claimed} but ceilings.csv has no {TRITON_LAUNCH} rows"], "")
        else:
            result.not_applicable(
                name, f"not applicable: ceilings.csv has no {TRITON_LAUNCH} rows (a run from before it)"
            )
        return
    samples, problems = ceiling_sets(rows, TRITON_LAUNCH, copy_count(ceiling_rows))
    problems += [f"{TRITON_LAUNCH} sample(s) of {moved} bytes: must be 0" for moved in samples if moved != 0]
    launches = [ns for values in samples.values() for ns in values]
    floor = median_of(launches) if launches else None
    problems += diff(
        "ceilings",
        recorded,
        {"triton_launch_floor_ns": floor, "triton_launch_samples": len(launches)},
        TRITON_FLOOR_FIELDS,
    )
    result.add(name, problems, f"{floor} ns, the median of {len(launches)} one-element Triton launches")


def copy_count(ceiling_rows: list[dict[str, str]]) -> int | None:
    """Samples per ceiling kind (and size): as many as the `copy` rows (the runner takes the same
    number of each); None without copy rows."""
    return sum(r["kind"] == "copy" for r in ceiling_rows) or None


def ceiling_sets(
    rows: list[dict[str, str]], kind: str, per_set: int | None
) -> tuple[dict[int, list[float]], list[str]]:
    """ns of well-formed rows of one ceiling kind by bytes, and the problems: unparsable rows, ns not
    finite and > 0, and any size whose sample numbers are not exactly 0..per_set-1 (a missing sample
    may be a dropped fast one; a repeated one, an added slow one)."""
    found: dict[int, list[float]] = {}
    numbers: dict[int, list[str]] = {}
    problems: list[str] = []
    for row in rows:
        try:
            ns, moved = float(row["ns"]), int(row["bytes"])
        except ValueError as error:
            problems.append(f"{kind} sample {row['sample']}: unparsable ({error})")
            continue
        numbers.setdefault(moved, []).append(row["sample"])
        found.setdefault(moved, [])  # a size with only bad rows is still a size
        if not (math.isfinite(ns) and ns > 0):
            problems.append(f"{kind} sample {row['sample']} of {moved} bytes: ns {ns:g} (must be finite and > 0)")
            continue
        found.setdefault(moved, []).append(ns)
    for moved, samples in numbers.items():
        expected = [str(i) for i in range(per_set if per_set is not None else len(samples))]
        if sorted(samples, key=lambda x: (len(x), x)) != expected:
            problems.append(f"{kind} samples of {moved} bytes are {sorted(samples)}, not 0..{len(expected) - 1}")
    return found, problems


def check_matched_copies(
    plan: dict[str, Any], summary: dict[str, Any], ceiling_rows: list[dict[str, str]], result: VerifyResult
) -> None:
    """The copies of each case's traffic: well-formed rows, one set per case's bytes (rounded down
    to even), and every case's matched_copy_gbps their median GB/s."""
    rows = [r for r in ceiling_rows if r["kind"] == COPY_MATCHED]
    name = "size-matched copies"
    recorded = {str(c.get("case")): c for c in summary.get("cases", [])}
    if not rows:
        claimed = [case for case, c in recorded.items() if "matched_copy_gbps" in c]
        if claimed:
            result.add(
                name, [f"cases {claimed} have matched_copy_gbps but ceilings.csv has no {COPY_MATCHED} rows"], ""
            )
        else:
            result.not_applicable(
                name, f"not applicable: ceilings.csv has no {COPY_MATCHED} rows (a run from before it)"
            )
        return
    samples, problems = ceiling_sets(rows, COPY_MATCHED, copy_count(ceiling_rows))
    problems += [
        f"{COPY_MATCHED} sample(s) of {moved} bytes: must be even and > 0"
        for moved in samples
        if moved <= 0 or moved % 2
    ]
    rates = {moved: [moved / ns for ns in values] for moved, values in samples.items()}
    wanted = {int(case["bytes"]) - int(case["bytes"]) % 2 for case in plan["cases"]} - {0}  # the runner skips < 2
    if set(rates) != wanted:
        problems.append(f"{COPY_MATCHED} sizes {sorted(rates)} are not the cases' traffic {sorted(wanted)}")
    for case in plan["cases"]:
        moved = int(case["bytes"]) - int(case["bytes"]) % 2
        expected = median_of(rates[moved]) if rates.get(moved) else None
        problems += diff(
            f"case {case['case']}",
            recorded.get(str(case["case"]), {}),
            {"matched_copy_gbps": expected},
            ("matched_copy_gbps",),
        )
    result.add(name, problems, f"{len(rates)} sizes, {len(rows)} samples")


def check_floor(
    plan: dict[str, Any],
    summary: dict[str, Any],
    ceiling_rows: list[dict[str, str]],
    per_unit: dict[tuple[str, str], dict[tuple[int, int], float]],
    contract: Contract,
    result: VerifyResult,
) -> None:
    """The speed-of-light floor (schema 6): each case's floor_ns is the median `triton_launch` ns
    plus its bytes over the median `copy` GB/s, and each arm's fraction_of_floor that floor over
    its median ns per call (null where the summary has no median). Older runs must claim none."""
    name = "speed-of-light floor"
    cases = summary.get("cases", [])
    claimed = [str(c.get("case")) for c in cases if "floor_ns" in c] + [
        f"{c.get('case')}/{arm}" for c in cases for arm, e in c.get("arms", {}).items() if "fraction_of_floor" in e
    ]
    if not contract.floor:
        if claimed:
            result.add(name, [f"{claimed[:3]} have floor figures but plan.json has no `floor`"], "")
        else:
            result.not_applicable(name, "not applicable: plan.json has no `floor` (a run from before it)")
        return
    problems = [] if plan["floor"] == FLOOR_MODEL else [f"plan.json floor {plan['floor']!r} is not {FLOOR_MODEL}"]
    kind = FLOOR_MODEL["launch"]  # its well-formed rows, as `triton launch floor` takes them (it names bad ones)
    sets, _ = ceiling_sets([r for r in ceiling_rows if r["kind"] == kind], kind, None)
    launches = [ns for values in sets.values() for ns in values]
    launch, rate = (median_of(launches) if launches else None), ceiling_median(ceiling_rows, FLOOR_MODEL["rate"])
    recorded = {str(c.get("case")): c for c in cases}
    for case in plan["cases"]:
        case_id = str(case["case"])
        entry = recorded.get(case_id, {})
        floor = launch + int(case["bytes"]) / rate if launch is not None and rate else None
        problems += diff(f"case {case_id}", entry, {"floor_ns": floor}, ("floor_ns",))
        for arm, figures in entry.get("arms", {}).items():
            times = per_unit.get((case_id, arm))
            timed = figures.get("median_ns_per_call") is not None and times and floor is not None
            expected = floor / median_of(list(times.values())) if timed else None
            problems += diff(
                f"case {case_id} arm {arm}", figures, {"fraction_of_floor": expected}, ("fraction_of_floor",)
            )
    result.add(name, problems, f"launch {launch} ns + bytes / {rate} GB/s, per case and arm")


def launch_floor(ceiling_rows: list[dict[str, str]]) -> float | None:
    launches = [float(r["ns"]) for r in ceiling_rows if r["kind"] == "launch"]
    return median_of(launches) if launches else None


def ceiling_median(rows: list[dict[str, str]], kind: str) -> float | None:
    rates = [float(r["bytes"]) / float(r["ns"]) for r in rows if r["kind"] == kind]
    return median_of(rates) if rates else None


def check_plausibility(
    plan: dict[str, Any], summary: dict[str, Any], ceiling_rows: list[dict[str, str]], result: VerifyResult
) -> None:
    """The top-level figures of a schema-4 summary: plausibility limits, launch floor, frozen_at, their warnings."""
    limits = limits_of(plan, ceiling_rows)
    applied = bool(plan["is_gpu"]) and plan["backend"] == "cuda-events"
    launches = sum(r["kind"] == "launch" for r in ceiling_rows)
    figures = {
        "bandwidth_margin": limits.margin,
        "launch_floor_fraction": limits.fraction,
        "applied": applied,
        "bandwidth_limit_gbps": None if limits.ceiling is None else limits.ceiling * (1 + limits.margin),
        "time_limit_ns": None if limits.floor is None else limits.fraction * limits.floor,
    }
    problems = diff("plausibility", summary.get("plausibility") or {}, figures, tuple(figures))
    problems += diff(
        "ceilings",
        summary.get("ceilings") or {},
        {"launch_floor_ns": launch_floor(ceiling_rows), "launch_samples": launches},
        ("launch_floor_ns", "launch_samples"),
    )
    warnings = summary.get("warnings", [])
    if applied and not launches and NO_LAUNCH_WARNING not in warnings:
        problems.append(f"summary warnings lack {NO_LAUNCH_WARNING!r}")
    result.add(
        "plausibility",
        problems,
        "judged: " + ", ".join(f"{k} {v}" for k, v in figures.items() if k.endswith(("gbps", "ns")))
        if applied
        else "not judged: not a GPU run timed with CUDA events",
    )

    frozen_at = plan.get("frozen_at")
    problems = diff("summary", summary, {"frozen_at": frozen_at}, ("frozen_at",))
    if "frozen_at" not in summary:
        problems.append("summary has no frozen_at (null when the protocol was not frozen)")
    if frozen_at is None and UNFROZEN_WARNING not in warnings:
        problems.append(f"summary warnings lack {UNFROZEN_WARNING!r}")
    result.add(
        "summary frozen_at",
        problems,
        "not frozen, and the summary warns" if frozen_at is None else f"frozen at {frozen_at}",
    )
