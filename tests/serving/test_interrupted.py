"""A run that stops before its end says so, and `verify` refuses it (issue 14: an interrupted or
killed run stayed "running" and verify passed it). Fake server, fake benchmark client."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving import trial
from kerneltrial.serving.launcher import LaunchError, free_port
from kerneltrial.serving.lifecycle import group_alive
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import cli_argv, run_cli, write_protocol

from .conftest import FAKE, REPO, answer_as_served, start_times


def protocol_text(port: int) -> str:
    argv = json.dumps([sys.executable, str(FAKE), "--port", "{port}", "--spawn-child"])
    arms = "".join(
        f'[[arms]]\nname = "{n}"\nrole = "{r}"\nargv = {argv}\n' for n, r in (("a", "baseline"), ("b", "candidate"))
    )
    return (
        f'name = "interrupted"\nrounds = 2\nrepeats = 2\n[server]\nmodel_id = "tiny"\nport = {port}\n'
        f"ready_timeout_s = 30\nstop_grace_s = 5\n[bench]\ncases = [[8, 4, 1, 2]]\n{arms}"
    )


def fake_bench(stop_at: int, error: BaseException):
    """A benchmark client that writes a plausible result, and raises `error` in launch `stop_at`."""

    def run(argv: list[str], json_path: Path, log_path: Path, timeout_s: float, server: Any = None) -> dict:
        if int(json_path.parent.parent.name.split("-")[0]) == stop_at:
            raise error
        n = 2
        answer_as_served(server, n)
        raw = {
            "duration": 1.0,
            "completed": n,
            "input_lens": [8] * n,
            "output_lens": [4] * n,
            "errors": [""] * n,
            "ttfts": [0.1] * n,
            "latencies": [0.13] * n,
            "itls": [[0.01] * 3] * n,
            "start_times": start_times(n, 1.0, 0.13),
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(raw))
        log_path.write_text("fake bench\n")
        return raw

    return run


def run_trial(out: Path, bench: Any) -> None:
    text = protocol_text(free_port())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", bench)
        trial.run_protocol(parse_protocol(text), text.encode(), out, vllm=sys.executable, argv=["test"])


def provenance(out: Path) -> dict[str, Any]:
    return json.loads((out / "provenance.json").read_text())


def launch_arm(out: Path, launch: int) -> str:
    return json.loads((out / "plan.json").read_text())["launches"][launch]["arm"]


def test_ctrl_c_mid_trial_marks_the_run_interrupted_and_verify_refuses_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_trial(out, fake_bench(2, KeyboardInterrupt()))
    prov = provenance(out)
    assert prov["status"] == "interrupted" and prov["finished_at"]
    assert prov["stopped_in"] == {"launch": 2, "arm": launch_arm(out, 2)}
    assert not (out / "summary.json").exists()
    [problem] = verify_serving_run(out).problems
    assert problem == (
        f"incomplete run: interrupted at {prov['finished_at']} in launch 2 ({launch_arm(out, 2)}); "
        "it is not evidence, run the trial again"
    )
    r = run_cli("verify", str(out))
    assert r.exit_code == 1 and "incomplete run: interrupted" in r.output


def test_an_unexpected_error_marks_the_run_failed_with_the_error(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="client crashed"):
        run_trial(out, fake_bench(1, RuntimeError("client crashed")))
    prov = provenance(out)
    assert prov["status"] == "failed" and prov["error"] == "RuntimeError: client crashed" and prov["finished_at"]
    assert prov["stopped_in"] == {"launch": 1, "arm": launch_arm(out, 1)}
    [problem] = verify_serving_run(out).problems
    assert problem.startswith("incomplete run: failed at") and "before its summary was written" in problem


def test_a_finished_run_has_no_stopping_point_and_verifies(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_trial(out, fake_bench(-1, KeyboardInterrupt()))
    prov = provenance(out)
    assert prov["status"] == "finished" and "stopped_in" not in prov
    assert verify_serving_run(out).problems == []


def test_a_run_left_running_is_refused_even_with_a_summary_that_says_ok(tmp_path: Path) -> None:
    """Planted: a finished run's directory whose provenance is put back to what kill -9 leaves
    ("running", no finished_at); its summary still says ok."""
    out = tmp_path / "run"
    run_trial(out, fake_bench(-1, KeyboardInterrupt()))
    prov = provenance(out) | {"status": "running", "finished_at": None}
    (out / "provenance.json").write_text(json.dumps(prov))
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    [problem] = verify_serving_run(out).problems
    assert problem.startswith("incomplete run: provenance.json says status 'running' with no finished record")
    r = run_cli("verify", str(out))
    assert r.exit_code == 1 and "the run was killed" in r.output


def fake_client(tmp_path: Path) -> Path:
    """A `vllm` whose benchmark never ends (the trial is mid-benchmark when it is signalled); it
    writes its pid to bench-started."""
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    started = tmp_path / "bench-started"
    exe.write_text(
        f"#!{sys.executable}\nimport os, time\nopen({str(started)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _gone(pgid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and group_alive(pgid):
        time.sleep(0.1)
    return not group_alive(pgid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_trial_is_refused_by_verify(tmp_path: Path, sig: signal.Signals, server_records: Path) -> None:
    """SIGTERM: the trial stops its server and records "interrupted" in launch 0. SIGKILL: nothing
    is recorded (provenance stays "running"), the supervisor stops the server, verify refuses."""
    port = free_port()
    out, started = tmp_path / "run", tmp_path / "bench-started"
    protocol = write_protocol(tmp_path / "p.toml", protocol_text(port))
    cmd = cli_argv("serve", "trial", protocol, "--out", out, "--quiet")
    proc = subprocess.Popen(
        [*cmd, "--vllm", str(fake_client(tmp_path))],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = None
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (started.is_file() and started.read_text()):
            time.sleep(0.2)
        client = int(started.read_text())
        server = int(json.loads((server_records / f"port-{port}.json").read_text())["pid"])
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if client is not None and group_alive(client):  # the client of a killed trial is nobody's
            os.killpg(client, signal.SIGKILL)
    assert _gone(server, 30), "the server outlived the trial"
    prov = provenance(out)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, err
        assert prov["status"] == "interrupted" and prov["stopped_in"]["launch"] == 0
    else:
        assert prov["status"] == "running" and prov["finished_at"] is None
    assert verify_serving_run(out).problems[0].startswith("incomplete run:")
    assert run_cli("verify", str(out)).exit_code == 1


def test_the_run_ending_follows_what_stopped_the_loop() -> None:
    """A gate failure is summarised, Ctrl-C and an unexpected error are not; SystemExit leaves the run
    "running", as a killed run leaves it (verify refuses it)."""
    assert trial.run_ending(None) == trial.RunEnding("finished")
    assert trial.run_ending(KeyboardInterrupt()) == trial.RunEnding("interrupted", summarised=False)
    assert trial.run_ending(LaunchError("gate")) == trial.RunEnding("failed", "gate")
    assert trial.run_ending(RuntimeError("boom")) == trial.RunEnding("failed", "RuntimeError: boom", summarised=False)
    assert trial.run_ending(SystemExit(3)) == trial.RunEnding("running")
