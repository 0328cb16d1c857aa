"""The front door as a new user meets it (issues 11 and 25): `protocol new` without a GPU writes the
small CPU panel and says so; `run` names the arms it cannot time before any timing; `demo`
freezes its protocol, says once what interpreter times are, spells out its verdicts, ends with
the next two commands and never overwrites an earlier run; `inspect` of an unknown operator is
bad input; the `tiny` model preset is documented; the device scripts refuse unfrozen protocols."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from kerneltrial.cli.demo import INTERPRETER_NOTE, NEXT_STEPS, demo_lines, fresh_run_dir
from kerneltrial.model.spec import PRESETS
from kerneltrial.ops.registry import all_ops, get_op
from kerneltrial.rundir.provenance import source_digest
from kerneltrial.trial.check import check_cases
from kerneltrial.trial.panel import beyond_grid_case
from tests.conftest import REPO
from tests.kt import run_cli, run_process, write_protocol

PROTOCOL = """
name = "front-door"
op = "rmsnorm"
control = "control"
candidates = ["packed_r4_w4", "torch_compile"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
[[cases]]
shape = [4, 64]
"""


def test_fresh_run_dir_never_reuses_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    assert fresh_run_dir(out) == out / "run" and out.is_dir()
    (out / "run").mkdir()
    assert fresh_run_dir(out) == out / "run-2"
    (out / "run-2").mkdir()
    (out / "run-3").write_text("a file is taken too")
    assert fresh_run_dir(out) == out / "run-4"


def test_protocol_new_without_a_gpu_writes_the_cpu_panel_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "p.toml"
    result = run_process("protocol", "new", "rmsnorm", "--out", str(out), "--candidate", "packed_r4_w4")
    assert result.exit_code == 0, result.stderr
    assert "No GPU visible: writing the operator's small CPU panel" in result.stderr
    shapes = [tuple(c["shape"]) for c in tomllib.loads(out.read_text())["cases"]]
    small = {c.shape for c in get_op("rmsnorm").small_cases}
    assert shapes and set(shapes) <= small, shapes


@pytest.mark.slow
def test_run_names_unavailable_arms_before_timing(tmp_path: Path) -> None:
    protocol = write_protocol(tmp_path / "p.toml", PROTOCOL)
    result = run_process("run", str(protocol), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.stderr
    said = "arm torch_compile is unavailable here and will not be timed: torch.compile peers run on a GPU"
    progress = result.stderr.splitlines()  # piped: a line per step (correctness: i/n, timing: i/n)
    first = next(i for i, line in enumerate(progress) if said in line)
    assert first < min(i for i, line in enumerate(progress) if line.startswith(("correctness:", "timing:")))


@pytest.mark.slow
def test_demo_again_writes_a_fresh_run_directory(tmp_path: Path) -> None:
    """The README's first set-up command, run a second time: the earlier run stays as it was."""
    out = tmp_path / "demo"
    earlier = out / "run"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text('{"earlier": true}')
    result = run_process("demo", "--out", str(out), timeout=1800)
    assert result.exit_code == 0, result.stderr[-2000:]
    assert (earlier / "summary.json").read_text() == '{"earlier": true}'
    assert (out / "run-2" / "summary.json").is_file() and (out / "run-2" / "report.md").is_file()
    said = " ".join(result.stdout.split())
    assert said.count("not GPU performance") == 1 and said.count(INTERPRETER_NOTE) == 1
    assert (out / "run-2.protocol.toml.freeze.json").is_file() and "- protocol frozen at " in (
        out / "run-2" / "report.md"
    ).read_text()
    assert said.endswith(" ".join(NEXT_STEPS))


def test_demo_lines_spell_out_the_verdicts() -> None:
    summary = {
        "is_gpu": False,
        "label": "host clock, Triton interpreter on a CPU: NOT GPU performance",
        "aggregates": {"fast": {"geomean": 1.25, "wins": 1, "ties": 0, "losses": 2, "inconclusive": 1}},
    }
    lines = demo_lines(summary, [{"passed": True}, {"passed": False}])
    assert lines == [
        "correctness: 1 of 2 checks passed",
        "  fast: geomean speedup 1.250 over the control; verdicts over the cases: "
        "1 win, 0 ties, 2 losses, 1 inconclusive",
    ]  # no timing line: without a GPU, INTERPRETER_NOTE said it once
    assert demo_lines(summary | {"is_gpu": True, "label": "CUDA events, cold L2"}, [])[-1] == (
        "timing: CUDA events, cold L2"
    )


def test_the_interpreters_default_check_panel_covers_every_shape_and_every_layout() -> None:
    """`check` without a GPU (panel `quick`): each small case once, the layouts in turn; `small`
    keeps every pair (issue 25: `check --all` within 10 minutes on 2 CPU cores)."""
    for op in all_ops():
        quick, small = (check_cases(op, None, None, None, panel) for panel in ("quick", "small"))
        beyond = beyond_grid_case(op)  # both panels end with the case of more than 65535 rows
        assert len(small) == (len(op.small_cases) + 1) * len(op.layouts) and set(quick) <= set(small)
        assert [(c.shape, c.dtype) for c in quick] == [
            *((c.shape, c.dtype) for c in op.small_cases),
            (beyond.shape, beyond.dtype),
        ], op.name
        assert {c.layout for c in quick} == set(op.layouts), op.name


def test_inspect_of_an_unknown_operator_is_bad_input() -> None:
    done = run_cli("inspect", str(REPO / "submissions" / "zimage_qk_rmsnorm.zip"), "--op", "nosuch")
    assert done.exit_code == 2, done.output
    assert done.output.startswith("error: unknown operator 'nosuch'; known: rmsnorm")


def test_the_tiny_model_preset_is_documented() -> None:
    shown = " ".join(run_cli("model", "--help").output.split())
    readme = " ".join((REPO / "README.md").read_text().split())
    for name in PRESETS:
        assert f"`{name}`" in shown and f"`{name}`" in readme, name
    assert "`tiny` (2 layers, hidden 64, vocabulary 512" in shown and 'model = "tiny"' in readme


def device_script(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`name` run from a copy of scripts/device/ whose setup.sh only says it was reached."""
    scripts = tmp_path / "scripts" / "device"
    scripts.mkdir(parents=True, exist_ok=True)
    for script in ("frozen.sh", name):
        (scripts / script).write_text((REPO / "scripts" / "device" / script).read_text())
    (scripts / "setup.sh").write_text("echo setup reached; return 1\n")
    return subprocess.run(["bash", f"scripts/device/{name}", *args], capture_output=True, text=True, cwd=tmp_path)


def test_device_scripts_refuse_an_unfrozen_protocol_unless_exploratory(tmp_path: Path) -> None:
    (tmp_path / "protocols" / "suite").mkdir(parents=True)
    for path in ("a.toml", "b.toml", "suite/a.toml", "suite/b.toml"):
        (tmp_path / "protocols" / path).write_text("")
    for path in ("a.toml", "suite/a.toml"):
        (tmp_path / "protocols" / f"{path}.freeze.json").write_text("{}")
    refused = device_script(tmp_path, "panels.sh", "60", "a", "b=other", "check")
    assert refused.returncode == 2 and "setup reached" not in refused.stdout
    assert refused.stderr.startswith("refusing protocols/b.toml: it is not frozen, so its evidence would not be")
    assert "pass --exploratory as the first argument" in refused.stderr
    assert "setup reached" in device_script(tmp_path, "panels.sh", "60", "a", "check").stdout
    assert "setup reached" in device_script(tmp_path, "panels.sh", "--exploratory", "60", "a", "b").stdout
    suite = device_script(tmp_path, "suite.sh", "suite", "E0")
    assert suite.returncode == 2 and suite.stderr.startswith("refusing protocols/suite/b.toml")
    assert "setup reached" in device_script(tmp_path, "suite.sh", "--exploratory", "suite", "E0").stdout


def test_device_setup_refuses_a_source_commit_that_is_not_the_code_here(tmp_path: Path) -> None:
    """A copy whose .git is older than its files: the commit named must be the code that runs."""
    package = tmp_path / "src" / "kerneltrial"
    (package / "rundir").mkdir(parents=True)
    for name in ("__init__.py", "rundir/__init__.py", "rundir/provenance.py", "rundir/hashing.py"):
        (package / name).write_text((REPO / "src" / "kerneltrial" / name).read_text())  # the digest's code
    (package / "a.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")  # as the repository's: the digest's import writes them
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "old"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    setup = (REPO / "scripts" / "device" / "setup.sh").read_text()
    stop = "echo setup-passed; return 0\n"  # the lines after the check need a GPU
    (tmp_path / "setup.sh").write_text(setup.replace("export PYTHONPATH", stop + "export PYTHONPATH", 1))

    def sourced() -> subprocess.CompletedProcess[str]:
        # the digest of the files as they are now: setup.sh's digest check passes, its commit check is tested
        env = {
            "PATH": "/usr/bin:/bin",
            "KERNELTRIAL_SOURCE_COMMIT": head,
            "KERNELTRIAL_SOURCE_DIGEST": source_digest(package),
        }
        return subprocess.run(["bash", "-c", ". ./setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True)

    assert "setup-passed" in sourced().stdout
    (tmp_path / "src" / "kerneltrial" / "a.py").write_text("x = 2\n")  # the files moved on, .git did not
    refused = sourced()
    assert refused.returncode == 1 and "setup-passed" not in refused.stdout
    assert f"refusing: KERNELTRIAL_SOURCE_COMMIT={head} is not the code here" in refused.stderr
    (tmp_path / "src" / "kerneltrial" / "a.py").write_text("x = 1\n")
    (tmp_path / "src" / "kerneltrial" / "b.py").write_text("y = 1\n")  # a file the commit lacks
    assert "refusing" in sourced().stderr


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run calls the README's test command: the same line in both (the quick subset first)."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    start = next(
        i for i, text in enumerate(ci) if text.startswith("# The README's test command (keep the two in step)")
    )
    line = next(text for text in ci[start:] if not text.startswith("#"))
    # in a subshell: under `set -e` a failure inside an && list (the quick subset) would not fail the script
    assert line.startswith("(") and line.endswith(")"), line
    line = line[1:-1]
    assert f"```bash\n{line}\n```" in (REPO / "README.md").read_text()
    assert "-m 'not slow and not serving' -x" in line.split("&& python -m pytest -m 'slow or serving'")[0]
