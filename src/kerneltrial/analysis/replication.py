"""Replication on PERFORMANCE.md (issue 38 item 2): which panels have more than one run of the same
frozen protocol, whether those runs give each (case, arm) the same verdict, and the flips.

Runs are replicates when their summaries name the same protocol_sha256 (the same protocol.toml,
byte for byte) and the protocol was frozen; an unfrozen protocol's runs are not preregistered and
are left out. Per (case, arm other than the control) timed or judged in every run of the group, the
verdict is the summary's (win, tie, loss, inconclusive) or the status that left the arm without one
(failed correctness, implausible, ...). The runs agree on a (case, arm) when every verdict is the
same; a flip lists each run's verdict and speedup, and its size is the largest speedup over the
smallest among the runs. A panel with one frozen run is listed as not replicated: its verdicts are
one run's (issue 38: a replication of three frozen panels flipped some verdicts, torch.compile's
among them, so one run is not yet evidence a user can rely on).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kerneltrial.kernel.report import markdown_table
from kerneltrial.rundir.summary_doc import ArmFigures, Summary, read_summary

SHOWN_FLIPS = 8  # per group on the page; the count says how many there are


@dataclass(frozen=True)
class Flip:
    """A (case, arm) whose runs gave different verdicts."""

    case: str
    arm: str
    verdicts: tuple[str, ...]
    speedups: tuple[float | None, ...]

    @property
    def size(self) -> float | None:
        """The largest speedup over the smallest among the runs (None unless every run has one)."""
        values = [s for s in self.speedups if s is not None]
        if len(values) != len(self.speedups) or min(values) <= 0:
            return None
        return max(values) / min(values)


@dataclass(frozen=True)
class ReplicateGroup:
    """The runs of one frozen protocol and how their verdicts compare."""

    runs: tuple[str, ...]
    compared: int  # (case, arm) pairs present in every run
    flips: tuple[Flip, ...]


def verdict_of(entry: ArmFigures) -> str:
    """The arm's verdict, or the status that left it without one."""
    return entry.verdict if entry.status == "timed" and entry.verdict else entry.status


def compare_runs(named: list[tuple[str, Summary]]) -> ReplicateGroup:
    """Every (case, arm) but the control present in all of `named`, in the first run's order."""
    first = named[0][1]
    compared, flips = 0, []
    for case in first.cases:
        entries_per_run = [{c.case: c for c in s.cases}.get(case.case) for _, s in named]
        for arm in case.arms:
            if arm == first.control:
                continue
            entries = [c.arms.get(arm) if c is not None else None for c in entries_per_run]
            if any(e is None for e in entries):
                continue
            present = [e for e in entries if e is not None]
            compared += 1
            verdicts = tuple(verdict_of(e) for e in present)
            if len(set(verdicts)) > 1:
                flips.append(Flip(case.case, arm, verdicts, tuple(e.speedup for e in present)))
    return ReplicateGroup(tuple(name for name, _ in named), compared, tuple(flips))


def replicate_groups(run_dirs: list[Path]) -> tuple[list[ReplicateGroup], list[str]]:
    """The groups of two or more runs of one frozen protocol, and the runs of a frozen protocol run once."""
    by_protocol: dict[str, list[tuple[str, Summary]]] = {}
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        if summary.frozen_at is not None:
            by_protocol.setdefault(summary.protocol_sha256, []).append((Path(run_dir).name, summary))
    groups = [compare_runs(named) for named in by_protocol.values() if len(named) > 1]
    single = [named[0][0] for named in by_protocol.values() if len(named) == 1]
    return groups, single


def _flip_cell(flip: Flip) -> str:
    speedups = ", ".join("–" if s is None else f"{s:.3f}" for s in flip.speedups)
    size = "" if flip.size is None else f", {flip.size:.3f}x apart"
    return f"`{flip.case}` `{flip.arm}`: {' / '.join(flip.verdicts)} ({speedups}{size})"


def replication_section(run_dirs: list[Path]) -> list[str]:
    """PERFORMANCE.md's replication section over the current kernel runs `run_dirs`."""
    groups, single = replicate_groups(run_dirs)
    rows = []
    for group in groups:
        shown = [_flip_cell(f) for f in group.flips[:SHOWN_FLIPS]]
        more = len(group.flips) - len(shown)
        rows.append(
            [
                ", ".join(f"`{r}`" for r in group.runs),
                str(group.compared),
                str(group.compared - len(group.flips)),
                "; ".join(shown) + (f"; and {more} more" if more > 0 else "") if shown else "none",
            ]
        )
    lines = [
        "## Replication",
        "",
        "Runs of the same frozen protocol (the same protocol.toml) are replicates; a verdict is evidence where "
        "they agree. Per group: the (case, arm) pairs present in every run (the control left out), how many got "
        "the same verdict in every run, and each flip with every run's verdict and speedup over the control "
        "(the size: the largest speedup over the smallest). `kerneltrial compare A B` tells each change from "
        "the raw samples.",
        "",
    ]
    if rows:
        lines += [*markdown_table(["runs", "(case, arm) pairs", "same verdict", "flips"], rows), ""]
    else:
        lines += ["No frozen protocol here has been run twice: every verdict on these pages is one run's.", ""]
    if single:
        lines += [f"Not replicated (one frozen run): {', '.join(f'`{name}`' for name in sorted(single))}.", ""]
    return lines
