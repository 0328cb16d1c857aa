"""rotary_embedding (neox) and rotary_embedding_gptj: our kernel against the reference on every small
case and layout, the gate passing it and catching planted defects (wrong half, positions ignored,
the tail past rotary_dim written), bounded grids, the vLLM-style view, and the peer adapters' views."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kerneltrial.ops import launch
from kerneltrial.ops import peers_flashinfer as fi
from kerneltrial.ops import peers_sglang as sgl
from kerneltrial.ops import rotary as rot
from kerneltrial.ops.registry import Case, Impl, get_op, load_user_module
from kerneltrial.trial.gate import check
from tests.conftest import REPO
from tests.launches import record_launches

PLANTED = REPO / "tests" / "fixtures" / "planted"
OPS = (rot.NAME, rot.GPTJ_NAME)
KERNELS = (*rot.GEOMETRIES, "kerneltrial")


def planted(stem: str) -> Impl:
    return next(i for i in load_user_module(str(PLANTED / f"{stem}.py")) if i.op == rot.NAME)


def as_impl(op_name: str, fn: Callable[..., None]) -> Impl:
    return Impl(op=op_name, name="adapter", kind="user", loader=lambda: fn)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.contiguous().view(torch.int16))


@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("name", KERNELS)
def test_kernels_equal_the_reference_bit_for_bit_on_every_small_case(op_name, name, device):
    """bf16 x bf16 products are exact in fp32: the fp32 formula rounds once, and so does the kernel."""
    op = get_op(op_name)
    fn = op.impl(name).resolve()
    for layout in op.layouts:
        for case in op.small_cases:
            values = op.make_inputs(Case(case.shape, case.dtype, layout), 1, device)
            expected = op.reference(*values.values())
            fn(*values.values())
            for got, want in zip(op.outputs(values, None), expected, strict=True):
                assert same_bits(got, want), (name, layout, case.id)


@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("name", ["control", "kerneltrial"])
def test_the_gate_passes_the_kernel_on_the_model_spec_heads(op_name, name, device):
    op = get_op(op_name)
    for layout in op.layouts:
        result = check(op, op.impl(name), Case((3, 16, 2, 128), layout=layout), 0, device)
        assert result.passed, (layout, result.message)


@pytest.mark.parametrize("stem", ["rotary_swaps_cos_sin", "rotary_ignores_positions"])
def test_a_kernel_with_the_wrong_cos_sin_is_caught(stem, device):
    result = check(get_op(rot.NAME), planted(stem), Case((3, 16, 2, 128)), 0, device, thorough=False)
    assert not result.passed and "differs from the reference" in result.message, result.message


def test_a_kernel_writing_the_tail_past_rotary_dim_is_caught_in_the_partial_layout(device):
    op, impl = get_op(rot.NAME), planted("rotary_writes_the_tail")
    assert check(op, impl, Case((3, 16, 2, 64)), 0, device, thorough=False).passed  # no tail: right
    result = check(op, impl, Case((3, 16, 2, 64), layout="partial_rotary"), 0, device, thorough=False)
    assert not result.passed and "wrote outside its output" in result.message, result.message


def test_the_styles_are_two_operators_that_tell_each_other_apart(device):
    """A neox kernel checked as GPT-J (and back) fails: the panels tell the two pairings apart."""
    neox, gptj = get_op(rot.NAME), get_op(rot.GPTJ_NAME)
    case = Case((3, 4, 1, 64))
    assert not check(gptj, as_impl(gptj.name, rot.rotary_embedding), case, 0, device, thorough=False).passed
    assert not check(neox, as_impl(neox.name, rot.rotary_embedding_gptj), case, 0, device, thorough=False).passed


def test_the_grid_is_bounded_and_strides_over_the_tokens(monkeypatch, device):
    """With the grid limit at 3 programs, 7 tokens (4 per step: 2 steps) are still all rotated."""
    grids = record_launches(monkeypatch, rot, "_rotary_qk")
    monkeypatch.setattr(launch, "MAX_GRID", 3)
    op = get_op(rot.NAME)
    for geometry in ("control", "tokens4_w4"):
        values = op.make_inputs(Case((7, 4, 1, 64)), 0, device)
        expected = op.reference(*values.values())
        op.impl(geometry).resolve()(*values.values())
        assert all(same_bits(got, want) for got, want in zip(op.outputs(values, None), expected, strict=True))
    assert grids == [(3,), (2,)]


def test_partial_rotary_through_the_vllm_view_leaves_the_tail_untouched(device):
    """vLLM's call: query [tokens, heads * head_size], rotary_dim = the cache's width < head_size."""
    gen = torch.Generator(device=device).manual_seed(0)
    tokens, heads, head_size, r = 5, 4, 128, 64
    query = torch.randn(tokens, heads * head_size, generator=gen, device=device).to(torch.bfloat16)
    key = torch.randn(tokens, heads * head_size, generator=gen, device=device).to(torch.bfloat16)
    cache = rot.draw_cache(r, torch.bfloat16, gen, device)
    positions = torch.tensor([0, 7, 4095, 3, 3], device=device)
    before_q, before_k = query.clone(), key.clone()
    q_rot, k_rot = (x.view(tokens, heads, head_size)[..., :r] for x in (query, key))
    expected = rot.reference(q_rot, k_rot, cache, positions)
    rot.rotary_embedding(q_rot, k_rot, cache, positions)
    assert same_bits(q_rot, expected[0]) and same_bits(k_rot, expected[1])
    for after, before in ((query, before_q), (key, before_k)):
        tail = (slice(None), slice(None), slice(r, None))
        assert torch.equal(after.view(tokens, heads, head_size)[tail], before.view(tokens, heads, head_size)[tail])


@pytest.mark.parametrize(
    "query_shape,message",
    [((5, 4, 64), "even and twice"), ((5, 256), "must be \\[tokens, heads, rotary_dim\\]")],
)
def test_bad_views_are_refused_with_the_fix(query_shape, message, device):
    query = torch.zeros(query_shape, dtype=torch.bfloat16, device=device)
    key = torch.zeros((5, 1, 64), dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=message):
        rot.rotary_embedding(query, key, torch.zeros(16, 32, device=device), torch.zeros(5, dtype=torch.long))


# ---- the peers' adapters, each around a torch stand-in of the peer's interface ------------


def vllm_style(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """FlashInfer's apply_rope_with_cos_sin_cache_inplace interface: [tokens, heads * head_size]."""
    assert cos_sin_cache.dtype == torch.float32
    r = cos_sin_cache.shape[-1]
    q, k = (x.view(x.shape[0], -1, head_size)[..., :r] for x in (query, key))
    rot.eager(q, k, cos_sin_cache.to(q.dtype), positions, neox=is_neox)


class HuggingFaceRope:
    """LigerRopeFunction's interface: q [bsz, heads, tokens, R], cos [1, tokens, R]; it rotates
    contiguous copies (Liger's rope_forward calls .contiguous()) and returns them."""

    @staticmethod
    def apply(q, k, cos, sin):
        half = q.shape[-1] // 2
        c, s = cos[:, None, :, :half].float(), sin[:, None, :, :half].float()
        outs = []
        for x in (q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)):
            x1, x2 = x[..., :half].float(), x[..., half:].float()
            x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype))
            outs.append(x)
        return outs[0], outs[1], cos, sin


def sglang_style(q, k, cos_sin_cache, positions, *, is_neox, rope_dim):
    """SGLang's apply_rope_with_cos_sin_cache_inplace interface: q [tokens, heads, head_size]."""
    assert cos_sin_cache.dtype == torch.float32 and rope_dim == cos_sin_cache.shape[-1]
    rot.eager(q[..., :rope_dim], k[..., :rope_dim], cos_sin_cache.to(q.dtype), positions, neox=is_neox)


def gems_rope_forward(q, k, cos, sin, position_ids=None, rotary_interleaved=False, inplace=False):
    """FlagGems' interface: q [tokens, heads, R], cos/sin [max_position, R/2]."""
    assert inplace and cos.shape[-1] * 2 == q.shape[-1]
    rot.rotate_qk(q, k, cos, sin, position_ids, neox=not rotary_interleaved)
    return q, k


@pytest.mark.parametrize("op_name", OPS)
def test_the_flashinfer_sglang_and_flaggems_adapters_pass_the_gate_in_every_layout(op_name, device):
    op = get_op(op_name)
    neox = op_name == rot.NAME
    adapters = (fi.rope_in_place(vllm_style, neox), sgl.rope_in_place(sglang_style, neox))
    for adapter in (*adapters, rot.flaggems_rope(gems_rope_forward, neox)):
        for layout in op.layouts:
            result = check(op, as_impl(op_name, adapter), Case((3, 4, 2, 64), layout=layout), 0, device, thorough=False)
            assert result.passed, (layout, result.message)


def test_the_liger_adapter_writes_back_what_liger_rotated_in_copies(device):
    op = get_op(rot.NAME)
    for layout in op.layouts:
        result = check(
            op, as_impl(op.name, rot.liger_rope(HuggingFaceRope)), Case((3, 4, 2, 64), layout=layout), 0, device
        )
        assert result.passed, (layout, result.message)
