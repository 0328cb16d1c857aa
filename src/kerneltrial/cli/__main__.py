"""`python -m kerneltrial.cli`: the `kerneltrial` command (the device scripts and the runners' fresh processes use it)."""

from kerneltrial.cli import app

app()
