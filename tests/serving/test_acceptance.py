"""Noise-aware acceptance (issue 14): intervals across launches, counterbalanced launch order,
INCONCLUSIVE below two launches per arm, and the A/A case from the issue whose swapped labels
the old rule (ratio of pooled means) accepted. Trials run against the fake server with a
synthetic benchmark client whose figures are set per arm and launch."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from kerneltrial.serving import trial
from kerneltrial.serving.acceptance import (
    ACCEPTED,
    INCONCLUSIVE,
    REJECTED,
    GateCheck,
    LaunchFigure,
    Rule,
    compare_case,
    judge,
)
from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.order import launch_order, williams_rows
from kerneltrial.serving.protocol import Arm, parse_protocol
from kerneltrial.serving.report_data import load_run, verdict
from kerneltrial.serving.verify import verify_serving_run
from kerneltrial.stats import paired_ratio
from tests.conftest import REPO
from tests.kt import run_cli, write_protocol

from .conftest import FAKE, answer_as_served, start_times

RULE = Rule(noise_band=0.01, ttft_ratio_max=1.01, confidence=0.95)
CASE = "in8-out4-c1-n2"

# ---------------------------------------------------------------- the interval


def test_the_interval_is_a_paired_t_interval_on_log_ratios():
    num, den = [105.0, 103.0, 108.0, 104.0], [100.0, 99.0, 101.0, 100.5]
    r = paired_ratio(num, den, 0.95)
    logs = [math.log(a / b) for a, b in zip(num, den, strict=True)]
    ci = stats.ttest_1samp(logs, 0.0).confidence_interval(0.95)  # scipy's own, as the reference
    assert r.n == 4 and r.estimate == pytest.approx(math.exp(sum(logs) / 4), rel=1e-12)
    assert r.interval is not None
    assert (r.interval.low, r.interval.high) == pytest.approx((math.exp(ci.low), math.exp(ci.high)), rel=1e-12)
    # labels swapped: the inverse ratio and the inverse interval, so the rule treats both labellings alike
    s = paired_ratio(den, num, 0.95)
    assert s.interval is not None
    assert (s.estimate, s.interval.low, s.interval.high) == pytest.approx(
        (1 / r.estimate, 1 / r.interval.high, 1 / r.interval.low), rel=1e-12
    )
    assert paired_ratio([105.0], [100.0], 0.95).interval is None
    with pytest.raises(ValueError, match="positive figures, got 0.0"):
        paired_ratio([1.0, 0.0], [1.0, 1.0], 0.95)


def figures(tput: list[float], ttft: list[float]) -> list[LaunchFigure]:
    return [LaunchFigure(r, t, f) for r, (t, f) in enumerate(zip(tput, ttft, strict=True))]


def test_a_clear_gain_is_accepted_and_a_noisy_one_is_not():
    base = figures([100.0, 101.0, 99.0, 100.0], [50.0, 50.5, 49.5, 50.0])
    fast = figures([120.0, 121.5, 118.5, 120.2], [50.0, 50.4, 49.6, 50.0])
    c = compare_case(CASE, fast, base, RULE)
    assert c.status == "ok" and c.throughput_ok and c.ttft_ok
    assert judge("B", "A", [c], [], RULE).verdict == ACCEPTED
    # the same mean gain with launch-to-launch noise: the lower bound is not above the band
    noisy = figures([150.0, 95.0, 140.0, 96.0], [50.0, 50.0, 50.0, 50.0])
    c = compare_case(CASE, noisy, base, RULE)
    assert c.gain is not None and c.gain > 0.1 and not c.throughput_ok
    v = judge("B", "A", [c], [], RULE)
    assert v.verdict == REJECTED and "lower bound not above the noise band 1.00%" in v.reasons[0]


def test_one_launch_per_arm_is_inconclusive_and_says_how_many_are_needed():
    c = compare_case(CASE, figures([200.0], [10.0]), figures([100.0], [10.0]), RULE)
    assert c.status == INCONCLUSIVE and c.gain == pytest.approx(1.0)
    v = judge("B", "A", [c], [], RULE)
    assert v.verdict == INCONCLUSIVE and not v.accepted
    assert v.reasons == (
        f"{CASE}: 1 launch(es) per arm give no interval; at least 2 launches per arm are needed (rounds >= 2; "
        "an even number completes the A B / B A blocks)",
    )
    # a failed gate beside it is a decision: REJECTED, with both reasons
    v = judge("B", "A", [c], [GateCheck(False, "accuracy 0.100 (0 errors) below the gate 0.95")], RULE)
    assert v.verdict == REJECTED and len(v.reasons) == 2
    # a missing side is a failed case, not an inconclusive one
    assert judge("B", "A", [compare_case(CASE, None, figures([1.0], [1.0]), RULE)], [], RULE).verdict == REJECTED


def old_rule_accepts(arm: list[LaunchFigure], against: list[LaunchFigure]) -> bool:
    """The rule before issue 14: ratio of pooled means, no interval."""
    gain = sum(f.throughput for f in arm) / sum(f.throughput for f in against) - 1
    ratio = sum(f.ttft_ms for f in arm) / sum(f.ttft_ms for f in against)
    return gain > RULE.noise_band and ratio <= RULE.ttft_ratio_max


# The issue's A/A trial: one arm read -40.8% throughput and a 1.74 TTFT ratio, because one of
# its launches was slow (a cold start); the same data with the labels swapped passed the old rule.
AA_A = figures([100.0, 101.0], [50.0, 50.5])
AA_B = figures([59.2, 100.5], [87.0, 50.2])


def test_the_issues_a_a_case_no_longer_flips_to_accepted_when_the_labels_are_swapped():
    assert not old_rule_accepts(AA_B, AA_A) and old_rule_accepts(AA_A, AA_B)  # the planted flip
    for arm, against, a, b in (("B", "A", AA_B, AA_A), ("A", "B", AA_A, AA_B)):
        v = judge(arm, against, [compare_case(CASE, a, b, RULE)], [], RULE)
        assert v.verdict == REJECTED, v
    # with one launch each (the issue's trial) there is no interval at all
    one = compare_case(CASE, AA_A[:1], AA_B[:1], RULE)
    assert old_rule_accepts(AA_A[:1], AA_B[:1]) and judge("A", "B", [one], [], RULE).verdict == INCONCLUSIVE


# ---------------------------------------------------------------- launch order


def arms(k: int) -> list[Arm]:
    return [Arm(name=f"a{i}", argv=["x"]) for i in range(k)]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_every_arm_is_at_every_position_equally_often_over_a_complete_design(k):
    rounds = 2 * k  # k blocks of two rounds (a row of the Williams square, then reversed)
    for seed in range(6):
        order = launch_order(arms(k), rounds, seed)
        assert len(order) == rounds * k
        for r in range(rounds):  # each round runs every arm once
            assert sorted(n for rr, _, n in order if rr == r) == sorted(a.name for a in arms(k))
        counts = Counter((p, n) for _, p, n in order)
        assert set(counts.values()) == {2} and len(counts) == k * k
        for block in range(k):  # within a block every arm has the same mean position: linear drift cancels
            sums = Counter()
            for r, p, n in order:
                if r // 2 == block:
                    sums[n] += p
            assert set(sums.values()) == {k - 1}


def test_the_order_is_a_pure_function_of_the_seed_and_two_arms_run_abba_blocks():
    two = arms(2)
    assert launch_order(two, 4, 7) == launch_order(two, 4, 7)
    seqs = {tuple(n for _, _, n in launch_order(two, 4, s)) for s in range(20)}
    assert seqs == {("a0", "a1", "a1", "a0", "a1", "a0", "a0", "a1"), ("a1", "a0", "a0", "a1", "a0", "a1", "a1", "a0")}
    # the seed decides which arm starts; the names, not their order in the protocol, are shuffled
    assert len({launch_order(arms(3), 6, s)[0][2] for s in range(20)}) == 3


@pytest.mark.parametrize("k", [2, 4, 6])
def test_williams_rows_balance_carry_over_for_an_even_number_of_arms(k):
    rows = williams_rows(k)
    follows = Counter((a, b) for row in rows for a, b in itertools.pairwise(row))
    assert len(follows) == k * (k - 1) and set(follows.values()) == {1}


# ---------------------------------------------------------------- trials on the fake server

Bench = Callable[..., dict[str, Any]]


def synthetic_bench(factors: Callable[[str, int], tuple[float, float]]) -> Bench:
    """A `vllm bench serve --save-detailed` result whose duration and TTFT scale with
    factors(arm, launch) = (throughput factor, TTFT factor); the same in every run of a launch."""

    def bench(argv: list[str], json_path: Path, log_path: Path, timeout_s: float, server: Any = None) -> dict:
        opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        n, n_in, n_out = int(opt["--num-prompts"]), int(opt["--random-input-len"]), int(opt["--random-output-len"])
        launch, arm = json_path.parent.parent.name.split("-", 1)
        speed, slow_start = factors(arm, int(launch))
        ttft = 0.1 * slow_start
        latency = ttft + 0.01 * (n_out - 1)
        answer_as_served(server, n)
        raw = {
            "duration": 2.0 / speed,
            "completed": n,
            "input_lens": [n_in] * n,
            "output_lens": [n_out] * n,
            "errors": [""] * n,
            "ttfts": [ttft] * n,
            "latencies": [latency] * n,
            "itls": [[0.01] * (n_out - 1)] * n,
            "start_times": start_times(n, 2.0 / speed, latency),
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(raw))
        log_path.write_text("synthetic bench\n")
        return raw

    return bench


def trial_text(rounds: int, names: tuple[str, str] = ("A", "B"), extra: str = "", port: int | None = None) -> str:
    argv = json.dumps([sys.executable, str(FAKE), "--port", "{port}"])
    arms = "".join(
        f'[[arms]]\nname = "{n}"\nrole = "{r}"\nargv = {argv}\n'
        for n, r in zip(names, ("baseline", "candidate"), strict=True)
    )
    return (
        f'name = "noise"\nseed = 3\nrounds = {rounds}\nrepeats = 2\n[server]\nmodel_id = "tiny"\n'
        f"port = {port or free_port()}\nready_timeout_s = 30\nstop_grace_s = 5\n[bench]\ncases = [[8, 4, 1, 2]]\n"
        f"[acceptance]\n{extra}{arms}"
    )


def run_trial(tmp_path: Path, monkeypatch, text: str, bench: Bench) -> tuple[int, str, Path]:
    proto = write_protocol(tmp_path / "trial.toml", text)
    out = tmp_path / "run"
    monkeypatch.setattr(trial, "run_bench", bench)
    r = run_cli("serve", "trial", str(proto), "--vllm", sys.executable, "--quiet", "--out", str(out))
    return r.exit_code, r.output, out


def wobble(launch: int) -> float:
    """Launch-to-launch noise of +-0.1%, the same for every arm."""
    return 1 + 0.001 * ((launch * 5) % 3 - 1)


def test_a_clearly_faster_candidate_is_accepted(tmp_path, monkeypatch):
    bench = synthetic_bench(lambda arm, L: ((1.2 if arm == "B" else 1.0) * wobble(L), 1.0 / wobble(L)))
    code, output, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=4), bench)
    assert code == 0, output
    acc = json.loads((out / "summary.json").read_text())["acceptance"]
    assert acc["verdict"] == "ACCEPTED" and acc["accepted"] and acc["reasons"] == []
    case = acc["cases"][CASE]
    assert case["rounds"] == 4 and case["gain_low"] > 0.15 and case["ttft_ratio_high"] <= 1.01
    assert "candidate B vs baseline A: ACCEPTED" in output
    assert verify_serving_run(out).problems == []
    plan = json.loads((out / "plan.json").read_text())
    rows = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert [L["arm"] for L in plan["launches"]] == [L["arm"] for L in rows] in (list("ABBABAAB"), list("BAABABBA"))
    assert [(L["round"], L["block"], L["position"]) for L in rows] == [
        (r, r // 2, p) for r in range(4) for p in range(2)
    ]
    # tampering: a recorded bound that the figures do not give
    summary = json.loads((out / "summary.json").read_text())
    summary["acceptance"]["cases"][CASE]["gain_low"] = 0.5
    (out / "summary.json").write_text(json.dumps(summary))
    assert any(f"acceptance {CASE}: gain_low 0.5, recomputed" in p for p in verify_serving_run(out).problems)


def test_an_accepted_run_naming_a_commit_older_than_its_records_is_refused(tmp_path, monkeypatch):
    """A forger names an older clean commit (its package digest copied into provenance.json) to shed the
    records that commit's runner never wrote: the plan's keys cannot see them, the acceptance floor can."""
    from kerneltrial.kernel.git_history import package_at
    from kerneltrial.kernel.integrity import package_digest
    from kerneltrial.serving.verify_plan import ACCEPTANCE_FLOOR

    parent = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", f"{ACCEPTANCE_FLOOR}~1"], capture_output=True, text=True
    )
    older = package_at(parent.stdout.strip() or "none")
    if older.files is None:
        pytest.skip(f"no git history before the acceptance floor here: {older.reason}")
    bench = synthetic_bench(lambda arm, L: ((1.2 if arm == "B" else 1.0) * wobble(L), 1.0 / wobble(L)))
    code, output, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=4), bench)
    assert code == 0, output
    honest = next(c for c in verify_serving_run(out).checks if c.name == "acceptance runner")
    assert honest.ok and honest.applicable and "or later" in honest.detail
    prov = json.loads((out / "provenance.json").read_text())
    git = prov["git"] | {"commit": older.commit, "dirty": False, "source_sha256": package_digest(older.files)}
    for forged, says in (
        (git, f"the run is accepted, but commit {older.commit[:12]} is older than {ACCEPTANCE_FLOOR[:12]}"),
        ({k: v for k, v in git.items() if k != "commit"}, "the run is accepted but names no commit by its full hash"),
        (git | {"commit": "HEAD"}, 'the run is accepted but names no commit by its full hash ("HEAD")'),
        (git | {"commit": "f" * 40}, f"the run is accepted, but commit {'f' * 12} is not in this checkout's history"),
    ):
        (out / "provenance.json").write_text(json.dumps(prov | {"git": forged}))
        check = next(c for c in verify_serving_run(out).checks if c.name == "acceptance runner")
        assert not check.ok and check.problems[0].startswith(says), check.problems


def test_an_a_a_trial_is_not_accepted(tmp_path, monkeypatch):
    bench = synthetic_bench(lambda arm, L: (wobble(L), 1.0 / wobble(L)))
    code, output, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=2), bench)
    assert code == 1, output
    acc = json.loads((out / "summary.json").read_text())["acceptance"]
    assert acc["verdict"] == "REJECTED" and not acc["accepted"]
    assert acc["cases"][CASE]["gain_low"] < 0 < acc["cases"][CASE]["gain_high"]
    assert "candidate B vs baseline A: REJECTED" in output
    assert verify_serving_run(out).problems == []
    # tampering: the verdict flipped to ACCEPTED
    summary = json.loads((out / "summary.json").read_text())
    summary["acceptance"] |= {"accepted": True, "verdict": "ACCEPTED"}
    (out / "summary.json").write_text(json.dumps(summary))
    assert "acceptance verdict ACCEPTED, recomputed REJECTED" in verify_serving_run(out).problems
    # and the rule that would accept it written into plan.json, or the rule deleted: protocol.toml's rule decides
    plan = json.loads((out / "plan.json").read_text())
    for edited in (
        plan | {"acceptance": plan["acceptance"] | {"noise_band": -1.0, "ttft_ratio_max": 9.0}},
        {k: v for k, v in plan.items() if k != "acceptance"},
    ):
        (out / "plan.json").write_text(json.dumps(edited))
        assert "acceptance verdict ACCEPTED, recomputed REJECTED" in verify_serving_run(out).problems


def test_one_launch_per_arm_is_an_inconclusive_trial_that_exits_1(tmp_path, monkeypatch):
    bench = synthetic_bench(lambda arm, L: (2.0 if arm == "B" else 1.0, 1.0))
    code, output, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=1), bench)
    assert code == 1, output
    acc = json.loads((out / "summary.json").read_text())["acceptance"]
    assert acc["verdict"] == "INCONCLUSIVE" and acc["cases"][CASE]["gain"] == pytest.approx(1.0)
    assert "at least 2 launches per arm are needed" in output and "INCONCLUSIVE" in output
    assert verify_serving_run(out).problems == []


def test_the_issues_case_run_as_a_trial_is_accepted_under_neither_label(tmp_path, monkeypatch):
    """A/A with a cold first launch of B (-40.8% throughput, 1.74 x TTFT): the old rule accepted A against B."""
    order = launch_order(parse_protocol(trial_text(rounds=2)).arms, 2, 3)
    first_b = next(i for i, (_, _, n) in enumerate(order) if n == "B")
    bench = synthetic_bench(lambda arm, L: (0.592, 1.74) if L == first_b else (wobble(L), 1.0))
    code, _, out = run_trial(tmp_path, monkeypatch, trial_text(rounds=2), bench)
    assert code == 1 and verify_serving_run(out).problems == []
    run = load_run(out)
    launches = {
        arm: [
            LaunchFigure(0, f.total_token_throughput, f.mean_ttft_ms) for f in run.summary.results[arm][CASE].launches
        ]
        for arm in ("A", "B")
    }
    assert old_rule_accepts(launches["A"], launches["B"])  # the planted flip: A "beats" B on the old rule
    for arm, against in (("B", "A"), ("A", "B")):
        assert verdict(run, arm, against).verdict == REJECTED
