"""The typed, frozen record of a model run's summary.json (`ModelSummary`), its reader
(`read_model_summary`) and its writer (Document.as_json, rundir/documents.py write_document):
model/summary.py builds the record, analysis/model_report.py and model/verify.py read it.

One record holds every version still read: `kerneltrial.model-summary/3` (graph mode, fresh
inputs and their timed checks, the weight-read floor), `/2` (results/h200/minicpm5-2b-model:
paired ratios with a Student-t interval, device time and drift) and `/1` (the first runs,
results/archive/: a bootstrap interval, attribution against `total_ns` and `wall_ns`). A key a
version did not record is left unset (None) by the reader and not written back, so that a
document read and written again is its own bytes; a `/3` document must hold every key `/3` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, model_validator

from kerneltrial.rundir.documents import Document, document_data, validate
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import SUMMARY
from kerneltrial.rundir.summary_doc import TimedCheckCounts

MODEL_SUMMARY_V1 = "kerneltrial.model-summary/1"
MODEL_SUMMARY_V2 = "kerneltrial.model-summary/2"
MODEL_SUMMARY_V3 = "kerneltrial.model-summary/3"
ModelSummaryVersion = Literal[
    "kerneltrial.model-summary/1", "kerneltrial.model-summary/2", "kerneltrial.model-summary/3"
]
MODEL_SUMMARY_VERSIONS: tuple[str, ...] = get_args(ModelSummaryVersion)
REFERENCES = ("eager", "torch_eager", "kerneltrial")  # the arms every other arm is compared with, in key order


class PairedRatio(Document):
    """One arm against one reference in one case: reference time / arm time."""

    speedup: float = Field(
        description="The geometric mean of the per-round ratios (`/1`: median(reference) / median(arm))."
    )
    ci: tuple[float, float] | None = Field(
        description="Its interval: Student-t on the ratios' logs (`/1`: a paired bootstrap); null with one round."
    )
    verdict: Literal["win", "tie", "loss", "inconclusive"] = Field(
        description="Against the tie band: a tie only when the interval lies inside it; inconclusive without one."
    )
    rounds: int = Field(description="Rounds paired.")


class ModelAttribution(Document):
    """Where the profiled call's time went (attribution.csv)."""

    total_ns: int | None = Field(default=None, description="`/1` only: the profiled call's device time.")
    wall_ns: int | None = Field(default=None, description="`/1` only: the profiled call's wall time.")
    regions_ns: dict[str, int] = Field(
        description="Device time inside each routed operator; {}: a graph replay's kernels could not be matched."
    )
    device_ns: int | None = Field(
        default=None,
        description="The profiled call's device time (on a CPU: its host time); absent in `/1`.",
    )
    share: float | None = Field(
        description="The routed operators' time over the median wall time per call (`/1`: over `total_ns`); null without regions."
    )
    device_busy: float | None = Field(
        default=None,
        description="device_ns over the median wall time (below 0.8: host-bound); null on a CPU; absent in `/1`.",
    )


class ModelArm(Document):
    """One timed arm in one case."""

    median_ns: float = Field(description="Median over the rounds of ns per call.")
    samples: int = Field(description="Rounds timed.")
    tokens_per_s: float = Field(description="tokens_per_call over the median, per second.")
    attribution: ModelAttribution | None = Field(description="The profiled call's split; null: not profiled.")
    vs_floor: float | None = Field(default=None, description="The median over the case's floor ns (`/3`).")
    device_vs_floor: float | None = Field(
        default=None, description="The profiled call's device time over the floor (`/3`); null on a CPU or unprofiled."
    )
    vs_eager: PairedRatio | None = Field(
        default=None, description="Against eager (the model's own code); absent for eager, or where eager is not timed."
    )
    vs_torch_eager: PairedRatio | None = Field(
        default=None,
        description="Against torch_eager (the routed structure, torch formulas); absent for it, or where it is not timed.",
    )
    vs_kerneltrial: PairedRatio | None = Field(
        default=None, description="Against kerneltrial (never in `/1`); absent for it, or where it is not timed."
    )

    def against(self) -> dict[str, PairedRatio]:
        """The comparisons the entry holds, by reference, in key order."""
        return {ref: ratio for ref in REFERENCES if (ratio := getattr(self, f"vs_{ref}")) is not None}


class WeightFloor(Document):
    bytes: int = Field(description="The bytes a call must read (plan.json `floor_bytes`, summed).")
    ns: float = Field(description="Those bytes at the run's copy rate.")


class ModelCase(Document):
    """One (case, mode) of the plan."""

    phase: Literal["prefill", "decode"] = Field(description="The plan's phase.")
    mode: Literal["eager", "graph"] | None = Field(
        default=None, description="`eager`, or `graph` (ids ending in `-graph`, `/3`); absent before `/3`."
    )
    tokens_per_call: int = Field(description="Tokens a call processes.")
    floor: WeightFloor | None = Field(default=None, description="The weight-read floor (`/3`).")
    drift: float | None = Field(
        default=None,
        description="Median over arms of median(second half of rounds) / median(first half); null under 2 rounds; absent in `/1`.",
    )
    excluded: dict[str, str] | None = Field(
        default=None,
        description="Each timed arm with no figures here and why: not captured, or its first failed timed check (`/3`).",
    )
    arms: dict[str, ModelArm] = Field(description="Each arm's figures, by name.")


class ArmGate(Document):
    passed: bool = Field(description="Whether the arm passed the correctness gate.")
    message: str = Field(description="Why it failed; empty when it passed.")


class CopyRate(Document):
    bytes: int = Field(description="Bytes per copy (read + written).")
    samples: int = Field(description="copies.csv rows.")
    gbps: float = Field(description="Their median rate (bytes per ns).")


class ModelSummary(Document):
    schema_: ModelSummaryVersion = Field(
        alias="schema",
        description="`kerneltrial.model-summary/3`; `/1` and `/2` are still read. A key marked `/3` (`/2` on) is absent before that version, read as null, and required in a `/3` document.",
    )
    method: str | None = Field(default=None, description="How speedups are estimated (`/2` on).")
    timing_label: str = Field(description="What the times measure.")
    graph_label: str | None = Field(default=None, description="What graph mode replays on this device (`/3`).")
    copy_rate: CopyRate | None = Field(default=None, alias="copy", description="The run's copy rate (`/3`).")
    cases: dict[str, ModelCase] = Field(description="Each (case, mode)'s figures, by id.")
    correctness: dict[str, ArmGate] = Field(description="Each available arm's gate verdict.")
    unavailable: dict[str, str] = Field(description="Each arm that could not run here, with the reason.")
    timed_checks: TimedCheckCounts | None = Field(default=None, description="The timed checks' counts (`/3`).")

    @model_validator(mode="after")
    def _newest_is_whole(self) -> ModelSummary:
        if self.schema_ == MODEL_SUMMARY_V3 and (missing := unrecorded_v3(self)):
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(
                f"a {MODEL_SUMMARY_V3} document lacks {', '.join(missing[:3])}{more}; "
                "rebuild it from the run's rows (kerneltrial.model.summary.build)"
            )
        return self


def _lacks(record: Document, where: str, keys: tuple[str, ...], nullable: tuple[str, ...] = ()) -> list[str]:
    """The `keys` and `nullable` keys `record` does not hold, and the `keys` it holds as null."""
    return [
        f"{where}{type(record).model_fields[key].alias or key}"
        for key in keys + nullable
        if key not in record.model_fields_set or (key in keys and getattr(record, key) is None)
    ]


def unrecorded_v3(summary: ModelSummary) -> list[str]:
    """The keys `/3` writes that `summary` lacks, or holds as null where `/3` writes a value (dotted)."""
    missing = _lacks(summary, "", ("method", "graph_label", "copy_rate", "timed_checks"))
    for cid, case in summary.cases.items():
        missing += _lacks(case, f"cases.{cid}.", ("mode", "floor", "excluded"), ("drift",))
        for name, arm in case.arms.items():
            missing += _lacks(arm, f"cases.{cid}.arms.{name}.", ("vs_floor",), ("device_vs_floor",))
            if arm.attribution is not None:
                where = f"cases.{cid}.arms.{name}.attribution."
                missing += _lacks(arm.attribution, where, ("device_ns",), ("device_busy",))
    return missing


def read_model_summary(run_dir: Path) -> ModelSummary:
    """summary.json of the model run at `run_dir`; RunDirError naming the file and its first bad key."""
    data = document_data(run_dir, SUMMARY)
    if data.get("schema") not in MODEL_SUMMARY_VERSIONS:
        raise RunDirError(
            f"{Path(run_dir) / SUMMARY}: schema {data.get('schema')!r}; model reports read "
            f"{', '.join(MODEL_SUMMARY_VERSIONS)} (rebuild it: kerneltrial.model.summary.build)"
        )
    return validate(ModelSummary, data, Path(run_dir) / SUMMARY)
