"""The `kerneltrial` command line, the only roof of the house: parses arguments, calls the
library a floor down, prints.

One module per command group in this package: kernel commands in `trial.py`, analysis commands
in `analysis.py`, the Track 1 workflow (derive, confirm, replicate) in `workflow.py`, package and
inspect in `submission.py`, whole-model trials in `model.py`, fleet runs in `fleet.py`, serving
commands in `serving.py` (`serving_adhoc.py`, `serving_common.py`). This module only mounts them. Errors, exit codes and output width
follow `support` (one error path for every command); `records` writes what commands print.
"""

from __future__ import annotations

import typer

from kerneltrial.cli import analysis as analysis_cli
from kerneltrial.cli import model as model_cli
from kerneltrial.cli import serving as serving_cli
from kerneltrial.cli import submission as submission_cli
from kerneltrial.cli import support as cli_support
from kerneltrial.cli import trial as trial_cli
from kerneltrial.cli import workflow as workflow_cli

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
