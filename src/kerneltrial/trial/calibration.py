"""Calibration: can this set-up tell an arm from itself, and see a known slowdown?

Two kinds of arm, named after an existing arm ARM:
- `aa:ARM` — the same callable timed as a separate arm (A/A): any win/loss verdict against
  ARM is a false positive;
- `slow:ARM` — ARM followed by `Delay`, extra device work sized per case to
  `injected_slowdown` of ARM's time: it should be called a loss.
`kerneltrial calibrate PROTOCOL` runs the control against both with the protocol's
settings (`calibration_protocol`, run by `runner.calibrate`); another protocol's `calibration_run` names such a run,
and `require_calibration` refuses to run until it passed on the same operator and device.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerneltrial.ops.registry import Case, Impl, Operator
from kerneltrial.rundir.documents import read_provenance
from kerneltrial.rundir.layout import SUMMARY
from kerneltrial.rundir.summary_doc import read_summary
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.timing import Timer


class CalibrationError(RuntimeError):
    """A calibration requirement is not met; the message says which and what to do."""


@dataclass
class Delay:
    """Extra work of a known duration appended to a `slow:` arm (`ns` is set per case)."""

    device: torch.device
    ns: float = 0.0
    cycles_per_ns: float = 0.0

    def __call__(self) -> None:
        if self.device.type == "cuda":
            # Always a launch, even of 0 cycles: its launch gap is part of the measured
            # overhead that `size_delay` subtracts.
            torch.cuda._sleep(max(0, int(self.ns * self.cycles_per_ns)))
        elif self.ns > 0:
            end = time.perf_counter_ns() + self.ns
            while time.perf_counter_ns() < end:
                pass

    def measure_rate(self) -> None:
        """Measure the GPU's spin rate (cycles per ns) so a delay in ns becomes a cycle count."""
        if self.device.type != "cuda":
            return
        torch.cuda._sleep(1_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
        self.cycles_per_ns = 50_000_000 / (start.elapsed_time(end) * 1e6)


def calibration_arm(op: Operator, name: str, delay: Delay) -> Impl:
    """`aa:ARM` (an A/A copy of ARM) or `slow:ARM` (ARM followed by `delay`), with ARM's contract
    (layouts, widths, alignment): the gate draws the copy what it draws ARM."""
    prefix, _, base_name = name.partition(":")
    base = op.impl(base_name)
    if prefix == "aa":
        return _copy(op, base, name, base.resolve, f"A/A copy of {base_name}")

    def load() -> Any:
        fn = base.resolve()

        def slowed(*args: Any) -> Any:
            out = fn(*args)
            delay()
            return out

        return slowed

    return _copy(op, base, name, load, f"{base_name} plus an injected delay")


def _copy(op: Operator, base: Impl, name: str, loader: Callable[[], Any], doc: str) -> Impl:
    return Impl(
        op=op.name,
        name=name,
        kind="calibration",
        loader=loader,
        doc=doc,
        layouts=base.layouts,
        widths=base.widths,
        aligned=base.aligned,
    )


def median_call_ns(p: proto.Protocol, op: Operator, timer: Timer, case: Case, fn: Any, device: torch.device) -> float:
    """Median of seven single-call samples of `fn` on the case's first-seed inputs."""
    inputs = op.make_inputs(case, p.seeds[0], device)
    for _ in range(p.warmup):
        fn(*inputs.values())
    ns = float(np.median([timer.sample(lambda: fn(*inputs.values()), 1) for _ in range(7)]))
    timer.release()
    return ns


def size_delay(
    p: proto.Protocol, op: Operator, timer: Timer, case: Case, timed: list[Impl], delay: Delay, device: torch.device
) -> dict[str, float]:
    """Plan fields of a case with a `slow:` arm: the target extra time (`injected_delay_ns` =
    injected_slowdown x one call of the base) and the spin that realises it once the measured
    cost of an empty delay is subtracted (`delay_spin_ns`, never negative)."""
    slow = [a for a in timed if a.name.startswith("slow:")]
    if not slow:
        return {}
    base_ns = median_call_ns(p, op, timer, case, op.impl(slow[0].name.partition(":")[2]).resolve(), device)
    target = p.injected_slowdown * base_ns
    delay.ns = 0.0
    empty = median_call_ns(p, op, timer, case, slow[0].resolve(), device) - base_ns
    return {
        "injected_delay_ns": target,
        "delay_overhead_ns": max(0.0, empty),
        "delay_spin_ns": max(0.0, target - max(0.0, empty)),
    }


def require_calibration(p: proto.Protocol, protocol_path: Path, device_name: str | None) -> None:
    """Refuse to run when the protocol names a calibration run that did not pass, or one
    made for another operator or on another device."""
    if p.calibration_run is None:
        return
    run = protocol_path.parent / p.calibration_run
    if not (run / SUMMARY).exists():
        raise CalibrationError(
            f"calibration_run {p.calibration_run!r}: no summary.json in {run}; run `kerneltrial calibrate` first"
        )
    summary = read_summary(run)
    calibration = summary.calibration
    if calibration is None or not calibration.passed:
        raise CalibrationError(
            f"calibration_run {p.calibration_run!r} did not pass ({calibration.sentence if calibration else 'no calibration section'}); this run does not report until it does"
        )
    if summary.op not in (None, p.op):
        raise CalibrationError(f"calibration_run {p.calibration_run!r} calibrated {summary.op!r}, not {p.op!r}")
    calibrated_on = read_provenance(run).device.gpu
    if calibrated_on != device_name:
        raise CalibrationError(
            f"calibration_run {p.calibration_run!r} ran on {calibrated_on or 'a CPU'}, this run is on {device_name or 'a CPU'}; calibrate here first"
        )


def calibration_protocol(protocol_path: Path) -> str:
    """The protocol's settings with arms: control, an A/A copy of it, and the control slowed down."""
    import tomli_w

    data = tomllib.loads(protocol_path.read_text())
    control = data.get("control", "control")
    data.update(
        name=f"{data.get('name', 'trial')}-calibration",
        phase="exploratory",
        candidates=[f"aa:{control}", f"slow:{control}"],
    )
    for key in ("calibration_run", "exploratory_seeds", "isolate"):  # its arms run in kerneltrial's process
        data.pop(key, None)
    text = tomli_w.dumps(data)
    proto.parse(text, f"calibration of {protocol_path}")
    return text
