"""The raw rows of a kernel run as verify reads them (csv and json only): timings.csv samples,
timed_checks.jsonl rows, and what plan.json says of seeds, rounds, clocks and calibration arms."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json
from kerneltrial.rundir.layout import (
    PEAK_BYTES,
    TIMED_CHECKS,
)

RAISED = "raised while timed: "


def read_document(run_dir: Path, name: str) -> Any:
    return read_json(run_dir / name)


def read_csv_rows(run_dir: Path, name: str, header: list[str]) -> list[dict[str, str]]:
    path = run_dir / name
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not set(header) <= set(reader.fieldnames):
            raise RunDirError(f"{path}: header {reader.fieldnames} lacks {header}")
        return list(reader)


@dataclass(frozen=True)
class Sample:
    case: str
    seed: int
    round: int
    position: int
    arm: str
    calls: int
    ns: float
    sm_mhz: float | None = None  # None: no clock reading (column absent or empty)
    peak_bytes: int | None = None  # None: not measured (column absent or empty; kernel/verify/throughput.py)


def _mhz(text: str | None) -> float | None:
    return None if text is None or text.strip() == "" else float(text)


def _bytes(text: str | None) -> int | None:
    return None if text is None or text.strip() == "" else int(text)


def read_samples(run_dir: Path) -> list[Sample]:
    rows = read_csv_rows(run_dir, "timings.csv", ["case", "seed", "round", "position", "arm", "calls", "ns"])
    try:
        return [
            Sample(
                r["case"],
                int(r["seed"]),
                int(r["round"]),
                int(r["position"]),
                r["arm"],
                int(r["calls"]),
                float(r["ns"]),
                _mhz(r.get("sm_mhz")),
                _bytes(r.get(PEAK_BYTES)),
            )
            for r in rows
        ]
    except (TypeError, ValueError) as error:
        raise RunDirError(f"{run_dir / 'timings.csv'}: unparsable row ({error})") from error


@dataclass(frozen=True)
class TimedRow:
    """One row of timed_checks.jsonl (the fields verify checks)."""

    case: str
    seed: int
    round: int
    arm: str
    values_seed: int
    passed: bool
    message: str
    checked_call: Any = None  # checks 2: which call of the sample was checked

    @property
    def key(self) -> tuple[str, int, int, str]:
        return self.case, self.seed, self.round, self.arm

    @property
    def raised(self) -> bool:
        return self.message.startswith(RAISED)


def _timed_row(row: Any) -> TimedRow:
    """A timed_checks.jsonl row with every contract field of the right type; TypeError otherwise."""
    fields = {
        "case": str,
        "seed": int,
        "round": int,
        "arm": str,
        "values_seed": int,
        "passed": bool,
        "max_abs": (int, float),
        "max_rel": (int, float),
        "ulp": (int, float),
        "message": str,
    }
    if not isinstance(row, dict):
        raise TypeError(f"{row!r} is not an object")
    wrong = [
        name
        for name, kind in fields.items()
        if not isinstance(row.get(name), kind) or (kind is int and isinstance(row.get(name), bool))
    ]
    if wrong:
        raise TypeError(f"fields {wrong} missing or of the wrong type in {row!r}")
    return TimedRow(
        row["case"],
        row["seed"],
        row["round"],
        row["arm"],
        row["values_seed"],
        row["passed"],
        row["message"],
        row.get("checked_call"),
    )


def read_timed_rows(run_dir: Path) -> tuple[list[TimedRow], list[str]]:
    """The rows of timed_checks.jsonl and the problems reading it (a missing file is one)."""
    path = run_dir / TIMED_CHECKS
    if not path.is_file():
        return [], [f"{TIMED_CHECKS} is missing: a run with timed checks writes one row per timing sample"]
    rows, problems = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(_timed_row(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as error:
                problems.append(f"{TIMED_CHECKS} line {number}: {error}")
    return rows, problems


@dataclass(frozen=True)
class TimedChecks:
    """The timed checks of a run and what follows from them."""

    rows: list[TimedRow]
    raised: dict[tuple[str, str], tuple[int, int]]  # (case, arm) -> the (seed, round) where it first raised

    def failures(self, case: str, arm: str) -> list[str]:
        """Messages of the (case, arm)'s failed timed checks, in file order."""
        return [r.message for r in self.rows if r.case == case and r.arm == arm and not r.passed]

    def raised_in(self) -> dict[tuple[str, int, int], list[str]]:
        """Arms that raised, by (case, seed, round) unit."""
        units: dict[tuple[str, int, int], list[str]] = {}
        for row in self.rows:
            if row.raised:
                units.setdefault((row.case, row.seed, row.round), []).append(row.arm)
        return units


def unit_order(plan: dict[str, Any]) -> Callable[[int, int], tuple[int, int, int]]:
    """When a (seed, round) unit ran: the planned rounds seed by seed (plan `seeds` order), then
    each round the noise rule added, across the seeds (docs/VERIFY.md, "Timed checks"; the runner's loop)."""
    seeds, planned = as_list(plan["seeds"]), len(as_list(plan["rounds"]))

    def order(seed: int, rnd: int) -> tuple[int, int, int]:
        index = seeds.index(seed) if seed in seeds else len(seeds)
        return (0, index, rnd) if rnd < planned else (1, rnd, index)

    return order


def as_list(value: Any) -> list[int]:
    """plan `seeds`/`rounds`: a list of values, or a count meaning 0..count-1."""
    return [int(v) for v in value] if isinstance(value, list) else list(range(int(value)))


def rounds_of(plan: dict[str, Any], case: dict[str, Any]) -> list[int]:
    """Rounds of one case: its own `rounds` count when plan.json has one, else plan `rounds`."""
    return as_list(case["rounds"] if case.get("rounds") is not None else plan["rounds"])


def clock_threshold(plan: dict[str, Any]) -> tuple[Any, float, float | None]:
    """(max_sm_mhz, throttle_fraction, threshold MHz or None) from plan `clocks`."""
    clocks = plan.get("clocks") or {}
    top, fraction = clocks.get("max_sm_mhz"), float(clocks.get("throttle_fraction", 0.9))
    return top, fraction, (None if top is None else fraction * float(top))


def is_throttled(sample: Sample, threshold: float | None) -> bool:
    return threshold is not None and sample.sm_mhz is not None and sample.sm_mhz < threshold


def calibration_arm(name: str) -> tuple[str, str] | None:
    kind, sep, base = name.partition(":")
    return (kind, base) if kind in ("aa", "slow") and sep else None
