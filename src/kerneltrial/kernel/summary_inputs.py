"""The raw files a kernel summary is computed from, parsed (kernel/summary.py), and the plan's
facts every part of it asks: the control arm, a case's rounds and planned units, which arms take a
case's layout, the per-call times of each (case, arm)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kerneltrial import stats
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.hashing import sha256_bytes
from kerneltrial.rundir.layout import (
    COPY_MATCHED,
    HOST,
    PARTIAL_LAYOUT_KINDS,
    ROUNDTRIP,
    ROUNDTRIP_COLUMNS,
    TIMED_CHECKS,
)

TIMING_COLUMNS = ["case", "seed", "round", "position", "arm", "calls", "ns"]
CLOCK_COLUMNS = ["sm_mhz", "mem_mhz"]  # optional; empty where the clock is unknown
CEILING_COLUMNS = ["kind", "sample", "bytes", "ns"]
HOST_COLUMNS = ["case", "arm", "sample", "calls", "ns", "behind"]


@dataclass(frozen=True)
class TimedCheck:
    """One row of timed_checks.jsonl: the check of one timing sample's output (the fields the summary uses)."""

    case: str
    seed: int
    round: int
    arm: str
    passed: bool
    message: str


@dataclass(frozen=True)
class RunFiles:
    """The raw files of a kernel run directory, parsed."""

    plan: dict[str, Any]
    protocol_sha256: str
    correctness: list[dict[str, Any]]
    timings: pd.DataFrame
    ceilings: pd.DataFrame
    timed_checks: list[TimedCheck] | None = None  # None: the run has no timed_checks.jsonl
    host: pd.DataFrame | None = None  # None: the run has no host.csv
    roundtrip: pd.DataFrame | None = None  # None: the run has no roundtrip.csv


def _require(run_dir: Path, name: str) -> Path:
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir}: missing {name}; not a complete kernel run directory")
    return path


def _read_csv(path: Path, columns: list[str], dtypes: dict[str, type]) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype=dtypes)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise RunDirError(f"{path}: missing column(s) {missing}; expected header {','.join(columns)}")
    return frame


def load_run(run_dir: Path) -> RunFiles:
    """Parse the raw files of a kernel run directory; RunDirError names anything missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    protocol_bytes = _require(run_dir, "protocol.toml").read_bytes()
    plan = read_json(_require(run_dir, "plan.json"))
    correctness = read_jsonl(_require(run_dir, "correctness.jsonl"))
    timings_path = _require(run_dir, "timings.csv")
    timings = _read_csv(timings_path, TIMING_COLUMNS, {"case": str, "arm": str})
    for column in CLOCK_COLUMNS:
        if column not in timings.columns:
            timings[column] = float("nan")  # a run directory from before clocks were recorded
        try:
            timings[column] = pd.to_numeric(timings[column]).astype(float)
        except (TypeError, ValueError) as error:
            raise RunDirError(f"{timings_path}: column {column} is not MHz or empty ({error})") from error
    ceilings = _read_csv(_require(run_dir, "ceilings.csv"), CEILING_COLUMNS, {"kind": str})
    timed_checks = _timed_checks(run_dir / TIMED_CHECKS) if (run_dir / TIMED_CHECKS).is_file() else None
    host = _read_csv(run_dir / HOST, HOST_COLUMNS, {"case": str, "arm": str}) if (run_dir / HOST).is_file() else None
    path = run_dir / ROUNDTRIP
    roundtrip = _read_csv(path, list(ROUNDTRIP_COLUMNS), {"case": str}) if path.is_file() else None
    return RunFiles(plan, sha256_bytes(protocol_bytes), correctness, timings, ceilings, timed_checks, host, roundtrip)


def _timed_checks(path: Path) -> list[TimedCheck]:
    rows = []
    for number, row in enumerate(read_jsonl(path), start=1):
        try:
            rows.append(
                TimedCheck(
                    str(row["case"]),
                    int(row["seed"]),
                    int(row["round"]),
                    str(row["arm"]),
                    row["passed"] is True,
                    str(row.get("message") or ""),
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            raise RunDirError(
                f"{path}: row {number}: not a timed-check row ({error!r}); expected the fields case, "
                "seed, round, arm, values_seed, passed, max_abs, max_rel, ulp, message"
            ) from error
    return rows


def timing_label(backend: str, is_gpu: bool) -> str:
    """What the timings measure, in words; CPU runs say plainly they are not GPU performance."""
    if not is_gpu:
        if backend == "host-clock":
            return "host clock, Triton interpreter: NOT GPU performance"
        return f"{backend} without a GPU: NOT GPU performance"
    if backend == "cuda-graph":
        return "CUDA events on GPU, replayed as CUDA graphs (launch overhead amortised)"
    return "CUDA events on GPU"


def count(value: Any) -> int:
    """plan.json `seeds` or `rounds`: a list of them or their count."""
    return len(value) if isinstance(value, list) else int(value)


def case_rounds(plan: dict[str, Any], case: dict[str, Any] | None = None) -> int:
    """Rounds run for a case: its own `rounds` (the noise rule may have added some), else plan `rounds`."""
    if case is not None and case.get("rounds") is not None:
        return int(case["rounds"])
    return count(plan["rounds"])


def planned_units(plan: dict[str, Any], case: dict[str, Any] | None = None) -> int:
    """Number of (seed, round) units of a case (or of the plan); `seeds`/`rounds` may be a list or a count."""
    return count(plan["seeds"]) * case_rounds(plan, case)


def control_arm(plan: dict[str, Any]) -> str:
    """Name of the single available control arm; RunDirError otherwise."""
    controls = [arm for arm in plan["arms"] if arm["kind"] == "control"]
    if len(controls) != 1 or not controls[0]["available"]:
        names = [arm["name"] for arm in controls]
        raise RunDirError(f"plan.json: need exactly one available arm of kind 'control', found {names}")
    return controls[0]["name"]


def takes_layout(arm: dict[str, Any], case: dict[str, Any]) -> bool:
    """Whether plan.json's arm takes the case's layout: an arm with `layouts` (a peer that only
    takes some, e.g. contiguous rows) is neither checked nor timed in the others."""
    if "layouts" not in arm or arm["kind"] not in PARTIAL_LAYOUT_KINDS:  # a candidate's `layouts` is ignored
        return True
    return case.get("layout") in arm["layouts"]


def correctness_by_case_arm(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((str(row["case"]), row["arm"]), []).append(row)
    return grouped


def unit_series(timings: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """Per-call ns of every (case, arm), indexed by (seed, round) and sorted; duplicates are an error."""
    per_call = timings.assign(per_call=timings["ns"] / timings["calls"])
    result: dict[tuple[str, str], pd.Series] = {}
    for (case, arm), rows in per_call.groupby(["case", "arm"], sort=False):
        series = rows.set_index(["seed", "round"])["per_call"].astype(float).sort_index()
        if series.index.has_duplicates:
            duplicated = sorted(set(series.index[series.index.duplicated()]))
            raise RunDirError(f"timings.csv: case {case!r} arm {arm!r} has duplicate (seed, round) rows {duplicated}")
        result[(case, arm)] = series
    return result


def matched_copies(frame: pd.DataFrame) -> dict[int, float]:
    """GB/s of the copy of each case's traffic (ceilings.csv `copy_matched`, keyed by bytes
    moved); empty for a run from before it was measured."""
    rows = frame[frame["kind"] == COPY_MATCHED]
    return {
        int(moved): stats.ceiling_gbps(group["bytes"].to_numpy(), group["ns"].to_numpy())
        for moved, group in rows.groupby("bytes")
    }
