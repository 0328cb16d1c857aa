"""Proof of dispatch: did a server run the operator implementations its arm claims?

A launch whose environment sets KERNELTRIAL_DISPATCH_LOG=DIR leaves one call record per
server process in DIR (kerneltrial/plugins/records.py). `check_launch(DIR, arm_env)` reads
them and decides, from the arm's own environment, what should have run:

- the vLLM plugin: KERNELTRIAL_VLLM_OPS=rms_norm,silu_and_mul swaps those ops in;
- vllm-plugin-FL: an op whose order, as the plugin's policy reads it (fl_policy.py: VLLM_FL_CONFIG's
  file, then VLLM_FL_OP_CONFIG's, then VLLM_FL_PER_OP, then the platform table; the vendor filters),
  starts with `vendor:kerneltrial` or `impl:vendor.kerneltrial` selects ours; the verdict records
  every dispatch op's order and where it came from (`selection`);
- the implementation is KERNELTRIAL_KERNELS (a candidate's module) or kerneltrial's own.

Valid only if every intended op was served (> 0 calls) by the intended implementation, no
call of ours raised (the FL dispatcher then falls back to another implementation), no layer
was handed back to vLLM's own code, no plugin failed to load, and no op the arm does not
select ran our kernels (a baseline that ran them is not a baseline). Otherwise invalid,
with the first reason found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kerneltrial.plugins import (
    DISPATCH_OPS,
    FALLBACK,
    FL_VENDOR,
    OPS_ENV,
    impl_label,
    kernels_module,
    parse_ops,
)
from kerneltrial.plugins.records import OpCount, ProcessRecord
from kerneltrial.serving.fl_policy import FILE_ENVS, Platform, selection

FL_PER_OP_ENV = "VLLM_FL_PER_OP"


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
    selection: dict[str, str] = field(default_factory=dict)  # dispatch op -> "order (where it came from)"


Files = Mapping[str, str | None]  # VLLM_FL_CONFIG / VLLM_FL_OP_CONFIG -> the file's text (None: not a file)


def fl_selection(env: Mapping[str, str], platform: Platform | None, files: Files | None) -> dict[str, str]:
    """Each dispatch op's vllm-plugin-FL order as the policy reads it, and its source (empty when the
    arm sets none of the plugin's selection variables and no platform table is stated)."""
    if not any(env.get(v) for v in (FL_PER_OP_ENV, *FILE_ENVS)) and platform is None:
        return {}
    sel = selection(env, platform, files or {})
    out = {}
    for op in sorted(DISPATCH_OPS):
        order, source = sel.order(op)
        shown = "|".join(order) if order is not None else "unknown"
        out[op] = f"{shown} ({source}" + ("" if sel.ours_allowed() else f"; the vendor filters drop {FL_VENDOR}") + ")"
    return out


def intended_ops(
    env: Mapping[str, str], platform: Platform | None = None, files: Files | None = None
) -> dict[str, str]:
    """Dispatch op -> implementation label that the arm's environment selects (empty: baseline):
    KERNELTRIAL_VLLM_OPS, and the ops vllm-plugin-FL's policy gives to vendor kerneltrial first.
    SelectionError when a selection file the policy reads is missing or malformed."""
    label = impl_label(kernels_module(env))
    ops = set(parse_ops(env.get(OPS_ENV, "")))
    if any(env.get(v) for v in (FL_PER_OP_ENV, *FILE_ENVS)) or platform is not None:
        sel = selection(env, platform, files or {})
        ops |= {op for op in DISPATCH_OPS if sel.selects_ours(op)}
    return {op: label for op in sorted(ops)}


def read_records(directory: Path) -> list[ProcessRecord]:
    """Every dispatch-PID.json in `directory` (none: empty list); ValueError on a bad file."""
    if not directory.is_dir():
        return []
    return [ProcessRecord.from_json(p.read_text(), str(p)) for p in sorted(directory.glob("dispatch-*.json"))]


def summed(counts: Iterable[OpCount | Served]) -> tuple[Served, ...]:
    """Calls and errors per (op, implementation), summed over `counts`, sorted by op and implementation."""
    totals: dict[tuple[str, str], list[int]] = {}
    for c in counts:
        t = totals.setdefault((c.op, c.impl), [0, 0])
        t[0] += c.calls
        t[1] += c.errors
    return tuple(Served(op, impl, n, e) for (op, impl), (n, e) in sorted(totals.items()))


def served(records: list[ProcessRecord]) -> tuple[Served, ...]:
    return summed(c for rec in records for c in rec.counts)


def decide(
    records: list[ProcessRecord], intended: Mapping[str, str], chosen: Mapping[str, str] | None = None
) -> DispatchVerdict:
    """The verdict on a launch's records; `chosen` (fl_selection) is recorded and named in a reason."""
    rows = served(records)
    orders = dict(chosen or {})

    def verdict(valid: bool, reason: str) -> DispatchVerdict:
        return DispatchVerdict(valid, reason, dict(intended), rows, len(records), orders)

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
            why = f" (its vllm-plugin-FL order: {orders[op]})" if op in orders else ""
            return verdict(False, f"{r.op}: {r.calls} calls of {r.impl}, which this arm does not select for {op}{why}")
    for op, label in intended.items():
        n = sum(r.calls for r in rows if r.impl == label and kernel_ops.get(r.op) == op)
        if n == 0:
            return verdict(False, f"{op}: selected {label} served no calls")
    if not intended:
        return verdict(True, "baseline: no kerneltrial kernel served a call")
    detail = "; ".join(f"{r.op}: {r.calls} calls of {r.impl}" for r in rows if r.impl in intended.values())
    return verdict(True, detail)


def check_launch(
    directory: Path, arm_env: Mapping[str, str], platform: Platform | None = None, files: Files | None = None
) -> DispatchVerdict:
    """The verdict for one launch: its records in `directory`, its arm's environment, the platform
    table and the selection files the plugin's policy reads."""
    try:
        intended = intended_ops(arm_env, platform, files)
        chosen = fl_selection(arm_env, platform, files)
        records = read_records(directory)
    except ValueError as e:  # SelectionError too: a selection file the plugin cannot read either
        return DispatchVerdict(False, str(e), {}, (), 0)
    return decide(records, intended, chosen)
