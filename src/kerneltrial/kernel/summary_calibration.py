"""The calibration figures of a kernel summary: did the timing method tell an arm from its copy
(`aa:` arms) and catch an injected slowdown (`slow:` arms)? (docs/VERIFY.md, "Calibration arms")"""

from __future__ import annotations

from typing import Any

from kerneltrial import stats
from kerneltrial.kernel.summary_schemas import SchemaV3
from kerneltrial.rundir.summary_doc import AACalibration, ArmFigures, Calibration, SlowCalibration, SummaryCase


def calibration(
    plan: dict[str, Any], cases: list[SummaryCase], control: str, schema: SchemaV3, warnings: list[str]
) -> Calibration | None:
    """Calibration figures of the `aa:`/`slow:` arms (None when there are none)."""
    found = [(arm["name"], stats.calibration_base(arm["name"])) for arm in plan["arms"]]
    found = [(name, parsed) for name, parsed in found if parsed is not None]
    if not found:
        return None
    settings = stats.CALIBRATION_DEFAULTS | (plan.get("calibration") or {})
    nominal = float(settings["injected_slowdown"])
    arms: dict[str, AACalibration | SlowCalibration] = {}
    aa_figures, slow_figures = [], []
    for name, (kind, base) in found:
        if base != control:
            warnings.append(
                f"calibration arm {name} is compared with the control {control}, not with {base}; "
                "its calibration figures do not measure what they claim"
            )
        compared = [c for c in cases if c.arms[name].verdict is not None]
        if kind == "aa":
            aa, arms[name] = _aa_arm(name, base, compared, schema)
            aa_figures.append(aa)
        else:
            slow, arms[name] = _slow_arm(name, base, compared, nominal)
            slow_figures.append(slow)
            if slow.realized_min is not None and slow.realized_min > stats.NOMINAL_FACTOR * nominal:
                warnings.append(never_nominal_warning(name, slow.realized_min, slow.realized_max, nominal))
    max_fpr, min_power = float(settings["max_false_positive_rate"]), float(settings["min_power"])
    passed = stats.calibration_passed(aa_figures, slow_figures, max_fpr, min_power)
    return Calibration(
        injected_slowdown=nominal,
        max_false_positive_rate=max_fpr,
        min_power=min_power,
        arms=arms,
        passed=passed,
        sentence=calibration_sentence(arms, passed, nominal, max_fpr, min_power),
    )


def _aa_arm(
    name: str, base: str, compared: list[SummaryCase], schema: SchemaV3
) -> tuple[stats.AACalibration, AACalibration]:
    entries = [c.arms[name] for c in compared]
    figures = stats.aa_calibration([e.verdict for e in entries], [stats.Interval(e.ci_low, e.ci_high) for e in entries])
    return figures, AACalibration(
        kind="aa",
        base=base,
        n_cases=figures.n_cases,
        false_positives=figures.false_positives,
        inconclusive=schema.aa_inconclusive(figures),
        false_positive_rate=figures.false_positive_rate,
        mean_ci_width=figures.mean_ci_width,
    )


def _slow_arm(
    name: str, base: str, compared: list[SummaryCase], nominal: float
) -> tuple[stats.SlowCalibration, SlowCalibration]:
    realized = {c.case: _realized(c.arms[name], c.arms.get(base)) for c in compared}
    figures = stats.slow_calibration([c.arms[name].verdict for c in compared], list(realized.values()), nominal)
    return figures, SlowCalibration(
        kind="slow",
        base=base,
        n_cases=figures.n_cases,
        losses=figures.losses,
        power=figures.power,
        realized_slowdown={case: r for case, r in realized.items() if r is not None},
        realized_min=figures.realized_min,
        realized_max=figures.realized_max,
        power_at_nominal=figures.power_at_nominal,
    )


def _realized(slow: ArmFigures, base: ArmFigures | None) -> float | None:
    """Realized slowdown of a slowed arm in one case; None when the base arm has no median."""
    if base is None or base.median_ns_per_call is None or slow.median_ns_per_call is None:
        return None
    return stats.realized_slowdown(slow.median_ns_per_call, base.median_ns_per_call)


def never_nominal_warning(name: str, realized_min: float, realized_max: float | None, nominal: float) -> str:
    """The warning for a slowed arm whose smallest realized slowdown exceeds NOMINAL_FACTOR x nominal."""
    return (
        f"calibration arm {name}: the injected slowdown was never as small as nominal "
        f"({_realized_range(realized_min, realized_max)} realized, {100 * nominal:g}% nominal): "
        "power at nominal is not demonstrated"
    )


def _realized_range(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"{100 * low:.1f}-{100 * high:.1f}%"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _claimed(aa: AACalibration) -> str:
    """An A/A arm's false positives, and from summary/4 on its inconclusive verdicts (summary/3 has none)."""
    if aa.inconclusive is None:
        return str(aa.false_positives)
    return f"{aa.false_positives} ({aa.inconclusive} inconclusive)"


def calibration_sentence(
    arms: dict[str, AACalibration | SlowCalibration],
    passed: bool,
    injected_slowdown: float,
    max_fpr: float,
    min_power: float,
) -> str:
    """One sentence saying whether the timing method told A from A and caught an injected slowdown."""
    parts = [
        f"A/A arm {name} was called different from its copy in {_claimed(f)} of {f.n_cases} case(s) "
        f"(false-positive rate {_pct(f.false_positive_rate)}, at most {_pct(max_fpr)} allowed; "
        f"mean CI width {'n/a' if f.mean_ci_width is None else format(f.mean_ci_width, '.4f')})"
        for name, f in arms.items()
        if isinstance(f, AACalibration)
    ]
    near = stats.NOMINAL_FACTOR * injected_slowdown
    parts += [
        f"slowed arm {name} ({100 * injected_slowdown:g}% nominal, "
        f"{_realized_range(f.realized_min, f.realized_max)} realized) was called a loss in {f.losses} of "
        f"{f.n_cases} case(s) (power {_pct(f.power)}, at least {_pct(min_power)} required; "
        f"power at nominal {_pct(f.power_at_nominal)} over the "
        f"{sum(r <= near for r in f.realized_slowdown.values())} case(s) realized at most {100 * near:g}%)"
        for name, f in arms.items()
        if isinstance(f, SlowCalibration)
    ]
    return f"Calibration {'passed' if passed else 'FAILED'}: " + "; ".join(parts) + "."
