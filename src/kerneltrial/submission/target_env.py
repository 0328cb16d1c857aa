"""The interpreter, environment and parent the package interface check's worker runs under:
as a target imports the unpacked archive, with nothing of kerneltrial to see.

A module that behaves one way when checked and another at the target tells the two apart by
what its process looks like. So the worker runs:
- in a plain interpreter with site enabled (not `python -I -S`): a virtual environment made in
  the check's scratch folder (`target_python`) whose interpreter is this one's base interpreter
  and whose one site-packages holds links to every entry of this interpreter's site
  directories but kerneltrial's (the package, its distribution metadata, an editable
  install's .pth or finder), so every other .pth runs at start-up as at the target and none of
  kerneltrial's does; its sys.path is then set to what that interpreter starts with plus
  PYTHONPATH, with each directory holding a kerneltrial entry replaced by links to its other
  entries (`path_without_kerneltrial`);
- with an environment scrubbed of kerneltrial (`scrubbed_environ`): no variable whose name
  names it, no entry of a variable's value that names it or (PATH) holds a `kerneltrial*`
  program, none of the test runner's PYTEST_* variables, no thread-count variable;
- started by a parent whose command line names nothing of kerneltrial: a launcher (`LAUNCHER`,
  `python -c` of a few neutral lines) says its pid on the channel (`launcher N`), starts the
  worker, waits for it and reports its exit status there (`exited N`). In the sandbox's PID
  namespace (trial/confine.py; submission/confined.py runs the sandbox from neutrally named
  copies) the harness is outside it and the launcher's parent is the namespace's init, so the
  launcher does not fork away (the init would see its child exit and end the namespace). Without
  one it forks first and its first process exits, so that the second, reparented away from the
  harness, is the worker's parent: no ancestor of the worker left in its PID namespace is the
  harness;
- under each of two environments (`ENVIRONMENTS`) that differ in what a target may differ in:
  the worker script's name, the working directory (an empty folder, the unpacked archive) and
  torch's thread count (its default, then another: 1, or 2 where the default is 1).
The worker's channel is its standard input and output and its configuration the first request
(trial/worker.py, MODE target), so its own command line is `python <scratch>/app/<script>` too.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

# The launcher: it says its pid (`launcher N`, the process the harness reads the sandbox of
# when the worker has no PID namespace of its own) on its status descriptor, starts the worker
# with the request and answer pipes as its standard input and output and the descriptor socket
# kept (closing its own copies, so the worker's end is the channel's), and reports the worker's exit status there (`exited N`). Its arguments: STATUS_FD
# READ_FD WRITE_FD SOCKET_FD, then the worker's command line.
# `FORK_AWAY` goes first where the harness is in the worker's PID namespace: its first process
# exits at once, so the second (the worker's parent) is reparented away from the harness.
FORK_AWAY = "if os.fork():\n    os._exit(0)\n"
LAUNCHER = (
    "import os, subprocess, sys\n"
    "{fork}"
    "status, read, write, sock = (int(a) for a in sys.argv[1:5])\n"
    "os.write(status, b'launcher %d\\n' % os.getpid())\n"
    "child = subprocess.Popen(sys.argv[5:], stdin=read, stdout=write, pass_fds=(sock,))\n"
    "for fd in (read, write, sock):\n"
    "    os.close(fd)\n"
    "os.write(status, b'exited %d\\n' % child.wait())\n"
)
# variables a test runner sets (pytest-xdist, pytest-cov), and those that fix the thread count
DROPPED_PREFIXES = ("PYTEST_", "COV_CORE_")
DROPPED = frozenset(
    {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PWD", "OLDPWD", "_", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}
)


@dataclass(frozen=True)
class Environment:
    """One way a target runs the archive (the check repeats under each)."""

    script: str  # the worker file's name, in the scratch folder's app/
    cwd: str  # "empty": an empty folder; "archive": the unpacked archive
    threads: int | None  # torch.set_num_threads before the import; None: torch's default

    def describe(self, threads: int) -> str:
        """The environment in words, with the thread count the worker had (`threads`)."""
        count = f"torch's default {threads} thread(s)" if self.threads is None else f"{threads} torch thread(s)"
        folder = "an empty folder" if self.cwd == "empty" else "the unpacked archive"
        return f"python {self.script} with site, {count}, cwd {folder}"


FIRST = Environment("main.py", "empty", None)
ENVIRONMENTS = 2  # FIRST and `second_environment`


def second_environment(default_threads: int) -> Environment:
    """The other environment: another script name, cwd the archive, another thread count."""
    return Environment("app.py", "archive", 1 if default_threads != 1 else 2)


def names_kerneltrial(text: str) -> bool:
    return "kerneltrial" in text.casefold()


def _holds_kerneltrial(folder: Path) -> bool:
    try:
        return any(names_kerneltrial(child.name) for child in folder.iterdir())
    except OSError:  # unreadable: nothing can be imported or run from it either
        return False


def _hidden(folder: Path) -> set[str]:
    """The entries of `folder` that would make kerneltrial importable from it: those whose name
    contains 'kerneltrial' (the package, its distribution metadata, an editable install's .pth
    or finder) and folders holding one (a repository's src/: `import src.kerneltrial`)."""
    hidden = set()
    for child in folder.iterdir():
        try:
            if names_kerneltrial(child.name) or (child.is_dir() and _holds_kerneltrial(child)):
                hidden.add(child.name)
        except OSError:
            continue
    return hidden


def _link_entries(folder: Path, into: Path, skip: set[str]) -> None:
    """Link every entry of `folder` not in `skip` and not linked yet into `into`."""
    for child in sorted(folder.iterdir()):
        if child.name not in skip and not os.path.lexists(into / child.name):
            (into / child.name).symlink_to(child)


def site_directories() -> list[Path]:
    """This interpreter's site directories (its site-packages, the user's where enabled)."""
    folders = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    return list(dict.fromkeys(Path(f) for f in folders if Path(f).is_dir()))


def target_python(scratch: Path) -> Path:
    """A virtual environment in `scratch/py` on this interpreter's base interpreter, whose
    site-packages links every entry of this interpreter's site directories but kerneltrial's
    (see the module docstring); its python."""
    base = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    env = scratch / "py"
    version = sysconfig.get_python_version()
    packages = env / "lib" / f"python{version}" / "site-packages"
    packages.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
    )
    python = env / "bin" / "python"
    python.symlink_to(base)
    for folder in site_directories():
        _link_entries(folder, packages, _hidden(folder))
    return python


def _scrubbed_value(name: str, value: str) -> str:
    """`value` without its entries (os.pathsep-separated) that name kerneltrial, or, for PATH,
    hold a kerneltrial program."""
    kept = [
        entry
        for entry in value.split(os.pathsep)
        if not names_kerneltrial(entry) and not (name == "PATH" and entry and _holds_kerneltrial(Path(entry)))
    ]
    return os.pathsep.join(kept)


# On a GPU the harness holds its gate's copies and the worker's shared buffers at once; torch's
# default segments fragment them: on an H100 (80 GB) the last case of zimage_qk_rmsnorm's GPU panel
# ran out of memory with 8 GiB reserved but unallocated, and passed with expandable segments
# (the device runs of 2026-12-07, docs/NOTES.md). `roomy_allocator` sets them for the harness; the
# marker beside it says so, and the worker gets neither (a target's allocator is torch's default).
ALLOCATOR = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ALLOCATOR_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the older name and torch's newer one
ALLOCATOR_SET = "KERNELTRIAL_SET_ALLOCATOR"  # names kerneltrial, so it is scrubbed as well


def roomy_allocator(environ: MutableMapping[str, str] = os.environ) -> None:
    """Expandable segments for this process's CUDA allocator, unless the user configured it; before
    CUDA starts (the package command's first step), else torch has read it."""
    if not any(name in environ for name in ALLOCATOR_NAMES):
        name, value = ALLOCATOR
        environ[name], environ[ALLOCATOR_SET] = value, name


def scrubbed_environ(environ: Mapping[str, str], cwd: Path) -> dict[str, str]:
    """`environ` scrubbed of kerneltrial and of the harness (see the module docstring), with PWD
    the worker's working directory, as a shell starting it there would set."""
    scrubbed: dict[str, str] = {}
    for name, value in environ.items():
        if names_kerneltrial(name) or name in DROPPED or name.startswith(DROPPED_PREFIXES):
            continue
        if name == environ.get(ALLOCATOR_SET):  # the harness's allocator setting, not the user's
            continue
        kept = _scrubbed_value(name, value)
        if kept or not value:
            scrubbed[name] = kept
    return scrubbed | {"PWD": str(cwd)}


def fresh_path(python: Path, cwd: Path, environ: Mapping[str, str]) -> list[str]:
    """sys.path of `python` started in the empty `cwd` with `environ` and this process's
    PYTHONPATH, without the working directory."""
    extra = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    done = subprocess.run(
        [str(python), "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        cwd=cwd,
        env=dict(environ) | extra,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def path_without_kerneltrial(scratch: Path, path: list[str]) -> list[str]:
    """`path` with nothing of kerneltrial: each directory with `_hidden` entries, or whose path
    names kerneltrial, is replaced by a folder in `scratch` of links to its other entries; an
    entry that is not a directory (a zip) is kept unless its own path names kerneltrial."""
    kept: list[str] = []
    for index, entry in enumerate(path):
        folder = Path(entry)
        if not folder.is_dir():
            if entry and not names_kerneltrial(entry):
                kept.append(entry)
            continue
        hidden = _hidden(folder)
        if not hidden and not names_kerneltrial(entry):
            kept.append(entry)
            continue
        overlay = scratch / f"path-{index}"
        overlay.mkdir()
        _link_entries(folder, overlay, hidden)
        kept.append(str(overlay))
    return kept


def launch_command(python: Path, script: Path, fds: tuple[int, int, int, int], fork_away: bool = True) -> list[str]:
    """The launcher's command line: `python -c LAUNCHER STATUS READ WRITE SOCKET python script`;
    `fork_away` False in a PID namespace of the worker's own (see `LAUNCHER`)."""
    code = LAUNCHER.format(fork=FORK_AWAY if fork_away else "")
    return [str(python), "-c", code, *map(str, fds), str(python), str(script)]
