"""Z-Image QK RMSNorm: strided reads from a fused QKV tensor, edge shapes, the bounded grid,
the one-launch Q+K variant, the dispatcher rule, and wrong kernels the gate must reject."""

from __future__ import annotations

import math

import pytest
import torch
import triton

from kerneltrial.ops import zimage_qk_norm as zq
from kerneltrial.ops import zimage_qk_rmsnorm as module
from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial.gate import check
from tests.launches import LaunchRecorder

BF16 = dict(rtol=0.016, atol=1e-5)
SINGLE_KERNELS = ("control", "packed_r4_w4", "packed_r8_w4", "packed_r16_w8", "persistent_r16_w8", "kerneltrial")
PAIR_KERNELS = ("control", "packed_r4_w4", "packed_r8_w4", "packed_r16_w8", "two_launches", "kerneltrial")


def fused_qkv(shape, seed, device, poison_others=False):
    """(fused [..., 3, H, D], q, k) with q and k views; optionally Q and V filled with NaN."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k = zq.qkv_slices(shape, torch.bfloat16, gen, device)
    fused_shape = (*shape[:-2], 3, *shape[-2:])
    fused = q.as_strided(
        fused_shape, torch.empty(fused_shape).stride(), q.storage_offset()
    )  # Q is the fused tensor's start
    if poison_others:
        fused.select(-3, 0).fill_(math.nan)
        fused.select(-3, 2).fill_(math.nan)
    return fused, q, k


def weight(d, device, seed=1):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(d, generator=gen, device=device).to(torch.bfloat16)


@pytest.mark.parametrize("shape", [(6, 30, 128), (2, 3, 4, 128)])
def test_token_head_view_reads_fused_qkv_in_place(shape, device):
    _, q, k = fused_qkv(shape, 0, device)
    for x in (q, k):
        view = module.token_head_view(x)
        assert view.data_ptr() == x.data_ptr()
        assert view.stride() == (3 * shape[-2] * 128, 128, 1)


@pytest.mark.parametrize("impl_name", SINGLE_KERNELS)
def test_kernels_read_only_their_slice_and_write_fresh_contiguous_output(impl_name, device):
    fused, _, k = fused_qkv((5, 30, 128), 3, device, poison_others=True)
    w = weight(128, device)
    before = fused.clone()
    y = get_op(zq.OP).impl(impl_name).resolve()(k, w, 1e-5)
    assert y.is_contiguous() and y.shape == k.shape
    assert y.untyped_storage().data_ptr() != fused.untyped_storage().data_ptr()
    assert not torch.isnan(y).any(), "read a NaN from the Q or V part of the fused tensor"
    torch.testing.assert_close(y, zq.eager(k, w), **BF16)
    assert torch.equal(fused.view(torch.int16), before.view(torch.int16)), "modified the fused tensor"


def test_eps_is_used(device):
    gen = torch.Generator(device=device).manual_seed(5)
    x = (torch.randn((3, 4, 128), generator=gen, device=device) * 0.3).to(torch.bfloat16)
    w = weight(128, device)
    big, small = zq.zimage_qk_rmsnorm(x, w, 0.5), zq.zimage_qk_rmsnorm(x, w, 1e-5)
    torch.testing.assert_close(big, zq.eager(x, w, 0.5), **BF16)
    assert (big.float() - small.float()).abs().max() > 0.1


@pytest.mark.parametrize("shape", [(1, 1, 128), (2, 5, 96), (3, 2, 256)])
@pytest.mark.parametrize("layout", zq.LAYOUTS)
def test_edge_shapes_pass_the_gate(shape, layout, device):
    for op_name, names in ((zq.OP, SINGLE_KERNELS), (zq.PAIR_OP, PAIR_KERNELS)):
        op = get_op(op_name)
        for name in names:
            result = check(op, op.impl(name), Case(shape, layout=layout), seed=7, device=device)
            assert result.passed, f"{op_name}/{name} {shape}: {result.message}"


def test_more_than_65535_rows_through_a_packed_kernel(device, monkeypatch):
    recorder = LaunchRecorder(module._qk_norm)
    monkeypatch.setattr(module, "_qk_norm", recorder)
    _, _, k = fused_qkv((2185, 30, 128), 11, device)  # 65550 rows
    w = weight(128, device)
    y = module.qk_norm(k, w, block_rows=2048, num_warps=8)
    torch.testing.assert_close(y, zq.eager(k, w), **BF16)
    assert recorder.grids == [(triton.cdiv(2185 * 30, 2048),)]


def test_grid_stride_loop_covers_every_row_when_the_grid_is_capped(device, monkeypatch):
    monkeypatch.setattr(module, "MAX_GRID", 3)
    single, pair = LaunchRecorder(module._qk_norm), LaunchRecorder(zq._qk_norm_pair)
    monkeypatch.setattr(module, "_qk_norm", single)
    monkeypatch.setattr(zq, "_qk_norm_pair", pair)
    _, q, k = fused_qkv((4, 30, 128), 13, device)
    wq, wk = weight(128, device, 2), weight(128, device, 3)
    for name in SINGLE_KERNELS:
        y = get_op(zq.OP).impl(name).resolve()(k, wk, 1e-5)
        torch.testing.assert_close(y, zq.eager(k, wk), **BF16)
    for name in PAIR_KERNELS:
        q_out, k_out = get_op(zq.PAIR_OP).impl(name).resolve()(q, k, wq, wk, 1e-5)
        torch.testing.assert_close(q_out, zq.eager(q, wq), **BF16)
        torch.testing.assert_close(k_out, zq.eager(k, wk), **BF16)
    assert single.grids and pair.grids
    assert all(g[0] <= 3 for g in single.grids + pair.grids)
    assert all(g[1] == 2 for g in pair.grids)


def test_pair_is_one_launch_equal_to_two_single_launches(device, monkeypatch):
    _, q, k = fused_qkv((9, 30, 128), 17, device)
    wq, wk = weight(128, device, 4), weight(128, device, 5)
    expected = module.qk_norm(q, wq, block_rows=8, num_warps=4), module.qk_norm(k, wk, block_rows=8, num_warps=4)
    single, pair = LaunchRecorder(module._qk_norm), LaunchRecorder(zq._qk_norm_pair)
    monkeypatch.setattr(module, "_qk_norm", single)
    monkeypatch.setattr(zq, "_qk_norm_pair", pair)
    q_out, k_out = zq.zimage_qk_rmsnorm_qk(q, k, wq, wk)
    assert (len(pair.grids), len(single.grids)) == (1, 0)
    assert torch.equal(q_out, expected[0]) and torch.equal(k_out, expected[1])
    assert q_out.is_contiguous() and k_out.is_contiguous()


def test_pair_rejects_q_and_k_of_different_shapes(device):
    q = torch.zeros((2, 30, 128), dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="same shape"):
        zq.zimage_qk_rmsnorm_qk(q, q[:1], q[0, 0], q[0, 0])


def test_dispatcher_reads_the_committed_rule_derived_from_the_h200_trial():
    """The committed rule (from results/h200/zimage_qk_rmsnorm-t2) picks 16 rows per step, 8 warps,
    for Z-Image's width at every row count, and every arm it can name is a registered arm."""
    rule = module.rule()
    for rows in (1, 7680, 30720, 3932160):
        for layout in zq.LAYOUTS:
            assert rule.choose(rows, 128, layout) == module.GEOMETRIES["packed_r16_w8"]
    text = module.rule_path().read_text()
    assert 'path = "../../../results/h200/zimage_qk_rmsnorm-t2"' in text
    assert set(module.GEOMETRIES) <= set(get_op(zq.OP).impls)


def test_dispatcher_follows_a_rule_with_thresholds(device, monkeypatch):
    rule = module.parse_rule(
        'schema = "kerneltrial.dispatch-rule/1"\ndefault = "control"\n'
        '[[branches]]\nwidth = 128\nlayout = "*"\nmin_rows = 0\narm = "packed_r4_w4"\n'
        '[[branches]]\nwidth = 128\nlayout = "*"\nmin_rows = 100\narm = "persistent_r16_w8"\n',
        "test rule",
    )
    assert rule.choose(99, 128, "contiguous") == module.GEOMETRIES["packed_r4_w4"]
    assert rule.choose(100, 128, "qkv_slice") == module.GEOMETRIES["persistent_r16_w8"]
    assert rule.choose(100, 96, "contiguous") == module.GEOMETRIES["control"]
    monkeypatch.setattr(module, "rule", lambda: rule)
    recorder = LaunchRecorder(module._qk_norm)
    monkeypatch.setattr(module, "_qk_norm", recorder)
    w = weight(128, device)
    for tokens in (3, 4):  # 90 rows, then 120 rows
        x = torch.randn((tokens, 30, 128), device=device).to(torch.bfloat16)
        torch.testing.assert_close(module.zimage_qk_rmsnorm(x, w), zq.eager(x, w), **BF16)
    assert recorder.grids == [(triton.cdiv(90, 4),), (min(triton.cdiv(120, 16), module.INTERPRETER_PROGRAMS),)]


def test_a_rule_naming_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="arm 'packed_r32_w8' has no geometry here"):
        module.parse_rule('schema = "kerneltrial.dispatch-rule/1"\ndefault = "packed_r32_w8"\n', "bad rule")


def test_module_and_rule_work_alone_from_a_zip(tmp_path):
    """The submission form: the module and its rule in a ZIP, imported by a fresh interpreter
    that has no kerneltrial on its path."""
    import subprocess
    import sys
    import zipfile

    archive = tmp_path / "submission.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(module.__file__, "zimage_qk_rmsnorm.py")
        z.write(module.rule_path(), "zimage_qk_rmsnorm.rule.toml")
    code = (
        "import os, sys; os.environ['TRITON_INTERPRET'] = '1'; sys.path[:0] = [sys.argv[1]]\n"
        "import torch, zimage_qk_rmsnorm as m\n"
        "assert 'kerneltrial' not in sys.modules and '.zip' in m.__file__\n"
        "torch.manual_seed(0); x = torch.randn(3, 30, 128).to(torch.bfloat16); w = torch.randn(128).to(torch.bfloat16)\n"
        "ref = ((x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(w.dtype) * w)\n"
        "y = m.zimage_qk_rmsnorm(x, w)  # bf16 rounds twice in ref, once in the kernel: 2 ulp at most\n"
        "assert ((y.float() - ref.float()).abs() <= ref.float().abs() / 64 + 1e-2).all()\n"
        "print(m.rule().choose(90, 128, 'contiguous'))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(archive)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "block_rows=16, num_warps=8" in done.stdout


def test_bytes_moved_and_gpu_panel():
    case = Case((4096, 30, 128))
    assert get_op(zq.OP).bytes_moved(case) == (2 * 4096 * 30 * 128 + 128) * 2
    assert get_op(zq.PAIR_OP).bytes_moved(case) == 2 * (2 * 4096 * 30 * 128 + 128) * 2
    panel = {(c.shape, c.layout) for c in get_op(zq.OP).gpu_cases}
    z_image = {((t, 30, 128), lay) for t in (256, 1024, 4096, 16384, 32768, 131072) for lay in zq.LAYOUTS}
    coverage = {((2400, 30, 96), lay) for lay in zq.LAYOUTS}  # head_dim 96, 72000 (token, head) rows
    assert panel == z_image | coverage


# ---- deliberately wrong kernels the gate must reject --------------------------------------


def raw_launch(x, w, y, n_rows, token_stride, eps=1e-5):
    """Launch the packed kernel with explicit geometry, bypassing the wrapper's checks."""
    heads, d = x.shape[-2:]
    module._qk_norm[(triton.cdiv(max(n_rows, 1), 8),)](
        x, w, y, n_rows, token_stride, d, d, eps, HEADS=heads, BLOCK_ROWS=8, BLOCK_D=d, num_warps=4
    )
    return y


def assumes_contiguous(x, w, eps=1e-5):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return raw_launch(x, w, y, x.numel() // x.shape[-1], x.shape[-2] * x.shape[-1], eps)


def skips_last_row(x, w, eps=1e-5):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return raw_launch(x, w, y, x.numel() // x.shape[-1] - 1, x.stride(-3), eps)


def writes_into_input(x, w, eps=1e-5):
    raw_launch(x, w, x, x.numel() // x.shape[-1], x.stride(-3), eps)
    return x.clone()


@pytest.mark.parametrize(
    "fn,layout,message",
    [
        (assumes_contiguous, "qkv_slice", "finite element(s) where the reference is NaN or Inf"),  # reads other rows
        (skips_last_row, "qkv_slice", "NaN element(s)"),
        (writes_into_input, "contiguous", "modified its input(s) x"),
    ],
)
def test_gate_rejects_wrong_kernels(fn, layout, message, device):
    op = get_op(zq.OP)
    impl = Impl(op=zq.OP, name=fn.__name__, kind="user", loader=lambda: fn)
    result = check(op, impl, Case((4, 30, 128), layout=layout), seed=19, device=device)
    assert not result.passed
    assert message in result.message, result.message
