"""Protocol parsing, launch order and CLI input errors (no server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from kerneltrial.plugins import KERNELS_ENV, OPS_ENV, OURS
from kerneltrial.serving.dispatch_proof import intended_ops
from kerneltrial.serving.order import launch_order
from kerneltrial.serving.protocol import (
    OPERATOR_SELECTION_ENV,
    ProtocolError,
    load_protocol,
    non_operator_difference,
    parse_protocol,
)
from tests.kt import run_cli, write_protocol

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
    write_protocol(tmp_path / "p.toml", text)
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
    r = run_cli("serve", "trial", str(tmp_path / "missing.toml"))
    assert r.exit_code == 2 and "not found" in r.output and "Traceback" not in r.output
    bad = write_protocol(tmp_path / "bad.toml", BASE.replace("port = 9000", "port = 70000"))
    r = run_cli("serve", "trial", str(bad))
    assert r.exit_code == 2 and "server.port: input should be less than or equal to 65535, got 70000" in r.output
    r = run_cli("serve", "bench", "--cases", "[[1,2,3,4]]")
    assert r.exit_code == 2 and "choose exactly one of" in r.output
    r = run_cli("serve", "bench", "--preset", "minicpm5-2b")
    assert r.exit_code == 2 and "needs --model" in r.output
    r = run_cli("serve", "bench", "--preset", "nope", "--model", "x")
    assert r.exit_code == 2 and "unknown preset 'nope'" in r.output
    r = run_cli("serve", "accuracy", "--base-url", "http://127.0.0.1:9", "--data", str(tmp_path / "x.jsonl"))
    assert r.exit_code == 2 and "not found" in r.output
    r = run_cli("serve", "bench", "--base-url", "http://127.0.0.1:9", "--cases", "[[8,8,1,1]]")
    assert r.exit_code == 2 and "no answer from http://127.0.0.1:9/v1/models" in r.output
    for cmd in ("bench", "trial", "accuracy", "launch"):
        assert run_cli("serve", cmd, "--help").exit_code == 0


def test_preset_argv():
    from kerneltrial.serving.presets import get_preset

    p = get_preset("minicpm5-2b")
    argv = p.argv("vllm", "/m", 8123)
    assert argv[:3] == ["vllm", "serve", "/m"] and "8123" in argv and "minicpm5-2b" in argv


ARGV = '["srv", "--port", "{port}"]'


@pytest.mark.parametrize(
    "argv_b, env_b, msg",
    [
        # planted: each non-operator difference is refused, naming the arm, the field and both values
        ('["srv", "--port", "{port}", "--max-model-len", "8192"]', "", "in argv --max-model-len: '8192' in b, absent"),
        ('["srv", "--port", "{port}", "--dtype=float16"]', "", "in argv --dtype: 'float16' in b, absent in a"),
        ('["srv", "--port", "{port}", "--quantization", "fp8"]', "", "in argv --quantization: 'fp8' in b"),
        ('["srv", "--port", "{port}", "--speculative-config", "{}"]', "", "in argv --speculative-config: '{}'"),
        ('["srv", "--port", "{port}", "--enforce-eager"]', "", "in argv --enforce-eager: 'set' in b, absent in a"),
        ('["srv", "--port", "{port}", "--max-num-seqs", "8"]', "", "in argv --max-num-seqs: '8' in b"),
        ('["srv2", "--port", "{port}"]', "", "in argv: 'srv2' in b, 'srv' in a"),
        ('["srv", "--port", "{port}", "--port", "1"]', "", "in argv --port: '{port}; 1' in b, '{port}' in a"),
        (
            ARGV,
            'VLLM_ATTENTION_BACKEND = "FLASH_ATTN"',
            "in env VLLM_ATTENTION_BACKEND: 'FLASH_ATTN' in b, absent in a",
        ),
        (ARGV, 'VLLM_PLUGINS = ""', "in env VLLM_PLUGINS: '' in b, absent in a"),
        (ARGV, 'KERNELTRIAL_DISPATCH_LOG = "/tmp/x"', "in env KERNELTRIAL_DISPATCH_LOG"),
    ],
)
def test_arms_that_differ_beyond_operator_selection_are_refused(argv_b, env_b, msg):
    text = BASE.replace(
        'env = { USE_FLAGGEMS = "1" }', "env = { " + ", ".join(filter(None, ['USE_FLAGGEMS = "1"', env_b])) + " }"
    )
    text = text.replace(f'role = "candidate"\nargv = {ARGV}', f'role = "candidate"\nargv = {argv_b}')
    assert text != BASE
    with pytest.raises(ProtocolError, match=re.escape(msg)) as info:
        parse_protocol(text)
    assert str(info.value).startswith("arms: arm b differs from arm a in ") and "\n" not in str(info.value)
    assert "arms may differ only in operator-selection variables (KERNELTRIAL_KERNELS" in str(info.value)


def test_the_difference_is_named_against_the_baseline_whatever_the_order():
    text = BASE.replace(
        'argv = ["srv", "--port", "{port}"]\n[[arms]]', 'argv = ["srv", "--port", "{port}", "-q"]\n[[arms]]'
    )
    moved = text.replace('role = "baseline"', 'role = "arm"').replace('role = "candidate"', 'role = "baseline"')
    with pytest.raises(ProtocolError, match="arm a differs from arm b in argv -q: 'set' in a, absent in b"):
        parse_protocol(moved)
    reordered = BASE.replace('"{port}"]\n[[arms]]', '"{port}", "-q", "-v"]\n[[arms]]').replace(
        '"{port}"]\nenv', '"{port}", "-v", "-q"]\nenv'
    )
    with pytest.raises(ProtocolError, match="in argv order: 'srv --port {port} -v -q' in b, 'srv --port {port} -q -v'"):
        parse_protocol(reordered)


def test_every_operator_selection_variable_may_differ():
    env = ", ".join(f'{k} = "x"' for k in sorted(OPERATOR_SELECTION_ENV))
    p = parse_protocol(BASE.replace('env = { USE_FLAGGEMS = "1" }', "env = { " + env + " }"))
    assert p.arms[1].selection == dict.fromkeys(OPERATOR_SELECTION_ENV, "x") and p.arms[0].selection == {}
    assert non_operator_difference(p.arms[0], p.arms[1]) is None
    # equal values of other variables are fine; a value that differs is not
    same = BASE.replace("[[arms]]\n", '[[arms]]\nenv = { OMP_NUM_THREADS = "4" }\n', 1)
    same = same.replace('env = { USE_FLAGGEMS = "1" }', 'env = { USE_FLAGGEMS = "1", OMP_NUM_THREADS = "4" }')
    assert parse_protocol(same).arms[1].env["OMP_NUM_THREADS"] == "4"
    with pytest.raises(ProtocolError, match="in env OMP_NUM_THREADS: '8' in b, '4' in a"):
        parse_protocol(
            same.replace('OMP_NUM_THREADS = "4" }\nrole = "c', "XX").replace(
                'USE_FLAGGEMS = "1", OMP_NUM_THREADS = "4"', 'USE_FLAGGEMS = "1", OMP_NUM_THREADS = "8"'
            )
        )


def test_operator_selection_variables_are_read_by_their_plugins():
    """The vllm-plugin-FL names are string literals of the snapshot's source (read with os.environ.get,
    or through a constant such as discovery.py's PLUGIN_MODULES_ENV); the rest are kerneltrial's."""
    from tests.plugins.conftest import snapshot_dir

    source = "\n".join(p.read_text() for p in (snapshot_dir() / "vllm_fl").rglob("*.py"))
    literals = set(re.findall(r"""["']([A-Z][A-Z0-9_]+)["']""", source))
    assert sorted(OPERATOR_SELECTION_ENV - {OPS_ENV, KERNELS_ENV} - literals) == []
    # planted: the whitelist name the FlagGems protocol first shipped with is read by nobody
    assert "VLLM_FL_FLAGGEMS_WHITELIST" not in literals


T2 = REPO / "protocols" / "serving" / "minicpm5-2b-t2.toml"


def test_track2_protocol_states_e0_to_e3_differing_only_in_operator_selection():
    p, _ = load_protocol(T2)
    assert [(a.name, a.role) for a in p.arms] == [("E0", "baseline"), ("E1", "arm"), ("E2", "arm"), ("E3", "candidate")]
    assert [c.as_list() for c in p.bench.cases] == [[4096, 1024, 64, 256], [16384, 1024, 64, 128]]
    assert (p.repeats, p.rounds) == (4, 4)  # R=4 with run 0 dropped; two counterbalanced blocks of launches
    assert (p.acceptance.noise_band, p.acceptance.ttft_ratio_max) == (0.01, 1.01)
    assert p.accuracy is not None and (p.accuracy.level, p.accuracy.gate) == ("Level 3", 0.95)
    e0 = p.arms[0]
    for arm in p.arms:
        assert arm.argv == e0.argv and arm.env["VLLM_DISABLE_COMPILE_CACHE"] == "1"
        assert {k: v for k, v in arm.env.items() if k not in arm.selection} == {
            k: v for k, v in e0.env.items() if k not in e0.selection
        }
        assert non_operator_difference(e0, arm) is None
    # what each arm swaps in, as the dispatch proof reads it
    assert [sorted(intended_ops(a.env)) for a in p.arms] == [
        [],
        ["rms_norm"],
        ["silu_and_mul"],
        ["rms_norm", "silu_and_mul"],
    ]
    assert all(set(intended_ops(a.env).values()) <= {OURS} for a in p.arms)
