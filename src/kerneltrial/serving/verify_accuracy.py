"""verify's recount of the MATH-500 gate: every arm's accuracy figures from its records.jsonl,
under the run's spec (plan.json's accuracy: n problems, k samples each, the gate rule).

What it counts itself: the problems, each problem's samples (k of them, numbered 0 to k - 1,
none twice), the correct samples, the failed requests, the preregistered n (its own table of the
MATH-500 level sizes, apart from serving/accuracy.py's). What it takes from the code it checks,
because they are definitions rather than arithmetic: the interval and the pass probability at the
gate (serving/accuracy_stats.py), fed with the recounted counts. Runs from before samples (no
`samples` in the plan's accuracy) are recounted as they always were: one record per problem, the
Wilson interval, accuracy >= gate.

The cross-grade (`cross_grade_problems`): summary.json's record of it is accuracy.json's, and its
counts are recounted from records.jsonl and its own list of disagreements: graded = the answered
samples, correct_ours = their correct flags, agree = graded - disagreements, correct_theirs =
correct_ours with each disagreement's sample turned over; every disagreement names an answered
sample once, with that sample's reference, extracted answers and our grade. A record that did not
run says why ("cross-grade not run: REASON") and counts nothing. What this cannot catch without
running evalscope again: a disagreement left out with the counts rewritten to match.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.layout import ACCURACY_DIR
from kerneltrial.rundir.serving_summary_doc import NOT_RUN, CrossGrade
from kerneltrial.serving import accuracy_stats as stats
from kerneltrial.serving.accuracy_stats import GateRule

# MATH-500 problems per level (written out here, apart from serving/accuracy.py: verify does not
# trust the writer's table). The gate needs the protocol's `limit`, else the whole level.
_FULL_SET_SIZE = {"1": 43, "2": 90, "3": 105, "4": 128, "5": 134}
SHOWN = 10  # incomplete problems named per arm


def _required_n(acc_plan: dict[str, Any]) -> int | None:
    if acc_plan.get("limit") is not None:
        return int(acc_plan["limit"])
    level = acc_plan.get("level")
    if level is None:
        return 500
    return _FULL_SET_SIZE.get(str(level).removeprefix("Level ").strip())


def _wilson(k: int, n: int, conf: float) -> tuple[float, float]:
    # scipy's Wilson interval, the one accuracy.py records (through metrics.py): here the interval
    # is not an independent formula any more; what verify checks independently is its inputs,
    # k and n recounted from records.jsonl, and that the recorded bounds are the ones they give.
    if n <= 0:
        return (0.0, 1.0)
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=conf, method="wilson")
    return (float(ci.low), float(ci.high))


def accuracy_problems(path: Path, acc_plan: dict[str, Any] | None, acc_sum: dict[str, Any]) -> list[str]:
    """Every arm's accuracy summary against its records, recounted."""
    problems: list[str] = []
    for arm, s in acc_sum.items():
        problems += _arm_problems(path, arm, s, acc_plan or {})
    return problems


def _arm_problems(path: Path, a: str, s: dict[str, Any], acc_plan: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    try:
        recs = read_jsonl(path / ACCURACY_DIR / a / "records.jsonl")
    except RunDirError as error:
        problems.append(str(error))
        recs = []
    gate = float(acc_plan.get("gate", s.get("gate", 0.95)))
    need = _required_n(acc_plan) if "required_n" in s else None  # older runs: any n
    if "required_n" in s and s["required_n"] != need:
        problems.append(f"accuracy {a}: required_n = {s['required_n']}, the protocol gives {need}")
    errs = sum(1 for r in recs if r.get("error"))
    if "samples" in acc_plan:
        want, found = _recount(a, recs, acc_plan, float(s.get("confidence", 0.95)), gate)
        problems += found
    else:  # a run from before samples: one record per problem, Wilson, accuracy >= gate
        want = _legacy(recs, float(s.get("confidence", 0.95)), gate)
    n = int(want["n"])
    want["errors"] = errs
    want["passed"] = bool(n > 0 and errs == 0 and want.pop("rule_ok") and (need is None or n >= need))
    for key, v in want.items():
        if not _same(s.get(key, float("nan")), v):
            problems.append(f"accuracy {a}: {key} = {s.get(key)}, recomputed {v}")
    return problems


def _same(got: Any, want: Any) -> bool:
    if want is None or isinstance(want, str):
        return bool(got == want)
    try:
        return math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _legacy(recs: list[dict[str, Any]], confidence: float, gate: float) -> dict[str, Any]:
    n, k = len(recs), sum(1 for r in recs if r.get("correct") is True)
    lo, hi = _wilson(k, n, confidence)
    acc = k / n if n else 0.0
    return {"n": n, "correct": k, "accuracy": acc, "ci_low": lo, "ci_high": hi, "rule_ok": acc >= gate}


def _recount(
    a: str, recs: list[dict[str, Any]], acc_plan: dict[str, Any], confidence: float, gate: float
) -> tuple[dict[str, Any], list[str]]:
    """The figures of a run with samples, and the problems whose samples are not k distinct ones."""
    k, named = int(acc_plan["samples"]), acc_plan.get("rule", "point")
    if named not in ("point", "lower_bound"):
        return {"n": 0, "rule_ok": False}, [
            f"accuracy {a}: plan.json's accuracy rule {named!r} is not point or lower_bound; the protocol's "
            "[accuracy] rule says which"
        ]
    rule = cast(GateRule, named)
    seen: dict[str, set[object]] = {}
    counts: dict[str, int] = {}
    problems: list[str] = []
    for r in recs:
        uid, j = str(r.get("unique_id")), r.get("sample", 0)
        if not isinstance(j, int) or not 0 <= j < k or j in seen.get(uid, set()):
            problems.append(f"accuracy {a}: problem {uid} has sample {j!r} twice or outside 0..{k - 1}")
        seen.setdefault(uid, set()).add(j)
        counts[uid] = counts.get(uid, 0) + (r.get("correct") is True)
    short = [f"accuracy {a}: problem {uid} has {len(js)} of {k} samples" for uid, js in seen.items() if len(js) != k]
    problems += short[:SHOWN] + ([f"accuracy {a}: {len(short) - SHOWN} more problems short"] * (len(short) > SHOWN))
    fig = stats.gate_figures(list(counts.values()), k, confidence)
    want: dict[str, Any] = {
        "n": fig.n,
        "correct": fig.correct,
        "accuracy": fig.accuracy,
        "ci_low": fig.ci_low,
        "ci_high": fig.ci_high,
        "samples": k,
        "rule": rule,
        "interval": fig.interval,
        "design_effect": fig.design_effect,
        "pass_probability_at_gate": stats.pass_probability(fig.n, k, gate, confidence, rule),
        "rule_ok": stats.rule_passes(fig, gate, rule),
    }
    return want, problems


def cross_grade_problems(path: Path, acc_sum: dict[str, Any]) -> list[str] | None:
    """Every arm's cross-grade (summary.json's, which must be accuracy.json's) recounted from its
    records; None when no arm records one in either file (a run from before the trial recorded it)."""
    problems: list[str] = []
    found = False
    for a, s in acc_sum.items():
        try:
            stored = read_json(path / ACCURACY_DIR / a / "accuracy.json").get("cross_grade")
            recs = read_jsonl(path / ACCURACY_DIR / a / "records.jsonl")
        except (RunDirError, AttributeError) as error:
            problems.append(f"accuracy {a}: {error}")
            continue
        summed = s.get("cross_grade")
        found = found or summed is not None or stored is not None
        if summed != stored:
            problems.append(
                f"accuracy {a}: summary.json's cross_grade is not accuracy/{a}/accuracy.json's (summary "
                f"{'absent' if summed is None else 'differs'}); the trial copies accuracy.json's into the summary"
            )
        if summed is not None:
            problems += _cross_grade_arm(a, summed, recs)
    return problems if found else None


def _cross_grade_arm(a: str, record: Any, recs: list[dict[str, Any]]) -> list[str]:
    try:
        cg = CrossGrade.from_record(record)
    except (TypeError, AttributeError) as error:
        return [f"accuracy {a}: cross_grade is not a cross-grade record ({error}); serving/crossgrade.py writes it"]
    counted = (cg.graded, cg.agree, cg.correct_ours, cg.correct_theirs, len(cg.disagreements))
    if not cg.ran:
        ok = cg.reason.startswith(NOT_RUN) and len(cg.reason) > len(NOT_RUN) and counted == (0, 0, 0, 0, 0)
        if ok:
            return []
        return [
            f"accuracy {a}: cross_grade did not run but its reason is {cg.reason!r} and its counts (graded, agree, "
            f"correct_ours, correct_theirs, disagreements) {counted}; one not run says {NOT_RUN!r}REASON and counts 0"
        ]
    answered = {(str(r.get("unique_id")), r.get("sample", 0)): r for r in recs if not r.get("error")}
    graded = sum(1 for r in recs if not r.get("error"))
    ours = sum(1 for r in recs if not r.get("error") and r.get("correct") is True)
    turned = sum(1 if d.ours else -1 for d in cg.disagreements)  # ours right, theirs wrong: one fewer
    want = {
        "graded": graded,
        "agree": graded - len(cg.disagreements),
        "correct_ours": ours,
        "correct_theirs": ours - turned,
        "reason": "",
    }
    problems = [
        f"accuracy {a}: cross_grade {key} = {getattr(cg, key)!r}, recounted {v!r}"
        for key, v in want.items()
        if getattr(cg, key) != v
    ]
    return problems + _disagreement_problems(a, cg, answered)


def _disagreement_problems(a: str, cg: CrossGrade, answered: dict[tuple[str, Any], dict[str, Any]]) -> list[str]:
    """Each listed disagreement against the answered sample it names."""
    problems: list[str] = []
    seen: set[tuple[str, int]] = set()
    for d in cg.disagreements:
        where = f"accuracy {a}: cross_grade disagreement on problem {d.unique_id} sample {d.sample}"
        rec = answered.get((d.unique_id, d.sample))
        if rec is None or (d.unique_id, d.sample) in seen:
            problems.append(f"{where} names no answered sample of records.jsonl, or names it twice")
        elif d.ours != (rec.get("correct") is True) or d.ours == d.theirs:
            problems.append(f"{where}: ours {d.ours}, theirs {d.theirs}; records.jsonl grades it {rec.get('correct')}")
        elif d.reference != rec.get("reference") or d.our_extracted != rec.get("extracted"):
            problems.append(f"{where}: its reference or extracted answers are not records.jsonl's")
        seen.add((d.unique_id, d.sample))
    return problems[:SHOWN] + (
        [f"accuracy {a}: {len(problems) - SHOWN} more disagreements wrong"] * (len(problems) > SHOWN)
    )
