"""The shared test helpers (tests/kt.py): a refused command reads the same in-process and in a
fresh interpreter (exit 2, one error line on stderr, nothing on stdout); a template's fields are
filled, literal TOML is written as it is."""

from __future__ import annotations

from pathlib import Path

from tests.kt import run_cli, run_process, write_protocol


def test_a_refused_run_has_exit_2_and_its_error_on_stderr_alone_in_and_out_of_process(tmp_path: Path) -> None:
    protocol = write_protocol(tmp_path / "p.toml", 'name = "x"\nop = "{op}"\nroundz = 3\n', op="rmsnorm")
    assert protocol.read_text() == 'name = "x"\nop = "rmsnorm"\nroundz = 3\n'
    args = ("run", protocol, "--out", tmp_path / "run")
    for result in (run_cli(*args), run_process(*args, timeout=120)):
        assert result.exit_code == 2, result.output
        assert result.stdout == "" and result.output == result.stderr
        assert result.stderr.endswith("roundz is not a protocol key; did you mean rounds?\n"), result.stderr
    assert not (tmp_path / "run").exists()


def test_text_without_fields_is_written_as_it_is(tmp_path: Path) -> None:
    text = 'name = "x"\nenv = { A = "1" }\n'  # braces of an inline table: no template
    assert write_protocol(tmp_path / "p.toml", text).read_text() == text
