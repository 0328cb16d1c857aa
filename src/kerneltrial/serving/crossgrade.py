"""Cross-grade: every accuracy sample graded again by evalscope's math_500 benchmark, the
organisers' evaluator, and each answer the two graders disagree on listed.

evalscope is the optional extra kerneltrial[evalscope] (heavy: it brings modelscope, datasets,
nltk, ...); without it the cross-grade is not run and its record says so ("cross-grade not run:
REASON"), never absent. Nothing of evalscope is copied here: the benchmark is looked up in its
registry (`get_benchmark("math_500")`), the response goes through the adapter's own
`filter_prediction` (its answer extraction, evalscope.metrics.math.parser.extract_answer), and
the extracted answer is scored against the reference by each metric of the benchmark's
metric_list (accuracy with numeric=True: its compare_answers), as its `match_score` does. A
sample is evalscope-correct when that metric scores 1. Our grade stays the gate's; the
cross-grade is evidence beside it. `cross_grade` takes where its grader comes from as a
parameter (evalscope_grader by default), so a run can be cross-graded by another parser.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kerneltrial.rundir.serving_summary_doc import CrossGrade, Disagreement

BENCHMARK = "math_500"


class Graded(Protocol):
    """What the cross-grade reads of an accuracy record (accuracy.Record)."""

    unique_id: str
    sample: int
    reference: str
    response: str
    error: str
    correct: bool
    extracted: list[str]


@dataclass(frozen=True)
class CrossGrader:
    """A second grader: its name (recorded) and grade(response, reference) -> (extracted, correct)."""

    name: str  # "evalscope VERSION math_500"
    grade: Callable[[str, str], tuple[str, bool]]


# Where the cross-grade's grader comes from: the grader, or the reason there is none.
GraderSource = Callable[[], CrossGrader | str]


def evalscope_grader() -> CrossGrader | str:
    """evalscope's math_500 as a CrossGrader, or the reason there is none (not installed, or its
    benchmark cannot be built: the cross-grade is evidence, it never fails the accuracy run)."""
    try:
        from evalscope.api.registry import get_benchmark, get_metric  # type: ignore[import-not-found]
    except ImportError as error:
        return f"evalscope is not installed ({error}): pip install 'kerneltrial[evalscope]'"
    try:
        adapter = get_benchmark(BENCHMARK)
        metrics = []
        for entry in adapter.metric_list:
            name, args = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
            metrics.append(get_metric(name)(**args))
        version = importlib.metadata.version("evalscope")
    except Exception as error:  # an evalscope whose registry differs from the one this was written for
        return f"evalscope's {BENCHMARK} could not be built ({type(error).__name__}: {error}); install evalscope>=1.14"

    def grade(response: str, reference: str) -> tuple[str, bool]:
        extracted = str(adapter.filter_prediction(response, None))
        scores = [float(m(prediction=extracted, reference=reference)) for m in metrics]
        return extracted, bool(scores) and all(s == 1.0 for s in scores)

    return CrossGrader(f"evalscope {version} {BENCHMARK}", grade)


def cross_grade(records: Iterable[Graded], source: GraderSource = evalscope_grader) -> CrossGrade:
    """Every answered sample graded by the grader `source` gives (evalscope's math_500) beside ours."""
    found = source()
    if isinstance(found, str):
        return CrossGrade.not_run(found)
    graded = agree = ours_n = theirs_n = 0
    listed: list[Disagreement] = []
    for r in records:
        if r.error:
            continue
        try:
            extracted, theirs = found.grade(r.response, r.reference)
        except Exception as error:  # evalscope raises when it cannot score (e.g. a reference it rejects)
            extracted, theirs = f"evalscope error: {type(error).__name__}: {error}"[:200], False
        graded += 1
        ours_n += r.correct
        theirs_n += theirs
        if theirs == r.correct:
            agree += 1
        else:
            listed.append(Disagreement(r.unique_id, r.sample, r.reference, r.correct, theirs, r.extracted, extracted))
    return CrossGrade(True, found.name, graded, agree, ours_n, theirs_n, listed)
