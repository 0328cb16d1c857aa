"""The `flashinfer` and `quack` peers (ops/peers_flashinfer.py, ops/peers_quack.py): unavailable
with a one-line reason when the package, its JIT or the GPU is missing; the argument mapping
checked through the gate against stand-ins with the documented signatures (FlashInfer 0.6-0.7's
flashinfer.norm and flashinfer.activation, quack-kernels' quack.rmsnorm.rmsnorm, computing with
torch as each kernel's contract says); planted wrong mappings fail the gate."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from kerneltrial.ops import peers_flashinfer as fi
from kerneltrial.ops import peers_quack as quack
from kerneltrial.ops.registry import Case, Impl, Unavailable, all_ops, get_op
from kerneltrial.trial.gate import check

# the rotary operators' peers: their adapters are checked against stand-ins in tests/ops/test_rotary.py
ROTARY_OPS = ("rotary_embedding", "rotary_embedding_gptj")
FLASHINFER_OPS = ("rmsnorm", "rmsnorm_fp32", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul")
QUACK_OPS = ("rmsnorm", "rmsnorm_fp32")
CASES = {name: Case((7, 512)) for name in FLASHINFER_OPS}
STRIDED = Case((7, 512), layout="row_strided")


def normed(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def flashinfer_stand_in(calls: list[dict[str, Any]], gemma_one_plus: bool = True) -> dict[str, types.ModuleType]:
    """flashinfer, flashinfer.norm and flashinfer.activation with FlashInfer's signatures."""

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # noqa: A002
        assert input.dim() == 2 and input.stride(-1) == 1, "the stand-in takes [rows, N] with unit column stride"
        calls.append({"fn": "rmsnorm", "input": input, "out": out, "eps": eps})
        out = torch.empty_like(input) if out is None else out
        out.copy_((normed(input, eps) * weight.float()).to(input.dtype))
        return out

    def fused(offset: float) -> Callable[..., None]:
        def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):  # noqa: A002
            calls.append({"fn": "fused", "input": input, "residual": residual})
            s = input.float() + residual.float()
            residual.copy_(s.to(residual.dtype))
            input.copy_((normed(s, eps) * (offset + weight.float())).to(input.dtype))

        return fused_add_rmsnorm

    def silu_and_mul(input, out=None, enable_pdl=None):  # noqa: A002
        if input.shape[-1] * input.dtype.itemsize % 16 != 0:
            raise ValueError("The pointers must be multiple of 16 bytes.")
        d = input.shape[-1] // 2
        return (torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)

    root, norm, activation = (types.ModuleType(n) for n in ("flashinfer", "flashinfer.norm", "flashinfer.activation"))
    norm.rmsnorm = rmsnorm
    norm.fused_add_rmsnorm = fused(0.0)
    norm.gemma_fused_add_rmsnorm = fused(1.0 if gemma_one_plus else 0.0)
    activation.silu_and_mul = silu_and_mul
    root.norm, root.activation = norm, activation
    return {"flashinfer": root, "flashinfer.norm": norm, "flashinfer.activation": activation}


def quack_stand_in(calls: list[dict[str, Any]]) -> dict[str, types.ModuleType]:
    """quack, quack.rmsnorm and the CuTe DSL's cutlass.cute with quack-kernels' signatures."""

    def rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6, prenorm=False):
        if bias is not None and not isinstance(bias, torch.Tensor):  # quack reads bias.dtype: a float raises
            raise AttributeError(f"'{type(bias).__name__}' object has no attribute 'dtype'")
        calls.append({"fn": "quack", "eps": eps})
        y = normed(x, eps) * weight.float()
        return (y + bias.float() if bias is not None else y).to(out_dtype or x.dtype)

    root, module, cutlass, cute = (types.ModuleType(n) for n in ("quack", "quack.rmsnorm", "cutlass", "cutlass.cute"))
    module.rmsnorm = rmsnorm
    root.rmsnorm = module
    cute.compile = lambda *args, **kwargs: None
    cutlass.cute = cute
    return {"quack": root, "quack.rmsnorm": module, "cutlass": cutlass, "cutlass.cute": cute}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[dict[str, Any]]]:
    """Install the stand-ins (CUDA, JIT and capability checks off: they run on the CPU)."""

    def install(gemma_one_plus: bool = True, gpu: bool = True) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []
        for name, module in {**flashinfer_stand_in(calls, gemma_one_plus), **quack_stand_in(calls)}.items():
            monkeypatch.setitem(sys.modules, name, module)
        for module in (fi, quack) if gpu else ():
            monkeypatch.setattr(module, "require_cuda", lambda package: None)
        monkeypatch.setattr(fi, "require_jit", lambda: None)
        monkeypatch.setattr(quack, "require_capability", lambda: None)
        return calls

    return install


def fresh(op_name: str, peer: str) -> Impl:
    """A new Impl with the registered loader (the registry caches its first answer)."""
    registered = get_op(op_name).impl(peer)
    return replace(registered, _fn=None, _reason=None)


def passes(op_name: str, impl: Impl, case: Case, device: torch.device) -> bool:
    result = check(get_op(op_name), impl, case, seed=0, device=device)
    return result.passed


def test_the_flashinfer_and_quack_peers_cover_their_operators():
    assert sorted(op.name for op in all_ops() if "flashinfer" in op.impls) == sorted(FLASHINFER_OPS + ROTARY_OPS)
    assert sorted(op.name for op in all_ops() if "quack" in op.impls) == sorted(QUACK_OPS)
    assert get_op("silu_and_mul").impl("flashinfer").layouts == ("contiguous",)


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed here")
@pytest.mark.parametrize("op_name", FLASHINFER_OPS)
def test_absent_flashinfer_is_unavailable_with_its_reason(op_name):
    impl = fresh(op_name, "flashinfer")
    assert not impl.available and impl.reason == "flashinfer-python is not installed (flashinfer)"
    result = check(get_op(op_name), impl, CASES[op_name], seed=0, device=torch.device("cpu"))
    assert not result.passed and result.message == "unavailable: flashinfer-python is not installed (flashinfer)"


@pytest.mark.skipif(importlib.util.find_spec("quack") is not None, reason="a quack package is installed here")
@pytest.mark.parametrize("op_name", QUACK_OPS)
def test_absent_quack_is_unavailable_with_its_reason(op_name):
    impl = fresh(op_name, "quack")
    assert not impl.available and impl.reason == "quack-kernels is not installed (quack)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_without_a_gpu_the_installed_packages_are_unavailable(fake):
    fake(gpu=False)
    assert fresh("rmsnorm", "flashinfer").reason == "FlashInfer needs a CUDA device; none is visible"
    assert fresh("rmsnorm", "quack").reason == "QuACK needs a CUDA device; none is visible"


def test_no_jit_cache_nvcc_or_ninja_makes_flashinfer_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(
        Unavailable, match=f"FlashInfer's JIT CUDA kernels need nvcc; none on PATH or in {tmp_path}/bin"
    ):
        fi.require_jit()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    with pytest.raises(Unavailable, match="build with ninja; none on PATH"):
        fi.require_jit()


def test_an_older_gpu_makes_quack_unavailable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (8, 0))
    with pytest.raises(Unavailable, match=r"need compute capability 9.0 or newer; this GPU is 8.0"):
        quack.require_capability()


@pytest.mark.parametrize("op_name", FLASHINFER_OPS)
def test_the_flashinfer_adapter_passes_the_gate_against_the_stand_in(op_name, fake, device):
    fake()
    impl = fresh(op_name, "flashinfer")
    assert impl.available, impl.reason
    assert passes(op_name, impl, CASES[op_name], device)


@pytest.mark.parametrize("op_name", QUACK_OPS)
def test_the_quack_adapter_passes_the_gate_against_the_stand_in(op_name, fake, device):
    calls = fake()
    assert passes(op_name, fresh(op_name, "quack"), CASES[op_name], device)
    drawn = get_op(op_name).make_inputs(CASES[op_name], 0, device)["eps"]
    assert drawn in {c["eps"] for c in calls if c["fn"] == "quack"}  # eps reaches `eps`, not `bias`


@pytest.mark.parametrize("op_name", ("rmsnorm", "fused_add_rmsnorm"))
def test_row_strided_rows_reach_flashinfer_as_strided_views(op_name, fake, device):
    calls = fake()
    assert passes(op_name, fresh(op_name, "flashinfer"), STRIDED, device)
    rows = [c["input"] for c in calls if c["input"].shape[0] > 1]  # a 1-D extra shape is one row
    assert rows and all(t.stride(0) > t.shape[1] for t in rows)  # the row stride is passed on, not copied away


def test_flashinfer_rmsnorm_writes_a_fresh_output(fake, device):
    calls = fake()
    assert passes("rmsnorm", fresh("rmsnorm", "flashinfer"), CASES["rmsnorm"], device)
    assert all(c["out"] is not None and c["out"].data_ptr() != c["input"].data_ptr() for c in calls)


def test_flashinfer_silu_and_mul_refusing_a_width_is_a_named_failure(fake, device):
    fake()
    result = check(get_op("silu_and_mul"), fresh("silu_and_mul", "flashinfer"), Case((3, 10)), seed=0, device=device)
    assert not result.passed and "The pointers must be multiple of 16 bytes." in result.message


# ---- planted wrong mappings: the gate catches each ----------------------------------------


def planted(op_name: str, loader: Callable[[], Callable[..., Any]]) -> Impl:
    return Impl(op=op_name, name="planted", kind="peer", loader=loader)


def test_planted_swapped_x_and_residual_fails(fake, device):
    fake()

    def swapped(fn):
        return lambda x, residual, weight, eps=1e-6: fn(residual, x, weight, eps=eps)

    impl = planted("fused_add_rmsnorm", fi.flashinfer_loader("norm", "fused_add_rmsnorm", swapped))
    assert not passes("fused_add_rmsnorm", impl, CASES["fused_add_rmsnorm"], device)


def test_planted_plain_fused_add_for_gemma_fails(fake, device):
    fake(gemma_one_plus=False)  # a Gemma kernel that forgets the (1 + w)
    op = "gemma_fused_add_rmsnorm"
    assert not passes(op, fresh(op, "flashinfer"), CASES[op], device)


def test_planted_rmsnorm_into_its_input_fails(fake, device):
    fake()

    def in_place(fn):
        return lambda x, weight, eps=1e-6: fn(x, weight, eps, out=x)

    impl = planted("rmsnorm", fi.flashinfer_loader("norm", "rmsnorm", in_place))
    assert not passes("rmsnorm", impl, CASES["rmsnorm"], device)


def test_planted_quack_eps_passed_positionally_fails(fake, device):
    fake()
    impl = planted("rmsnorm_fp32", quack.quack_loader(lambda fn: lambda x, weight, eps=1e-6: fn(x, weight, eps)))
    result = check(get_op("rmsnorm_fp32"), impl, CASES["rmsnorm_fp32"], seed=0, device=device)
    assert not result.passed and "has no attribute 'dtype'" in result.message


def test_planted_silu_and_mul_with_swapped_halves_fails(fake, device):
    fake()

    def swapped(fn):
        return lambda x: fn(torch.cat([x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]], dim=-1))

    impl = planted("silu_and_mul", fi.flashinfer_loader("activation", "silu_and_mul", swapped))
    assert not passes("silu_and_mul", impl, CASES["silu_and_mul"], device)
