"""The accuracy gate with k samples per problem (issue "Kernel-author parity", item 5): the seeds,
the interval and the pass probability at the gate by hand, the lower_bound rule, verify's recount,
and the cross-grade with evalscope's math_500 (skipped, with the reason, where it is absent)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from scipy.stats import binom

from kerneltrial.serving import accuracy as A
from kerneltrial.serving import accuracy_stats as S
from kerneltrial.serving.crossgrade import cross_grade
from kerneltrial.serving.launcher import Server, ServerSpec
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli

from .test_accuracy_gate import two_problem_trial


def wilson_by_hand(p: float, n: float, z: float = 1.959963984540054) -> tuple[float, float]:
    d = 1 + z * z / n
    c, h = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def records(counts: list[int], k: int) -> list[A.Record]:
    """k samples of each problem, the first counts[i] of problem i correct."""
    return [
        A.Record(i, f"u{i}", "Level 3", "s", "1", "p", correct=j < c, sample=j)
        for j in range(k)
        for i, c in enumerate(counts)
    ]


def test_k_samples_on_a_fake_server_carry_their_seeds(tmp_path: Path, port: int, fake_argv, math500_path) -> None:
    spec = ServerSpec(fake_argv(port, "--model-id", "f", "--answer", "\\boxed{42} seed={seed}"), "f", port=port)
    with Server(spec, tmp_path / "server.log"):
        one = A.run_accuracy(
            spec.base_url, "f", A.AccuracySpec(data=str(math500_path), limit=2, seed=7), tmp_path / "1"
        )
        three = A.run_accuracy(
            spec.base_url, "f", A.AccuracySpec(data=str(math500_path), limit=4, samples=3, seed=7), tmp_path / "3"
        )
    k1 = [json.loads(x) for x in (tmp_path / "1" / "records.jsonl").read_text().splitlines()]
    assert ["sample" in r for r in k1] == [False, False]  # k = 1: the records of before samples
    assert sorted(r["response"] for r in k1) == sorted(f"\\boxed{{42}} seed={7 + r['index']}" for r in k1)
    recs = [json.loads(x) for x in (tmp_path / "3" / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 12 and three["n"] == 4 and three["samples"] == 3 and one["samples"] == 1
    by_problem: dict[int, list[int]] = {}
    for r in recs:
        by_problem.setdefault(r["index"], []).append(r["sample"])
        assert r["response"].endswith(f"seed={7 + r['index'] + r['sample'] * S.SEED_STRIDE}")
    assert len(by_problem) == 4 and all(sorted(js) == [0, 1, 2] for js in by_problem.values())
    assert three["correct"] == sum(r["correct"] for r in recs) and three["interval"] == S.WILSON_DEFF
    assert three["pass_probability_at_gate"] == pytest.approx(binom.sf(math.ceil(0.95 * 12) - 1, 12, 0.95))


def test_interval_and_pass_probability_by_hand() -> None:
    one = S.gate_figures([1, 0, 1, 1], 1, 0.95)
    assert (one.accuracy, one.interval, one.design_effect) == (0.75, S.WILSON, 1.0)
    assert (one.ci_low, one.ci_high) == pytest.approx(wilson_by_hand(0.75, 4), abs=1e-12)
    # k = 3, problems all right or all wrong: T = 9, Q = 27, deff = k n (n Q - T^2) / ((n - 1) T (n k - T))
    # = 3 * 4 * (108 - 81) / (3 * 9 * 3) = 4: the 12 samples count as 3
    three = S.gate_figures([3, 0, 3, 3], 3, 0.95)
    assert (three.accuracy, three.design_effect) == (0.75, pytest.approx(4.0))
    assert (three.ci_low, three.ci_high) == pytest.approx(wilson_by_hand(0.75, 3), abs=1e-12)
    spread = S.gate_figures([2, 3, 2, 2], 3, 0.95)  # within-problem spread: deff clipped at 1, Wilson on 12
    assert spread.design_effect == 1.0
    assert (spread.ci_low, spread.ci_high) == pytest.approx(wilson_by_hand(0.75, 12), abs=1e-12)
    # point: P(X >= 3), X ~ Bin(4, 0.75); k = 3 on 2 problems: P(T >= 5), T ~ Bin(6, 0.75)
    assert S.pass_probability(4, 1, 0.75, 0.95, "point") == pytest.approx(4 * 0.75**3 * 0.25 + 0.75**4)
    assert S.pass_probability(2, 3, 0.75, 0.95, "point") == pytest.approx(6 * 0.75**5 * 0.25 + 0.75**6)
    # lower_bound, k = 1, 105 problems at 0.95: only 105 of 105 has its Wilson lower end >= 0.95
    assert S.pass_probability(105, 1, 0.95, 0.95, "lower_bound") == pytest.approx(0.95**105)
    # lower_bound, k > 1: the dynamic programme against every outcome enumerated
    n, k, gate = 3, 2, 0.6
    per = binom.pmf(range(k + 1), k, gate)
    brute = sum(
        math.prod(per[c] for c in cs)
        for cs in itertools.product(range(k + 1), repeat=n)
        if S.gate_figures(list(cs), k, 0.95).ci_low >= gate
    )
    assert brute > 0 and S.pass_probability(n, k, gate, 0.95, "lower_bound") == pytest.approx(brute, abs=1e-12)


def test_the_lower_bound_rule_refuses_what_the_point_rule_accepts() -> None:
    recs = records([1] * 101 + [0] * 4, 1)  # 101/105 = 0.962 >= 0.95; Wilson lower end 0.906
    point = A.summarise(recs, A.AccuracySpec(data="x"))
    lower = A.summarise(recs, A.AccuracySpec(data="x", rule="lower_bound"))
    assert point["passed"] and point["accuracy"] >= 0.95 and not lower["passed"] and lower["ci_low"] < 0.95
    assert point["pass_probability_at_gate"] == pytest.approx(binom.sf(99, 105, 0.95))  # P(X >= 100)
    assert lower["pass_probability_at_gate"] == pytest.approx(0.95**105)
    assert A.summarise(records([3] * 105, 3), A.AccuracySpec(data="x", samples=3, rule="lower_bound"))["passed"]


def _trial(tmp_path: Path, monkeypatch) -> Path:
    return two_problem_trial(tmp_path, monkeypatch, "k3", "limit = 2\nsamples = 3\n")[0]


def test_verify_recounts_samples_and_the_pass_probability(tmp_path: Path, monkeypatch) -> None:
    out = _trial(tmp_path, monkeypatch)
    acc = json.loads((out / "summary.json").read_text())["accuracy"]["E1"]
    assert (acc["n"], acc["samples"], acc["correct"], acc["passed"]) == (2, 3, 6, True)
    assert verify_serving_run(out).problems == []
    short = tmp_path / "short"
    shutil.copytree(out, short)
    path = short / "accuracy" / "E1" / "records.jsonl"
    lines = path.read_text().splitlines()
    gone = json.loads(lines[-1])
    path.write_text("\n".join(lines[:-1]) + "\n")  # planted: one sample left out
    assert f"accuracy E1: problem {gone['unique_id']} has 2 of 3 samples" in verify_serving_run(short).problems
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    summary = json.loads((edited / "summary.json").read_text())
    summary["accuracy"]["E1"]["pass_probability_at_gate"] = 0.9  # planted: a gate that looks decisive
    (edited / "summary.json").write_text(json.dumps(summary))
    assert any(p.startswith("accuracy E1: pass_probability_at_gate = 0.9") for p in verify_serving_run(edited).problems)


def test_cross_grade_without_evalscope_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "evalscope", None)
    got = cross_grade(records([1], 1))
    assert not got.ran and got.reason.startswith("cross-grade not run: evalscope is not installed")
    assert got.reason.endswith("pip install 'kerneltrial[evalscope]'") and got.lines() == [got.reason]


def test_cross_grade_with_evalscope_lists_the_disagreements() -> None:
    pytest.importorskip("evalscope", reason="evalscope is not installed (the optional extra kerneltrial[evalscope])")
    right = A.Record(0, "u0", "Level 3", "s", "\\frac{1}{2}", "p", "so \\boxed{0.5}", correct=True)
    wrong = A.Record(1, "u1", "Level 3", "s", "3", "p", "so \\boxed{4}", correct=True, sample=2)  # planted: ours wrong
    failed = A.Record(2, "u2", "Level 3", "s", "3", "p", error="HTTP 500")
    got = cross_grade([right, wrong, failed])
    assert got.ran and got.grader.startswith("evalscope ") and got.grader.endswith(" math_500")
    assert (got.graded, got.agree, got.correct_ours, got.correct_theirs) == (2, 1, 2, 1)
    assert [(d.unique_id, d.sample, d.ours, d.theirs, d.their_extracted) for d in got.disagreements] == [
        ("u1", 2, True, False, "4")
    ]


def test_serve_accuracy_prints_the_pass_probability(tmp_path: Path, port: int, fake_argv, math500_path) -> None:
    spec = ServerSpec(fake_argv(port, "--model-id", "f"), "f", port=port)
    with Server(spec, tmp_path / "server.log"):
        args = ["--base-url", spec.base_url, "--data", str(math500_path), "--limit", "3", "--samples", "2"]
        r = run_cli("serve", "accuracy", *args, "--rule", "lower_bound", "--out", str(tmp_path / "acc"))
    assert r.exit_code == 1, r.output  # far below the gate
    at_gate = json.loads((tmp_path / "acc" / "accuracy.json").read_text())["pass_probability_at_gate"]
    assert "(3 problems x 2 samples)" in r.output and "(rule: interval's lower end >= 0.95)" in r.output
    assert f"a model at exactly 0.95 passes this gate with probability {at_gate:.3f}" in r.output
    assert "cross-grade" in r.output
