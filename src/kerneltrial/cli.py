"""The `kerneltrial` command line: parses arguments, calls the library, prints.

Command groups live next to the code they drive: analysis commands in
`analysis/cli.py`, serving commands in `serving/cli.py`, kernel commands in
`trial/cli.py`, the Track 1 workflow (derive, confirm, replicate) in `workflow_cli.py`,
package and inspect in `submission/cli.py`, whole-model trials in `model/cli.py`. This module only mounts them. Errors, exit codes
and output width follow `cli_support` (one error path for every command).
"""

from __future__ import annotations

import typer

from kerneltrial import cli_support, workflow_cli
from kerneltrial.analysis import cli as analysis_cli
from kerneltrial.model import cli as model_cli
from kerneltrial.serving import cli as serving_cli
from kerneltrial.submission import cli as submission_cli
from kerneltrial.trial import cli as trial_cli

app = cli_support.app(
    help=(
        "Controlled trials for GPU kernels and LLM serving: correctness before timing, "
        "interleaved rounds, raw data kept, every figure rebuilt on a CPU by `verify`."
    ),
    epilog=cli_support.EXIT_CODES_HELP,
)


def _version(value: bool) -> None:
    if value:
        from kerneltrial import __version__

        typer.echo(f"kerneltrial {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Controlled trials for GPU kernels and LLM serving."""


trial_cli.mount(app)
analysis_cli.mount(app)
workflow_cli.mount(app)
submission_cli.mount(app)
model_cli.mount(app)
app.add_typer(serving_cli.app, name="serve", help="Serving trials: launch vLLM, benchmark, A/B, MATH-500 accuracy.")

if __name__ == "__main__":
    app()
