"""Protocol parsing, launch order and CLI input errors (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneltrial.serving.cli import app
from kerneltrial.serving.protocol import ProtocolError, load_protocol, parse_protocol
from kerneltrial.serving.trial import launch_order

from .conftest import REPO

BASE = """
name = "t"
repeats = 3
rounds = 2
[server]
model_id = "m"
port = 9000
[bench]
cases = [[8, 4, 1, 2]]
[[arms]]
name = "a"
role = "baseline"
argv = ["srv", "--port", "{port}"]
[[arms]]
name = "b"
role = "candidate"
argv = ["srv", "--port", "{port}"]
env = { USE_FLAGGEMS = "1" }
"""


def test_parse_and_expand():
    p = parse_protocol(BASE)
    assert p.repeats == 3 and p.rounds == 2 and p.arm("candidate").env == {"USE_FLAGGEMS": "1"}
    assert p.expand(p.arms[0]) == ["srv", "--port", "9000"]
    assert p.accuracy is None and p.noise_band == 0.01 and p.ttft_ratio_max == 1.01


@pytest.mark.parametrize(
    "edit, msg",
    [
        (("repeats = 3", "repeats = 1"), "repeats must be >= 2"),
        (('argv = ["srv", "--port", "{port}"]\n[[arms]]', 'argv = "srv --port 1"\n[[arms]]'), "argv must be list"),
        (("cases = [[8, 4, 1, 2]]", "cases = [[8, 4, 1]]"), "4 positive integers"),
        (('name = "b"', 'name = "a"'), "arm names repeat"),
        (('model_id = "m"', 'model_idx = "m"'), "server.model_id is missing"),
        (("[bench]", "[bench"), "not valid TOML"),
    ],
)
def test_bad_protocols_name_the_problem(edit, msg):
    with pytest.raises(ProtocolError, match=msg):
        parse_protocol(BASE.replace(*edit, 1))


def test_launch_order_is_seeded_and_interleaved():
    p = parse_protocol(BASE)
    o1, o2 = launch_order(p.arms, 4, 3), launch_order(p.arms, 4, 3)
    assert o1 == o2
    for r in range(4):
        assert sorted(n for rr, _, n in o1 if rr == r) == ["a", "b"]
    assert (
        len(
            {tuple(n for rr, _, n in o1 if rr == r) for r in range(4)}
            | {tuple(n for rr, _, n in launch_order(p.arms, 4, s) if rr == 0) for s in range(10)}
        )
        == 2
    )


def test_example_protocol_parses():
    p, raw = load_protocol(REPO / "protocols" / "serving" / "minicpm5-2b-flaggems.toml")
    assert [c.as_list() for c in p.cases] == [[4096, 1024, 64, 256], [16384, 1024, 64, 128]]
    assert p.arm("baseline") and p.arm("candidate") and p.accuracy and p.accuracy.gate == 0.95


def test_cli_errors_are_one_line(tmp_path: Path):
    runner = CliRunner()
    r = runner.invoke(app, ["trial", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "not found" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["bench", "--cases", "[[1,2,3,4]]"])
    assert r.exit_code == 2 and "choose exactly one of" in r.output
    r = runner.invoke(app, ["bench", "--preset", "minicpm5-2b"])
    assert r.exit_code == 2 and "needs --model" in r.output
    r = runner.invoke(app, ["bench", "--preset", "nope", "--model", "x"])
    assert r.exit_code == 2 and "unknown preset 'nope'" in r.output
    r = runner.invoke(app, ["accuracy", "--base-url", "http://127.0.0.1:9", "--data", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 2 and "not found" in r.output
    r = runner.invoke(app, ["bench", "--base-url", "http://127.0.0.1:9", "--cases", "[[8,8,1,1]]"])
    assert r.exit_code == 2 and "no answer from http://127.0.0.1:9/v1/models" in r.output
    for cmd in ("bench", "trial", "accuracy", "launch"):
        assert runner.invoke(app, [cmd, "--help"]).exit_code == 0


def test_preset_argv():
    from kerneltrial.serving.presets import get_preset

    p = get_preset("minicpm5-2b")
    argv = p.argv("vllm", "/m", 8123)
    assert argv[:3] == ["vllm", "serve", "/m"] and "8123" in argv and "minicpm5-2b" in argv
    assert [c.as_list() for c in p.cases] == [[4096, 1024, 64, 256], [16384, 1024, 64, 128]]
