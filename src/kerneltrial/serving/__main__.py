"""`python -m kerneltrial.serving ...` runs the serving commands without the main CLI."""

from kerneltrial.cli.serving import app

if __name__ == "__main__":
    app(prog_name="kerneltrial serve")
