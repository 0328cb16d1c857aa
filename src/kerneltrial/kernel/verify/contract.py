"""One contract record per summary schema: which schema a run is verified under, and what it requires.

`contract_of` is the one place that reads plan.json `checks` / `host` / `floor` and the summary's
`schema`; it picks a `Contract` of CONTRACTS (one per schema, 1 to 7), and every check reads
that record (the raw files it hashes, the figure and aggregate fields, the verdict rule, the
optional check families) instead of comparing schema strings. A family the contract lacks is
listed as not applicable, or failed where `no downgrade` shows the run was written under a
contract that has it (`Family`, `not_checked`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerneltrial.kernel import schema_requirements
from kerneltrial.kernel.verify.rows import Sample, as_list, calibration_arm, rounds_of
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import HOST, INPUT_FILES, TIMED_CHECKS

BASE_FIGURE_FIELDS = (
    "median_ns_per_call",
    "n_samples",
    "ci_units",
    "speedup",
    "ci_low",
    "ci_high",
    "verdict",
    "gbps",
    "pct_of_copy_ceiling",
)
FIGURE_FIELDS = (*BASE_FIGURE_FIELDS, "throttled_samples", "spread")
AGGREGATE_FIELDS = (
    "n_cases",
    "geomean",
    "geomean_ci_low",
    "geomean_ci_high",
    "mean",
    "worst",
    "worst_case",
    "wins",
    "ties",
    "losses",
    "failed_correctness",
)
CHECKED_AGGREGATE_FIELDS = (*AGGREGATE_FIELDS, "inconclusive", "failed_while_timed", "implausible", "ulp_hist")
LEGACY_SCHEMA = "kerneltrial.summary/1"
SCHEMA_2 = "kerneltrial.summary/2"  # before the realized slowdown of slow: arms
SCHEMA_3 = "kerneltrial.summary/3"  # before timed checks (plan.json without `checks`)
SCHEMA_4 = "kerneltrial.summary/4"  # plan.json `"checks": 1` or 2
SCHEMA_5 = "kerneltrial.summary/5"  # plan.json `"checks"` and `host` (host cost per call)
SCHEMA_6 = "kerneltrial.summary/6"  # and plan.json `floor` (the speed-of-light floor, issue 27)
SCHEMA_7 = "kerneltrial.summary/7"  # plan.json `"checks": 3` (isolated arms and the harness's bounds)
CHECKS_EVERY_CALL = 2  # checks 2: fresh values before every call, a random call of each sample checked
CHECKS_ISOLATED = 3  # checks 3: as 2, and plan `isolated` arms whose timing rows carry the harness's bound
# the checks only a run with timed checks has; listed as not applicable for older runs
CHECKED_RUN_CHECKS = (
    "plan contract fields",
    "timed checks",
    "dropped arms",
    "ulp histograms",
    "plausibility",
    "summary frozen_at",
    "manifest",
    "provenance",
    "source archive",
    "protocol freeze",
)


@dataclass(frozen=True)
class Family:
    """Checks that only some contracts have: their names, why a run without them has none, and
    whether a run written under a WriterContract (what `no downgrade` shows) must have them."""

    names: tuple[str, ...]
    why: str
    written: Callable[[schema_requirements.WriterContract], bool]


TIMED_FAMILY = Family(
    CHECKED_RUN_CHECKS, "plan.json has no `checks` (a run from before timed checks)", lambda w: w.checks >= 1
)
HOST_FAMILY = Family(("host cost",), "plan.json has no `host` (a run from before host cost)", lambda w: w.host)
ISOLATION_FAMILY = Family(
    ("isolation bounds",), "plan.json checks < 3 (a run from before isolation)", lambda w: w.checks >= CHECKS_ISOLATED
)


@dataclass(frozen=True)
class Contract:
    """What a summary schema covers. plan.json `checks` (1: schema 4) or else the summary's
    `schema` (1, 2 or 3) selects one; each later schema adds figures to check."""

    schema: str
    clocks: bool  # clock figures, spreads, per-case rounds, calibration, their warnings (schema 2 on)
    realized: bool  # realized slowdown of slow: arms (schema 3 on)
    checked: bool  # timed checks, plausibility, inconclusive, ulp histograms, file integrity (schema 4)
    host: bool = False  # host cost per call, host.csv (schema 5)
    floor: bool = False  # the speed-of-light floor per case and arm (schema 6)
    isolation: bool = False  # isolated arms, the harness's wall bounds (schema 7)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The raw files summary.json records the sha256 of."""
        return (*INPUT_FILES, *((TIMED_CHECKS,) if self.checked else ()), *((HOST,) if self.host else ()))

    @property
    def figure_fields(self) -> tuple[str, ...]:
        """The per-arm figures of each case (spreads and throttled samples since schema 2)."""
        return FIGURE_FIELDS if self.clocks else BASE_FIGURE_FIELDS

    @property
    def aggregate_fields(self) -> tuple[str, ...]:
        """The per-arm aggregates (the timed-check counts and ulp histograms since schema 4)."""
        return CHECKED_AGGREGATE_FIELDS if self.checked else AGGREGATE_FIELDS

    def has(self, family: Family) -> bool:
        return {TIMED_FAMILY: self.checked, HOST_FAMILY: self.host, ISOLATION_FAMILY: self.isolation}[family]

    def verdict(self, low: float, high: float, band: float) -> str:
        """win / loss outside the band; schema 4: tie only inside it, else inconclusive; before: tie."""
        if low > 1 + band:
            return "win"
        if high < 1 - band:
            return "loss"
        if not self.checked or (1 - band <= low and high <= 1 + band):
            return "tie"
        return "inconclusive"


CONTRACTS = {
    c.schema: c
    for c in (
        Contract(LEGACY_SCHEMA, clocks=False, realized=False, checked=False),
        Contract(SCHEMA_2, clocks=True, realized=False, checked=False),
        Contract(SCHEMA_3, clocks=True, realized=True, checked=False),
        Contract(SCHEMA_4, clocks=True, realized=True, checked=True),
        Contract(SCHEMA_5, clocks=True, realized=True, checked=True, host=True),
        Contract(SCHEMA_6, clocks=True, realized=True, checked=True, host=True, floor=True),
        Contract(SCHEMA_7, clocks=True, realized=True, checked=True, host=True, floor=True, isolation=True),
    )
}


def contract_of(plan: dict[str, Any], summary: dict[str, Any], samples: list[Sample], result: VerifyResult) -> Contract:
    """The contract the run is verified under, and the check `summary schema`. plan.json
    `"checks"` needs a schema 4-7 summary; a run without `checks` a schema 1-3 one (schema 1 only
    for raw files without the newer fields)."""
    if "checks" in plan:
        return _checked_contract(plan, summary.get("schema"), result)
    if summary.get("schema") != LEGACY_SCHEMA:
        return _unchecked_contract(summary.get("schema"), result)
    return _legacy_contract(plan, samples, result)


def _checked_contract(plan: dict[str, Any], schema: Any, result: VerifyResult) -> Contract:
    """Schemas 4 to 7: plan.json `checks`, `host` and `floor` say which one the summary must be."""
    if plan["checks"] not in (1, CHECKS_EVERY_CALL, CHECKS_ISOLATED) or isinstance(plan["checks"], bool):
        raise RunDirError(
            f"plan.json checks {plan['checks']!r}: this kerneltrial verifies timed-check contracts 1, 2 and 3 "
            "(or none); update kerneltrial to verify this run"
        )
    wanted = (
        SCHEMA_7
        if plan["checks"] == CHECKS_ISOLATED
        else SCHEMA_6
        if "floor" in plan
        else SCHEMA_5
        if "host" in plan
        else SCHEMA_4
    )
    result.add(
        "summary schema",
        []
        if schema == wanted
        else [
            f"summary schema {schema!r} is not {wanted}, which a plan with checks {plan['checks']}"
            + (" and host" if "host" in plan else "")
            + (" and floor" if "floor" in plan else "")
            + " needs"
        ],
        f"{schema}",
    )
    return CONTRACTS[wanted]


def _unchecked_contract(schema: Any, result: VerifyResult) -> Contract:
    """Schemas 2 and 3 (a plan without `checks`): the summary says which."""
    result.add(
        "summary schema",
        []
        if schema in (SCHEMA_3, SCHEMA_2)
        else [
            f"summary schema {schema!r} is not {SCHEMA_3} (or /2, /1) for a plan without checks"
            + (" (a schema-4 summary needs plan.json checks 1)" if schema == SCHEMA_4 else "")
        ],
        f"{schema}",
    )
    return CONTRACTS[SCHEMA_2 if schema == SCHEMA_2 else SCHEMA_3]


def _legacy_contract(plan: dict[str, Any], samples: list[Sample], result: VerifyResult) -> Contract:
    """Schema 1: accepted only for raw files without the fields later schemas cover."""
    newer = []
    if any(s.sm_mhz is not None for s in samples):
        newer.append("timings.csv has sm_mhz readings")
    if any(
        c.get("rounds") is not None and len(rounds_of(plan, c)) != len(as_list(plan["rounds"])) for c in plan["cases"]
    ):
        newer.append("plan.json cases have their own rounds")
    if any(calibration_arm(a["name"]) for a in plan["arms"]):
        newer.append("plan.json has aa:/slow: calibration arms")
    result.add(
        "summary schema",
        [f"{LEGACY_SCHEMA} summary lacks the figures for raw data it must cover: " + "; ".join(newer)] if newer else [],
        f"{LEGACY_SCHEMA}: no clock, per-case rounds or calibration data to check",
    )
    return CONTRACTS[LEGACY_SCHEMA]


def not_checked(family: Family, floor: schema_requirements.WriterContract, result: VerifyResult) -> None:
    """The checks of a family the run's declared contract does not have: not applicable, or failed
    where `no downgrade` shows the run was written under a contract that has them."""
    for name in family.names:
        if family.written(floor):
            result.add(
                name,
                [f"not checked: {family.why}, yet the run was written under a contract that has it (see no downgrade)"],
                "",
            )
        else:
            result.not_applicable(name, f"not applicable: {family.why}")
