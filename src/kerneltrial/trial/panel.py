"""The check panel: the cases `check` and the package interface check run when none are named.

On a GPU, the operator's GPU panel. On a CPU, its small panel and one case of more rows than a
grid dimension holds (BEYOND_GRID_ROWS rows of BEYOND_GRID_WIDTH elements, in the operator's
extra-shape form): a kernel wrong above 65535 rows, torch code or not, fails there. Every case
in every layout of the operator; the gate adds its extra shapes to each check (trial/gate.py).

The Triton interpreter runs a kernel's programs one after another, about a millisecond per row
step of a one-row-per-program kernel on this project's machines (the control on 2000 x 8 rows
took 19 s of CPU), so the 65537-row case would take minutes per call for the kernels
kerneltrial ships (controls, candidates, calibration arms): they skip it in the interpreter
(`skip_reason`) and are checked past 65535 rows on the GPU panels (70001 rows). Peers, user
arms and packages are checked on it.
"""

from __future__ import annotations

from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, Impl, Operator

BEYOND_GRID_ROWS = launch.MAX_GRID + 2  # more rows than one grid dimension's programs
BEYOND_GRID_WIDTH = 8  # narrow: the case costs a torch arm a few milliseconds
SHIPPED_KINDS = ("control", "candidate", "calibration")


def beyond_grid_case(op: Operator) -> Case:
    """The CPU panel's case of more than 65535 rows (in the operator's extra-shape form)."""
    shape = op.extra_shape(BEYOND_GRID_ROWS, BEYOND_GRID_WIDTH)
    return Case(shape, op.dtypes[0])


def check_panel(op: Operator, gpu: bool, layouts: list[str] | None = None) -> list[Case]:
    """The cases `check` runs for `op` (see the module doc), in `layouts` (default: every layout)."""
    base = op.gpu_cases if gpu else (*op.small_cases, beyond_grid_case(op))
    return [Case(c.shape, c.dtype, layout) for c in base for layout in (layouts or op.layouts)]


def skip_reason(impl: Impl, case: Case) -> str:
    """Why `impl` is not checked on `case` here ('' when it is): see the module doc."""
    rows = 1
    for size in case.shape[:-1]:
        rows *= size
    if impl.kind in SHIPPED_KINDS and launch.interpreted() and rows > launch.MAX_GRID:
        return (
            f"{case.id} in the Triton interpreter (one program at a time, minutes per call); "
            "the GPU panel checks this kernel past 65535 rows"
        )
    return ""
