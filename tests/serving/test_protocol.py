"""Protocol parsing, launch order and CLI input errors (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
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
    assert p.accuracy is None and p.acceptance.noise_band == 0.01 and p.acceptance.ttft_ratio_max == 1.01
    assert p.bench.percentiles == (50.0, 90.0, 99.0) and p.server.effective_tokenizer is None


@pytest.mark.parametrize(
    "edit, msg",
    [
        (("repeats = 3", "repeats = 1"), "repeats: must be >= 2, got 1: the first run of each case is the warm-up"),
        (
            ('argv = ["srv", "--port", "{port}"]\n[[arms]]', 'argv = "srv --port 1"\n[[arms]]'),
            "arms\\[0\\].argv: must be an argv list .* never a shell string, got 'srv --port 1'",
        ),
        (
            ("cases = [[8, 4, 1, 2]]", "cases = [[8, 4, 1]]"),
            "bench.cases: case \\[8, 4, 1\\] must be 4 positive integers",
        ),
        (('name = "b"', 'name = "a"'), "arms: arm names repeat in \\['a', 'a'\\]"),
        (('model_id = "m"\n', ""), "server.model_id is missing; add it \\(Model id the server serves"),
        (("[bench]", "[bench"), "not valid TOML"),
        # planted: each check added with the pydantic model
        (('model_id = "m"', 'model_idx = "m"'), "server.model_idx is not a protocol key; did you mean model_id\\?"),
        (('name = "t"\n', 'name = "t"\ncolour = 1\n'), "colour is not a protocol key; use one of name, seed"),
        (("port = 9000", "port = 70000"), "server.port: input should be less than or equal to 65535, got 70000"),
        (("port = 9000", 'port = "9000"'), "server.port: input should be a valid integer, got '9000'"),
        (("port = 9000", "port = true"), "server.port: input should be a valid integer, got True"),
        (("rounds = 2", "rounds = 0"), "rounds: input should be greater than or equal to 1, got 0"),
        (('role = "candidate"', 'role = "cand"'), "arms\\[1\\].role: input should be 'baseline', 'candidate' or 'arm'"),
        (('role = "candidate"', 'role = "baseline"'), "more than one arm has role baseline; keep one"),
        (('name = "b"', 'name = "b c"'), "arms\\[1\\].name: must be a non-empty word .* got 'b c'"),
        (
            ('USE_FLAGGEMS = "1"', "USE_FLAGGEMS = 1"),
            "arms\\[1\\].env.USE_FLAGGEMS: input should be a valid string, got 1",
        ),
        (
            ('"{port}"]\n[[arms]]', '"{prot}"]\n[[arms]]'),
            "unknown placeholder \\{prot\\} in '\\{prot\\}'; use one of \\{port\\}",
        ),
        (('argv = ["srv", "--port", "{port}"]\n[[arms]]', "argv = []\n[[arms]]"), "only allowed alone"),
        (
            ("[bench]", "[bench]\npercentiles = [50, 120]"),
            "bench.percentiles: percentiles are between 0 and 100, got 120",
        ),
        (("[bench]", "[bench]\ntimeout_s = 0"), "bench.timeout_s: input should be greater than 0, got 0"),
        (("[server]", "[server]\nready_timeout_s = -1"), "server.ready_timeout_s: input should be greater than 0"),
        (
            ("[server]", "[acceptance]\nnoise_band = -0.1\n[server]"),
            "acceptance.noise_band: .* greater than or equal to 0",
        ),
        (("[server]", "[acceptance]\nttft_ratio_max = 0\n[server]"), "acceptance.ttft_ratio_max: .* greater than 0"),
        (("[server]", '[accuracy]\ndata = "x"\napi = "chatt"\n[server]'), "accuracy.api: .* 'chat' or 'completions'"),
        (("[server]", '[accuracy]\ndata = ""\n[server]'), "accuracy.data: must not be empty"),
        (("[server]", "[accuracy]\nlevel = 3\n[server]"), "accuracy.data is missing"),
        (
            ("[server]", '[accuracy]\ndata = "x"\ngate = 1.5\n[server]'),
            "accuracy.gate: .* less than or equal to 1, got 1.5",
        ),
        (("[server]", '[accuracy]\ndata = "x"\nlimit = 0\n[server]'), "accuracy.limit: .* greater than or equal to 1"),
        (("[server]", '[accuracy]\ndata = "x"\nconfidence = 1\n[server]'), "accuracy.confidence: .* less than 1"),
        (("[server]", '[accuracy]\ndata = "x"\ntop_p = 0\n[server]'), "accuracy.top_p: .* greater than 0"),
        (
            ("[server]", '[accuracy]\ndata = "x"\nmax_tokens = 0\n[server]'),
            "accuracy.max_tokens: .* greater than or equal to 1",
        ),
        (
            ("[server]", '[accuracy]\ndata = "x"\nconcurrency = 0\n[server]'),
            "accuracy.concurrency: .* greater than or equal to 1",
        ),
        (
            ("[server]", '[accuracy]\ndata = "x"\ntemperature = -1\n[server]'),
            "accuracy.temperature: .* greater than or equal to 0",
        ),
        (
            ("[server]", '[accuracy]\ndata = "x"\nrequest_timeout_s = 0\n[server]'),
            "accuracy.request_timeout_s: .* greater than 0",
        ),
        (
            ("[server]", '[accuracy]\ndata = "x"\nleve = 3\n[server]'),
            "accuracy.leve is not a protocol key; did you mean level\\?",
        ),
    ],
)
def test_bad_protocols_name_the_problem(edit, msg):
    text = BASE.replace(*edit, 1)
    assert text != BASE, f"the edit {edit} does not apply"
    with pytest.raises(ProtocolError, match=msg) as info:
        parse_protocol(text)
    assert "\n" not in str(info.value)  # the CLI prints it as one line


def test_paths_are_taken_from_the_protocol_folder(tmp_path: Path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    text = BASE.replace('model_id = "m"', 'model_id = "m"\nmodel = "models/m"').replace(
        "[server]", '[accuracy]\ndata = "data/test.jsonl"\nlevel = 2\n[server]'
    )
    (tmp_path / "p.toml").write_text(text)
    p, raw = load_protocol(tmp_path / "p.toml")
    assert raw == text.encode()
    assert p.server.model == str(tmp_path / "models" / "m") == p.server.effective_tokenizer
    assert p.accuracy is not None and p.accuracy.data == str(tmp_path / "data" / "test.jsonl")
    assert p.accuracy.level == "2"
    # a model path that does not exist there is kept as written (a hub id)
    assert parse_protocol(text.replace("models/m", "org/name"), tmp_path).server.model == "org/name"


def test_with_model_replaces_the_model_and_a_following_tokenizer():
    p = parse_protocol(BASE.replace('model_id = "m"', 'model_id = "m"\nmodel = "/a"'))
    q = p.with_model("/b")
    assert q.server.model == "/b" and q.server.effective_tokenizer == "/b" and p.server.model == "/a"
    assert q.expand(q.arms[0]) == ["srv", "--port", "9000"]
    pinned = parse_protocol(BASE.replace('model_id = "m"', 'model_id = "m"\nmodel = "/a"\ntokenizer = "/t"'))
    assert pinned.with_model("/b").server.effective_tokenizer == "/t"
    with pytest.raises(ValidationError):  # frozen: a protocol is changed by copy only
        p.server.model = "/c"  # type: ignore[misc]


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
    assert [c.as_list() for c in p.bench.cases] == [[4096, 1024, 64, 256], [16384, 1024, 64, 128]]
    assert p.arm("baseline") and p.arm("candidate") and p.accuracy and p.accuracy.gate == 0.95


def test_cli_errors_are_one_line(tmp_path: Path):
    runner = CliRunner()
    r = runner.invoke(app, ["trial", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "not found" in r.output and "Traceback" not in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text(BASE.replace("port = 9000", "port = 70000"))
    r = runner.invoke(app, ["trial", str(bad)])
    assert r.exit_code == 2 and "server.port: input should be less than or equal to 65535, got 70000" in r.output
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
