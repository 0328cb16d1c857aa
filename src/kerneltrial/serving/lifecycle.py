"""Around a launch: is the port free, wait for its release, records of running servers
(docs/serving.md, "Launch lifecycle"). Standard library only, below the launcher.

Server records: a launched server is recorded in a per-user state folder, one file per port
(`$XDG_STATE_HOME/kerneltrial/servers/port-P.json`, default `~/.local/state/...`), from before its
start until its process group is gone. A run killed before it could stop its server leaves the
file behind, and the next start on that port, from any run directory, finds it by the only thing
it knows (the port) and names the server (run, pid, start time) and the command that stops it. A
record inside the killed run's own directory could not be found from a new run.

The record is consulted whether or not anything listens (issue 26): vLLM takes tens of seconds
to bind its port and binds with SO_REUSEPORT, so a second trial that only looked for a listener
started its own server on a port another trial's server was about to take, and both answered.
A launch therefore claims the port's record before it spawns anything, and a record that names a
live process (the claiming kerneltrial, or the server it started) refuses every other launch on
that port, bound or not.

One holder per port (issue 36): every read-decide-write of a port's record (claim, the server's
pid, release) runs under an exclusive flock of `port-P.lock` beside it, a file that is never
removed or replaced (a lock on a file that another process may unlink locks nothing), and every
record is written whole to a temporary file and renamed over the old one, so a reader sees the
old record or the new one, never a file half written. A record is stale only when it names a
process that is gone (its pid, and its start time where /proc shows it); an unreadable record
names no process and is never taken over (the O_EXCL claim it replaces deleted an unreadable
record, the claim another kerneltrial had just created and not yet written: 4 simultaneous
claimers gave 2-4 holders in 35 of 100 rounds). The kernel drops a lock with its holder, even
one killed by kill -9, so a dead claimer never blocks the port.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from kerneltrial.rundir.files import now

POLL_S = 0.5
# How long a launch waits for its port: a server whose kerneltrial was killed is stopped by its
# supervisor within stop_grace_s (30 s by default) plus SIGTERM's 10 s; 60 s covers both.
PORT_WAIT_S = 60.0
# How long a claim waits for another process's read-decide-write of the same record (milliseconds
# each); a holder stopped inside it (SIGSTOP, a debugger) is named after this.
LOCK_WAIT_S = 10.0
LOCK_POLL_S = 0.002


class PortTaken(RuntimeError):
    """The port stayed taken; the message names what holds it, if known, and the fix."""


def port_is_free(host: str, port: int) -> bool:
    """Nothing listens on (host, port). SO_REUSEADDR, as the server itself (uvicorn) binds:
    a port held only by TIME_WAIT connections (vLLM closing an idle keep-alive connection
    leaves them for up to 60 s) is free to serve on, and must not stop the next launch."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) != 0


def _answers(kill: Callable[[int, int], None], target: int) -> bool:
    """Whether signal 0 through `kill` (os.kill or os.killpg) finds `target`: a process (group)
    that exists but is not ours to signal still answers."""
    try:
        kill(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    return _answers(os.killpg, pgid)


def process_alive(pid: int) -> bool:
    return _answers(os.kill, pid)


@dataclass(frozen=True)
class ServerRecord:
    """A launched server, or a launch about to start one (pid None: the port is claimed), as its
    port's state file keeps it."""

    port: int
    host: str
    pid: int | None  # the supervisor's pid, which is the server's process-group id; None: claimed, not spawned
    start_ticks: int | None  # the process's start time (/proc/PID/stat): a reused pid is not this server
    kerneltrial_pid: int
    run_dir: str
    argv: list[str]
    started_at: str
    kerneltrial_ticks: int | None = None  # the claiming kerneltrial's start time (records before issue 26: None)

    @property
    def alive(self) -> bool:
        """The process the record names still runs: the server's group, or (a claim) its kerneltrial."""
        if self.pid is None:
            return _same_process(self.kerneltrial_pid, self.kerneltrial_ticks, process_alive)
        return _same_process(self.pid, self.start_ticks, group_alive)

    @property
    def kerneltrial_alive(self) -> bool:
        return _same_process(self.kerneltrial_pid, self.kerneltrial_ticks, process_alive)

    def holds_message(self) -> str:
        if self.pid is None:
            return (
                f"port {self.port} is claimed by kerneltrial pid {self.kerneltrial_pid} (run {self.run_dir}, since "
                f"{self.started_at}), which is starting a server on it (bound or not, two servers on one port both "
                "answer); wait for that run to end, or pick another port (server.port / --port)"
            )
        return (
            f"a server from run {self.run_dir} (pid {self.pid}, started at {self.started_at}) holds port "
            f"{self.port}, bound or not; stop it with `kill -- -{self.pid}`"
        )


def _same_process(pid: int, ticks: int | None, exists: Callable[[int], bool]) -> bool:
    now_ticks = _start_ticks(pid)
    if now_ticks is None or ticks is None:
        return ticks is None and exists(pid)  # no /proc (or an old record): the process's existence
    return now_ticks == ticks and exists(pid)


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kerneltrial" / "servers"


def _record_path(port: int) -> Path:
    return state_dir() / f"port-{port}.json"


def _lock_path(port: int) -> Path:
    return state_dir() / f"port-{port}.lock"


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name


@contextmanager
def port_lock(port: int, wait_s: float | None = None) -> Iterator[None]:
    """The port's record to this process alone: an exclusive flock of `port-P.lock`, released when
    the block ends or the process dies. PortTaken when another process holds it for `wait_s`
    (default LOCK_WAIT_S)."""
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    path = _lock_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PortTaken(
                        f"another process has held the lock {path} of port {port}'s record for {wait_s:.0f} s (a "
                        "kerneltrial stopped while it claims or releases the port?); resume or end it (`fuser "
                        f"{path}` names it), or pick another port (server.port / --port)"
                    ) from None
                time.sleep(LOCK_POLL_S)
            except OSError as e:
                raise PortTaken(
                    f"cannot lock {path} ({e.strerror}): port claims need flock; point XDG_STATE_HOME at a local "
                    "folder (the state folder is on a file system without locks)"
                ) from None
        yield
    finally:
        os.close(fd)


class _Unreadable(ValueError):
    """A port's record exists but holds no record (empty, cut short, not JSON, other keys)."""


def _load(port: int) -> ServerRecord | None:
    """The port's record, None when there is none; _Unreadable when the file holds no record."""
    path = _record_path(port)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Unreadable(f"{path}: {e.strerror}") from None
    try:
        return ServerRecord(**json.loads(text))
    except (ValueError, TypeError) as e:
        raise _Unreadable(f"{path} ({len(text)} bytes): {e}") from None


def _write(rec: ServerRecord) -> None:
    """The record whole or not at all: written to a file of this process's own, then renamed over."""
    path = _record_path(rec.port)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(rec), indent=1))
    os.replace(tmp, path)


def unreadable_message(port: int, why: str) -> str:
    return (
        f"port {port}'s record {why} is not a record kerneltrial can read: it names no process, so nothing "
        "says whether its writer still runs, and it is not taken over; remove it once no kerneltrial uses port "
        f"{port}, or pick another port (server.port / --port)"
    )


def claim_port(host: str, port: int, run_dir: Path, argv: list[str], wait_s: float) -> ServerRecord:
    """Wait for the port (wait_for_port), then claim its record under the port's lock: the claim
    names this kerneltrial, so every other launch on the port is refused from now on, before
    anything binds. PortTaken when another launch's record names a live process (it claimed
    first), or the record cannot be read."""
    me = os.getpid()
    claim = ServerRecord(port, host, None, None, me, str(run_dir), list(argv), now(), _start_ticks(me))
    wait_for_port(host, port, wait_s)
    with port_lock(port):
        try:
            rec = _load(port)
        except _Unreadable as e:
            raise PortTaken(unreadable_message(port, str(e))) from None
        if rec is not None and rec.alive:  # claimed since wait_for_port looked
            raise PortTaken(rec.holds_message())
        _write(claim)  # over a stale record: the processes it names are gone
    return claim


def record_server(port: int, host: str, pid: int, run_dir: Path, argv: list[str]) -> ServerRecord:
    """The port's record names the started server (replacing this kerneltrial's claim)."""
    me = os.getpid()
    rec = ServerRecord(port, host, pid, _start_ticks(pid), me, str(run_dir), list(argv), now(), _start_ticks(me))
    with port_lock(port):
        _write(rec)
    return rec


def read_record(port: int) -> ServerRecord | None:
    """The port's record; None when there is none or it cannot be read."""
    try:
        return _load(port)
    except _Unreadable:
        return None


def forget_server(port: int, pid: int | None) -> None:
    """Remove the port's record if it is this kerneltrial's for this server (pid None: its claim);
    a later launch may own the port now."""
    with port_lock(port):
        rec = read_record(port)
        if rec is not None and rec.pid == pid and rec.kerneltrial_pid == os.getpid():
            _record_path(port).unlink(missing_ok=True)


def port_holders(port: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes that listen on `port`, as far as /proc shows them
    (Linux; sockets of other users' processes are not visible): empty when unknown."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    holders = []
    for proc in Path("/proc").glob("[0-9]*") if inodes else ():
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                holders.append((int(proc.name), cmd[:160]))
        except OSError:
            continue
    return holders


def port_taken_message(host: str, port: int, waited_s: float) -> str:
    rec = read_record(port)
    if rec is not None and rec.alive:
        return rec.holds_message()
    held = port_holders(port)
    if held:
        who = "; ".join(f"pid {pid} ({cmd})" for pid, cmd in held)
        return (
            f"port {port} on {host} is already taken after waiting {waited_s:.0f} s: {who} listens there; "
            f"stop it (`kill {held[0][0]}`) or pick another port (server.port / --port)"
        )
    return (
        f"port {port} on {host} is already taken after waiting {waited_s:.0f} s (by a process this user cannot "
        "see); stop whatever listens there or pick another port (server.port / --port)"
    )


def wait_for_port(host: str, port: int, wait_s: float) -> None:
    """Return once the port is free and no record names a live process for it; PortTaken naming
    the holder after `wait_s` seconds. A server still shutting down (one whose kerneltrial was
    killed stops within its grace time) is waited for; a record whose kerneltrial still runs
    (a claim, or the server it started) holds the port for good and is named at once, whether or
    not anything listens yet."""
    t0 = time.monotonic()
    while True:
        rec = read_record(port)
        recorded = rec is not None and rec.alive
        if not recorded and port_is_free(host, port):
            return
        if (recorded and rec is not None and rec.kerneltrial_alive) or time.monotonic() - t0 >= wait_s:
            raise PortTaken(port_taken_message(host, port, time.monotonic() - t0))
        time.sleep(POLL_S)
