"""Official equivalence: prompt seeding modes, the presets as data, extra server arguments (no vLLM)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from kerneltrial.serving import presets as presets_mod
from kerneltrial.serving.bench import Case, bench_argv
from kerneltrial.serving.presets import PLUMBING, PresetError, get_preset, presets
from kerneltrial.serving.protocol import VLLM_BENCH_DEFAULT_SEED, load_protocol, parse_protocol
from tests.kt import run_cli

from .conftest import FAKE, REPO, flagos_chat_script, official_script, vllm_venv

SCRIPTS = (official_script(), flagos_chat_script())  # the organisers' (--client official) and the fork's
PROTOCOLS = [REPO / "protocols" / "serving" / n for n in ("minicpm5-2b-t2.toml", "minicpm5-2b-flaggems.toml")]

BASE = """
repeats = 4
[server]
model_id = "m"
[bench]
cases = [[8, 4, 1, 2]]
{bench}
[[arms]]
name = "a"
argv = ["srv", "--port", "{{port}}"]
"""


def seeds_passed(bench_lines: str) -> list[int]:
    """The --seed of each run of a case, read from the client argv the trial would run."""
    p = parse_protocol(BASE.format(bench=bench_lines))
    out = []
    for k in range(p.repeats):
        argv = bench_argv("vllm", "http://h:1", "m", None, Case(8, 4, 1, 2), Path("r"), "x.json", p.bench.run_seed(k))
        out.append(int(argv[argv.index("--seed") + 1]))
    return out


def test_official_seeding_repeats_one_seed_per_case_by_default():
    assert parse_protocol(BASE.format(bench="")).bench.seeding == "official"
    assert seeds_passed("") == [0, 0, 0, 0]
    assert seeds_passed("seed = 7") == [7, 7, 7, 7]


def test_per_run_seeding_changes_the_seed_every_run():
    assert seeds_passed('seeding = "per_run"') == [0, 1, 2, 3]
    assert seeds_passed('seeding = "per_run"\nseed = 7') == [7, 8, 9, 10]


def test_unknown_seeding_mode_is_refused():
    from kerneltrial.serving.protocol import ProtocolError

    with pytest.raises(ProtocolError, match="bench.seeding: input should be 'official' or 'per_run'"):
        parse_protocol(BASE.format(bench='seeding = "fresh"'))


def test_official_script_passes_no_seed_and_the_client_default_is_ours():
    """The rule's sources: both scripts repeat `vllm bench serve` 4 times without --seed, whose default is 0."""
    missing = [str(p) for p in SCRIPTS if not p.is_file()]
    if missing:
        pytest.skip(f"vendored script not found at {', '.join(missing)}")
    upstream, fork = (p.read_text() for p in SCRIPTS)
    assert '"--seed"' not in upstream and "\nRUNS = 4\n" in upstream and '"random"' in upstream
    assert '"--seed"' not in fork and "NUM_RUNS = 4" in fork and '"random"' in fork
    datasets = list(vllm_venv().glob("lib/python3*/site-packages/vllm/benchmarks/datasets/datasets.py"))
    if not datasets:
        pytest.skip(f"no vLLM install under {vllm_venv()} to read its default seed from")
    found = re.search(r'add_argument\("--seed", type=int, default=(\d+)\)', datasets[0].read_text())
    assert found and int(found.group(1)) == VLLM_BENCH_DEFAULT_SEED


# the sources' flags, written out by hand from the files each preset cites
SOURCE_FLAGS = {
    "minicpm5-2b": ["--dtype", "bfloat16", "--max-model-len", "131072", "--gpu-memory-utilization", "0.85"],
    "minicpm5-2b-iluvatar": [
        *("--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "65536"),
        *("--gpu-memory-utilization", "0.85"),
    ],
    "minicpm5-2b-metax": [
        *("--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--enforce-eager"),
        *("--trust-remote-code", "--max-model-len", "32768"),
    ],
}


@pytest.mark.parametrize("name", sorted(SOURCE_FLAGS))
def test_presets_reproduce_their_sources(name: str):
    p = get_preset(name)
    assert p.args == tuple(SOURCE_FLAGS[name]) and p.source and p.description
    argv = p.argv("vllm", "/models/m", 8123)
    assert argv == [
        *("vllm", "serve", "/models/m", *SOURCE_FLAGS[name]),
        *("--host", "127.0.0.1", "--port", "8123", "--served-model-name", p.model_id),
    ]
    # a serving set-up's limits hold for every case: the model length covers input + output
    assert all(c.input_len + c.output_len <= int(argv[argv.index("--max-model-len") + 1]) for c in p.cases)


def test_nvidia_preset_is_the_official_command_and_nothing_else():
    argv = get_preset("minicpm5-2b").argv("vllm", "/m", 8000)
    assert "--max-num-seqs" not in argv and "--trust-remote-code" not in argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"
    assert argv[argv.index("--max-model-len") + 1] == "131072"


def test_metax_preset_keeps_its_environment_and_names_what_it_leaves_out():
    p = get_preset("minicpm5-2b-metax")
    assert dict(p.env) == {"MACA_VISIBLE_DEVICES": "0"}
    assert [o.flag for o in p.omitted] == ["--chat-template"] and "--chat-template" not in p.argv("v", "/m", 1)


def test_official_protocols_serve_the_nvidia_preset_command():
    pr = get_preset("minicpm5-2b")
    for path in PROTOCOLS:
        p, _ = load_protocol(path)
        assert p.bench.seeding == "official" and p.server.model_id == pr.model_id, path.name
        for arm in p.arms:
            assert arm.argv == ["vllm", "serve", "{model}", *pr.command()], (path.name, arm.name)
        # the accuracy phase fits too: a MATH-500 prompt is far below 131072 - 8192 tokens
        assert p.accuracy is not None and p.accuracy.max_tokens + 4096 <= 131072


def test_extra_arguments_are_appended_and_a_contradiction_needs_an_override():
    p = get_preset("minicpm5-2b")
    assert p.argv("vllm", "/m", 1, extra=["--max-num-seqs", "64"])[-2:] == ["--max-num-seqs", "64"]
    for extra in (["--max-model-len", "18432"], ["--max_model_len=18432"], ["--dtype", "bfloat16"]):
        with pytest.raises(PresetError, match="contradicts preset minicpm5-2b.*pass --override"):
            p.argv("vllm", "/m", 1, extra=extra)
    argv = p.argv("vllm", "/m", 1, extra=["--max-model-len", "18432"], overrides=["max-model-len"])
    assert argv.count("--max-model-len") == 1 and argv[-2:] == ["--max-model-len", "18432"]
    assert "131072" not in argv
    iluvatar = get_preset("minicpm5-2b-iluvatar")
    with pytest.raises(PresetError, match="--no-enforce-eager contradicts"):  # the negative form sets the flag too
        iluvatar.argv("v", "/m", 1, extra=["--no-enforce-eager"])
    argv = iluvatar.argv("v", "/m", 1, extra=["--no-enforce-eager"], overrides=["--enforce-eager"])
    assert "--enforce-eager" not in argv and argv[-1] == "--no-enforce-eager"


@pytest.mark.parametrize(
    "extra, overrides, msg",
    [
        (["--port", "9"], [], "kerneltrial sets --port itself; use its --port option"),
        (["--served-model-name", "x"], [], "use its --model-id option"),
        ([], ["max-model-len"], "--override max-model-len but no --max-model-len among the extra"),
        (["--max-num-seqs", "8"], ["max-num-seqs"], "does not set --max-num-seqs; an argument it does not set"),
        (["-tp", "2"], [], "write the long form"),
        (["64"], [], "comes before any option"),
        (["--max-num-seqs", "8", "--max-num-seqs", "9"], [], "--max-num-seqs is given twice"),
    ],
)
def test_bad_extra_arguments_name_the_fix(extra: list[str], overrides: list[str], msg: str):
    with pytest.raises(PresetError, match=re.escape(msg)):
        get_preset("minicpm5-2b").argv("vllm", "/m", 1, extra=extra, overrides=overrides)


def test_preset_data_file_is_checked(monkeypatch: pytest.MonkeyPatch):
    assert set(presets()) == set(SOURCE_FLAGS)
    table = {"vendor": "v", "model_id": "m", "description": "d", "source": "s", "args": [], "env": {}, "omitted": []}
    with pytest.raises(ValueError, match=r"\[bad\]: keys .* expected"):
        presets_mod._preset("bad", table)  # planted: a table without cases
    assert presets_mod._preset("ok", {**table, "cases": [[1, 1, 1, 1]]}).cases == (Case(1, 1, 1, 1),)
    with pytest.raises(PresetError, match="unknown preset 'nope'; known: minicpm5-2b, "):
        get_preset("nope")


def test_cli_refuses_a_contradicting_extra_argument_before_anything_runs(tmp_path: Path):
    common = ["--preset", "minicpm5-2b", "--model", "/m", "--out", str(tmp_path / "r")]
    r = run_cli("serve", "bench", *common, "--", "--gpu-memory-utilization", "0.9")
    assert r.exit_code == 2 and "contradicts preset minicpm5-2b" in r.output and "--override" in r.output
    assert not (tmp_path / "r").exists()
    r = run_cli("serve", "launch", "--preset", "minicpm5-2b", "--model", "/m", "--", "--port", "1")
    assert r.exit_code == 2 and "kerneltrial sets --port itself" in r.output
    r = run_cli("serve", "bench", "--base-url", "http://h:1", "--override", "dtype", "--cases", "[[1,1,1,1]]")
    assert r.exit_code == 2 and "--override replaces a flag of a --preset" in r.output
    r = run_cli("serve", "bench", *common, "--seeding", "fresh")
    assert r.exit_code == 2 and "--seeding 'fresh' is not official or per_run" in r.output


FAKE_VLLM = """#!{python}
# `vllm serve MODEL ...`: record the argv and environment, then run the fake server on --port
import json, os, sys
argv = sys.argv[1:]
with open({record!r}, "w") as f:
    json.dump({{"argv": argv, "maca": os.environ.get("MACA_VISIBLE_DEVICES")}}, f)
port = argv[argv.index("--port") + 1]
i = argv.index("--served-model-name") + 1
names = argv[i : next((j for j in range(i, len(argv)) if argv[j].startswith("-")), len(argv))]
ledger = ["--middleware", argv[argv.index("--middleware") + 1]]
os.execv(sys.executable, [sys.executable, {fake!r}, "--port", port, "--served-model-name", *names, *ledger])
"""


def test_launch_preset_runs_the_official_command_and_records_argv_and_env(tmp_path: Path, port: int):
    record = tmp_path / "served.json"
    exe = tmp_path / "vllm"
    exe.write_text(FAKE_VLLM.format(python=sys.executable, record=str(record), fake=str(FAKE)))
    exe.chmod(0o755)
    out = tmp_path / "launch"
    r = run_cli(
        "serve",
        *("launch", "--preset", "minicpm5-2b-metax", "--model", "/models/m", "--vllm", str(exe)),
        *("--port", str(port), "--out", str(out), "--", "--max-num-seqs", "32"),
    )
    assert r.exit_code == 0, r.output
    served = json.loads(record.read_text())
    want = ["serve", "/models/m", *SOURCE_FLAGS["minicpm5-2b-metax"], *PLUMBING, "--max-num-seqs", "32"]
    want = [{"{host}": "127.0.0.1", "{port}": str(port), "{model_id}": "minicpm5-2b"}.get(a, a) for a in want]
    launch = json.loads((out / "launch.json").read_text())["record"]
    nonce = launch["nonce"]  # the launch's nonce, served beside the model id (who answers: issue 26)
    want.insert(want.index("minicpm5-2b") + 1, nonce)
    want += ["--middleware", "kerneltrial.plugins.ledger.Ledger"]  # the served ledger (issue 36)
    assert served == {"argv": want, "maca": "0"}
    assert launch["argv"] == [str(exe), *want] and launch["env_set"] == {"MACA_VISIBLE_DEVICES": "0"}
    assert launch["operator_env"]["MACA_VISIBLE_DEVICES"] == "0"  # the device selection, in the environment record


SERVE_OR_CLIENT = """#!{python}
# `vllm serve ...` starts the fake server on --port; anything else (`vllm bench serve`) is the real client
import os, sys
argv = sys.argv[1:]
if argv[0] == "serve":
    port = argv[argv.index("--port") + 1]
    i = argv.index("--served-model-name") + 1
    names = argv[i : next((j for j in range(i, len(argv)) if argv[j].startswith("-")), len(argv))]
    ledger = ["--middleware", argv[argv.index("--middleware") + 1]] if "--middleware" in argv else []
    os.execv(sys.executable, [sys.executable, {fake!r}, "--port", port, "--served-model-name", *names, *ledger])
os.execv({client!r}, [{client!r}, *argv])
"""


@pytest.mark.serving
@pytest.mark.slow
@pytest.mark.parametrize("seeding, seed, want", [("official", None, [0, 0]), ("per_run", "5", [5, 6])])
def test_preset_bench_records_the_seed_of_every_run(
    tmp_path: Path, port: int, vllm_client: str, vllm_server_cmd, seeding: str, seed: str | None, want: list[int]
):
    """A preset bench against the fake server with the real client: the seeding mode and each --seed
    passed are recorded, and the peak output tok/s equals the one vLLM wrote."""
    from kerneltrial.serving.verify import verify_serving_run

    _, _, model = vllm_server_cmd
    exe = tmp_path / "vllm"
    exe.write_text(SERVE_OR_CLIENT.format(python=sys.executable, fake=str(FAKE), client=vllm_client))
    exe.chmod(0o755)
    out = tmp_path / "run"
    args = ["bench", "--preset", "minicpm5-2b", "--model", model, "--vllm", str(exe), "--port", str(port)]
    args += ["--cases", "[[32, 8, 2, 4]]", "-r", "2", "--seeding", seeding, "--quiet", "--out", str(out)]
    r = run_cli("serve", *args, *(["--seed", seed] if seed else []), "--", "--max-num-seqs", "4")
    assert r.exit_code == 0, r.output
    assert verify_serving_run(out).problems == []
    plan = json.loads((out / "plan.json").read_text())
    assert plan["seeding"] == seeding and plan["bench_seeds"] == want
    assert plan["arms"][0]["argv_expanded"][-2:] == ["--max-num-seqs", "4"]  # the full server argv
    assert "# preset minicpm5-2b (nvidia)" in (out / "protocol.toml").read_text()  # with its source
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["seeding"], r["seed"]) for r in rows] == [(seeding, s) for s in want]
    for row in rows:
        assert row["client_argv"][row["client_argv"].index("--seed") + 1] == str(row["seed"])
        raw = json.loads((out / row["raw"]).read_text())
        assert row["max_output_tokens_per_s"] == raw["max_output_tokens_per_s"] > 0  # vLLM's own figure
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["results"]["server"]["in32-out8-c2-n4"]["max_output_tokens_per_s"] == rows[1]["max_output_tokens_per_s"]
    )
    assert "peak output tok/s" in r.output
