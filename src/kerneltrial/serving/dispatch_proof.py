"""Proof of dispatch: did a server run the operator implementations its arm claims?

A launch whose environment sets KERNELTRIAL_DISPATCH_LOG=DIR leaves one call record per
server process in DIR (kerneltrial/plugins/records.py). `check_launch(DIR, arm_env)` reads
them and decides, from the arm's own environment, what should have run:

- the vLLM plugin: KERNELTRIAL_VLLM_OPS=rms_norm,silu_and_mul swaps those ops in;
- vllm-plugin-FL: VLLM_FL_PER_OP whose first token for an op is `vendor:kerneltrial` or
  `impl:vendor.kerneltrial` selects ours (a VLLM_FL_CONFIG file is not read here);
- the implementation is KERNELTRIAL_KERNELS (a candidate's module) or kerneltrial's own.

Valid only if every intended op was served (> 0 calls) by the intended implementation, no
call of ours raised (the FL dispatcher then falls back to another implementation), no layer
was handed back to vLLM's own code, no plugin failed to load, and no op the arm does not
select ran our kernels (a baseline that ran them is not a baseline). Otherwise invalid,
with the first reason found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kerneltrial.plugins import (
    DISPATCH_OPS,
    FALLBACK,
    FL_IMPL_ID,
    FL_VENDOR,
    OPS_ENV,
    impl_label,
    kernels_module,
    parse_ops,
)
from kerneltrial.plugins.records import ProcessRecord

FL_PER_OP_ENV = "VLLM_FL_PER_OP"
FL_SELECTORS = (f"vendor:{FL_VENDOR}", f"impl:{FL_IMPL_ID}")


@dataclass(frozen=True)
class Served:
    """Calls of one kernel-level op by one implementation, summed over the server's processes."""

    op: str
    impl: str
    calls: int
    errors: int


@dataclass(frozen=True)
class DispatchVerdict:
    valid: bool
    reason: str
    intended: dict[str, str]  # dispatch op -> implementation label
    served: tuple[Served, ...]
    processes: int


def intended_ops(env: Mapping[str, str]) -> dict[str, str]:
    """Dispatch op -> implementation label that the arm's environment selects (empty: baseline)."""
    label = impl_label(kernels_module(env))
    ops = set(parse_ops(env.get(OPS_ENV, "")))
    for part in env.get(FL_PER_OP_ENV, "").split(";"):
        op, _, order = part.partition("=")
        tokens = [t.strip() for t in order.split("|") if t.strip()]
        if op.strip() in DISPATCH_OPS and tokens and tokens[0] in FL_SELECTORS:
            ops.add(op.strip())
    return {op: label for op in sorted(ops)}


def read_records(directory: Path) -> list[ProcessRecord]:
    """Every dispatch-PID.json in `directory` (none: empty list); ValueError on a bad file."""
    if not directory.is_dir():
        return []
    return [ProcessRecord.from_json(p.read_text(), str(p)) for p in sorted(directory.glob("dispatch-*.json"))]


def served(records: list[ProcessRecord]) -> tuple[Served, ...]:
    totals: dict[tuple[str, str], list[int]] = {}
    for rec in records:
        for c in rec.counts:
            t = totals.setdefault((c.op, c.impl), [0, 0])
            t[0] += c.calls
            t[1] += c.errors
    return tuple(Served(op, impl, n, e) for (op, impl), (n, e) in sorted(totals.items()))


def decide(records: list[ProcessRecord], intended: Mapping[str, str]) -> DispatchVerdict:
    rows = served(records)

    def verdict(valid: bool, reason: str) -> DispatchVerdict:
        return DispatchVerdict(valid, reason, dict(intended), rows, len(records))

    for rec in records:
        for load in rec.loads:
            if load.error:
                return verdict(False, f"plugin {load.plugin} failed to load in pid {rec.pid}: {load.error}")
    if intended and not records:
        return verdict(
            False,
            "no dispatch records: no kerneltrial plugin loaded in the server (is kerneltrial installed in the server's venv?)",
        )
    for r in rows:
        if r.impl == FALLBACK:
            return verdict(False, f"{r.op}: {r.calls} layer(s) handed back to vLLM's own code (fallback)")
        if r.errors:
            return verdict(
                False, f"{r.op}: {r.errors} of {r.calls} calls of {r.impl} raised (the dispatcher falls back)"
            )
    kernel_ops = {k: op for op, ks in DISPATCH_OPS.items() for k in ks}
    for r in rows:  # every recorded implementation is a kerneltrial plugin's
        op = kernel_ops.get(r.op, r.op)
        if intended.get(op) != r.impl and r.calls:
            return verdict(False, f"{r.op}: {r.calls} calls of {r.impl}, which this arm does not select for {op}")
    for op, label in intended.items():
        n = sum(r.calls for r in rows if r.impl == label and kernel_ops.get(r.op) == op)
        if n == 0:
            return verdict(False, f"{op}: selected {label} served no calls")
    if not intended:
        return verdict(True, "baseline: no kerneltrial kernel served a call")
    detail = "; ".join(f"{r.op}: {r.calls} calls of {r.impl}" for r in rows if r.impl in intended.values())
    return verdict(True, detail)


def check_launch(directory: Path, arm_env: Mapping[str, str]) -> DispatchVerdict:
    """The verdict for one launch: its records in `directory`, its arm's environment."""
    try:
        intended = intended_ops(arm_env)
        records = read_records(directory)
    except ValueError as e:
        return DispatchVerdict(False, str(e), {}, (), 0)
    return decide(records, intended)
