"""The CLI convention (issue 11): exit codes 0/1/2/130 through one error path, one `error:` line
on stderr, `--json` documents on check/run/verify/compare, nothing cut in pipes, help that keeps
its `[...]`. Commands run as a user runs them (a subprocess with pipes) where the terminal matters."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from kerneltrial.cli import app
from kerneltrial.cli import support as cli_support
from tests.conftest import REPO
from tests.kt import CliResult, cli_argv, run_cli, run_process, write_protocol

# one xdist worker for the whole module: its module-scoped fixture (json_run) is built once,
# not once on each worker that runs one of its tests (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_cli_convention")

FIXTURES = REPO / "tests" / "fixtures"
runner = CliRunner()
PROTOCOL = """
name = "cli-json"
op = "rmsnorm"
control = "control"
candidates = ["packed_r4_w4", "user:wrong_rmsnorm"]
impl_modules = ["{module}"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
[[cases]]
shape = [4, 64]
"""


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---- exit codes --------------------------------------------------------------------------------


def test_top_level_help_documents_the_exit_codes():
    result = run_cli("--help")
    text = " ".join(result.output.split())
    assert result.exit_code == 0
    assert "Exit codes: 0 ok; 1 a verdict or check failed" in text and "130 interrupted" in text


def test_exit_0_when_every_check_passes():
    result = run_cli(
        "check",
        "rmsnorm",
        "--impl",
        "control",
        "--shape",
        "2x100",
        "--layout",
        "contiguous",
        "--seeds",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["check", "rmsnorm", "--seeds", "zero"], "Invalid value for '--seeds'"),  # usage error (click)
        (["check", "rmsnorm", "--no-such-option"], "No such option: --no-such-option"),
        (["no-such-command"], "No such command 'no-such-command'"),
        (["check", "nosuchop"], "unknown operator 'nosuchop'"),  # registry error
        (["check", "rmsnorm", "--impl-module", "no/such/file.py"], "does not exist"),  # missing file
        (["verify", "no/such/run"], "not a directory"),  # run-directory error
        (["protocol", "freeze", "no/such/protocol.toml"], "does not exist"),
    ],
)
def test_exit_2_on_bad_input_with_one_error_line(args, message):
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert message in one_error_line(result.stderr)


def test_exit_2_on_a_malformed_protocol(tmp_path: Path):
    protocol = write_protocol(
        tmp_path / "p.toml",
        'name = "x"\nop = "rmsnorm"\ncandidates = ["packed_r4_w4"]\nrounds = "many"\n[[cases]]\nshape = [4, 64]\n',
    )
    result = run_cli("run", str(protocol), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert "rounds" in one_error_line(result.stderr)
    assert not (tmp_path / "run").exists()


def test_every_command_takes_the_one_error_path():
    """A bad option fails every command, however it is mounted, with exit 2 and one line
    (`serve bench|accuracy|launch` pass unknown options on to the server: their own line)."""
    root = get_command(app)
    assert isinstance(root, cli_support.Group)

    def leaves(group, path):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from leaves(command, [*path, name])
            else:
                yield [*path, name]

    commands = list(leaves(root, []))
    assert len(commands) >= 14
    for command in commands:
        result = run_cli(*command, "--no-such-option")
        assert result.exit_code == 2, (command, result.output)
        line = one_error_line(result.stderr)
        assert "No such option" in line or command[0] == "serve", command


def _toy_app(raise_: BaseException) -> typer.Typer:
    toy = cli_support.app(help="toy")

    @toy.command()
    def boom() -> None:
        raise raise_

    @toy.command()
    def other() -> None:
        """A second command, so that `boom` stays a sub-command."""

    return toy


def test_interrupt_is_130_with_one_line_and_a_bug_keeps_its_traceback():
    interrupted = runner.invoke(_toy_app(KeyboardInterrupt()), ["boom"])
    assert interrupted.exit_code == 130 and interrupted.stderr == "interrupted\n"
    bug = runner.invoke(_toy_app(ZeroDivisionError("a bug")), ["boom"])
    assert isinstance(bug.exception, ZeroDivisionError)  # never dressed up as bad input
    failed = runner.invoke(_toy_app(cli_support.CliError("gate\nfailed", cli_support.ExitCode.FAILED)), ["boom"])
    assert failed.exit_code == 1 and failed.stderr == "error: gate failed\n"


def test_sigint_ends_a_running_check_with_130_and_one_line():
    """Ctrl-C during a check of a kernel that never returns: exit 130, "interrupted", no traceback."""
    proc = subprocess.Popen(
        cli_argv("check", "rmsnorm", "--impl-module", FIXTURES / "planted" / "never_returns.py")
        + ["--impl", "user:never_returns", "--shape", "4x64", "--seeds", "1", "--timeout", "600"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        progress = proc.stderr.readline()  # "rmsnorm: 1/1 after 0 s": the check has started
        assert progress.startswith("rmsnorm: "), progress
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    assert rest == "interrupted\n"


# ---- --json ------------------------------------------------------------------------------------


def test_check_json_lists_the_failing_arm():
    result = run_process(
        "check",
        "rmsnorm",
        "--impl-module",
        str(FIXTURES / "wrong_rmsnorm.py"),
        "--impl",
        "user:wrong_rmsnorm",
        "--impl",
        "control",
        "--shape",
        "2x100",
        "--seeds",
        "1",
        "--json",
    )
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout)  # stdout is the JSON document alone
    assert document["schema"] == "kerneltrial.check-result/1"
    assert document["failing_arms"] == ["rmsnorm/user:wrong_rmsnorm"]
    assert (document["passed"], document["failed"]) == (2, 2)  # two layouts, one seed
    wrong = next(c for c in document["checks"] if c["arm"] == "user:wrong_rmsnorm")
    assert not wrong["passed"] and wrong["message"] and wrong["case"].startswith("2x100")
    assert "2 passed, 2 failed" in result.stderr  # the human view went to stderr


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    tmp = tmp_path_factory.mktemp("json_run")
    protocol = write_protocol(tmp / "p.toml", PROTOCOL, module=FIXTURES / "wrong_rmsnorm.py")
    run = tmp / "run"
    return run, run_process("run", str(protocol), "--out", str(run), "--json")


def test_run_json_names_the_gate_verdict_of_each_arm(json_run):
    run, result = json_run
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "kerneltrial.run-result/1"
    assert document["run_dir"] == str(run) and "NOT GPU" in document["timing"]
    assert document["gate_rule"] == "no_loss"
    arms = {a["arm"]: a for a in document["arms"]}
    assert not arms["user:wrong_rmsnorm"]["passed"] and arms["user:wrong_rmsnorm"]["reasons"]
    assert "user:wrong_rmsnorm" not in document["passed_arms"]
    assert "gate failed by user:wrong_rmsnorm" in result.stderr


def test_verify_json_lists_the_problem_of_a_tampered_run(json_run, tmp_path: Path):
    run, _ = json_run
    good = run_process("verify", str(run), "--json")
    assert good.exit_code == 0, good.stderr
    document = json.loads(good.stdout)
    assert document["schema"] == "kerneltrial.verify-result/1" and document["ok"]
    assert document["runs"][0]["checks"] and all(c["ok"] for c in document["runs"][0]["checks"])

    tampered = tmp_path / "run"
    shutil.copytree(run, tampered)
    summary = json.loads((tampered / "summary.json").read_text())
    summary["ceilings"]["copy_gbps"] *= 1.01
    (tampered / "summary.json").write_text(json.dumps(summary))
    bad = run_process("verify", str(tampered), "--json")
    assert bad.exit_code == 1, bad.stderr
    document = json.loads(bad.stdout)
    assert not document["ok"] and not document["runs"][0]["ok"]
    failed = [c for c in document["runs"][0]["checks"] if not c["ok"]]
    assert any("copy_gbps" in c["detail"] for c in failed), failed


def test_compare_json_has_every_arm_with_numbers(json_run):
    run, _ = json_run
    result = run_process("compare", str(run), str(run), "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "kerneltrial.compare-result/2"
    rows = {(r["case"], r["arm"]): r for r in document["rows"]}
    case = "4x64/contiguous/bfloat16"
    assert (case, "control") in rows and rows[(case, "user:wrong_rmsnorm")]["verdict_a"] == "failed correctness"
    packed = rows[(case, "packed_r4_w4")]
    assert packed["ratio_b_over_a"] == 1.0 and packed["median_a_ns"] > 0
    assert packed["speedup_a"]["ci_low"] <= packed["speedup_a"]["value"] <= packed["speedup_a"]["ci_high"]
    assert document["only_in_a"] == [] and document["only_in_b"] == []


# ---- pipes and help ----------------------------------------------------------------------------


def test_piped_tables_keep_long_arm_names(tmp_path: Path):
    name = "a_kernel_module_whose_name_is_far_longer_than_eighty_columns_so_a_narrow_table_would_cut_it"
    shutil.copy(FIXTURES / "good_rmsnorm.py", tmp_path / f"{name}.py")
    result = run_process(
        "check",
        "rmsnorm",
        "--impl-module",
        str(tmp_path / f"{name}.py"),
        "--impl",
        f"user:{name}",
        "--shape",
        "2x100",
        "--seeds",
        "1",
    )
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if f"user:{name}" in line)
    assert "pass" in row and "…" not in result.stdout


def test_piped_errors_are_one_whole_line():
    long_name = "an_operator_name_" + "x" * 200
    result = run_process("check", long_name)
    assert result.exit_code == 2
    assert f"unknown operator '{long_name}'" in one_error_line(result.stderr)


def test_help_keeps_bracketed_text():
    from kerneltrial.serving.bench import VLLM_ENV

    result = run_cli("serve", "bench", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "JSON list [[input_len, output_len, concurrency, num_requests], ...]" in text
    assert f"env {VLLM_ENV}" in text  # the help names the variable bench reads


@pytest.mark.slow
def test_sigint_ends_a_run_with_130_and_keeps_its_rows(tmp_path: Path):
    protocol = write_protocol(
        tmp_path / "p.toml", PROTOCOL.replace("rounds = 2", "rounds = 40"), module=FIXTURES / "wrong_rmsnorm.py"
    )
    run = tmp_path / "run"
    proc = subprocess.Popen(
        cli_argv("run", protocol, "--out", run),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        timings = run / "timings.csv"
        while time.monotonic() < deadline and not (timings.is_file() and len(timings.read_text().splitlines()) > 5):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert len(timings.read_text().splitlines()) > 5  # the rows measured so far stay for --resume
