"""`kerneltrial check`'s logic: which arms and cases, the gate on each, the rows of its table.

The command (cli/trial.py) reads the options, draws the progress bar and prints; this module
decides. Every arm runs the correctness gate (trial/gate.py) per seed on the cases of the chosen
panel; a user module's arms run isolated unless `isolate` is "none" (trial/remote.py), built-in
arms too with "all"; each operator's built-in workers end before the next operator's start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, Impl, Operator, all_ops, get_op, load_user_module
from kerneltrial.trial import confine
from kerneltrial.trial.arms import Isolation, is_isolated
from kerneltrial.trial.gate import CheckResult
from kerneltrial.trial.gate import check as gate_check
from kerneltrial.trial.isolation import Settings
from kerneltrial.trial.panel import beyond_grid_case, check_panel, skip_reason
from kerneltrial.trial.targets import Target, targeting

PANELS = ("quick", "small", "gpu")
# how one check is waited for: (seconds, what, work) -> work's result (the command's `within`)
Wait = Callable[[float, str, Callable[[], CheckResult]], CheckResult]


@dataclass(frozen=True)
class CheckRequest:
    """What `check` was asked (each field: the command's option of that name)."""

    op: str | None  # the one operator named (None: --all)
    operators: list[Operator]
    impl: list[str] | None
    shapes: list[tuple[int, ...]] | None
    layout: list[str] | None
    dtype: str | None
    seeds: int
    inputs_seed: int
    panel: str  # one of PANELS, or "auto"
    impl_module: list[str]
    peers: bool
    exact: bool
    timeout: float
    target: Target | None
    isolate: str  # user, all or none


@dataclass(frozen=True)
class Checked:
    """One arm's seeds on one case."""

    op: str
    case: str
    arm: str
    results: list[CheckResult]


@dataclass(frozen=True)
class OperatorChecks:
    """One operator's part of `check`: its checks in the order they ran, and the (case, arm) pairs
    of its panel it skipped, with why."""

    checked: list[Checked]
    not_checked: list[str]


@dataclass(frozen=True)
class CheckOutcome:
    """Every operator's part, the arms requested of each, and what the verdicts rest on short of
    the whole isolation (`notes`)."""

    device: torch.device
    requested: dict[str, list[Impl]]
    parts: list[OperatorChecks]
    notes: list[str]


def operators(op: str | None, every: bool) -> list[Operator]:
    return all_ops() if every else [get_op(str(op))]


def run_checks(r: CheckRequest, wait: Wait, progress: Callable[[str, int], Callable[[], None]]) -> CheckOutcome:
    """Each operator's arms on its cases; `progress(name, total)` gives the step of one operator's bar."""
    device = launch.device()
    panel = r.panel if r.panel != "auto" else ("gpu" if device.type == "cuda" else "quick")
    for spec in r.impl_module if r.isolate == "none" else []:  # else imported in a worker only (below)
        load_user_module(spec, r.op)
    isolation = Isolation(Settings(r.timeout, device, r.target))
    parts: list[OperatorChecks] = []
    with targeting(r.target), isolation, inp.drawing(r.inputs_seed):
        for spec in r.impl_module if r.isolate != "none" else []:
            isolation.module_arms(spec, r.op)
        requested = {
            o.name: [
                isolation.isolate(i) if r.isolate == "all" and i.kind != "calibration" else i
                for i in requested_arms(o, r.impl, r.peers)
            ]
            for o in r.operators
        }
        for operator in r.operators:
            cases = check_cases(operator, r.shapes, r.dtype, r.layout, panel)
            impls = requested[operator.name]
            step = progress(operator.name, len(cases) * len(impls))
            parts.append(check_operator(r, operator, impls, cases, wait, step))
            isolation.close_builtin()  # one operator's built-in arms at a time in their workers
    notes = confine.isolation_notes(r.impl_module, r.isolate, device.type == "cuda")
    return CheckOutcome(device, requested, parts, notes)


def check_operator(
    r: CheckRequest, operator: Operator, impls: list[Impl], cases: list[Case], wait: Wait, step: Callable[[], None]
) -> OperatorChecks:
    """Each of the arms `impls` of `operator` on each of `cases` that it takes."""
    part = OperatorChecks([], [])
    for case in cases:
        operator.validate(case)
        part.not_checked.extend(
            f"{operator.name}/{i.name} on {skip_reason(i, case)}" for i in impls if skip_reason(i, case)
        )
        for i in impls:
            step()
            if not i.available or not i.supports(case) or skip_reason(i, case):
                continue
            part.checked.append(Checked(operator.name, case.id, i.name, check_arm(r, operator, i, case, wait)))
    return part


def check_arm(r: CheckRequest, operator: Operator, impl: Impl, case: Case, wait: Wait) -> list[CheckResult]:
    """One arm on one case: a gate check per seed 0..seeds-1, each within `timeout` (an isolated
    arm's worker has the same deadline per request, and is killed past it)."""
    device = launch.device()
    waits = (lambda _s, _w, work: work()) if is_isolated(impl) else wait
    return [
        waits(
            r.timeout,
            f"{operator.name} {case.id} arm {impl.name} seed {s}",
            lambda s=s: gate_check(operator, impl, case, s, device, exact=r.exact),
        )
        for s in range(r.seeds)
    ]


def requested_arms(operator: Operator, impl: list[str] | None, peers: bool) -> list[Impl]:
    """The arms `check` runs for `operator`: those named with --impl, else every implementation
    (peers unless --no-peers). Only these are reported, as checked or as skipped."""
    if impl:
        return [operator.impl(n) for n in impl]
    return [i for i in operator.impls.values() if peers or i.kind != "peer"]


def check_cases(
    operator: Operator,
    shapes: list[tuple[int, ...]] | None,
    dtype: str | None,
    layout: list[str] | None,
    panel: str,
) -> list[Case]:
    """The cases `check` runs, in the --layout(s) (default: every layout of the operator): the
    --shape cases in each; else the `gpu` or `small` panel in each; else (`quick`, the default
    without a GPU) each small case in one layout, the layouts in turn, so every shape and every
    layout is checked but not every pair: half the interpreter's time of `small` for two layouts
    (`check --all` within 10 minutes on 2 CPU cores, issue 25). Without a GPU, the panels add the
    case of more than 65535 rows (trial/panel.py; `quick`: in the first layout)."""
    layouts = layout or operator.layouts
    if shapes:
        return [Case(s, dtype or operator.dtypes[0], lay) for s in shapes for lay in layouts]
    if panel == "quick":
        quick = [Case(c.shape, c.dtype, layouts[i % len(layouts)]) for i, c in enumerate(operator.small_cases)]
        beyond = beyond_grid_case(operator)
        return [*quick, Case(beyond.shape, beyond.dtype, layouts[0])]
    return check_panel(operator, gpu=panel == "gpu", layouts=layouts)


def check_row(checked: Checked) -> list[str]:
    """One row of `check`'s table: the arm's seeds in one case (the first failure's message)."""
    results = checked.results
    bad = [r for r in results if not r.passed]
    worst = max(results, key=lambda r: (not r.passed, r.max_rel))
    hist = [sum(column) for column in zip(*(r.ulp_hist for r in results), strict=True)]
    status = "pass" if not bad else f"FAIL seed {bad[0].seed}: {bad[0].message}"
    head = [checked.op, checked.case, checked.arm, str(len(results)), status]
    return [*head, f"{worst.max_abs:.3g}", f"{worst.max_rel:.3g}", f"{worst.ulp:.3g}", "/".join(map(str, hist))]
