"""The `sglang` peer (ops/peers_sglang.py): unavailable with a reason when SGLang is absent;
its argument mapping checked against a stand-in of SGLang 0.5.23's kernel namespace (the
functions' signatures as the wheel defines them, computing with torch), through the gate;
planted wrong mappings fail the gate."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from kerneltrial.ops import peers_sglang
from kerneltrial.ops.registry import Case, Impl, Unavailable, all_ops, get_op
from kerneltrial.trial.gate import check

# the rotary operators' peers: their adapters are checked against stand-ins in tests/ops/test_rotary.py
ROTARY_OPS = ("rotary_embedding", "rotary_embedding_gptj")
COVERED = (
    "rmsnorm",
    "rmsnorm_fp32",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "silu_and_mul",
    "zimage_qk_rmsnorm",
    "zimage_qk_rmsnorm_pair",
    "softcap_row_argmax",
)
CASES = {
    "rmsnorm": Case((7, 512)),
    "rmsnorm_fp32": Case((7, 512)),
    "fused_add_rmsnorm": Case((7, 512)),
    "gemma_fused_add_rmsnorm": Case((7, 512)),
    "silu_and_mul": Case((7, 512)),
    "zimage_qk_rmsnorm": Case((5, 30, 128)),
    "zimage_qk_rmsnorm_pair": Case((5, 30, 128)),
    "softcap_row_argmax": Case((3, 1000)),
}


def normed(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


@dataclass
class Calls:
    """What the stand-in's functions were called with, by function name."""

    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def record(self, name: str, **args: Any) -> None:
        self.seen.setdefault(name, []).append(args)


def gemma_kernel(calls: Calls, one_plus: bool = True) -> Any:
    """Stand-in for the Triton `_gemma_fused_add_rmsnorm_kernel`: `kernel[grid](...)`."""

    def launch(x, res, w, out, res_out, n_cols, sxr, sxc, srr, src, eps, BLOCK_N, num_warps):  # noqa: N803
        calls.record("gemma", x=x, res=res, out=out, res_out=res_out, n_cols=n_cols, block=BLOCK_N)
        s = x.float() + res.float()
        scale = (1.0 + w.float()) if one_plus else w.float()
        y = (normed(s, eps) * scale).to(out.dtype)
        res_out.copy_(s.to(res_out.dtype))
        out.copy_(y)

    class Kernel:
        def __getitem__(self, grid: tuple[int]) -> Callable[..., None]:
            return launch

    return Kernel()


def stand_in(calls: Calls, gemma_one_plus: bool = True) -> dict[str, types.ModuleType]:
    """Modules of sglang.kernels.ops with SGLang 0.5.23's signatures (see the wheel's sources)."""

    def rmsnorm(input, weight, out=None, eps=1e-6):  # noqa: A002
        calls.record("rmsnorm", input=input, out=out, eps=eps)
        out = out if out is not None else input
        out.copy_((normed(input, eps) * weight.float()).to(input.dtype))

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6, *, cast_x_before_out_mul=False):  # noqa: A002
        calls.record("fused_add_rmsnorm", cast=cast_x_before_out_mul)
        s = input.float() + residual.float()
        residual.copy_(s.to(residual.dtype))
        rstd = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
        input.copy_((residual.float() * rstd * weight.float()).to(input.dtype))

    def rmsnorm_fp32(x, weight, eps):
        assert x.is_contiguous()
        return (normed(x, eps) * weight.float()).to(x.dtype)

    def silu_and_mul(input, out=None, expert_ids=None, expert_step=1):  # noqa: A002
        d = input.shape[-1] // 2
        return (torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)

    def zimage_qk_rmsnorm_native(x, weight, eps):
        calls.record("zimage", dim=x.dim())
        if x.dim() != 4 or x.shape[-1] != 128:
            return None
        return (normed(x, eps).to(x.dtype) * weight).contiguous()

    def softcap_row_argmax(logits, final_logit_softcapping, valid_width, col_offset):
        assert logits.dtype == torch.float32
        capped = final_logit_softcapping * torch.tanh(logits[:, :valid_width] / final_logit_softcapping)
        best, index = capped.max(dim=1)
        return torch.stack([best, (index + col_offset).float()], dim=1)

    def block_warps(block_n: int) -> int:
        return 16 if block_n >= 4096 else 8 if block_n >= 1024 else 4

    leaves = {
        "layernorm.norm": {"rmsnorm": rmsnorm, "fused_add_rmsnorm": fused_add_rmsnorm},
        "layernorm.rmsnorm_fp32": {"rmsnorm_fp32": rmsnorm_fp32},
        "layernorm.minimax_m3_rmsnorm": {
            "_gemma_fused_add_rmsnorm_kernel": gemma_kernel(calls, gemma_one_plus),
            "_num_warps": block_warps,
        },
        "activation": {"silu_and_mul": silu_and_mul},
        "diffusion.norm.zimage_qk_rmsnorm_triton": {"zimage_qk_rmsnorm_native": zimage_qk_rmsnorm_native},
        "sampling.softcap_row_argmax": {"softcap_row_argmax": softcap_row_argmax},
    }
    modules: dict[str, types.ModuleType] = {}
    for leaf, functions in leaves.items():
        parts = f"{peers_sglang.NAMESPACE}.{leaf}".split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            modules.setdefault(name, types.ModuleType(name))
        for attr, fn in functions.items():
            setattr(modules[".".join(parts)], attr, fn)
    return modules


@pytest.fixture
def fake_sglang(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Calls]:
    """Install the stand-in (CUDA and nvcc checks off: the stand-in runs on the CPU)."""

    def install(gemma_one_plus: bool = True) -> Calls:
        calls = Calls()
        for name, module in stand_in(calls, gemma_one_plus).items():
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.setattr(peers_sglang, "require_cuda", lambda package: None)
        monkeypatch.setattr(peers_sglang, "require_jit", lambda: None)
        return calls

    return install


def fresh(op_name: str) -> Impl:
    """A new Impl with the registered sglang loader (the registry's caches its first answer)."""
    registered = get_op(op_name).impl("sglang")
    return replace(registered, _fn=None, _reason=None)


def test_every_covered_operator_has_an_sglang_peer():
    assert sorted(op.name for op in all_ops() if "sglang" in op.impls) == sorted(COVERED + ROTARY_OPS)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
@pytest.mark.parametrize("op_name", COVERED)
def test_absent_sglang_is_unavailable_with_its_reason(op_name):
    impl = fresh(op_name)
    assert not impl.available
    assert impl.reason == "sglang is not installed (sglang)"
    result = check(get_op(op_name), impl, CASES[op_name], seed=0, device=torch.device("cpu"))
    assert not result.passed and result.message == "unavailable: sglang is not installed (sglang)"


def test_no_nvcc_makes_the_jit_kernels_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(Unavailable, match=f"need nvcc; none on PATH or in {tmp_path}/bin"):
        peers_sglang.require_jit()


@pytest.mark.parametrize("op_name", COVERED)
def test_the_adapter_passes_the_gate_against_the_stand_in(op_name, fake_sglang, device):
    fake_sglang()
    impl = fresh(op_name)
    assert impl.available, impl.reason
    result = check(get_op(op_name), impl, CASES[op_name], seed=0, device=device)
    assert result.passed, result.message


def test_rmsnorm_writes_a_fresh_output_not_its_input(fake_sglang, device):
    calls = fake_sglang()
    impl = fresh("rmsnorm")
    assert check(get_op("rmsnorm"), impl, CASES["rmsnorm"], seed=1, device=device).passed
    seen = calls.seen["rmsnorm"]
    assert all(c["out"] is not None and c["out"].data_ptr() != c["input"].data_ptr() for c in seen)
    drawn = get_op("rmsnorm").make_inputs(CASES["rmsnorm"], 1, device)["eps"]
    assert drawn in {c["eps"] for c in seen}  # eps reaches SGLang's keyword, not its `out` slot


def test_fused_add_uses_sglangs_default_rounding(fake_sglang, device):
    calls = fake_sglang()
    assert check(get_op("fused_add_rmsnorm"), fresh("fused_add_rmsnorm"), CASES["fused_add_rmsnorm"], 0, device).passed
    assert {c["cast"] for c in calls.seen["fused_add_rmsnorm"]} == {False}


def test_gemma_outputs_are_aliased_to_x_and_residual(fake_sglang, device):
    calls = fake_sglang()
    op = get_op("gemma_fused_add_rmsnorm")
    assert check(op, fresh(op.name), CASES[op.name], seed=0, device=device).passed
    call = [c for c in calls.seen["gemma"] if c["n_cols"] == CASES[op.name].shape[-1]][-1]  # not an extra shape
    assert call["out"] is call["x"] and call["res_out"] is call["res"]
    assert call["block"] == 512 and call["n_cols"] == 512


def test_zimage_gets_a_four_dimensional_view(fake_sglang, device):
    calls = fake_sglang()
    assert check(
        get_op("zimage_qk_rmsnorm"), fresh("zimage_qk_rmsnorm"), Case((5, 30, 128), layout="qkv_slice"), 0, device
    ).passed
    assert {c["dim"] for c in calls.seen["zimage"]} == {4}


def test_zimage_declining_a_shape_is_a_named_failure(fake_sglang, device):
    fake_sglang()
    result = check(get_op("zimage_qk_rmsnorm"), fresh("zimage_qk_rmsnorm"), Case((3, 7, 80)), seed=0, device=device)
    assert not result.passed and "declines (3, 7, 80)" in result.message


# ---- planted wrong mappings: the gate catches each ----------------------------------------


def planted(op_name: str, module: str, attr: str, adapt: Callable[[Any], Callable[..., Any]]) -> Impl:
    loader = peers_sglang.sglang_loader(module, attr, adapt, jit=False)
    return Impl(op=op_name, name="planted", kind="peer", loader=loader)


def test_planted_swapped_x_and_residual_fails(fake_sglang, device):
    fake_sglang()

    def swapped(fn):
        return lambda x, residual, weight, eps=1e-6: fn(
            residual.view(-1, x.shape[-1]), x.view(-1, x.shape[-1]), weight, eps
        )

    impl = planted("fused_add_rmsnorm", "layernorm.norm", "fused_add_rmsnorm", swapped)
    assert not check(get_op("fused_add_rmsnorm"), impl, CASES["fused_add_rmsnorm"], seed=0, device=device).passed


def test_planted_gemma_without_one_plus_weight_fails(fake_sglang, device):
    fake_sglang(gemma_one_plus=False)
    op = get_op("gemma_fused_add_rmsnorm")
    result = check(op, fresh(op.name), CASES[op.name], seed=0, device=device)
    assert not result.passed


def test_planted_rmsnorm_without_out_fails(fake_sglang, device):
    """SGLang's rmsnorm without `out` overwrites its input."""
    fake_sglang()

    def in_place(fn):
        def run(x, weight, eps=1e-6):
            fn(x, weight, eps=eps)
            return x

        return run

    impl = planted("rmsnorm", "layernorm.norm", "rmsnorm", in_place)
    assert not check(get_op("rmsnorm"), impl, CASES["rmsnorm"], seed=0, device=device).passed


def test_planted_softcap_returning_the_max_not_the_index_fails(fake_sglang, device):
    fake_sglang()
    impl = planted(
        "softcap_row_argmax",
        "sampling.softcap_row_argmax",
        "softcap_row_argmax",
        lambda fn: lambda logits, cap: fn(logits.float(), cap, logits.shape[1], 0)[:, 0].to(torch.int64),
    )
    assert not check(get_op("softcap_row_argmax"), impl, CASES["softcap_row_argmax"], seed=0, device=device).passed
