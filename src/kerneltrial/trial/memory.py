"""Peak memory per arm (issue 40): what each timed call of an arm allocates beyond what was
allocated when it started, on CUDA, in the harness's process.

Around every call j of a timed sample (`PeakMemory` wraps the sample's hooks, trial/timed.py),
after the untimed `before(j)` hook and before the call: the caching allocator's allocated bytes
are read and its peak reset (`torch.cuda.reset_peak_memory_stats`); after the call, before
`after(j)`: its peak (`torch.cuda.max_memory_allocated`) less those bytes is the call's own extra
peak: its output and any workspace, nothing of the harness's (the value sets written before the
call and the checked output kept after it are outside the window). A sample's figure is the
largest over its calls (timings.csv `peak_bytes`); the summary's, per (case, arm), the largest
over the arm's samples there.

Not measured (the column empty, the figure null), each for its reason:
- on a CPU: the Triton interpreter allocates host memory, which no allocator counter sees;
- under `cuda-graph`: a replay allocates nothing; the graph's memory was reserved from its
  private pool at capture, outside every sample, so a zero would be no figure of the arm;
- for an isolated arm (trial/worker.py): its calls allocate in its own process, whose allocator
  counters the arm's own code can reset or rewrite; a figure read there would be the arm's word,
  not a measurement, and the harness's allocator never sees the worker's allocations.
plan.json `peak_memory` says whether the run measured it (true: CUDA events on a GPU); a run
without the key (before issue 40) has no `peak_bytes` column.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kerneltrial.trial.timing import Hooks, Timer


def measured(timer: Timer) -> bool:
    """plan.json `peak_memory`: the run measures peak memory (on a GPU, not under `cuda-graph`)."""
    return timer.is_gpu and timer.name != "cuda-graph"


@dataclass
class PeakMemory:
    """The sample's hooks with each call's extra peak measured around the call (module docstring)."""

    inner: Hooks
    most: int = 0  # the largest extra peak of a call so far, bytes
    _allocated: int = 0  # bytes allocated when the current call started

    def _before(self, j: int) -> None:
        self.inner.before(j)
        self._allocated = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def _after(self, j: int) -> None:
        self.most = max(self.most, torch.cuda.max_memory_allocated() - self._allocated)
        self.inner.after(j)

    @property
    def hooks(self) -> Hooks:
        return Hooks(before=self._before, after=self._after)
