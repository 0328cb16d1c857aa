"""The sandbox an isolated worker runs in: run by path, as the harness's user, before any user code.

    python -I .../kerneltrial/trial/sandbox.py SPEC -- PROGRAM [ARG ...]

SPEC is one JSON object (trial/confine.py writes it): {"cgroup": path | null, "pidns": bool,
"seccomp": the path of pyseccomp.py | null}. In order:

1. `cgroup`: this process joins the cgroup (v2) the harness made for the worker; everything it
   starts is born there, so the harness can freeze all of it (while another arm is timed) and kill
   all of it (`cgroup.kill`), however it detaches itself (setsid, double fork).
2. `pidns`: a PID namespace of its own, with its own /proc in a mount namespace of its own, and a
   network namespace of its own with no interface up (unshare + fork + mount + fork): the worker
   sees no process outside it and reaches no socket of the host's network (a server on the
   harness's port included). Its PID 1 is this file's code: it
   reaps orphans, waits for the worker (PID 2) and exits as the worker did, and when it exits the
   kernel kills every process left in the namespace. This process stays outside as PID 1's
   parent and exits as it did; each dies when its parent does (parent-death signal), so the
   harness gone, everything goes.
3. no-new-privs, always: nothing executed from here on gains privileges (set-uid binaries, file
   capabilities). Resource ceilings, always, first: files at FILE_LIMIT bytes (the worker's log is
   a file on the harness's disk), processes and threads at PROCESS_LIMIT.
4. `seccomp`: a filter (libseccomp, through pyseccomp), inherited by everything the worker starts,
   that refuses with EPERM what reaches other processes (ptrace, process_vm_readv/writev,
   pidfd_getfd, kcmp), what would give it a namespace or mount of its own (unshare, setns, mount,
   clone with CLONE_NEWUSER; clone3, whose flags a filter cannot read, answers ENOSYS so that libc
   falls back to clone), and kernel interfaces a sandboxed program has no use for and that widen
   what it can reach (io_uring, perf_event_open, bpf, userfaultfd, the kernel keyring,
   open_by_handle_at).

Then it executes PROGRAM, which trial/confine.py makes `setpriv` (util-linux) where the harness
runs as root: every group dropped, a uid and gid no other process runs as, no capability but the
one it names. This file says nothing about what it applied: the harness reads the worker's
credentials, namespace and filter from /proc itself (trial/confine.py `observe`). A piece that
fails is an exit with code 71 and its reason on stderr (the worker's log). Imports: the standard
library, and pyseccomp for piece 4.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys

CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
DENIED = (
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"),
    *("unshare", "setns", "mount", "umount2", "pivot_root", "open_by_handle_at"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register", "perf_event_open", "bpf", "userfaultfd"),
    *("add_key", "request_key", "keyctl"),
)
FAILED = 71
# ceilings no honest worker reaches (`limit_resources`; trial/confine.py reads them back from /proc)
FILE_LIMIT = 4 << 30  # bytes of one file
PROCESS_LIMIT = 4096  # processes and threads of the worker's uid (root: the uid piece gives it one of its own)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def prctl(option: int, value: int) -> None:
    _check(_libc().prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def join_cgroup(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as handle:
        handle.write(str(os.getpid()))


def load_seccomp(path: str) -> None:
    """The filter, through pyseccomp loaded from `path` (the harness finds it: under `python -I`
    this process does not read PYTHONPATH)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pyseccomp", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load pyseccomp from {path}")
    pyseccomp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pyseccomp)

    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    denied = [(pyseccomp.ERRNO(errno.EPERM), name, ()) for name in DENIED]
    denied.append((pyseccomp.ERRNO(errno.ENOSYS), "clone3", ()))
    new_user = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    denied.append((pyseccomp.ERRNO(errno.EPERM), "clone", (new_user,)))
    for action, name, args in denied:
        try:
            rules.add_rule(action, name, *args)
        except (ValueError, OSError):  # a syscall this kernel or architecture lacks
            continue
    rules.load()


def wait_for(child: int) -> int:
    """`child`'s wait status, every other child reaped on the way (the namespace's init adopts the
    worker's orphans); a signal to this process kills `child`."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda _s, _f: os.kill(child, signal.SIGKILL))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(FAILED)
        except InterruptedError:
            continue
        if pid == child:
            return status


def exit_as(status: int) -> None:
    """Exit as a process with wait status `status` did (the same signal, or code)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def mount_own_proc() -> None:
    """A /proc of the new PID namespace, in a mount namespace of its own (CUDA's driver fails to
    start with the host's /proc in a new PID namespace; and the worker sees no process outside)."""
    libc = _libc()
    _check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "mount --make-rprivate /")
    flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _check(libc.mount(b"proc", b"/proc", b"proc", flags, None), "mount proc on /proc")


def enter_pid_namespace() -> None:
    """Return in the worker (PID 2 of a new namespace, with its own /proc). The parent outside
    exits as the worker did, told its status by PID 1 over a pipe (PID 1 cannot kill itself with
    a signal: its namespace protects it)."""
    _check(
        _libc().unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET), "unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET)"
    )
    told, tell = os.pipe()
    init = os.fork()
    if init:
        os.close(tell)
        status = wait_for(init)
        said = os.read(told, 32).decode().strip()
        exit_as(int(said) if said else status)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a fork clears it
    os.close(told)
    mount_own_proc()
    worker = os.fork()
    if worker:
        os.write(tell, str(wait_for(worker)).encode())
        os._exit(0)
    os.close(tell)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def limit_resources() -> None:
    """Ceilings no honest worker reaches: its files (its log included: the harness's disk) at
    FILE_LIMIT bytes, its processes and threads at PROCESS_LIMIT (counted for its own uid)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    if os.getuid() == 0:  # else the worker keeps the harness's uid, whose processes would count too
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESS_LIMIT, PROCESS_LIMIT))


def confine(spec: dict[str, object]) -> None:
    """Apply the spec's pieces in order (with a PID namespace, only the worker returns)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the harness gone: this process goes too
    limit_resources()
    if spec.get("cgroup"):
        join_cgroup(str(spec["cgroup"]))
    if spec.get("pidns"):
        enter_pid_namespace()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if spec.get("seccomp"):
        load_seccomp(str(spec["seccomp"]))


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: python -I sandbox.py SPEC -- PROGRAM [ARG ...] (started by kerneltrial)")
    try:
        confine(json.loads(argv[1]))
    except (OSError, ImportError, ValueError, RuntimeError) as exc:
        print(f"kerneltrial sandbox: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FAILED
    os.execv(argv[3], argv[3:])
    return FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
