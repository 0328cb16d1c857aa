"""The sandbox around the package interface check's workers: trial/confine.py's, the one the
trial's isolated workers run in (issue 35, item 1), run from copies that name nothing of kerneltrial.

Each worker (submission/isolated.py `TargetStarter`) gets a `confine.Confinement` of its own: as root, a
uid no other process runs as, with no capability but CAP_DAC_READ_SEARCH (it reads every file and
writes none but its own folder's); a PID namespace of its own with its own /proc; a cgroup of its
own (killed whole, so a child that calls setsid dies with it); no-new-privs; a seccomp filter
(ptrace, process_vm_readv/writev, pidfd_getfd, kcmp refused). It writes one folder, its own
(`own-*/` in its run folder: its home and caches); it reads the target interpreter, the
unpacked archive and the shims with CAP_DAC_READ_SEARCH; its channel is inherited pipes and a
socket (trial/worker.py, MODE target), its log an inherited descriptor. The scratch folder
is root's (mode 0700), so the worker cannot write there (the shims, the archive, the other
environment's files), nor in the --out folder, nor signal, trace or read the harness.

The worker must not see kerneltrial (submission/target_env.py), and the sandbox is visible to it:
PID 1 of its namespace is trial/sandbox.py's init, whose command line holds the sandbox's path,
its spec (the cgroup's path, pyseccomp's path) and the interpreter's path, and /proc/self/cgroup
names the cgroup. So the sandbox runs from copies in the scratch folder (`Copies`: lib/init.py,
lib/seccomp.py, the target interpreter) and the cgroup is named like a temporary folder.

What the host cannot give (`confine.host`, probed once per process) is missing and said: in the
check's result, in the receipt (`interface_check.sandbox`) and in package's output. /proc must show
every piece the host allowed on the launcher before the worker starts and on the worker after its
hello (`Confinement.problems`), else the check ends (`isolated.WorkerEnded`).
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from kerneltrial.submission.receipt import SandboxRecord
from kerneltrial.trial import confine


@dataclass(frozen=True)
class Copies:
    """The sandbox's files under names that say nothing of kerneltrial."""

    python: Path  # the target interpreter (target_env.target_python), which runs the sandbox
    init: Path  # trial/sandbox.py
    seccomp: Path | None  # pyseccomp.py, None where it is not installed

    @classmethod
    def make(cls, lib: Path, python: Path) -> Copies:
        found = confine.pyseccomp_path()
        seccomp = Path(shutil.copy(found, lib / "seccomp.py")) if found else None
        return cls(python, Path(shutil.copy(confine.SANDBOX, lib / "init.py")), seccomp)


def _neutral_spec(arg: str, copies: Copies) -> str:
    """The sandbox's SPEC (trial/sandbox.py: a JSON object) with pyseccomp's path the copy's."""
    try:
        spec = json.loads(arg)
    except ValueError:
        return arg
    if not isinstance(spec, dict) or not spec.get("seccomp"):
        return arg
    return json.dumps(spec | {"seccomp": str(copies.seccomp)})


@dataclass
class WorkerSandbox:
    """One worker's confinement, started from the copies, with a cgroup of a neutral name."""

    host: confine.HostSandbox
    confinement: confine.Confinement
    copies: Copies

    @classmethod
    def make(cls, host: confine.HostSandbox, folder: Path, copies: Copies) -> WorkerSandbox:
        """The confinement of a worker that writes `folder` (chowned to its uid)."""
        cgroup = None
        if host.cgroup_root:
            cgroup = Path(host.cgroup_root) / f"tmp{secrets.token_hex(6)}"
            cgroup.mkdir()
        # the cgroup is given, so Confinement makes none of its own (whose name says kerneltrial)
        confinement = confine.Confinement(replace(host, cgroup_root=None), folder, cgroup=cgroup)
        return cls(host, confinement, copies)

    @property
    def pidns(self) -> bool:
        return "pidns" in self.host.allowed

    @property
    def folder(self) -> Path:
        return self.confinement.folder

    def command(self, program: list[str]) -> list[str]:
        """`program` started in the sandbox, the sandbox's own arguments pointing at the copies."""
        argv = self.confinement.command(program)
        head = argv[: len(argv) - len(program)]
        swap = {sys.executable: str(self.copies.python), str(confine.SANDBOX): str(self.copies.init)}
        neutral = [swap.get(arg, arg) for arg in head]
        if self.copies.seccomp is not None:
            neutral = [_neutral_spec(arg, self.copies) for arg in neutral]
        return [*neutral, *program]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with every home and cache the confinement puts in the worker's folder."""
        folder = str(self.folder)
        return dict(base) | {k: v for k, v in self.confinement.environment().items() if v == folder}

    def problems(self, leader: int) -> list[str]:
        return self.confinement.problems(leader)

    def kill(self) -> None:
        self.confinement.kill()

    def close(self) -> None:
        self.confinement.close()


def sandbox_record(host: confine.HostSandbox) -> SandboxRecord:
    """What the receipt records of the sandbox the host gives."""
    return SandboxRecord(allowed=list(host.allowed), missing=dict(host.missing))


def record_note(record: SandboxRecord) -> str:
    """One line for what shows the check's verdict: the missing pieces, or ''."""
    return confine.HostSandbox(tuple(record.allowed), dict(record.missing), None).note()
