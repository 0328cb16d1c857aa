"""The cross-grade in the serving trial (issue "Kernel-author parity", item 5): the trial grades the
same samples with a second grader (evalscope's math_500 where installed; here a stub injected
through `cross_grader`, or none), records the agreement and the disagreements in accuracy.json
and summary.json, the report and the trial's summary text show them, verify recounts them; and
verify's re-grade names the problem and the sample of an answer it grades otherwise."""

from __future__ import annotations

import json
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.cli.serving_common import print_summary
from kerneltrial.rundir.serving_summary_doc import NOT_RUN, read_serving_summary
from kerneltrial.serving import accuracy as A
from kerneltrial.serving import accuracy_stats as S
from kerneltrial.serving.crossgrade import CrossGrader, cross_grade, evalscope_grader
from kerneltrial.serving.report import render
from kerneltrial.serving.report_data import load_run
from kerneltrial.serving.verify import verify_serving_run

from .test_accuracy_gate import two_problem_trial

SEEDED = ("--show-seed",)  # the fake server's answer ends " seed=N", each sample's own


def stub_grader() -> CrossGrader:
    """A second grader that calls every sample 2 wrong (its seed, which the answer shows, says which)."""

    def grade(response: str, reference: str) -> tuple[str, bool]:
        seed = int(response.rsplit("seed=", 1)[1])
        return f"{reference}@{seed}", seed < 2 * S.SEED_STRIDE

    return CrossGrader("stub 0.1 math_500", grade)


def _rewrite(run: Path, arm: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """`edit` applied to the arm's cross_grade in summary.json and accuracy.json alike (a consistent forgery)."""
    for path, inner in ((run / "summary.json", ("accuracy", arm)), (run / "accuracy" / arm / "accuracy.json", ())):
        doc = json.loads(path.read_text())
        node = doc
        for key in inner:
            node = node[key]
        edit(node["cross_grade"])
        path.write_text(json.dumps(doc))


def _planted(out: Path, tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> list[str]:
    copy = tmp_path / name
    shutil.copytree(out, copy)
    _rewrite(copy, "E1", edit)
    return verify_serving_run(copy, regrade=False).problems


@pytest.fixture
def crossed(tmp_path: Path, monkeypatch) -> Path:
    """A two-problem trial of 3 samples each, cross-graded by the stub."""
    return two_problem_trial(tmp_path, monkeypatch, "k3x", "limit = 2\nsamples = 3\n", stub_grader, SEEDED)[0]


def test_the_trial_records_the_cross_grade_and_verify_recounts_it(crossed: Path, tmp_path: Path, capsys) -> None:
    summary = json.loads((crossed / "summary.json").read_text())
    cg = summary["accuracy"]["E1"]["cross_grade"]
    assert cg == json.loads((crossed / "accuracy" / "E1" / "accuracy.json").read_text())["cross_grade"]
    assert (cg["ran"], cg["grader"], cg["reason"]) == (True, "stub 0.1 math_500", "")
    assert (cg["graded"], cg["agree"], cg["correct_ours"], cg["correct_theirs"]) == (6, 4, 6, 4)
    assert sorted((d["unique_id"], d["sample"], d["ours"], d["theirs"]) for d in cg["disagreements"]) == [
        ("u0", 2, True, False),
        ("u1", 2, True, False),
    ]
    assert verify_serving_run(crossed).problems == []
    head = "cross-grade with stub 0.1 math_500: 4/6 agree; correct 6 (math-verify) vs 4 (evalscope); 2 disagreement(s)"
    report = render(load_run(crossed))
    assert f"- E1: {head}" in report and "  - `u0 sample 2: reference '42', math-verify True" in report
    print_summary(read_serving_summary(crossed), crossed)
    printed = capsys.readouterr().out
    assert f"E1 {head}" in printed and "E1   u1 sample 2: reference '42'" in printed


def test_verify_refuses_an_edited_cross_grade(crossed: Path, tmp_path: Path) -> None:
    def agree(cg: dict[str, Any]) -> None:
        cg["agree"] = 5  # planted: one disagreement fewer in the count than in the list

    assert _planted(crossed, tmp_path, "agree", agree) == ["accuracy E1: cross_grade agree = 5, recounted 4"]

    def dropped(cg: dict[str, Any]) -> None:
        cg["disagreements"].pop()  # planted: a disagreement left out, the counts not rewritten

    assert _planted(crossed, tmp_path, "dropped", dropped) == [
        "accuracy E1: cross_grade agree = 4, recounted 5",
        "accuracy E1: cross_grade correct_theirs = 4, recounted 5",
    ]

    named: list[str] = []

    def flipped(cg: dict[str, Any]) -> None:
        d = cg["disagreements"][0]
        d["ours"], d["theirs"] = False, True  # planted: the disagreement told the other way round, the
        cg["correct_theirs"] = 6  # counts rewritten to match it
        named.append(d["unique_id"])

    assert _planted(crossed, tmp_path, "flipped", flipped) == [
        f"accuracy E1: cross_grade disagreement on problem {named[0]} sample 2: ours False, theirs True; "
        "records.jsonl grades it True"
    ]

    def first(key: str, value: object) -> Callable[[dict[str, Any]], None]:
        def edit(cg: dict[str, Any]) -> None:
            named.append(cg["disagreements"][0]["unique_id"])
            cg["disagreements"][0][key] = value

        return edit

    (elsewhere,) = _planted(crossed, tmp_path, "elsewhere", first("sample", 7))  # planted: a sample never asked
    assert elsewhere == (
        f"accuracy E1: cross_grade disagreement on problem {named[-1]} sample 7 names no answered sample of "
        "records.jsonl, or names it twice"
    )
    assert _planted(crossed, tmp_path, "reference", first("reference", "43")) == [  # planted: another reference
        f"accuracy E1: cross_grade disagreement on problem {named[-1]} sample 2: its reference or extracted answers "
        "are not records.jsonl's"
    ]

    def unknown(cg: dict[str, Any]) -> None:
        cg["verdict"] = "fine"  # planted: a key no cross-grade record has

    (odd,) = _planted(crossed, tmp_path, "unknown", unknown)
    assert odd.startswith("accuracy E1: cross_grade is not a cross-grade record (") and "'verdict'" in odd

    unlisted = tmp_path / "unlisted"  # planted: summary.json's cross_grade deleted, accuracy.json's kept
    shutil.copytree(crossed, unlisted)
    summary = json.loads((unlisted / "summary.json").read_text())
    del summary["accuracy"]["E1"]["cross_grade"]
    (unlisted / "summary.json").write_text(json.dumps(summary))
    assert verify_serving_run(unlisted, regrade=False).problems == [
        "accuracy E1: summary.json's cross_grade is not accuracy/E1/accuracy.json's (summary absent); the trial "
        "copies accuracy.json's into the summary"
    ]


def test_a_trial_without_a_cross_grader_says_why(tmp_path: Path, monkeypatch, capsys) -> None:
    out, summary = two_problem_trial(tmp_path, monkeypatch, "nox", "limit = 2\n", lambda: "no grader here")
    cg = summary["accuracy"]["E1"]["cross_grade"]
    assert (cg["ran"], cg["reason"], cg["graded"], cg["disagreements"]) == (False, NOT_RUN + "no grader here", 0, [])
    assert verify_serving_run(out).problems == []
    assert "- E1: cross-grade not run: no grader here" in render(load_run(out))
    print_summary(read_serving_summary(out), out)
    assert "E1 cross-grade not run: no grader here" in capsys.readouterr().out

    def counted(cg: dict[str, Any]) -> None:
        cg["graded"] = 2  # planted: a cross-grade that did not run claims samples

    (problem,) = _planted(out, tmp_path, "counted", counted)
    assert problem.startswith("accuracy E1: cross_grade did not run but its reason is 'cross-grade not run: no grader")
    assert "(2, 0, 0, 0, 0)" in problem


def test_an_evalscope_whose_benchmark_cannot_be_built_is_not_run(monkeypatch) -> None:
    def missing(name: str) -> None:
        raise KeyError(name)

    registry = types.ModuleType("evalscope.api.registry")
    registry.get_benchmark = missing  # type: ignore[attr-defined]
    registry.get_metric = missing  # type: ignore[attr-defined]
    for name, module in (("evalscope", types.ModuleType("evalscope")), ("evalscope.api", types.ModuleType("e"))):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "evalscope.api.registry", registry)
    why = evalscope_grader()
    assert why == "evalscope's math_500 could not be built (KeyError: 'math_500'); install evalscope>=1.14"


def test_cross_grade_counts_with_a_stub_grader() -> None:
    def grade(response: str, reference: str) -> tuple[str, bool]:
        if response == "boom":
            raise ValueError("cannot score")
        return response, response == reference

    right = A.Record(0, "u0", "Level 3", "s", "3", "p", "3", correct=True, extracted=["3"])
    ours_only = A.Record(1, "u1", "Level 3", "s", "3", "p", "boom", correct=True, sample=1)  # theirs raises: wrong
    theirs_only = A.Record(2, "u2", "Level 3", "s", "4", "p", "4", correct=False, sample=2)
    failed = A.Record(3, "u3", "Level 3", "s", "3", "p", error="HTTP 500")
    got = cross_grade([right, ours_only, theirs_only, failed], lambda: CrossGrader("stub math_500", grade))
    assert (got.ran, got.graded, got.agree, got.correct_ours, got.correct_theirs) == (True, 3, 1, 2, 2)
    assert [(d.unique_id, d.sample, d.ours, d.theirs, d.their_extracted) for d in got.disagreements] == [
        ("u1", 1, True, False, "evalscope error: ValueError: cannot score"),
        ("u2", 2, False, True, "4"),
    ]


def test_regrade_names_the_problem_and_the_sample(crossed: Path, tmp_path: Path) -> None:
    run = tmp_path / "regraded"
    shutil.copytree(crossed, run)
    path = run / "accuracy" / "E1" / "records.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    (target,) = [r for r in rows if (r["unique_id"], r["sample"]) == ("u1", 1)]
    target["response"] = "The answer is \\boxed{7}. seed=1000001"  # planted: a wrong answer stored as correct
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert verify_serving_run(run, regrade=False).problems == []  # the flags and counts still agree
    assert verify_serving_run(run).problems == [
        "accuracy E1: problem u1 sample 1 is stored correct=True, re-graded False",
        "accuracy E1: summary correct = 6, re-graded 5 of 6 samples",
    ]
