"""The watchdog between kerneltrial and a launched server: the server dies with kerneltrial.

    python -I supervise.py PARENT_PID GRACE_S -- SERVER ARGV...

The launcher starts this script, by path and with the standard library only (`-I`: nothing of
the user's environment can break it), as the leader of the server's own process group. It starts
the server in that group and waits for it:

- the server exits: this script exits with the server's code (or dies of the same signal), so the
  launcher reads the server's exit status as if it had started the server itself;
- kerneltrial dies, even by `kill -9` (this script's parent pid changes: it is reparented): it
  stops the whole group as the launcher would, SIGINT, then SIGTERM, then SIGKILL, which also
  ends vLLM's own child processes (engine cores) and this script;
- this script is killed itself: the server gets SIGTERM from the kernel (PR_SET_PDEATHSIG, set
  in the server before it execs; this script is single-threaded, so "the parent thread died"
  means this process died).

The served ledger's socket (KERNELTRIAL_LEDGER_FD, launcher.py) is passed on to the server and closed
here. SIGINT and SIGTERM sent to the group by the launcher's stop are for the server; this script
outlives them until the server has exited. kerneltrial's parent is watched by polling getppid
rather than by a death signal: PR_SET_PDEATHSIG fires when the *thread* that forked dies, and
kerneltrial may start a server from any thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2
LEDGER_FD_ENV = "KERNELTRIAL_LEDGER_FD"  # plugins/ledger.py FD_ENV: the served ledger's socket, passed on
TERM_WAIT_S = 10.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In the server, before exec: SIGTERM when this supervisor dies (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reaped(child: subprocess.Popen[bytes], wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            return True
        time.sleep(0.1)
    return child.poll() is not None


def _stop_group(child: subprocess.Popen[bytes], grace_s: float) -> None:
    group = os.getpgrp()
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, TERM_WAIT_S)):
        os.killpg(group, sig)
        if _reaped(child, wait_s):
            break
    os.killpg(group, signal.SIGKILL)  # whatever is left of the group, this process included


def _exit_like(returncode: int) -> None:
    if returncode < 0:  # the server died of a signal: so does this process
        if -returncode != signal.SIGKILL:  # SIGKILL's action cannot be set (nor caught)
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


def main(argv: list[str]) -> None:
    parent, grace_s, argv = int(argv[0]), float(argv[1]), argv[3:]
    for sig in (signal.SIGINT, signal.SIGTERM):  # a handler, not SIG_IGN: exec resets it in the server
        signal.signal(sig, lambda signum, frame: None)
    try:
        ledger = os.environ.get(LEDGER_FD_ENV, "")  # the served ledger's socket (launcher.py): the server's
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent, pass_fds=(int(ledger),) if ledger.isdigit() else ())
        if ledger.isdigit():
            os.close(int(ledger))  # the server holds it; the ledger ends when the server's group does
    except OSError as e:
        sys.stderr.write(f"kerneltrial supervisor: cannot start {argv[0]!r}: {e.strerror}\n")
        sys.exit(127)
    while child.poll() is None:
        if os.getppid() != parent:
            sys.stderr.write(f"kerneltrial supervisor: kerneltrial (pid {parent}) died; stopping the server group\n")
            sys.stderr.flush()
            _stop_group(child, grace_s)
        time.sleep(POLL_S)
    _exit_like(child.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
