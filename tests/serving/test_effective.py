"""plan.json `effective` against the command line it came from (serving/effective.py; issue 36 item 5,
the hostile review): the tokenizer recorded and used (a relative model path with a tokenizer equal to
it gave a false failure), an `effective` the provenance argv does not give fails named, and the
command line's overrides of protocol.toml. Fake servers, synthetic benchmark client (test_acceptance)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving import trial
from kerneltrial.serving.effective import (
    CommandLine,
    Override,
    Written,
    argv_problems,
    command_line,
    overrides,
    recovered,
    resolves,
)
from kerneltrial.serving.protocol import parse_protocol
from kerneltrial.serving.report import overrides_line, render
from kerneltrial.serving.report_data import load_run
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .test_acceptance import synthetic_bench, trial_text

CHECK = "plan derived"
TRIAL = ["kerneltrial", "serve", "trial", "p.toml", "--vllm", "python3"]


def trial_run(root: Path, text: str, *options: str) -> Path:
    proto = write_protocol(root / "trial.toml", text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial, "run_bench", synthetic_bench(lambda arm, launch: (1.0, 1.0)))
        done = run_cli(
            "serve", "trial", str(proto), "--vllm", "python3", "--quiet", "--out", str(root / "run"), *options
        )
    assert done.exit_code in (0, 1), done.output  # 1: the candidate is not accepted (no gain)
    return root / "run"


def check(run: Path) -> Any:
    return next(c for c in verify_serving_run(run).checks if c.name == CHECK)


def edit(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def with_model_folder(root: Path, tokenizer: str | None) -> str:
    """A protocol naming the relative model folder `tiny` (present beside it), and `tokenizer`."""
    (root / "tiny").mkdir()
    (root / "tiny" / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    extra = 'model = "tiny"\n' + (f'tokenizer = "{tokenizer}"\n' if tokenizer else "")
    return trial_text(rounds=1).replace('model_id = "tiny"\n', 'model_id = "tiny"\n' + extra)


# ---------------------------------------------------------------- the command line


def test_the_serve_command_line_is_read_as_the_cli_reads_it() -> None:
    assert command_line(TRIAL) == CommandLine("trial")
    got = command_line([*TRIAL, "--model", "/m", "--client=official", "--model", "/n"])
    assert got == CommandLine("trial", model="/n", client="official")  # the last of a repeated option
    assert command_line(["python", "-m", "kerneltrial.cli", "serve", "calibrate", "p.toml"]) == CommandLine("calibrate")
    main = "/venv/lib/python3.11/site-packages/kerneltrial/serving/__main__.py"  # python -m kerneltrial.serving
    assert command_line([main, "trial", "p.toml", "--model", "/m"]) == CommandLine("trial", model="/m")
    assert command_line([main, "report", "run"]) is None
    assert command_line(["pytest", "-q", "tests/serving"]) is None
    assert command_line("serve trial --model /m") is None  # not an argv list
    assert command_line([*TRIAL, "--model"]) == CommandLine("trial")  # a flag without its value gave nothing


def test_a_resolved_path_ends_in_the_relative_one() -> None:
    assert resolves("tiny", "/p/tiny") and resolves("./models/tiny", "/p/models/tiny") and resolves("/a", "/a")
    assert not resolves("tiny", "/p/other") and not resolves("/a", "/b") and not resolves("tiny", "tinier")
    assert not resolves(None, "/p/tiny") and resolves(None, None)


# ---------------------------------------------------------------- effective against the argv

PROTO = Written(model="tiny", tokenizer=None, client="completions")


def test_an_effective_the_argv_gives_passes() -> None:
    honest = {"model": "/p/tiny", "client": "completions", "tokenizer": "/p/tiny"}
    assert argv_problems(honest, PROTO, command_line(TRIAL)) == []
    by_flag = {"model": "/m", "client": "official", "tokenizer": "/m"}
    assert argv_problems(by_flag, PROTO, CommandLine("trial", model="/m", client="official")) == []
    pinned = Written(model="tiny", tokenizer="/tok", client="completions")
    assert (
        argv_problems({"model": "/m", "client": "completions", "tokenizer": "/tok"}, pinned, CommandLine("trial", "/m"))
        == []
    )


def test_an_effective_the_argv_does_not_give_is_named() -> None:
    forged = {"model": "/elsewhere", "client": "official", "tokenizer": "/elsewhere"}
    problems = argv_problems(forged, PROTO, CommandLine("trial"))
    source = "provenance.json argv (`serve trial`) with protocol.toml give"
    assert problems == [
        f"plan.json effective model is '/elsewhere'; {source} 'tiny'",
        f"plan.json effective client is 'official'; {source} 'completions'",
    ]
    followed = argv_problems(
        {"model": "/m", "client": "completions", "tokenizer": "/t"}, PROTO, CommandLine("trial", "/m")
    )
    assert followed == [
        "plan.json effective tokenizer is '/t'; provenance.json argv (`serve trial --model /m`) with protocol.toml give '/m'"
    ]


def test_without_a_serve_command_line_the_protocols_values_are_the_only_ones() -> None:
    problems = argv_problems({"model": "/m", "client": "completions"}, PROTO, command_line(["pytest"]))
    assert problems == [
        "plan.json effective model is '/m'; provenance.json argv (no serve command line (protocol.toml's values)) "
        "with protocol.toml give 'tiny'"
    ]


def test_an_older_runs_effective_is_recovered_from_its_argv() -> None:
    assert recovered(PROTO, CommandLine("trial", "/m", "official"), "/m") == {"model": "/m", "client": "official"}
    assert recovered(PROTO, None, "/p/tiny") == {"model": "/p/tiny", "client": "completions"}  # as resolved
    assert recovered(PROTO, None, "/p/other") == {"model": "tiny", "client": "completions"}  # not its resolution


def test_overrides_are_the_values_given_that_differ() -> None:
    assert overrides(PROTO, CommandLine("trial", "/m", "official")) == [
        Override("--model", "/m", "tiny"),
        Override("--client", "official", "completions"),
    ]
    assert overrides(PROTO, CommandLine("trial", "/p/tiny", "completions")) == []  # the protocol's own values
    assert overrides(PROTO, None) == []
    assert str(Override("--model", "/m", None)) == "--model /m (protocol.toml: unset)"


# ---------------------------------------------------------------- trials


def test_a_relative_model_with_its_tokenizer_verifies(tmp_path: Path) -> None:
    """The hostile review's false failure: model = tokenizer = "tiny", a folder beside the protocol.
    Both resolve there, the tokenizer is recorded in `effective` and the plan derives again."""
    run = trial_run(tmp_path, with_model_folder(tmp_path, tokenizer="tiny"))
    resolved = str((tmp_path / "tiny").resolve())
    plan = json.loads((run / "plan.json").read_text())
    assert plan["effective"] == {"model": resolved, "client": "completions", "tokenizer": resolved}
    assert plan["tokenizer"] == resolved and plan["model_layers"] == 2
    found = check(run)
    assert found.ok, found.problems


def test_a_tokenizer_equal_to_the_model_follows_model(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    run = trial_run(tmp_path, with_model_folder(tmp_path, tokenizer="tiny"), "--model", str(other))
    plan = json.loads((run / "plan.json").read_text())
    assert plan["effective"] == {"model": str(other), "client": "completions", "tokenizer": str(other)}
    found = check(run)
    assert found.ok, found.problems


def test_the_protocols_tokenizer_parses_like_its_model(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    text = trial_text(rounds=1).replace('model_id = "tiny"\n', 'model_id = "tiny"\nmodel = "m"\ntokenizer = "tok"\n')
    proto = parse_protocol(text, tmp_path)
    assert proto.server.tokenizer == str((tmp_path / "tok").resolve()) and proto.server.model == "m"


@pytest.fixture(scope="module")
def client_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = trial_text(rounds=1).replace("repeats = 2\n", "repeats = 4\n")  # the official client's RUNS
    return trial_run(tmp_path_factory.mktemp("client"), text, "--client", "official")


@pytest.fixture
def run(client_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(client_run, tmp_path / "run"))


def test_a_run_with_client_given_derives_from_its_argv(run: Path) -> None:
    found = check(run)
    assert found.ok, found.problems
    assert json.loads((run / "plan.json").read_text())["effective"]["client"] == "official"


def test_an_argv_stripped_of_its_client_fails_named(run: Path) -> None:
    """`effective` (and the plan it gives) consistent, the command line without --client: a plan the
    recorded command did not run."""
    edit(
        run / "provenance.json",
        lambda prov: prov.update(argv=[a for a in prov["argv"] if a not in ("--client", "official")]),
    )
    assert check(run).problems == (
        "plan.json effective client is 'official'; provenance.json argv (`serve trial`) with protocol.toml give "
        "'completions'",
    )


def test_a_forged_effective_model_fails_named(run: Path) -> None:
    edit(run / "plan.json", lambda plan: plan["effective"].update(model="/forged", tokenizer="/forged"))
    problems = check(run).problems
    given = "provenance.json argv (`serve trial --client official`) with protocol.toml give"
    assert f"plan.json effective model is '/forged'; {given} None" in problems


def test_the_report_shows_the_command_lines_overrides(run: Path, tmp_path: Path) -> None:
    text = render(load_run(run))
    assert "Command line overrides protocol.toml: --client official (protocol.toml: completions)." in text
    edit(run / "provenance.json", lambda prov: prov.update(argv=["kerneltrial", "serve", "trial", "p.toml"]))
    assert "Command line: protocol.toml as written (no value given beside it differs from it)." in render(load_run(run))
    (run / "protocol.toml").write_text("not = [toml")
    assert overrides_line(load_run(run)) == "Command line: not recorded (protocol.toml does not parse)."
