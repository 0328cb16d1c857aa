"""Calibration arms (`aa:` copies of an arm, `slow:` ones with an injected delay): false positive
rate and power from the verdicts figures.py recomputed, the realized slowdown (schema 3 on), the
calibration verdict, sentence and warnings."""

from __future__ import annotations

import math
from typing import Any

from kerneltrial.kernel.verify.arithmetic import diff, same
from kerneltrial.kernel.verify.contract import Contract
from kerneltrial.kernel.verify.plan import CALIBRATION_DEFAULTS
from kerneltrial.kernel.verify.rows import calibration_arm
from kerneltrial.rundir.checks import VerifyResult

NOMINAL_FACTOR = 1.5  # power at nominal: cases whose realized slowdown <= this x injected_slowdown


def check_calibration(
    plan: dict[str, Any],
    summary: dict[str, Any],
    speedups: dict[str, list[tuple[str, float, str]]],
    intervals: dict[str, list[tuple[float, float]]],
    medians: dict[tuple[str, str], float | None] | None,
    result: VerifyResult,
    contract: Contract,
) -> None:
    """Calibration figures; `medians` None for a schema-2 summary, written before the realized slowdown.
    A false positive of an A/A arm is a win or a loss; schema 4 counts its inconclusive verdicts apart."""
    arms = [(a["name"], calibration_arm(a["name"])) for a in plan["arms"]]
    arms = [(name, parsed) for name, parsed in arms if parsed]
    recorded = summary.get("calibration")
    if not arms:
        result.add(
            "calibration",
            [] if recorded is None else ["summary has a calibration section but plan.json has no aa:/slow: arm"],
            "no calibration arms",
        )
        return
    if not isinstance(recorded, dict):
        result.add("calibration", ["summary has no calibration section for the aa:/slow: arms"], "")
        return
    settings = {**CALIBRATION_DEFAULTS, **(plan.get("calibration") or {})}
    max_fpr, min_power = float(settings["max_false_positive_rate"]), float(settings["min_power"])
    nominal = float(settings["injected_slowdown"])
    problems = diff(
        "calibration",
        recorded,
        {"injected_slowdown": nominal, "max_false_positive_rate": max_fpr, "min_power": min_power},
        ("injected_slowdown", "max_false_positive_rate", "min_power"),
    )
    passed = True
    recorded_arms = recorded.get("arms") or {}
    for name, (kind, base) in arms:
        verdicts = [v for _, _, v in speedups.get(name, [])]
        if kind == "aa":
            figures = _aa_figures(base, verdicts, intervals.get(name, []), contract)
            passed = passed and bool(verdicts) and figures["false_positive_rate"] <= max_fpr
        else:
            figures = _slow_figures(base, verdicts)
            passed = passed and bool(verdicts) and figures["power"] >= min_power
            if medians is not None:
                problems += _realized_problems(
                    name,
                    speedups.get(name, []),
                    base,
                    medians,
                    nominal,
                    recorded_arms.get(name) or {},
                    str(recorded.get("sentence", "")),
                    summary.get("warnings", []),
                )
        problems += diff(f"calibration {name}", recorded_arms.get(name) or {}, figures, tuple(figures))
    problems += _verdict_problems(recorded, [name for name, _ in arms], passed)
    word = "passed" if passed else "FAILED"
    result.add("calibration", problems, f"calibration {word}: " + ", ".join(name for name, _ in arms))


def _aa_figures(
    base: str, verdicts: list[str], intervals: list[tuple[float, float]], contract: Contract
) -> dict[str, Any]:
    """An A/A arm's figures: its false positives (wins and losses) and mean interval width."""
    n = len(verdicts)
    claimed = sum(v in ("win", "loss") for v in verdicts)
    widths = [high - low for low, high in intervals]
    counts = (
        {"false_positives": claimed, "inconclusive": verdicts.count("inconclusive")}
        if contract.checked
        else {"not_tie": claimed}
    )
    return {
        "kind": "aa",
        "base": base,
        "n_cases": n,
        **counts,
        "false_positive_rate": claimed / n if n else None,
        "mean_ci_width": math.fsum(widths) / n if n else None,
    }


def _slow_figures(base: str, verdicts: list[str]) -> dict[str, Any]:
    """A slowed arm's figures: its losses and the power they give."""
    n, losses = len(verdicts), verdicts.count("loss")
    return {"kind": "slow", "base": base, "n_cases": n, "losses": losses, "power": losses / n if n else None}


def _verdict_problems(recorded: dict[str, Any], arms: list[str], passed: bool) -> list[str]:
    """The calibration section lists only plan.json's calibration arms, and its verdict and sentence are `passed`'s."""
    problems = []
    extra = sorted(set(recorded.get("arms") or {}) - set(arms))
    if extra:
        problems.append(f"calibration lists arms that are not aa:/slow: arms of plan.json: {extra}")
    if recorded.get("passed") is not passed:
        problems.append(f"calibration passed: summary {recorded.get('passed')!r} != recomputed {passed}")
    word = "passed" if passed else "FAILED"
    if not str(recorded.get("sentence", "")).startswith(f"Calibration {word}"):
        problems.append(f"calibration sentence {recorded.get('sentence')!r} does not start 'Calibration {word}'")
    return problems


def _realized_problems(
    name: str,
    rows: list[tuple[str, float, str]],
    base: str,
    medians: dict[tuple[str, str], float | None],
    nominal: float,
    recorded: dict[str, Any],
    sentence: str,
    warnings: list[str],
) -> list[str]:
    """Realized slowdown of a slowed arm per compared case, its range, power at nominal, and the warning."""
    realized: dict[str, float] = {}
    near: list[str] = []
    for case, _, verdict in rows:
        arm_median, base_median = medians.get((case, name)), medians.get((case, base))
        if arm_median is None or base_median is None:
            continue
        realized[case] = arm_median / base_median - 1
        if realized[case] <= NOMINAL_FACTOR * nominal:
            near.append(verdict)
    low = min(realized.values()) if realized else None
    high = max(realized.values()) if realized else None
    figures = {
        "realized_min": low,
        "realized_max": high,
        "power_at_nominal": near.count("loss") / len(near) if near else None,
    }
    problems = diff(f"calibration {name}", recorded, figures, tuple(figures))
    shown = recorded.get("realized_slowdown")
    if (
        not isinstance(shown, dict)
        or list(shown) != list(realized)
        or not all(same(shown[case], value) for case, value in realized.items())
    ):
        problems.append(f"calibration {name} realized_slowdown: summary {shown!r} != recomputed {realized!r}")
    sentence_part = (
        f"{name} ({100 * nominal:g}% nominal, "
        + ("n/a" if low is None else f"{100 * low:.1f}-{100 * high:.1f}%")
        + " realized)"
    )
    power_part = "power at nominal " + (
        "n/a" if figures["power_at_nominal"] is None else f"{100 * figures['power_at_nominal']:.0f}%"
    )
    missing = [part for part in (sentence_part, power_part) if part not in sentence]
    if missing:
        problems.append(f"calibration sentence {sentence!r} does not state {missing}")
    if (
        low is not None
        and low > NOMINAL_FACTOR * nominal
        and not any(
            w.startswith(f"calibration arm {name}: the injected slowdown was never as small as nominal")
            and w.endswith("power at nominal is not demonstrated")
            for w in warnings
        )
    ):
        problems.append(
            f"summary warnings do not say that {name}'s injected slowdown was never as small as "
            f"nominal (realized at least {100 * low:.1f}%, nominal {100 * nominal:g}%)"
        )
    return problems
