"""The harness's side of the sandbox (trial/sandbox.py): what this host allows, one worker's
confinement, and what /proc says the worker got.

The pieces (docs/CHECKS.md, "The sandbox"):

- `uid`: the worker runs as a uid and gid no other process runs as, with every group and
  capability dropped (util-linux `setpriv`; the harness must be root). It cannot trace, signal or
  open /proc/PID/mem of the harness or of another arm, nor write what the harness did not give it
  (the run directory included). It keeps one capability, CAP_DAC_READ_SEARCH: it reads every file
  and writes none, so that an interpreter, a package or a user's kernel file in a folder only root
  may enter (a pytest temporary folder, /root) loads as it would in the harness.
- `pidns`: PID, mount and network namespaces of its own: everything it starts dies with it, it
  sees no process outside, and it reaches no socket of the host's network.
- `cgroup`: a cgroup (v2) of its own: frozen while another arm is timed (`freeze`), killed whole.
- `no_new_privs`: always.
- `seccomp`: what reaches other processes (ptrace, process_vm_*, pidfd_getfd, kcmp), new
  namespaces and mounts, io_uring, perf_event_open, bpf and the keyring refused (pyseccomp;
  trial/sandbox.py lists them).

`host()` probes each piece once per process by starting the sandbox with it alone. A piece the host
refuses is recorded with its reason (`HostSandbox.missing`) and every page that shows the run's
verdict says so. After a worker loads, `Confinement.observe` reads the worker's credentials,
namespace, filter and cgroup from /proc (never from the worker) and the harness refuses a worker
that lacks a piece the host allowed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kerneltrial.rundir.integrity_notes import in_process_warning, sandbox_warning
from kerneltrial.trial.sandbox import FILE_LIMIT  # its ceiling on one file a worker writes (its log included)

if TYPE_CHECKING:
    from kerneltrial.trial.shared import Arena

SANDBOX = Path(__file__).with_name("sandbox.py")
WORKER = Path(__file__).with_name("worker.py")
VMM = Path(__file__).with_name("vmm.py")
PIECES = ("uid", "pidns", "cgroup", "no_new_privs", "seccomp")
UID_BASE = 2_000_000_000  # far above the ranges distributions and subuid files hand out
UID_SPAN = 100_000_000
READ_SEARCH = "dac_read_search"
CAP_DAC_READ_SEARCH = 1 << 2  # its bit in /proc/PID/status CapEff
FREEZE_WAIT_S = 5.0

PROBE_S = 60.0
WORKER_IMPORTS = "import torch"  # what a worker must reach under its own uid
HANDED_OUT: set[int] = set()  # the uids this process gave its workers (never given twice)


def setpriv_argv(uid: int) -> list[str]:
    """setpriv's options for a worker of `uid`: every group and capability dropped but
    CAP_DAC_READ_SEARCH (kept as an ambient capability: read every file, write none)."""
    setpriv = shutil.which("setpriv") or "setpriv"
    caps = f"-all,+{READ_SEARCH}"
    argv = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
    argv += [f"--inh-caps={caps}", f"--bounding-set={caps}", f"--ambient-caps=+{READ_SEARCH}"]
    return [*argv, "--"]


def cgroup2_root() -> Path | None:
    """The mount point of the cgroup v2 hierarchy (pure v2 or a hybrid's `unified`), if any."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def free_uid(taken: set[int]) -> int:
    """A uid in [UID_BASE, UID_BASE + UID_SPAN) that no running process has and this process has
    not handed out."""
    running = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    running.update(int(u) for u in line.split()[1:])
                    break
        except OSError:
            continue
    while True:
        uid = UID_BASE + random.SystemRandom().randrange(UID_SPAN)
        if uid not in running and uid not in taken:
            taken.add(uid)
            return uid


def pyseccomp_path() -> str | None:
    spec = importlib.util.find_spec("pyseccomp")
    return spec.origin if spec is not None else None


@dataclass(frozen=True)
class HostSandbox:
    """What this host lets the harness put around a worker."""

    allowed: tuple[str, ...]
    missing: dict[str, str]  # piece -> why the host refuses it
    cgroup_root: str | None

    def note(self) -> str:
        """One line for pages that show a verdict: what the sandbox lacked, or ''."""
        return sandbox_warning(self.missing) if self.missing else ""


@dataclass(frozen=True)
class Probe:
    """One probe: a sandbox with some pieces, running the worker's first steps."""

    pieces: tuple[str, ...]
    cgroup: Path | None
    uid: int

    def argv(self, code: str) -> list[str]:
        uid = self.uid if "uid" in self.pieces else None
        return sandbox_argv(self.pieces, self.cgroup, uid, [sys.executable, "-I", "-c", code])


def sandbox_argv(pieces: tuple[str, ...], cgroup: Path | None, uid: int | None, program: list[str]) -> list[str]:
    """The command that starts `program` in the sandbox with `pieces` (trial/sandbox.py, then setpriv)."""
    spec = {
        "cgroup": str(cgroup) if "cgroup" in pieces and cgroup else None,
        "pidns": "pidns" in pieces,
        "seccomp": pyseccomp_path() if "seccomp" in pieces else None,
    }
    prefix = setpriv_argv(uid) if uid is not None else []
    return [sys.executable, "-I", str(SANDBOX), json.dumps(spec), "--", *prefix, *program]


def run_probes(probes: list[Probe], code: str, fds: tuple[int, ...] = ()) -> list[str]:
    """For each probe, '' when it ran `code`, else why not (the probes run at once)."""
    procs = []
    for t in probes:
        env = {k: v for k, v in os.environ.items() if k != "HOME"} | {"HOME": "/tmp"}
        procs.append(
            subprocess.Popen(
                t.argv(code), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/", env=env, pass_fds=fds
            )
        )
    reasons = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=PROBE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        reasons.append("" if proc.returncode == 0 else failure(err.decode(errors="replace"), proc.returncode))
    return reasons


def failure(stderr: str, code: int) -> str:
    """Why a probe failed, in one line: the last line that starts with an exception's name (a
    traceback's last line is often a hint, not the error), else the last line, else the exit code."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    line = (named or lines or [f"exit {code}"])[-1]
    return f"the worker's first steps fail in it: {line}"[:300]


def _preconditions(root: Path | None) -> dict[str, str]:
    """Pieces this host cannot offer at all, and why (no process started)."""
    missing = {}
    if os.geteuid() != 0:
        missing["uid"] = "the harness is not root, so it cannot start a worker under another uid"
    elif shutil.which("setpriv") is None:
        missing["uid"] = "util-linux setpriv is not installed"
    if pyseccomp_path() is None:
        missing["seccomp"] = "pyseccomp is not installed (pip install pyseccomp)"
    if root is None:
        missing["cgroup"] = "no cgroup v2 hierarchy is mounted"
    return missing


def _make_probe_cgroup(root: Path | None, missing: dict[str, str]) -> Path | None:
    if root is None or "cgroup" in missing:
        return None
    probe = root / f"kerneltrial-probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
    except OSError as exc:
        missing["cgroup"] = f"cannot make a cgroup under {root}: {exc.strerror}"
        return None
    lacking = [n for n in ("cgroup.freeze", "cgroup.kill", "cgroup.procs") if not (probe / n).exists()]
    if lacking:
        missing["cgroup"] = f"the kernel's cgroup v2 lacks {', '.join(lacking)}"
    return probe


def _cuda_ipc_code() -> tuple[Arena, str, tuple[int, ...]]:
    """A harness buffer on the GPU (kept alive by the caller), the code that opens and writes it
    with the worker's own functions (trial/worker.py and trial/vmm.py, loaded by path) and the
    descriptor the code needs passed (a VMM buffer's), as a worker's buffers are made and opened."""
    import torch

    from kerneltrial.trial.shared import Arena

    arena = Arena(torch.device("cuda", torch.cuda.current_device()))
    buffer = arena.allocate(16)
    desc = buffer.desc | ({"fd": buffer.fd} if buffer.fd is not None else {})
    load = "spec = importlib.util.spec_from_file_location({0!r}, {1!r}); {2} = importlib.util.module_from_spec(spec); spec.loader.exec_module({2}); "
    code = (
        f"{WORKER_IMPORTS}; import importlib.util; "
        + load.format("_kt_probe_worker", str(WORKER), "w")
        + load.format("_kt_probe_vmm", str(VMM), "v")
        + f"w.bytes_of(w.open_buffer({desc!r}, v)).fill_(1); torch.cuda.synchronize()"
    )
    return arena, code, (() if buffer.fd is None else (buffer.fd,))


@functools.cache
def host(cuda: bool = False) -> HostSandbox:
    """Probe the pieces once per process and device kind: the whole sandbox first, running the
    worker's first steps (torch imported; with `cuda`, a GPU buffer of the harness opened and written
    as a worker opens its buffers); where that fails, each piece alone, at once, and the pieces that
    fail alone are left out, with their reasons."""
    root = cgroup2_root()
    missing = _preconditions(root)
    probe = _make_probe_cgroup(root, missing)
    uid = free_uid(set())
    shared, code, fds = None, WORKER_IMPORTS, ()
    if cuda:  # the worker must open the harness's GPU buffers (trial/shared.py, trial/vmm.py)
        shared, code, fds = _cuda_ipc_code()
    try:
        offered = tuple(p for p in PIECES if p not in missing)
        if run_probes([Probe(offered, probe, uid)], code, fds)[0]:
            alone = [Probe((p,), probe, uid) for p in offered]
            for piece, why in zip(offered, run_probes(alone, code, fds), strict=True):
                if why:
                    missing[piece] = why
    finally:
        if shared is not None:
            shared.close()
        if probe is not None:
            probe.rmdir()
    allowed = tuple(p for p in PIECES if p not in missing)
    return HostSandbox(allowed, missing, str(root) if "cgroup" in allowed else None)


def descendants(leader: int) -> list[int]:
    """`leader` and every process below it (from /proc/PID/stat's parent pids)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found = [leader]
    for pid in found:
        found += [child for child, parent in parents.items() if parent == pid and child not in found]
    return found


@dataclass(frozen=True)
class Observed:
    """One process of a worker as /proc shows it."""

    pid: int
    uids: tuple[int, ...]
    cap_eff: int
    no_new_privs: bool
    seccomp_filter: bool
    ns_pids: tuple[int, ...]  # its pid in each PID namespace, outermost first
    net_ns: str  # its network namespace ("net:[inode]"; "" when unreadable)
    file_limit: int | None = None  # RLIMIT_FSIZE's soft limit in bytes (None: unlimited or unreadable)

    @property
    def nested_pid(self) -> bool:
        return len(self.ns_pids) > 1


def read_status(pid: int) -> Observed | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return Observed(
        pid=pid,
        uids=tuple(int(u) for u in fields.get("Uid", "").split()),
        cap_eff=int(fields.get("CapEff", "0").strip() or "0", 16),
        no_new_privs=fields.get("NoNewPrivs", "0").strip() == "1",
        seccomp_filter=fields.get("Seccomp", "0").strip() == "2",
        ns_pids=tuple(int(p) for p in fields.get("NSpid", "").split()),
        net_ns=network_namespace(pid),
        file_limit=file_size_limit(pid),
    )


def file_size_limit(pid: int) -> int | None:
    """The soft "Max file size" of /proc/PID/limits in bytes; None when unlimited or unreadable."""
    try:
        lines = Path(f"/proc/{pid}/limits").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("Max file size"):
            soft = line[len("Max file size") :].split()[0]
            return int(soft) if soft.isdigit() else None
    return None


def network_namespace(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


@dataclass
class Confinement:
    """One worker's sandbox: its uid, its cgroup, and the command and environment that start it."""

    sandbox: HostSandbox
    folder: Path
    uid: int | None = None
    cgroup: Path | None = None
    frozen: bool = False

    def __post_init__(self) -> None:
        if "uid" in self.sandbox.allowed:
            self.uid = free_uid(HANDED_OUT)
            os.chown(self.folder, self.uid, self.uid)
        if self.sandbox.cgroup_root:
            self.cgroup = Path(self.sandbox.cgroup_root) / f"kerneltrial-{os.getpid()}-{self.folder.name}"
            self.cgroup.mkdir()

    def command(self, program: list[str]) -> list[str]:
        return sandbox_argv(self.sandbox.allowed, self.cgroup, self.uid, program)

    def environment(self) -> dict[str, str]:
        """The worker's environment: the harness's, with every home and cache in the worker's folder
        (a uid of its own can write nothing else; no cache is shared between arms)."""
        env = dict(os.environ)
        home = str(self.folder)
        for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            env[name] = home
        env["USER"] = env["LOGNAME"] = "kerneltrial-worker"
        return env

    def pids(self, leader: int) -> list[int]:
        """The worker's processes: its cgroup's, else `leader` and its descendants."""
        if self.cgroup is not None:
            try:
                return [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
            except OSError:
                return []
        return descendants(leader)

    def problems(self, leader: int) -> list[str]:
        """What /proc shows missing from the worker's processes (the sandbox's own processes, its
        parent outside the PID namespace, `leader`, and the namespace's init, are root by design)."""
        found = [o for o in (read_status(p) for p in self.pids(leader)) if o is not None]
        if "pidns" in self.sandbox.allowed:
            workers = [o for o in found if o.pid != leader and o.ns_pids[-1:] != (1,)]
        else:
            workers = found
        if not workers:
            return ["no worker process was found in its cgroup"]
        problems = []
        harness_net = network_namespace("self")
        for o in workers:
            if self.uid is not None and (set(o.uids) != {self.uid} or o.cap_eff & ~CAP_DAC_READ_SEARCH):
                problems.append(f"pid {o.pid} runs as uid {o.uids} with capabilities {o.cap_eff:#x}")
            if not o.no_new_privs:
                problems.append(f"pid {o.pid} lacks no-new-privs")
            if o.file_limit is None or o.file_limit > FILE_LIMIT:
                problems.append(f"pid {o.pid} may write files of any size (RLIMIT_FSIZE {o.file_limit})")
            if "seccomp" in self.sandbox.allowed and not o.seccomp_filter:
                problems.append(f"pid {o.pid} has no seccomp filter")
            if "pidns" in self.sandbox.allowed and not o.nested_pid:
                problems.append(f"pid {o.pid} is not in a PID namespace of its own")
            if "pidns" in self.sandbox.allowed and o.net_ns in ("", harness_net):
                problems.append(f"pid {o.pid} is not in a network namespace of its own")
        return problems

    def _set_frozen(self, frozen: bool) -> None:
        if self.cgroup is None or self.frozen == frozen:
            return
        (self.cgroup / "cgroup.freeze").write_text("1" if frozen else "0")
        self.frozen = frozen
        deadline = time.monotonic() + FREEZE_WAIT_S
        want = f"frozen {int(frozen)}"
        while want not in (self.cgroup / "cgroup.events").read_text().splitlines():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup {self.cgroup} did not reach '{want}' in {FREEZE_WAIT_S:g} s")
            time.sleep(0.0002)

    def freeze(self) -> None:
        """Stop every process of the worker (it runs no instruction until `thaw`)."""
        self._set_frozen(True)

    def thaw(self) -> None:
        self._set_frozen(False)

    def cpu_us(self) -> int | None:
        """CPU time every process of the worker has used (cgroup cpu.stat), in microseconds."""
        if self.cgroup is None:
            return None
        for line in (self.cgroup / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1])
        return None

    def kill(self) -> None:
        """Kill every process of the worker, however it detached itself."""
        if self.cgroup is not None and self.cgroup.exists():
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
            except OSError:
                pass

    def close(self) -> None:
        self.kill()
        if self.cgroup is None:
            return
        deadline = time.monotonic() + FREEZE_WAIT_S
        while self.cgroup.exists():
            try:
                self.cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.005)


def isolation_notes(modules: list[str], isolate: str, cuda: bool) -> list[str]:
    """What `check`'s verdicts rest on short of the whole isolation (rundir/integrity_notes.py): the
    user `modules` left in kerneltrial's process (`isolate` none), or isolated arms without a
    sandbox piece."""
    from kerneltrial.ops.registry import user_stem

    if isolate == "none":
        return [in_process_warning(f"user:{user_stem(m)}") for m in modules]
    if not modules and isolate != "all":
        return []
    note = host(cuda).note()
    return [note] if note else []
