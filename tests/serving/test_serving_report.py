"""`kerneltrial report` on a serving run directory: a real run_protocol against the fake server,
with the benchmark client replaced by a synthetic one whose speed depends on the arm."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving import trial
from kerneltrial.serving.acceptance import case_record
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.report_data import GeomeanInterval, load_run, parts_of, verdict
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli

from .conftest import FAKE, answer_as_served, start_times

# arm -> (throughput factor, TTFT factor): E1 gains 5%, E2 is inside the noise band, E3 gains 9%
# but its TTFT is 3% worse than E0's.
SPEED = {"E0": (1.0, 1.0), "E1": (1.05, 1.0), "E2": (1.004, 1.0), "E3": (1.09, 1.03)}
JITTER = 0.0002  # per launch and run: intervals across launches of about +-0.3%, narrower than the 1% band


def protocol_text(port: int) -> str:
    argv = json.dumps([sys.executable, str(FAKE), "--port", "{port}"])
    arms = ""
    for name, role, ops in (("E0", "baseline", ""), ("E1", "arm", "rms_norm"), ("E2", "arm", "silu_and_mul")) + (
        ("E3", "candidate", "rms_norm,silu_and_mul"),
    ):
        env = f'{{ VLLM_DISABLE_COMPILE_CACHE = "1", KERNELTRIAL_VLLM_OPS = "{ops}" }}'
        arms += f'[[arms]]\nname = "{name}"\nrole = "{role}"\nargv = {argv}\nenv = {env}\n'
    return (
        f'name = "t2-fake"\nseed = 1\nrounds = 2\nrepeats = 3\n[server]\nmodel_id = "tiny"\nport = {port}\n'
        f"ready_timeout_s = 30\nstop_grace_s = 5\n[bench]\ncases = [[8, 4, 1, 2], [16, 4, 2, 4]]\n{arms}"
    )


def fake_bench(argv: list[str], json_path: Path, log_path: Path, timeout_s: float, server: Any = None) -> dict:
    """A `vllm bench serve --save-detailed` result: duration set by the arm (from raw/NN-ARM/...), the
    launch and the run, so that intervals have a spread."""
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    n, n_in, n_out = int(opt["--num-prompts"]), int(opt["--random-input-len"]), int(opt["--random-output-len"])
    launch, arm = json_path.parent.parent.name.split("-", 1)
    run = int(json_path.stem.removeprefix("run"))
    speed, slow_start = SPEED[arm]
    jitter = 1 + JITTER * ((int(launch) * 3 + run) % 4)
    answer_as_served(server, n)
    duration = 2.0 / (speed * jitter)
    ttft = 0.1 * slow_start * jitter
    raw = {
        "duration": duration,
        "completed": n,
        "input_lens": [n_in] * n,
        "output_lens": [n_out] * n,
        "errors": [""] * n,
        "ttfts": [ttft] * n,
        "latencies": [ttft + 0.01 * (n_out - 1)] * n,
        "itls": [[0.01] * (n_out - 1)] * n,
        # one after another, the last ending when the duration does (verify checks the span)
        "start_times": start_times(n, duration, ttft + 0.01 * (n_out - 1)),
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(raw))
    log_path.write_text("fake bench\n")
    return raw


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kerneltrial.serving.launcher import free_port

    out = tmp_path_factory.mktemp("t2") / "run"
    text = protocol_text(free_port())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", fake_bench)
        trial.run_protocol(parse_protocol(text), text.encode(), out, vllm=sys.executable, argv=["test"])
    assert verify_serving_run(out).problems == []  # a consistent run directory, as a real trial writes one
    return out


def test_report_command_renders_a_serving_run(run_dir: Path):
    r = run_cli("report", str(run_dir))
    assert r.exit_code == 0, r.output
    md = (run_dir / "report.md").read_text()
    for png in ("throughput.png", "ttft.png", "latency.png"):
        assert (run_dir / png).stat().st_size > 1000 and f"]({png})" in md
    # p50 and p99 of TTFT, TPOT, ITL and E2E per arm and case, as summary.json has them (issue 26)
    summary = json.loads((run_dir / "summary.json").read_text())
    e1 = summary["results"]["E1"]["in8-out4-c1-n2"]
    assert "| arm | p50 TTFT ms | p99 TTFT ms | p50 TPOT ms | p99 TPOT ms | p50 ITL ms | p99 ITL ms |" in md
    cells = [f"{e1[f'{s}_{m}_ms']:.1f}" for m in ("ttft", "tpot", "itl", "e2el") for s in ("median", "p99")]
    assert "| E1 | " + " | ".join(cells) + " |" in md
    assert "| E1 | arm | `KERNELTRIAL_VLLM_OPS=rms_norm` | rms_norm -> kerneltrial |" in md
    assert "- environment: `VLLM_DISABLE_COMPILE_CACHE=1`" in md
    assert "### in8-out4-c1-n2" in md and "### in16-out4-c2-n4" in md
    # acceptance of every arm against E0: E1 accepted; E2 inside the noise band; E3 slower to first token
    assert "| E1 | no gate | valid | ACCEPTED | - |" in md
    assert "| E1 | E0 | in8-out4-c1-n2 | 2 | +5.00% [+4.73%, +5.27%] | 1.0000 [0.9975, 1.0025] | yes | yes |" in md
    assert (
        "| E2 | no gate | valid | **REJECTED** | in8-out4-c1-n2: total tok/s gain +0.42% [+0.17%, +0.68%]: lower "
        "bound not above the noise band 1.00%" in md
    )
    assert (
        "| E3 | no gate | valid | **REJECTED** | in8-out4-c1-n2: mean TTFT ratio 1.0302 [1.0302, 1.0302]: upper" in md
    )
    assert "The trial's own verdict (summary.json, E3 against E0): REJECTED." in md
    # E3 against each single arm, and whether they qualified
    assert "### E3: a combination of E1, E2" in md and "(E1 qualified, E2 did not qualify)" in md
    assert "| E3 | E1 | in8-out4-c1-n2 | 2 | +3.83% [+3.57%, +4.09%] | 1.0302 [1.0276, 1.0328] | yes | **no** |" in md
    # the fake server leaves the call records kerneltrial's plugin would (tests/serving/fake_server.py)
    assert "| E0 | valid | all 2 launch(es) valid | - |" in md
    assert "| E1 | valid | all 2 launch(es) valid | fused_add_rms_norm: 16 calls of kerneltrial; rms_norm: 16" in md
    assert "No accuracy gate in the protocol." in md


def test_intervals_and_comparisons_follow_the_run_files(run_dir: Path):
    run = load_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    # the report's verdict of the candidate is the trial's own, figure for figure (one rule: serving/acceptance.py)
    v = verdict(run, "E3", "E0")
    recorded = summary["acceptance"]
    assert (v.verdict, list(v.reasons)) == (recorded["verdict"], recorded["reasons"])
    assert [case_record(c) for c in v.cases] == list(recorded["cases"].values())
    v = verdict(run, "E1", "E0")
    results = summary["results"]
    rounds = {L["launch"]: L["round"] for L in json.loads((run_dir / "plan.json").read_text())["launches"]}
    for c in v.cases:  # the gain is the geometric mean of the per-round ratios of the launches' figures
        per_round = {
            arm: {rounds[g["launch"]]: g["total_token_throughput"] for g in results[arm][c.case]["launches"]}
            for arm in ("E0", "E1")
        }
        want = math.prod(per_round["E1"][r] / per_round["E0"][r] for r in (0, 1)) ** 0.5 - 1
        assert c.gain == pytest.approx(want, rel=1e-12) and c.throughput_ok and c.ttft_ok
    assert [a.name for a in parts_of(run, run.plan.arms[3])] == ["E1", "E2"]
    assert parts_of(run, run.plan.arms[1]) == []
    assert GeomeanInterval.of([5.0], 0.95).low is None and GeomeanInterval.of([5.0], 0.95).cell(".1f") == "5.0 (n=1)"


def test_intervals_are_on_the_log_scale_and_never_negative():
    """Issue 26: three noisy launches gave "913.5 tok/s [-5004, 6831]" on the raw scale."""
    values = [120.0, 2500.0, 120.5]
    mean = sum(values) / 3
    raw_low = mean - 4.302653 * statistics.stdev(values) / 3**0.5
    assert raw_low < 0  # the planted case: the raw-scale interval goes negative
    i = GeomeanInterval.of(values, 0.95)
    logs = [math.log(v) for v in values]
    half = 4.302653 * statistics.stdev(logs) / 3**0.5
    assert i.mean == pytest.approx(math.exp(sum(logs) / 3), rel=1e-12)  # the geometric mean
    assert (i.low, i.high) == pytest.approx((i.mean * math.exp(-half), i.mean * math.exp(half)), rel=1e-6)
    assert 0 < i.low < min(values) and i.n == 3
    assert GeomeanInterval.of([0.0, 1.0], 0.95).low is None  # a zero has no log: the plain mean, no interval


def test_report_shows_accuracy_and_dispatch_when_recorded(run_dir: Path, tmp_path: Path):
    """summary.json's `dispatch` and the launches' verdicts (written by trials that record them),
    and an accuracy gate: an invalid proof or a failed gate rejects an arm that is fast enough."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    summary = json.loads((copy / "summary.json").read_text())
    plan = json.loads((copy / "plan.json").read_text())
    plan["accuracy"] = {"gate": 0.95, "level": "Level 3"}
    acc = {"n": 100, "correct": 97, "errors": 0, "accuracy": 0.97, "ci_low": 0.92, "ci_high": 0.99, "confidence": 0.95}
    summary["accuracy"] = {a: acc | {"passed": True} for a in ("E0", "E1", "E2")}
    summary["dispatch"] = {
        a: {
            "valid": a != "E2",
            "reason": "ok" if a != "E2" else "silu_and_mul: selected kerneltrial served no calls",
            "counts": [{"op": "rms_norm", "impl": "kerneltrial", "calls": 120, "errors": 0}] if a == "E1" else [],
        }
        for a in ("E0", "E1", "E2", "E3")
    }
    (copy / "summary.json").write_text(json.dumps(summary))
    (copy / "plan.json").write_text(json.dumps(plan))
    rows = [json.loads(x) for x in (copy / "launches.jsonl").read_text().splitlines()]
    rows[0]["dispatch"] = {"valid": False, "reason": "planted"}
    del rows[1]["dispatch"]  # as launches of a trial from before the proof
    (copy / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # hand-written figures: they do not verify, so the page is rendered (and titled) unverified
    assert run_cli("report", str(copy), "--unverified").exit_code == 0
    md = (copy / "report.md").read_text()
    assert "| E1 | passed | valid | ACCEPTED | - |" in md
    assert "| E2 | passed | **invalid** | **REJECTED** |" in md and "arm E2: dispatch proof invalid (silu_and_mul" in md
    assert "accuracy not measured below the gate 0.95" in md  # E3 has no accuracy record
    assert "| E0 | 97/100 | 0.970 | 0.920-0.990 (Wilson 95%) | 0 | passed |" in md
    assert "| E1 | valid | ok | rms_norm: 120 calls of kerneltrial |" in md
    assert f"| {rows[0]['launch']} | {rows[0]['arm']} | **invalid** | planted |" in md
    assert f"| {rows[1]['launch']} | {rows[1]['arm']} | not recorded | - |" in md


def test_a_directory_that_is_not_a_serving_run_is_one_error_line(tmp_path: Path):
    (tmp_path / "provenance.json").write_text(json.dumps({"kind": "serving"}))
    (tmp_path / "plan.json").write_text(json.dumps({"arms": []}))
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "runs.jsonl").write_text("")
    r = run_cli("report", str(tmp_path))
    assert r.exit_code == 2 and "plan.json: cases: Field required" in r.output and "Traceback" not in r.output
