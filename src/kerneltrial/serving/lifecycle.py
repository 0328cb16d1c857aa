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
A launch therefore claims the port's record atomically (O_EXCL) before it spawns anything, and a
record that names a live process (the claiming kerneltrial, or the server it started) refuses
every other launch on that port, bound or not.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from kerneltrial.rundir.files import now

POLL_S = 0.5
# How long a launch waits for its port: a server whose kerneltrial was killed is stopped by its
# supervisor within stop_grace_s (30 s by default) plus SIGTERM's 10 s; 60 s covers both.
PORT_WAIT_S = 60.0


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


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name


def claim_port(host: str, port: int, run_dir: Path, argv: list[str], wait_s: float) -> ServerRecord:
    """Wait for the port (wait_for_port), then claim its record atomically: the claim names this
    kerneltrial, so every other launch on the port is refused from now on, before anything binds.
    PortTaken when another launch's record names a live process (it claimed first)."""
    path = _record_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    claim = ServerRecord(port, host, None, None, me, str(run_dir), list(argv), now(), _start_ticks(me))
    while True:
        wait_for_port(host, port, wait_s)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            rec = read_record(port)
            if rec is not None and rec.alive:
                raise PortTaken(rec.holds_message()) from None
            path.unlink(missing_ok=True)  # a stale or unreadable record: nobody holds it
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(asdict(claim), indent=1))
        return claim


def record_server(port: int, host: str, pid: int, run_dir: Path, argv: list[str]) -> ServerRecord:
    """The port's record names the started server (replacing this kerneltrial's claim)."""
    me = os.getpid()
    rec = ServerRecord(port, host, pid, _start_ticks(pid), me, str(run_dir), list(argv), now(), _start_ticks(me))
    path = _record_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{me}")
    tmp.write_text(json.dumps(asdict(rec), indent=1))
    os.replace(tmp, path)
    return rec


def read_record(port: int) -> ServerRecord | None:
    try:
        return ServerRecord(**json.loads(_record_path(port).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def forget_server(port: int, pid: int | None) -> None:
    """Remove the port's record if it is this kerneltrial's for this server (pid None: its claim);
    a later launch may own the port now."""
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
