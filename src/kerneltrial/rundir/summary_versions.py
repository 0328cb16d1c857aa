"""summary.json's versions: the adapter that reads each older version as the newest shape, and
the downgrade that writes the newest shape as an older version (rundir/summary_doc.py applies
them in `read_summary` and `summary_json`). Plain dict functions: the models stay in summary_doc.py.
"""

from __future__ import annotations

from typing import Any

SUMMARY_V1 = "kerneltrial.summary/1"
SUMMARY_V2 = "kerneltrial.summary/2"
SUMMARY_V3 = "kerneltrial.summary/3"
SUMMARY_V4 = "kerneltrial.summary/4"
SUMMARY_V5 = "kerneltrial.summary/5"
SUMMARY_V6 = "kerneltrial.summary/6"
SUMMARY_V7 = "kerneltrial.summary/7"


def _summary_v3(data: dict[str, Any]) -> dict[str, Any]:
    """summary/3: no timed checks, no inconclusive verdict; A/A arms counted `not_tie`."""
    nothing = {"inconclusive": None, "failed_while_timed": None, "implausible": None, "ulp_hist": None}
    adapted = {
        **data,
        "aggregates": {name: {**figures, **nothing} for name, figures in data["aggregates"].items()},
        "exact": False,
        "frozen_at": None,
        "plausibility": None,
        "timed_checks": None,
    }
    if data.get("calibration"):
        arms = {
            name: {key: value for key, value in figures.items() if key != "not_tie"}
            | ({"false_positives": figures["not_tie"], "inconclusive": None} if figures["kind"] == "aa" else {})
            for name, figures in data["calibration"]["arms"].items()
        }
        adapted["calibration"] = {**data["calibration"], "arms": arms}
    return adapted


def _summary_v4(data: dict[str, Any]) -> dict[str, Any]:
    """summary/4 and older: no host cost per call (host.csv did not exist)."""
    unmeasured = {"host_ns_per_call": None, "host_samples": 0, "host_behind": None}
    cases = [
        {**case, "arms": {name: {**entry, **unmeasured} for name, entry in case["arms"].items()}}
        for case in data["cases"]
    ]
    return {**data, "cases": cases, "host": None}


def _summary_v5(data: dict[str, Any]) -> dict[str, Any]:
    """summary/5 and older: no speed-of-light floor (plan.json had no `floor`)."""
    cases = [
        {
            **case,
            "floor_ns": None,
            "arms": {name: {**entry, "fraction_of_floor": None} for name, entry in case["arms"].items()},
        }
        for case in data["cases"]
    ]
    return {**data, "cases": cases}


def _summary_v6(data: dict[str, Any]) -> dict[str, Any]:
    """summary/6 and older: no isolated arms (plan.json had no `checks` 3)."""
    return {**data, "isolation": None}


def _summary_v1(data: dict[str, Any]) -> dict[str, Any]:
    """summary/1: no clocks, spreads, throttle counts, per-case rounds, noise rule or calibration."""
    cases = [
        {"rounds": None, "units_planned": None, "injected_delay_ns": None, **case}
        | {"arms": {name: {"throttled_samples": 0, "spread": None, **e} for name, e in case["arms"].items()}}
        for case in data["cases"]
    ]
    return {"clocks": None, "noise_rule": None, **data, "cases": cases}


def _summary_v2(data: dict[str, Any]) -> dict[str, Any]:
    """summary/2: slowed calibration arms without the realized slowdown."""
    if not data.get("calibration"):
        return data
    unknown = {"realized_slowdown": {}, "realized_min": None, "realized_max": None, "power_at_nominal": None}
    arms = {
        name: unknown | figures if figures["kind"] == "slow" else figures
        for name, figures in data["calibration"]["arms"].items()
    }
    return {**data, "calibration": {**data["calibration"], "arms": arms}}


# each version's adapter, applied from the document's version on (summary/1 passes all six)
SUMMARY_ADAPTERS = {
    SUMMARY_V1: _summary_v1,
    SUMMARY_V2: _summary_v2,
    SUMMARY_V3: _summary_v3,
    SUMMARY_V4: _summary_v4,
    SUMMARY_V5: _summary_v5,
    SUMMARY_V6: _summary_v6,
    SUMMARY_V7: None,
}


# ---------------------------------------------------------------- writing summary.json
# Each writable version's downgrade, the inverse of its reader adapter above: a Summary holds the
# newest shape, and `summary_json` drops what the document's own version did not record. A field
# a run did not measure (`matched_copy_gbps`, `triton_launch_*`, `calibration`, an arm's
# `layouts`) is left unset by the writer and not written; the reader leaves it unset too.


def _drop(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in keys}


def _map_arms(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`data` with `keys` dropped from every case's arm entries."""
    cases = [
        {**case, "arms": {name: _drop(entry, *keys) for name, entry in case["arms"].items()}} for case in data["cases"]
    ]
    return {**data, "cases": cases}


def _to_v6(data: dict[str, Any]) -> dict[str, Any]:
    """summary/6: no isolated arms (inverse of `_summary_v6`)."""
    return _drop(data, "isolation")


def _to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """summary/5: no speed-of-light floor (inverse of `_summary_v5`)."""
    data = _map_arms(data, "fraction_of_floor")
    return {**data, "cases": [_drop(case, "floor_ns") for case in data["cases"]]}


def _to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """summary/4: no host cost per call (inverse of `_summary_v4`)."""
    return _drop(_map_arms(data, "host_ns_per_call", "host_samples", "host_behind"), "host")


def _not_tie(figures: dict[str, Any]) -> dict[str, Any]:
    """A summary/3 A/A arm: its false positives named `not_tie`, in their place; no inconclusive count."""
    if figures["kind"] != "aa":
        return figures
    renamed = {("not_tie" if key == "false_positives" else key): value for key, value in figures.items()}
    return _drop(renamed, "inconclusive")


def _to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """summary/3: no timed checks, launch floor or inconclusive verdicts (inverse of `_summary_v3`)."""
    unrecorded = ("inconclusive", "failed_while_timed", "implausible", "ulp_hist")
    adapted = _drop(data, "exact", "frozen_at", "plausibility", "timed_checks")
    adapted["ceilings"] = _drop(data["ceilings"], "launch_floor_ns", "launch_samples")
    adapted["aggregates"] = {name: _drop(figures, *unrecorded) for name, figures in data["aggregates"].items()}
    if "calibration" in data:
        arms = {name: _not_tie(figures) for name, figures in data["calibration"]["arms"].items()}
        adapted["calibration"] = {**data["calibration"], "arms": arms}
    return adapted


# the versions a summary is written in, newest first, each with its step down to it
SUMMARY_DOWNGRADES = {SUMMARY_V7: None, SUMMARY_V6: _to_v6, SUMMARY_V5: _to_v5, SUMMARY_V4: _to_v4, SUMMARY_V3: _to_v3}
