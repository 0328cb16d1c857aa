"""Rewrite a downloaded wheel in place, keeping only the files a kernel namespace needs, so the
carried wheels fit the GPU machine's 64 MiB limit (issue 18: "only what the kernel namespace
needs"). Every kept file is byte-identical to the original; RECORD is rewritten for the files
kept (sha256 and size, as the wheel format specifies), so pip installs it as the same version.

Usage: python3 scripts/device/slim_wheel.py WHEEL KEEP_PREFIX... [--py-only PREFIX...]
  KEEP_PREFIX: keep every file under it (e.g. sglang/kernels/: its CUDA headers are JIT sources);
  --py-only PREFIX: keep only the .py files under it (e.g. sglang/srt/: imported modules, not the
  Rust extensions beside them). The *.dist-info/ folder and top-level modules of the package
  are always kept.

sglang 0.5.23 (39 MB): its kernel namespace imports sglang/kernels/** and ~30 modules of
sglang/srt (traced with the adapters' import path, ops/peers_sglang.py); the wheel's 46 MB of
Rust extensions (sglang/srt/rust_extensions, mem_cache) and sglang/multimodal_gen are not
imported by it.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def keep(name: str, prefixes: list[str], py_only: list[str]) -> bool:
    top, _, rest = name.partition("/")
    if top.endswith(".dist-info") or ("/" not in rest and rest.endswith(".py")):
        return True
    if any(name.startswith(p) for p in prefixes):
        return True
    return name.endswith(".py") and any(name.startswith(p) for p in py_only)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, prefixes: list[str], py_only: list[str]) -> tuple[int, int]:
    """Rewrite `wheel`; returns (files kept, files dropped)."""
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        kept = {n: source.read(n) for n in names if n != record and keep(n, prefixes, py_only)}
    lines = [record_line(n, data) for n, data in kept.items()] + [f"{record},,"]
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in kept.items():
            out.writestr(name, data)
        out.writestr(record, "\n".join(lines) + "\n")
    tmp.replace(wheel)
    return len(kept), len(names) - 1 - len(kept)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel, rest = Path(argv[0]), argv[1:]
    split = rest.index("--py-only") if "--py-only" in rest else len(rest)
    prefixes, py_only = rest[:split], rest[split + 1 :]
    before = wheel.stat().st_size
    kept, dropped = slim(wheel, prefixes, py_only)
    print(
        f"{wheel.name}: kept {kept} files, dropped {dropped}; {before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
