"""`kerneltrial run PROTOCOL --out DIR --ray [--ray-address A] (--replicas N | --shard cases)`: the
command side of fleet runs (cli/trial.py parses the flags and hands over here)."""

from __future__ import annotations

from pathlib import Path

import typer

from kerneltrial.cli.support import CliError, ExitCode, console
from kerneltrial.fleet.record import FleetArm, Mode


def run_on_ray(
    protocol: Path, out: Path, address: str | None, replicas: int | None, shard: str | None, resume: bool
) -> None:
    """Exit 0 when every unit finished and some candidate passed: replicas, the gate on every GPU;
    shards, the protocol's gate over the whole panel (`passed`). 1 when a unit did not finish
    (continue with --resume) or no candidate passed."""
    from kerneltrial.fleet.driver import run_fleet
    from kerneltrial.fleet.record import fleet_markdown

    if (replicas is None) == (shard is None):
        raise CliError("--ray needs one of --replicas N or --shard cases")
    if shard is not None and shard != "cases":
        raise CliError(f"--shard {shard!r}: the one way to shard is --shard cases")
    fleet = run_fleet(
        protocol, out, address=address, mode="shard" if shard else "replicas", replicas=replicas or 0, resume=resume
    )
    human = console()
    human.print(fleet_markdown(out), highlight=False, markup=False, soft_wrap=True)
    unfinished = [u for u in fleet.units if u.status != "finished"]
    for u in unfinished:
        human.print(f"{u.id}: {u.status}: {u.error}", highlight=False, markup=False, soft_wrap=True)
    if unfinished:
        flags = "--shard cases" if fleet.mode == "shard" else f"--replicas {fleet.requested}"
        human.print(
            f"continue with: kerneltrial run {protocol} --out {out} --ray {flags} --resume",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(ExitCode.FAILED)
    human.print(f"next: kerneltrial verify {out} && kerneltrial report {out}", markup=False, soft_wrap=True)
    if fleet.combined is None or not any(passed(fleet.mode, a) for a in fleet.combined.arms):
        raise typer.Exit(ExitCode.FAILED)


def passed(mode: Mode, arm: FleetArm) -> bool:
    """The fleet's verdict on an arm: replicas, its gate on every GPU; shards, the protocol's gate
    over the whole panel (each shard's gate judges only its cases)."""
    return arm.passed_in_every_unit if mode == "replicas" else arm.panel_gate is not None and arm.panel_gate.passed
