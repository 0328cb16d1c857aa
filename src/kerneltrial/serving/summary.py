"""summary.json of a serving run: per arm and case the warm-up means per launch and over launches,
the dispatch verdicts per arm, and the acceptance verdict (serving/acceptance.py's rule).

Computed only from the run rows, the accuracy summaries and the launches' dispatch verdicts;
verify.py recomputes every figure from the raw files with its own arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kerneltrial.rundir.serving_summary_doc import (
    FIGURE_KEYS,
    SERVING_SUMMARY_V1,
    Acceptance,
    AcceptanceCase,
    ArmAccuracy,
    ArmDispatch,
    CaseResult,
    DispatchCount,
    LaunchResult,
    Scope,
    ServingSummary,
    SummaryCase,
    Warmup,
)
from kerneltrial.serving import metrics
from kerneltrial.serving.acceptance import (
    METHOD,
    LaunchFigure,
    Rule,
    accuracy_check,
    case_record,
    compare_case,
    dispatch_check,
    judge,
)
from kerneltrial.serving.bench import case_dict
from kerneltrial.serving.dispatch_proof import Served, summed
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.protocol import Protocol


@dataclass(frozen=True)
class LaunchProof:
    """One launch's dispatch verdict, as launches.jsonl stores it under `dispatch`."""

    launch: int
    arm: str
    dir: str  # the records' folder, relative to the run directory
    valid: bool
    reason: str
    intended: dict[str, str]  # dispatch op -> implementation the arm selects (empty: baseline)
    processes: int  # server processes that left a record
    counts: tuple[Served, ...]  # calls per kernel-level op and implementation, over the processes
    files: dict[str, str]  # record file name -> sha256
    selection: dict[str, str] = field(default_factory=dict)  # dispatch op -> its vllm-plugin-FL order (source)


def dispatch_summary(
    proto: Protocol, proofs: list[LaunchProof], refused: Mapping[int, str] | None = None
) -> dict[str, ArmDispatch]:
    """Per arm: valid only if every launch of it was (None for an external server: no records). A
    launch refused before it spawned (`refused`: launch -> arm) ran nothing: its arm is not valid."""
    out: dict[str, ArmDispatch] = {}
    for arm in proto.arms:
        mine = [p for p in proofs if p.arm == arm.name]
        never = sorted(L for L, name in (refused or {}).items() if name == arm.name)
        bad = [p for p in mine if not p.valid]
        valid: bool | None
        if arm.external:
            valid, reason = None, "external server: not launched by the trial, no dispatch records"
        elif never:
            valid, reason = False, f"launch {never[0]} was refused before it started: it ran nothing"
        elif not mine:
            valid, reason = False, "not launched"
        elif bad:
            valid, reason = False, f"launch {bad[0].launch}: {bad[0].reason}"
        else:
            valid, reason = True, f"all {len(mine)} launch(es) valid"
        out[arm.name] = ArmDispatch(
            valid=valid,
            reason=reason,
            launches=[p.launch for p in mine],
            counts=[DispatchCount(**asdict(s)) for s in summed(c for p in mine for c in p.counts)],
        )
    return out


def case_result(proto: Protocol, rows: list[dict[str, Any]]) -> CaseResult:
    """One (arm, case) from its run rows: ok with its figures only when every launch ran every repeat."""
    failed = [r for r in rows if r["status"] != "ok"]
    launches = sorted({r["launch"] for r in rows})
    complete = (
        all(len([r for r in rows if r["launch"] == L]) == proto.repeats for L in launches)
        and len(launches) == proto.rounds
    )
    counts = {"runs": len(rows), "failed_runs": len(failed), "launches": []}
    if failed or not rows or not complete:
        return CaseResult(**counts, status="FAILED" if failed else "INCOMPLETE")
    per_launch = []
    for L in launches:
        lrows = sorted((r for r in rows if r["launch"] == L), key=lambda r: r["run"])
        s = metrics.summarise_case(lrows, drop_first=1)
        per_launch.append(LaunchResult(launch=L, kept_runs=[r["run"] for r in lrows[1:]], **s))
    pooled = {
        k: metrics.pooled_mean([v for g in per_launch if (v := g.figure(k)) is not None])
        for k in FIGURE_KEYS
        if all(g.figure(k) is not None for g in per_launch)
    }
    return CaseResult(**counts | {"launches": per_launch}, status="ok", **pooled)


def summarise(
    proto: Protocol,
    runs: list[dict[str, Any]],
    acc: dict[str, ArmAccuracy],
    sha: str,
    failures: list[str],
    proofs: list[LaunchProof],
    refused: Mapping[int, str] | None = None,
    run_scope: Scope | None = None,
) -> ServingSummary:
    """Every figure of the report, from the run rows, accuracy summaries and dispatch verdicts, and the
    run's scope (serving/pins.py; None: not written)."""
    results = {
        arm.name: {
            case.id: case_result(proto, [r for r in runs if r["arm"] == arm.name and r["case"] == case.id])
            for case in proto.bench.cases
        }
        for arm in proto.arms
    }
    dispatch = dispatch_summary(proto, proofs, refused)
    ok = not failures and all(e.status == "ok" for a in results.values() for e in a.values())
    scoped = {} if run_scope is None else {"scope": run_scope}
    return ServingSummary(
        schema=SERVING_SUMMARY_V1,
        kind="serving",
        protocol_sha256=sha,
        warmup=Warmup(drop_first=1, rule="per launch and case: drop run 0, mean of the rest; then mean over launches"),
        arms=[a.name for a in proto.arms],
        cases=[SummaryCase(**case_dict(c)) for c in proto.bench.cases],
        results=results,
        accuracy=acc,
        dispatch=dispatch,
        acceptance=acceptance(proto, results, acc, dispatch),
        failures=failures,
        status="ok" if ok else "failed",
        **scoped,
    )


def acceptance_rule(proto: Protocol) -> Rule:
    a = proto.acceptance
    return Rule(a.noise_band, a.ttft_ratio_max, a.confidence)


def launch_figures(entry: CaseResult, rounds: Mapping[int, int]) -> list[LaunchFigure] | None:
    """The per-launch figures of a summarised (arm, case), each with its round; None unless ok."""
    if entry.status != "ok":
        return None
    return [
        LaunchFigure(rounds[g.launch], g.needed("total_token_throughput"), g.needed("mean_ttft_ms"))
        for g in entry.launches
    ]


def acceptance(
    proto: Protocol,
    results: Mapping[str, Mapping[str, CaseResult]],
    acc: Mapping[str, ArmAccuracy],
    dispatch: Mapping[str, ArmDispatch],
) -> Acceptance | None:
    """The candidate against the baseline by serving/acceptance.py's rule, as summary.json stores it."""
    base, cand = proto.arm("baseline"), proto.arm("candidate")
    if base is None or cand is None:
        return None
    rule = acceptance_rule(proto)
    rounds = {x.launch: x.round for x in planned_launches(proto.arms, proto.rounds, proto.seed)}
    cases = [
        compare_case(
            case.id,
            launch_figures(results[cand.name][case.id], rounds),
            launch_figures(results[base.name][case.id], rounds),
            rule,
        )
        for case in proto.bench.cases
    ]
    checks = []
    accuracy_ok: bool | None = None
    if proto.accuracy is not None:
        a = acc.get(cand.name)
        accuracy_ok = bool(a and a.passed)
        checks.append(
            accuracy_check(
                a.accuracy if a else None,
                a.errors if a else 0,
                accuracy_ok,
                proto.accuracy.gate,
                a.ci_low if a and proto.accuracy.rule == "lower_bound" else None,
            )
        )
    # an arm that did not demonstrably run its operators is not the arm it claims to be: a
    # candidate whose kernel served no call, or a baseline that ran ours, compares nothing
    proofs = [
        dispatch_check(role, a.name, dispatch[a.name].valid, dispatch[a.name].reason)
        for role, a in (("baseline", base), ("candidate", cand))
    ]
    v = judge(cand.name, base.name, cases, [*checks, *proofs], rule)
    return Acceptance(
        baseline=base.name,
        candidate=cand.name,
        noise_band=rule.noise_band,
        ttft_ratio_max=rule.ttft_ratio_max,
        confidence=rule.confidence,
        method=METHOD,
        cases={c.case: AcceptanceCase(**case_record(c)) for c in v.cases},
        reasons=list(v.reasons),
        accuracy_ok=accuracy_ok,
        dispatch_ok=all(p.passed for p in proofs),
        verdict=v.verdict,
        accepted=v.accepted,
    )
