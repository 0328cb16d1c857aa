"""Who listens on a launch's port (issue 36, item 1): every listening TCP socket on the port, from
the kernel's tables, and which of them belong to this launch's server.

vLLM binds with SO_REUSEPORT, so another process may listen on the same port and the kernel hands
it a share of the connections. Probing /v1/models (launcher.confirm_answers) finds such a server
only with the probability its share gives; the kernel's own tables find it always. `/proc/net/tcp`
and `/proc/net/tcp6` list every socket in the host's network namespace with its state (0A:
LISTEN), local port and inode; a socket belongs to a process when one of its `/proc/PID/fd`
entries links to `socket:[INODE]`. A listener on the port whose inode no process of the server's
process group holds is foreign. The server's group is supervise.py's (the group leader is the pid
kerneltrial started), so every process vLLM starts is in it.

What it cannot see: a listener in another network namespace (it shares no port with ours); the
owner of a foreign socket when this process may not read that process's fds (another uid without
root): the socket is still counted as foreign, its owner is "unknown".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp writes a socket's state
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


@dataclass(frozen=True)
class Listener:
    """A listening socket on the port: its inode and the processes holding it (empty: unknown)."""

    inode: int
    pids: tuple[int, ...]

    def describe(self) -> str:
        owners = ", ".join(f"pid {p} ({_command(p)})" for p in self.pids) or "owner unknown"
        return f"socket inode {self.inode}: {owners}"


def listening_inodes(port: int, tables: tuple[str, ...] = TABLES) -> set[int]:
    """Inodes of every socket listening on `port` (any local address), from the kernel's tables."""
    found = set()
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue  # no IPv6 on this host
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(fields[9]))
    return found


def socket_owners(inodes: set[int]) -> dict[int, tuple[int, ...]]:
    """inode -> the pids whose fds hold it (those this process may read)."""
    owners: dict[int, list[int]] = {i: [] for i in inodes}
    links = {f"socket:[{i}]": i for i in inodes}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
            for fd in fds:
                inode = links.get(os.readlink(fd.path))
                if inode is not None:
                    owners[inode].append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
    return {i: tuple(sorted(set(p))) for i, p in owners.items()}


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def foreign_listeners(port: int, pgid: int) -> list[Listener]:
    """Listeners on `port` that no process of process group `pgid` holds."""
    owners = socket_owners(listening_inodes(port))
    return [
        Listener(inode, pids) for inode, pids in sorted(owners.items()) if not any(group_of(p) == pgid for p in pids)
    ]


def foreign_listener_message(port: int, found: list[Listener], when: str) -> str:
    return (
        f"{len(found)} other listener(s) on port {port} {when} ({'; '.join(f.describe() for f in found)}): "
        "another server shares the port (SO_REUSEPORT) and would answer some of the requests; stop it or pick "
        "another port"
    )


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80] or "?"
