"""The speed-of-light floor of a case (issue 27, item 3): what a call moving `bytes` could take at
best on the machine of the run, from two figures that run measured itself.

    floor_ns = launch_ns + bytes / copy_gbps        (GB/s is bytes per ns)
    fraction_of_floor = floor_ns / median ns per call of the arm

- launch_ns: the run's Triton launch floor, the median of one-element Triton kernel calls
  (ceilings.csv `triton_launch`): the fixed cost every one of our entry points pays per call.
- copy_gbps: the run's 1 GiB copy rate (ceilings.csv `copy`, median GB/s of a copy that moves
  2 GiB: read 1 GiB, write 1 GiB), the streaming rate of a cold DRAM-bound kernel.
The two terms add: the model charges a whole launch, then the bytes at the best streaming rate
measured. A fraction of 1 is a kernel at the floor, 0.5 one twice as slow. It is a yardstick,
not a bound: a kernel may pass 1 (a read-mostly one streams faster than a copy; a hot-L2 run
reads from cache, so the floor is only reported for cold-L2 runs timed with CUDA events), and
a small case's floor is mostly the launch term, where the same-size copy (ceilings.csv
`copy_matched`) is the closer yardstick.

Runs whose plan.json names the model (`floor`, rundir/layout.py FLOOR_MODEL) record floor_ns
per case and fraction_of_floor per arm (summary/6). Older runs hold the same ceilings, so the
floor of their cases is computed here from summary.json's ceilings (`run_floor`); a run without
a Triton floor (before issue 16) uses torch's one-element `add_` instead, named as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import FLOOR_MODEL
from kerneltrial.rundir.summary_doc import Ceilings, Summary, SummaryCase

TRITON = "Triton"
TORCH_ADD = "torch `add_`"  # the launch floor of runs without a Triton one (plausibility's)


def floor_ns(launch_ns: float | None, copy_gbps: float | None, nbytes: int) -> float | None:
    """The floor of a call moving `nbytes` (module docstring); None when either figure is missing."""
    if launch_ns is None or not copy_gbps:
        return None
    return launch_ns + nbytes / copy_gbps


def fraction_of_floor(floor: float | None, median_ns: float | None) -> float | None:
    """floor / median: 1 at the floor, below 1 slower; None when either is missing."""
    if floor is None or not median_ns:
        return None
    return floor / median_ns


@dataclass(frozen=True)
class CaseFloors:
    """What summary/6 writes (kernel/summary_schemas.py SchemaV6): each case's floor_ns (each arm's fraction is `fraction_of_floor`)."""

    launch_ns: float | None  # the run's Triton launch floor
    copy_gbps: float | None

    @classmethod
    def for_plan(cls, plan: dict[str, Any], launch_ns: float | None, copy_gbps: float | None) -> CaseFloors:
        """The figures for a plan naming FLOOR_MODEL (with the host stage every such plan has)."""
        if plan.get("floor") != FLOOR_MODEL or "host" not in plan:
            raise RunDirError(
                f"plan.json floor {plan.get('floor')!r} (host stage: {'host' in plan}): this kerneltrial "
                f"summarises the floor model {FLOOR_MODEL} of a plan with a host stage; update kerneltrial"
            )
        return cls(launch_ns, copy_gbps)

    def case_floor(self, case_bytes: int) -> float | None:
        """The case's floor_ns (null without the launch floor or the copy rate)."""
        return floor_ns(self.launch_ns, self.copy_gbps, case_bytes)


@dataclass(frozen=True)
class RunFloor:
    """A run's two figures of the model and which launch floor it is."""

    launch_ns: float
    launch: str  # TRITON, or TORCH_ADD for a run without a Triton floor
    copy_gbps: float

    def case_ns(self, nbytes: int) -> float:
        return self.launch_ns + nbytes / self.copy_gbps


def run_floor(ceilings: Ceilings) -> RunFloor | None:
    """The run's floor figures: its Triton launch floor where measured, else torch's `add_`;
    None without a copy rate or any launch floor."""
    if not ceilings.copy_gbps:
        return None
    if ceilings.triton_launch_floor_ns is not None:
        return RunFloor(ceilings.triton_launch_floor_ns, TRITON, ceilings.copy_gbps)
    if ceilings.launch_floor_ns is not None:
        return RunFloor(ceilings.launch_floor_ns, TORCH_ADD, ceilings.copy_gbps)
    return None


def case_floor_ns(summary: Summary, case: SummaryCase) -> float | None:
    """A case's floor: as summary/6 recorded it, else computed from the run's ceilings (`run_floor`)."""
    if summary.records_floor:
        return case.floor_ns
    figures = run_floor(summary.ceilings)
    return None if figures is None else figures.case_ns(case.bytes)
