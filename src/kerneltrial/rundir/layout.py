"""The files of kernel and serving run directories (every file: docs/RUNDIR.md,
generated from these names), of replicate, suite and fleet directories (which hold kernel run
directories), and `kind_of`, which tells them apart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_json

Kind = Literal["kernel", "serving", "model", "replicates", "suite", "fleet"]

# both kinds
PROTOCOL = "protocol.toml"
PROVENANCE = "provenance.json"
PLAN = "plan.json"
SUMMARY = "summary.json"

# kernel run directories
CORRECTNESS = "correctness.jsonl"
CEILINGS = "ceilings.csv"
# ceilings.csv kinds measured from issue 16 on (optional: earlier runs lack them)
COPY_MATCHED = "copy_matched"  # a copy of one case's traffic (`bytes`)
TRITON_LAUNCH = "triton_launch"  # a one-element Triton kernel: the Triton launch floor
# plan.json `floor` (issue 27): the speed-of-light model of each case, named by the ceilings.csv
# kinds it reads: floor = median(`triton_launch`) + bytes / median GB/s of the 1 GiB `copy`
# (kernel/floor.py states the model; a plan with it gets a summary/6)
FLOOR_MODEL = {"launch": TRITON_LAUNCH, "rate": "copy"}
# plan.json arm kinds that may take only some layouts (the arm's `layouts`): a peer (e.g. one that
# takes only contiguous rows) and a calibration copy of one. A candidate must take every layout:
# unavailable in a case, it would leave the gate there.
PARTIAL_LAYOUT_KINDS = ("peer", "calibration")
TIMINGS = "timings.csv"
# timings.csv's column of a sample's extra peak memory (trial/memory.py), in runs with plan.json
# `peak_memory` (issue 40); empty where not measured (a CPU, `cuda-graph`, an isolated arm)
PEAK_BYTES = "peak_bytes"
TIMED_CHECKS = "timed_checks.jsonl"
HOST = "host.csv"  # host time per call of every timed arm (runs with plan.json `host`)
ROUNDTRIP = "roundtrip.csv"  # the trusted reference worker's samples (runs with plan.json `roundtrip`)
# its columns (trial/rounds.py writes a row after each round that timed an isolated arm)
ROUNDTRIP_COLUMNS = ("case", "seed", "round", "calls", "ns", "wall_ns")
# the reference's samples per round: several, so that its round trip has a spread to measure
ROUNDTRIP_SAMPLES = 2
MANIFEST = "manifest.json"
SOURCE_ARCHIVE = "source.tar.gz"
REPORT = "report.md"  # derived: verify renders it again and compares (kernel/derived.py)
ERRATA = "ERRATA.md"  # written by hand after the run: neither derived nor in the manifest
ERRATA_SUPERSEDED = "Superseded by:"  # an ERRATA.md line that retires the run: `Superseded by: RUN`
ERRATA_REASON = "Reason:"  # beside it: why
# the figures `kerneltrial report` writes into a kernel run directory (outside its manifest, like report.md)
SPEEDUP_PNG = "speedup.png"
VERDICTS_PNG = "verdicts.png"
CEILING_PNG = "ceiling.png"
REPORT_FIGURES = (SPEEDUP_PNG, VERDICTS_PNG, CEILING_PNG)
SIZE_PNG = "size.png"  # what `kerneltrial plot` writes into a kernel run directory by default
ADDED_FIGURES = (*REPORT_FIGURES, SIZE_PNG)  # every figure a command may add after the run
# A replicate directory (`kerneltrial replicate`): run-1..N, each a kernel run directory, and the cross-run table.
REPLICATES = "replicates.json"
REPLICATES_MD = "replicates.md"
# A suite directory (`kerneltrial suite`): one kernel run directory per protocol of a directory, and the suite record.
SUITE = "suite.json"
# A fleet directory (`kerneltrial run --ray`): the protocol's pieces, one kernel run directory per
# work unit (workers/<unit>), each unit's log, and the record with the combined figures.
FLEET = "fleet.json"
FLEET_PIECES = "pieces"
FLEET_WORKERS = "workers"
FLEET_LOGS = "logs"
INPUT_FILES = (PLAN, CORRECTNESS, TIMINGS, CEILINGS)  # the raw files every summary is computed from
# The input dtypes a case may name, with their bytes per element (torch-free: a protocol is
# validated before torch is imported; ops/registry.py maps the names to torch dtypes).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def case_id(shape: tuple[int, ...] | list[int], layout: str, dtype: str) -> str:
    """A case as every file of a kernel run directory names it, e.g. `4096x2048/contiguous/bfloat16`."""
    return f"{'x'.join(map(str, shape))}/{layout}/{dtype}"


# serving run directories
LAUNCHES = "launches.jsonl"
RUNS = "runs.jsonl"
REQUESTS = "requests.csv"
ACCURACY_DIR = "accuracy"
RAW_DIR = "raw"
LAUNCH_DIR = "launches"
ATTRIBUTION = "attribution.csv"  # model runs: time inside each routed operator of one profiled call
DISPATCH_DIR = "dispatch"  # launches/NN-ARM/dispatch: the plugins' call records (dispatch-PID.json)


@dataclass(frozen=True)
class RunDir:
    """The files of a kernel run directory."""

    root: Path

    @property
    def protocol(self) -> Path:
        return self.root / PROTOCOL

    @property
    def provenance(self) -> Path:
        return self.root / PROVENANCE

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    @property
    def correctness(self) -> Path:
        return self.root / CORRECTNESS

    @property
    def ceilings(self) -> Path:
        return self.root / CEILINGS

    @property
    def timings(self) -> Path:
        return self.root / TIMINGS

    @property
    def timed_checks(self) -> Path:
        return self.root / TIMED_CHECKS

    @property
    def host(self) -> Path:
        return self.root / HOST

    @property
    def roundtrip(self) -> Path:
        return self.root / ROUNDTRIP

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def source(self) -> Path:
        return self.root / SOURCE_ARCHIVE


def kind_of(run_dir: Path) -> Kind:
    """ "replicates" for a replicate directory (it holds replicates.json), "suite" for a suite
    directory (suite.json), "fleet" for a fleet directory (fleet.json), else "kernel", "serving" or "model": provenance.json's `kind`. Every committed run records it; for a
    provenance.json without one, the raw files tell (timings.csv: kernel; runs.jsonl or
    launches.jsonl: serving). RunDirError when the directory, provenance.json or any sign
    of either kind is missing, or the kind is another word."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    if (run_dir / REPLICATES).is_file():
        return "replicates"
    if (run_dir / SUITE).is_file():
        return "suite"
    if (run_dir / FLEET).is_file():
        return "fleet"
    path = run_dir / PROVENANCE
    record = read_json(path)
    kind = record.get("kind") if isinstance(record, dict) else None
    if kind in ("kernel", "serving", "model"):
        return kind
    if kind is not None:
        raise RunDirError(f"{path}: kind {kind!r} is not 'kernel', 'serving' or 'model'")
    kernel = (run_dir / TIMINGS).is_file()
    serving = (run_dir / RUNS).is_file() or (run_dir / LAUNCHES).is_file()
    if kernel != serving:
        return "kernel" if kernel else "serving"
    raise RunDirError(
        f"{path} has no kind and the directory holds {'both' if kernel else 'neither'} {TIMINGS} (kernel) "
        f'{"and" if kernel else "nor"} {RUNS}/{LAUNCHES} (serving); add "kind": "kernel" or "serving" to it'
    )
