"""A run with timed checks (plan.json `checks`): one timed check per timing sample, dropped arms,
and the checks that read no figure (plan contract fields, ulp histograms, manifest, provenance,
source archive, protocol freeze; kernel/integrity.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kerneltrial.kernel import integrity
from kerneltrial.kernel.verify.arithmetic import diff
from kerneltrial.kernel.verify.contract import CHECKS_EVERY_CALL, CHECKS_ISOLATED
from kerneltrial.kernel.verify.plan import PLAUSIBILITY_DEFAULTS
from kerneltrial.kernel.verify.rows import RAISED, Sample, TimedChecks, TimedRow, read_timed_rows, unit_order
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.layout import (
    MANIFEST,
    SOURCE_ARCHIVE,
)

# every failing timed check's message starts with one of these (the runner's contract)
TIMED_FAILURE_PREFIXES = (
    "wrong result while timed: ",
    "modified its inputs while timed: ",
    "wrote outside its output: ",
    "returns a persistent buffer: ",
    RAISED,
)
ULP_BINS = 6  # correctness.jsonl ulp_hist: elements at 0, (0,1], (1,2], (2,4], (4,16], >16 ulps


def check_timed_checks(
    run_dir: Path,
    plan: dict[str, Any],
    summary: dict[str, Any],
    samples: list[Sample],
    outcome: dict[tuple[str, str], str],
    result: VerifyResult,
) -> TimedChecks:
    """Every timing sample has exactly one timed check, and a raise none; records `timed checks` and
    (through `_check_dropped_arms`) `dropped arms`."""
    rows, problems = read_timed_rows(run_dir)
    counts: dict[tuple[str, int, int, str], int] = {}
    values: dict[tuple[str, int, int], set[int]] = {}
    for row in rows:
        counts[row.key] = counts.get(row.key, 0) + 1
        values.setdefault((row.case, row.seed, row.round), set()).add(row.values_seed)
    sampled = {(s.case, s.seed, s.round, s.arm) for s in samples}
    listed = [
        ("timing rows without a timed check", sorted(sampled - set(counts))),
        ("duplicated timed checks", sorted(key for key, n in counts.items() if n > 1)),
        (
            "timed checks without a timing row that did not raise",
            sorted(r.key for r in rows if not r.raised and r.key not in sampled),
        ),
        ("raised while timed but has a timing row", sorted(r.key for r in rows if r.raised and r.key in sampled)),
        (
            "timed checks of an arm not timed in the case",
            sorted({(r.case, r.arm) for r in rows if outcome.get((r.case, r.arm)) != "passed"}),
        ),
        ("units whose arms got different values_seed", sorted(unit for unit, seen in values.items() if len(seen) > 1)),
        (
            "failed timed checks whose message has no contract prefix, or a raise that passed",
            [
                r.key
                for r in rows
                if (not r.passed and not r.message.startswith(TIMED_FAILURE_PREFIXES)) or (r.raised and r.passed)
            ],
        ),
    ]
    if plan.get("checks") in (CHECKS_EVERY_CALL, CHECKS_ISOLATED):  # a random call of each sample checked: which one
        calls = {str(c["case"]): int(c["calls"]) for c in plan["cases"]}
        listed.append(
            (
                "timed checks without a checked_call in 0..calls-1",
                sorted(
                    r.key
                    for r in rows
                    if not r.raised
                    and not (
                        isinstance(r.checked_call, int)
                        and not isinstance(r.checked_call, bool)
                        and 0 <= r.checked_call < calls.get(r.case, 0)
                    )
                ),
            )
        )
    problems += [f"{label}: {len(keys)}, e.g. {keys[:3]}" for label, keys in listed if keys]
    failed = sum(not r.passed for r in rows)
    problems += diff(
        "summary timed_checks",
        summary.get("timed_checks") or {},
        {"rows": len(rows), "failed": failed},
        ("rows", "failed"),
    )
    result.add("timed checks", problems, f"{len(rows)} timed checks, one per timing sample ({failed} failed)")
    return TimedChecks(rows, _check_dropped_arms(plan, samples, rows, result))


def _check_dropped_arms(
    plan: dict[str, Any], samples: list[Sample], rows: list[TimedRow], result: VerifyResult
) -> dict[tuple[str, str], tuple[int, int]]:
    """An arm that raised while timed has no row in the later units of its case; returns where each raised."""
    order = unit_order(plan)
    raised: dict[tuple[str, str], tuple[int, int]] = {}
    for row in sorted((r for r in rows if r.raised), key=lambda r: order(r.seed, r.round)):
        raised.setdefault((row.case, row.arm), (row.seed, row.round))
    later = []
    for (case, arm), unit in raised.items():
        after = sorted(
            {
                (x.seed, x.round)
                for x in (*samples, *rows)
                if x.case == case and x.arm == arm and order(x.seed, x.round) > order(*unit)
            }
        )
        if after:
            later.append(
                f"arm {arm} raised while timed in ({case}, {unit[0]}, {unit[1]}) but has rows in "
                f"{len(after)} later unit(s), e.g. {after[:3]}"
            )
    result.add(
        "dropped arms", later, f"{len(raised)} arm(s) raised while timed, each absent from the later units of its case"
    )
    return raised


def check_integrity(
    run_dir: Path,
    plan: dict[str, Any],
    provenance: dict[str, Any],
    digest: str,
    correctness: list[dict[str, Any]],
    result: VerifyResult,
) -> None:
    """The checks of a run with timed checks that read no timing figure: plan fields, ulp histograms,
    manifest, provenance, source archive and freeze (kernel/integrity.py)."""
    result.add(
        "plan contract fields",
        _plan_contract_problems(plan),
        f"checks {plan.get('checks')}, exact {plan.get('exact')}, plausibility {plan.get('plausibility')}, "
        f"frozen_at {plan.get('frozen_at')}",
    )
    result.add(
        "ulp histograms",
        _ulp_problems(plan, correctness),
        f"{len(correctness)} correctness rows, each with a {ULP_BINS}-bin ulp histogram",
    )
    result.add(
        "manifest",
        integrity.manifest_problems(run_dir),
        f"every file hashes as {MANIFEST} recorded; no file added but {', '.join(integrity.ADDED_AFTER_RUN)}",
    )
    result.add(
        "provenance",
        integrity.provenance_problems(provenance),
        "versions, device, source digest, start and end recorded",
    )
    result.add(
        "source archive",
        integrity.source_problems(run_dir, provenance),
        f"{SOURCE_ARCHIVE} digests to git.source_sha256",
    )
    frozen = plan.get("frozen_at")
    result.add(
        "protocol freeze",
        integrity.freeze_problems(provenance, plan, digest),
        "not frozen (plan and provenance agree)"
        if frozen is None
        else f"frozen at {frozen}, the record of protocol.toml",
    )


def _plan_contract_problems(plan: dict[str, Any]) -> list[str]:
    """The plan.json fields of the timed-check contract, present and of their types."""
    problems = []
    if not isinstance(plan.get("exact"), bool):
        problems.append(f"exact {plan.get('exact')!r} is not true or false")
    settings = plan.get("plausibility")
    numbers = {key: (settings or {}).get(key) for key in PLAUSIBILITY_DEFAULTS} if isinstance(settings, dict) else {}
    if not numbers or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in numbers.values()
    ):
        problems.append(f"plausibility {settings!r} lacks non-negative numbers {list(PLAUSIBILITY_DEFAULTS)}")
    if "frozen_at" not in plan or not isinstance(plan["frozen_at"], (str, type(None))):
        problems.append(f"frozen_at {plan.get('frozen_at', 'absent')!r} is not a time or null")
    if plan.get("order_seed") is None:
        problems.append("order_seed is missing: the round order of a run with timed checks is seeded")
    return problems


def _ulp_problems(plan: dict[str, Any], correctness: list[dict[str, Any]]) -> list[str]:
    """Every correctness row has `ulp_hist` (6 counts); under `exact`, a passed row has every element at 0 ulps."""
    malformed, inexact = [], []
    for row in correctness:
        hist = row.get("ulp_hist")
        where = (row.get("case"), row.get("seed"), row.get("arm"))
        if not (
            isinstance(hist, list)
            and len(hist) == ULP_BINS
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in hist)
        ):
            malformed.append(f"{where}: {hist!r}")
        elif plan.get("exact") is True and row.get("passed") is True and any(hist[1:]):
            inexact.append(f"{where}: {hist}")
    problems = (
        [f"{len(malformed)} correctness row(s) without a {ULP_BINS}-bin ulp_hist, e.g. {malformed[:3]}"]
        if malformed
        else []
    )
    if inexact:
        problems.append(
            f"{len(inexact)} passed row(s) of an exact run with elements off the reference, e.g. {inexact[:3]}"
        )
    return problems
