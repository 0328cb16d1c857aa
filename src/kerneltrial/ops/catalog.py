"""The built-in operators, declared: one `OperatorSpec` per operator, apart from the kernels.

A spec names everything a trial of the operator draws on: its signature and one-line
description, its semantics (the inputs, reference, oracle and bytes moved its module defines; FLOPs: ops/flops.py),
its panels (`small_cases` for the interpreter and tests, `gpu_cases` for a GPU), the widths of
the gate's extra shapes, and its arms in the order `kerneltrial ops` lists them: the control
and the candidates (one per launch geometry of the family module's GEOMETRIES), the exported
entry point `kerneltrial`, then the peers (the peer modules state each peer kernel's contract).
`registry.load_builtin_ops` registers SPECS, once; nothing is registered at import.
"""

from __future__ import annotations

from functools import partial

from kerneltrial.ops import flops as fl
from kerneltrial.ops import fused_add_rms_norm as fa
from kerneltrial.ops import peers_flashinfer as fi
from kerneltrial.ops import peers_quack as quack
from kerneltrial.ops import peers_sglang as sgl
from kerneltrial.ops import rms_norm as rn
from kerneltrial.ops import rotary as rot
from kerneltrial.ops import sigmoid_gate as sg
from kerneltrial.ops import silu_and_mul as sam
from kerneltrial.ops import softcap_argmax as sa
from kerneltrial.ops import softcap_inputs as si
from kerneltrial.ops import zimage_qk_norm as zq
from kerneltrial.ops import zimage_qk_rmsnorm as zimage
from kerneltrial.ops.peers import flaggems, flaggems_at, liger, torch_arms
from kerneltrial.ops.spec import Arm, Case, Operator, OperatorSpec, kernel_arms, own


def as_float32(cases: tuple[Case, ...]) -> tuple[Case, ...]:
    """The same shapes in float32."""
    return tuple(Case(c.shape, "float32", c.layout) for c in cases)


# ---- rmsnorm, rmsnorm_fp32 (ops/rms_norm.py) ----------------------------------------------

RMS_SMALL = (  # (2, 3, 200): a width that is neither a power of two nor a multiple of 128
    Case((1, 64)),
    Case((7, 5120)),
    Case((33, 1536)),
    Case((2, 3, 200)),
    Case((4, 20000)),
)
RMS_GPU = (
    Case((1, 2048)),
    Case((64, 2048)),
    Case((4096, 2048)),
    Case((16384, 2048)),
    Case((4096, 4096)),
    Case((4096, 5120)),
    Case((4096, 8192)),
    Case((2048, 14336)),
    Case((65536, 2048)),
    Case((1000, 3000)),
    Case((70001, 40)),  # coverage: rows past the 65535 grid limit at a width that is no multiple of 128
)
RMS_ENTRY = "dispatch by row width (exported entry point)"

RMSNORM = OperatorSpec(
    Operator(
        name="rmsnorm",
        signature="rmsnorm(x, weight, eps=1e-6) -> Tensor",
        doc="rmsnorm:       y = (x.f32 * rsqrt(mean(x.f32^2) + eps)).to(dtype) * w",
        layouts=rn.LAYOUTS,
        make_inputs=rn.make_inputs,
        values_for=rn.make_inputs,
        reference=rn.reference_rmsnorm,
        oracle=rn.oracle,
        bytes_moved=rn.bytes_moved,
        flops=fl.rmsnorm,
        small_cases=RMS_SMALL,
        gpu_cases=RMS_GPU,
    ),
    (
        *kernel_arms(rn.GEOMETRIES, partial(rn.launcher, round_before_weight=True), rn.describe),
        own("kerneltrial", partial(rn.rms_norm_auto, round_before_weight=True), RMS_ENTRY),
        *torch_arms(rn.eager_rmsnorm),
        liger("liger_kernel.ops.rms_norm", "LigerRMSNormFunction", rn.liger_rms_norm("llama")),
        flaggems("rms_norm", rn.flaggems_rms_norm),
        fi.flashinfer("norm", "rmsnorm", fi.rmsnorm_out, "norm.rmsnorm (JIT CUDA), one rounding after the weight"),
        quack.quack("rmsnorm (CuTe DSL), one rounding after the weight"),
        sgl.sglang(
            "layernorm.norm",
            "rmsnorm",
            sgl.rmsnorm_out,
            "layernorm.norm.rmsnorm (JIT CUDA), one rounding after the weight",
            jit=True,
        ),
    ),
)

RMSNORM_FP32 = OperatorSpec(
    Operator(
        name="rmsnorm_fp32",
        signature="rmsnorm_fp32(x, weight, eps=1e-6) -> Tensor",
        doc="rmsnorm_fp32:  y = (x.f32 * rsqrt(mean(x.f32^2) + eps) * w.f32).to(dtype)",
        layouts=rn.LAYOUTS,
        make_inputs=rn.make_inputs,
        values_for=rn.make_inputs,
        reference=rn.reference_rmsnorm_fp32,
        oracle=rn.oracle,
        bytes_moved=rn.bytes_moved,
        flops=fl.rmsnorm,
        dtypes=("bfloat16", "float32"),
        small_cases=RMS_SMALL + as_float32(RMS_SMALL[:3]),
        gpu_cases=RMS_GPU + as_float32(RMS_GPU[2:5]),
    ),
    (
        *kernel_arms(rn.GEOMETRIES, partial(rn.launcher, round_before_weight=False), rn.describe),
        own("kerneltrial", partial(rn.rms_norm_auto, round_before_weight=False), RMS_ENTRY),
        *torch_arms(rn.eager_rmsnorm_fp32),
        liger("liger_kernel.ops.rms_norm", "LigerRMSNormFunction", rn.liger_rms_norm("gemma")),
        fi.flashinfer("norm", "rmsnorm", fi.rmsnorm_out, "norm.rmsnorm (JIT CUDA), the operator's contract"),
        quack.quack("rmsnorm (CuTe DSL), the operator's contract"),
        sgl.sglang(
            "layernorm.rmsnorm_fp32",
            "rmsnorm_fp32",
            sgl.rmsnorm_fp32,
            "layernorm.rmsnorm_fp32 (Triton), contiguous only",
            jit=False,
            layouts=("contiguous",),
        ),
    ),
)

# ---- fused_add_rmsnorm, gemma_fused_add_rmsnorm (ops/fused_add_rms_norm.py) ---------------

FUSED_SMALL = (  # (2, 3, 200): a width that is neither a power of two nor a multiple of 128
    Case((1, 64)),
    Case((5, 5120)),
    Case((11, 1536)),
    Case((2, 3, 200)),
    Case((2, 20000)),
)
FUSED_GPU = (
    Case((1, 2048)),
    Case((64, 2048)),
    Case((2048, 2048)),
    Case((4096, 2048)),
    Case((16384, 2048)),
    Case((4096, 4096)),
    Case((4096, 5120)),
    Case((4096, 8192)),
    Case((1000, 3000)),
    Case((70001, 40)),  # coverage: rows past the 65535 grid limit at a width that is no multiple of 128
)

FUSED_ADD_RMSNORM = OperatorSpec(
    Operator(
        name="fused_add_rmsnorm",
        signature="fused_add_rmsnorm(x, residual, weight, eps=1e-6) -> None (x, residual in place)",
        doc="in place: residual = x + residual; x = rmsnorm(residual), bf16 rounding before the weight",
        layouts=fa.LAYOUTS,
        make_inputs=fa.make_inputs,
        values_for=fa.make_inputs,
        reference=fa.reference_fused_add_rmsnorm,
        oracle=fa.oracle,
        bytes_moved=fa.bytes_moved,
        flops=fl.fused_add_rmsnorm,
        small_cases=FUSED_SMALL,
        gpu_cases=FUSED_GPU,
        inplace=("x", "residual"),
    ),
    (
        *kernel_arms(fa.GEOMETRIES, partial(fa.launcher, gemma=False), fa.describe),
        own("kerneltrial", fa.entry_point(gemma=False), RMS_ENTRY),
        *torch_arms(fa.eager_fused_add_rmsnorm),
        liger("liger_kernel.ops.fused_add_rms_norm", "_fused_add_rms_norm_forward_kernel", fa.liger_in_place(0, 0.0)),
        fi.flashinfer(
            "norm",
            "fused_add_rmsnorm",
            fi.fused_add_in_place,
            "norm.fused_add_rmsnorm (JIT CUDA, in place), statistics of the unrounded sum, one rounding after the weight",
        ),
        sgl.sglang(
            "layernorm.norm",
            "fused_add_rmsnorm",
            sgl.fused_add_in_place,
            "layernorm.norm.fused_add_rmsnorm (JIT CUDA, in place), one rounding after the weight, contiguous only",
            jit=True,
            layouts=("contiguous",),
        ),
        flaggems(
            "fused_add_rms_norm",
            fa.flaggems_in_place,
            "FlagGems (contiguous only: it writes into .contiguous() copies)",
            layouts=("contiguous",),
        ),
    ),
)

GEMMA_FUSED_ADD_RMSNORM = OperatorSpec(  # FlagGems 5.0.2 has no Gemma (1 + w) fused add
    Operator(
        name="gemma_fused_add_rmsnorm",
        signature="gemma_fused_add_rmsnorm(x, residual, weight, eps=1e-6) -> None (x, residual in place)",
        doc="in place: residual = x + residual; x = rmsnorm(residual) * (1 + w), fp32 to the store",
        layouts=fa.LAYOUTS,
        make_inputs=fa.make_inputs,
        values_for=fa.make_inputs,
        reference=fa.reference_gemma,
        oracle=fa.oracle_gemma,
        bytes_moved=fa.bytes_moved,
        flops=fl.gemma_fused_add_rmsnorm,
        small_cases=FUSED_SMALL,
        gpu_cases=FUSED_GPU,
        inplace=("x", "residual"),
    ),
    (
        *kernel_arms(fa.GEOMETRIES, partial(fa.launcher, gemma=True), fa.describe),
        own("kerneltrial", fa.entry_point(gemma=True), RMS_ENTRY),
        *torch_arms(fa.eager_gemma),
        liger("liger_kernel.ops.fused_add_rms_norm", "_fused_add_rms_norm_forward_kernel", fa.liger_in_place(1, 1.0)),
        fi.flashinfer(
            "norm",
            "gemma_fused_add_rmsnorm",
            fi.fused_add_in_place,
            "norm.gemma_fused_add_rmsnorm (JIT CUDA, in place), statistics of the unrounded sum, "
            "one rounding after the weight",
        ),
        sgl.sglang(
            "layernorm.minimax_m3_rmsnorm",
            "_gemma_fused_add_rmsnorm_kernel",
            sgl.gemma_fused_add_in_place,
            "layernorm.minimax_m3_rmsnorm Gemma fused add (Triton), outputs aliased to x and residual, contiguous only",
            jit=False,
            layouts=("contiguous",),
        ),
    ),
)

# ---- silu_and_mul (ops/silu_and_mul.py) ---------------------------------------------------

SILU_AND_MUL = OperatorSpec(
    Operator(
        name=sam.NAME,
        signature="silu_and_mul(x) -> Tensor",
        doc="SiLU-and-mul (SwiGLU activation): `silu_and_mul(x)`, x [..., 2d] -> [..., d], vLLM semantics.",
        layouts=sam.LAYOUTS,
        make_inputs=sam.make_inputs,
        reference=sam.reference,
        oracle=sam.oracle,
        bytes_moved=sam.bytes_moved,
        flops=fl.silu_and_mul,
        small_cases=(  # (3, 10) and (2, 3, 200): d = 5 and 100, neither a power of two nor a multiple of 128
            Case((1, 128)),
            Case((3, 10)),
            Case((5, 3072)),
            Case((2, 10240)),
            Case((2, 3, 200)),
        ),
        gpu_cases=(
            Case((1, 12288)),
            Case((64, 12288)),
            Case((2048, 12288)),
            Case((4096, 12288)),
            Case((16384, 12288)),
            Case((65536, 12288)),
            Case((4096, 28672)),
            # coverage: d = 5000 (a partial last tile; no multiple of 128), and rows past the 65535
            # grid limit at d = 40
            Case((1000, 10000)),
            Case((70001, 80)),
        ),
        shape_rule=sam.shape_rule,
        extra_shape=sam.extra_shape,
    ),
    (
        *kernel_arms(sam.GEOMETRIES, sam.launcher, sam.describe),
        own(
            "kerneltrial",
            sam.silu_and_mul_auto,
            "packed narrow rows, 2048-column tiles for wide rows (exported entry point)",
        ),
        *torch_arms(sam.eager),
        liger("liger_kernel.ops.swiglu", "LigerFusedGateUpSiLUMulFunction", sam.liger_fused),
        flaggems("silu_and_mul", sam.flaggems_halves),
        sgl.sglang(
            "activation",
            "silu_and_mul",
            sgl.silu_and_mul,
            "activation.silu_and_mul (JIT CUDA, fast math), one rounding, contiguous only",
            jit=True,
            layouts=("contiguous",),
        ),
        fi.flashinfer(
            "activation",
            "silu_and_mul",
            fi.silu_and_mul,
            "activation.silu_and_mul (JIT CUDA), one rounding, contiguous only",
            layouts=("contiguous",),
        ),
    ),
)

# ---- sigmoid_gate_mul (ops/sigmoid_gate.py) -----------------------------------------------

SIGMOID_GATE_MUL = OperatorSpec(
    Operator(
        name=sg.NAME,
        signature="sigmoid_gate_mul(x, gate) -> Tensor",
        doc="Sigmoid gate: `sigmoid_gate_mul(x, gate)`, out = x * sigmoid(gate), a fresh tensor of x's shape.",
        layouts=sg.LAYOUTS,
        make_inputs=sg.make_inputs,
        reference=sg.reference,
        oracle=sg.oracle,
        bytes_moved=sg.bytes_moved,
        flops=fl.sigmoid_gate_mul,
        small_cases=(  # 1000, 200 and 3: widths that are neither powers of two nor multiples of 128
            Case((1, 64)),
            Case((3, 1000)),
            Case((7, 5120)),
            Case((4, 1536)),
            Case((2, 3, 200)),
            Case((5, 3)),
        ),
        gpu_cases=(
            Case((4096, 4096)),
            Case((4096, 2048)),
            Case((16384, 2048)),
            Case((64, 2048)),
            Case((1, 2048)),
            Case((2048, 14336)),
            Case((1000, 3000)),
            Case((70001, 40)),  # coverage: rows past the 65535 grid limit at a width that is no multiple of 128
        ),
    ),
    (
        *kernel_arms(sg.GEOMETRIES, sg.launcher, sg.describe),
        own(
            "kerneltrial", sg.sigmoid_gate_auto, "row tiles for wide row gates, else flat tiles (exported entry point)"
        ),
        # Neither Liger-Kernel 0.8.5 nor FlagGems 5.0.2 has a fused x * sigmoid(gate) kernel, nor
        # SGLang 0.5.23 one of that contract: the peers are torch eager and its torch.compile.
        *torch_arms(sg.eager),
    ),
)

# ---- softcap_row_argmax (ops/softcap_argmax.py; its inputs ops/softcap_inputs.py) -------------------------------------------

ARGMAX_PAST_16_BITS = 70001  # a small panel's vocabulary: its last index, 70000, needs more than 16 bits

SOFTCAP_ROW_ARGMAX = OperatorSpec(
    Operator(
        name=sa.NAME,
        signature="softcap_row_argmax(logits, cap) -> int64 Tensor [rows]",
        doc="argmax over each row of cap * tanh(logits.f32 / cap), first index on ties",
        layouts=sa.LAYOUTS,
        make_inputs=si.make_inputs,
        values_for=si.make_inputs,
        reference=si.reference,
        oracle=si.oracle,
        bytes_moved=si.bytes_moved,
        flops=fl.softcap_row_argmax,
        # 1500, 37, 12289, 40000 and 70001: widths that are neither powers of two nor multiples of 128;
        # (3, 70001): a vocabulary past 65536 whose TAIL row (ops/softcap_inputs.py) answers 70000, so
        # a kernel that keeps its indices in 16 bits fails on the CPU panel too
        small_cases=(
            Case((1, 5120)),
            Case((3, 1500)),
            Case((5, 37)),
            Case((2, 12289)),
            Case((1, 40000)),
            Case((3, ARGMAX_PAST_16_BITS)),
        ),
        gpu_cases=(
            tuple(Case((rows, vocab)) for vocab in (256000, 262144) for rows in (1, 2, 4, 16, 64, 256))
            + tuple(Case((rows, 130560)) for rows in (1, 64, 2048))  # MiniCPM5-2B vocabulary
            + (
                Case((64, 50257)),  # coverage: a vocabulary that is no multiple of 128 (GPT-2's), several spans per row
                Case((70001, 40)),  # coverage: rows past the 65535 grid limit
            )
        ),
        exact=True,
        shape_rule=sa.shape_rule,
    ),
    (
        *kernel_arms(sa.GEOMETRIES, sa.launcher, sa.describe),
        own("kerneltrial", sa.softcap_row_argmax, "dispatch by shape (exported entry point)"),
        *torch_arms(sa.eager),
        sgl.sglang(
            "sampling.softcap_row_argmax",
            "softcap_row_argmax",
            sgl.softcap_argmax,
            "sampling.softcap_row_argmax (Triton), fp32 logits: bf16 converted inside the call",
            jit=False,
        ),
    ),
)

# ---- zimage_qk_rmsnorm, zimage_qk_rmsnorm_pair (ops/zimage_qk_norm.py) --------------------

# (3, 7, 80): a head_dim that is neither a power of two nor a multiple of 128
ZIMAGE_SMALL = (Case((1, 1, 128)), Case((5, 30, 128)), Case((3, 7, 80)), Case((2, 3, 4, 128)))
# Z-Image's shapes, then coverage: a head_dim that is neither a power of two nor a multiple of
# 128 (96, as Phi-3), with more (token, head) rows than the 65535 grid limit.
ZIMAGE_GPU = tuple(
    Case((tokens, 30, 128), layout=layout)
    for tokens in (256, 1024, 4096, 16384, 32768, 131072)
    for layout in zq.LAYOUTS
) + tuple(Case((2400, 30, 96), layout=layout) for layout in zq.LAYOUTS)
# Head dims of real models for the gate's extra shapes (ops/inputs.py, `extra_cases`): GPT-2 and
# Llama-3.2-1B (64), Phi-3 (96), Gemma (256); Z-Image's 128 is in the panels.
HEAD_DIMS = (64, 96, 256)
ZIMAGE_SGLANG = ("diffusion.norm.zimage_qk_rmsnorm_triton", "zimage_qk_rmsnorm_native")  # SGLang's kernel
SGLANG_HEAD_DIMS = (128,)  # the only head_dim zimage_qk_rmsnorm_native takes (it declines others)

ZIMAGE_QK_RMSNORM = OperatorSpec(
    Operator(
        name=zq.OP,
        signature="zimage_qk_rmsnorm(x, weight, eps=1e-5) -> Tensor",
        doc="y = bf16(x.f32 * rsqrt(mean(x.f32^2 over the last dim) + eps)) * w",
        layouts=zq.LAYOUTS,
        make_inputs=zq.make_inputs,
        values_for=zq.make_inputs,
        reference=zq.reference,
        oracle=zq.oracle,
        bytes_moved=zq.bytes_moved,
        flops=fl.rmsnorm,
        small_cases=ZIMAGE_SMALL,
        gpu_cases=ZIMAGE_GPU,
        contiguous_outputs=True,
        shape_rule=zq.shape_rule,
        real_widths=HEAD_DIMS,
        extra_shape=zq.token_heads_shape,
    ),
    (
        *kernel_arms(zimage.GEOMETRIES, zq.launcher, zq.describe),
        own(
            "kerneltrial",
            zq.zimage_qk_rmsnorm,
            f"geometry by rows, width and layout from {zimage.rule_path().name} (exported entry point)",
        ),
        *torch_arms(zq.eager),
        sgl.sglang(
            *ZIMAGE_SGLANG,
            sgl.zimage_qk,
            "zimage_qk_rmsnorm_native (Triton), bf16 statistics as SGLang's eager ZImageRMSNorm",
            jit=False,
            widths=SGLANG_HEAD_DIMS,
        ),
    ),
)

ZIMAGE_QK_RMSNORM_PAIR = OperatorSpec(
    Operator(
        name=zq.PAIR_OP,
        signature="zimage_qk_rmsnorm_pair(q, k, q_weight, k_weight, eps=1e-5) -> (Tensor, Tensor)",
        doc="Q and K normalised in one launch",
        layouts=zq.LAYOUTS,
        make_inputs=zq.make_pair_inputs,
        values_for=zq.make_pair_inputs,
        reference=zq.reference_pair,
        oracle=zq.oracle_pair,
        bytes_moved=zq.bytes_moved_pair,
        flops=fl.rmsnorm_pair,
        small_cases=ZIMAGE_SMALL,
        gpu_cases=ZIMAGE_GPU,
        contiguous_outputs=True,
        shape_rule=zq.shape_rule,
        real_widths=HEAD_DIMS,
        extra_shape=zq.token_heads_shape,
    ),
    (
        *kernel_arms(zq.PAIR_GEOMETRIES, zq.pair_launcher, zq.describe_pair),
        own("two_launches", zq.qk_norm_two_launches, "zimage_qk_rmsnorm dispatcher called for Q, then K"),
        own(
            "kerneltrial",
            zq.zimage_qk_rmsnorm_qk,
            "one launch, geometry from the single operator's rule (exported entry point)",
        ),
        *torch_arms(zq.eager_pair),
        sgl.sglang(
            *ZIMAGE_SGLANG,
            sgl.zimage_qk_pair,
            "zimage_qk_rmsnorm_native (Triton) called for Q, then K",
            jit=False,
            widths=SGLANG_HEAD_DIMS,
        ),
    ),
)

# ---- rotary_embedding, rotary_embedding_gptj (ops/rotary.py) -------------------------------

# (tokens, q_heads, kv_heads, rotary_dim); 16 query and 2 KV heads of 128 is the model spec's
# attention; (5, 3, 1, 80): a rotary_dim that is neither a power of two nor a multiple of 128
ROTARY_SMALL = (Case((1, 4, 1, 64)), Case((3, 16, 2, 128)), Case((5, 3, 1, 80)), Case((2, 2, 2, 256)))
# decode (1..64 tokens) and prefill (512..16384) at the model spec's heads; coverage: rotary_dim 96
# (Phi-3's head, no multiple of 128); 4096 and 16384 tokens hold more Q rows than the 65535 grid limit
ROTARY_GPU = tuple(Case((t, 16, 2, 128)) for t in (1, 8, 32, 64, 512, 1024, 4096, 16384)) + (Case((1024, 16, 2, 96)),)
ROTARY_GPTJ_GPU = tuple(Case((t, 16, 2, 128)) for t in (1, 64, 4096, 16384)) + (Case((1024, 16, 2, 96)),)
ROTARY_SIGNATURE = "(query, key, cos_sin_cache, positions) -> None (query, key in place)"
ROTARY_FLAGGEMS = ("flag_gems.modules.rotary_embedding", "gems_rope_forward")  # vllm-plugin-FL's flaggems backend
ROTARY_ENTRY = "one token per step, Q and K heads in one program (exported entry point; geometry to pick on a GPU)"


def rotary_operator(name: str, neox: bool, doc: str, gpu_cases: tuple[Case, ...]) -> Operator:
    """One rotary style's operator: the semantics of ops/rotary.py with `neox` fixed."""
    return Operator(
        name=name,
        signature=f"{name}{ROTARY_SIGNATURE}",
        doc=doc,
        layouts=rot.LAYOUTS,
        make_inputs=rot.make_inputs,
        reference=partial(rot.reference, neox=neox),
        oracle=partial(rot.oracle, neox=neox),
        bytes_moved=rot.bytes_moved,
        flops=fl.rotary,
        small_cases=ROTARY_SMALL,
        gpu_cases=gpu_cases,
        inplace=("query", "key"),
        shape_rule=rot.shape_rule,
        real_widths=HEAD_DIMS,
        extra_shape=rot.extra_shape,
    )


def rotary_peers(neox: bool) -> tuple[Arm, ...]:
    """The peers both styles share: FlashInfer, SGLang and FlagGems (vllm-plugin-FL's own)."""
    style = "neox" if neox else "GPT-J"
    return (
        fi.flashinfer(
            "rope",
            "apply_rope_with_cos_sin_cache_inplace",
            partial(fi.rope_in_place, neox=neox),
            f"rope.apply_rope_with_cos_sin_cache_inplace (JIT CUDA, {style}), the cache converted to fp32 per call",
        ),
        sgl.sglang(
            "attention.rope",
            "apply_rope_with_cos_sin_cache_inplace",
            partial(sgl.rope_in_place, neox=neox),
            f"attention.rope.apply_rope_with_cos_sin_cache_inplace (JIT CUDA, {style}), the cache converted to fp32",
            jit=True,
        ),
        flaggems_at(
            *ROTARY_FLAGGEMS,
            partial(rot.flaggems_rope, neox=neox),
            f"FlagGems gems_rope_forward in place ({style}), as vllm-plugin-FL's flaggems backend calls it",
        ),
    )


ROTARY_EMBEDDING = OperatorSpec(
    rotary_operator(
        rot.NAME,
        True,
        "neox rotary embedding of Q and K in place: halves [:R/2], [R/2:] rotated by cos_sin_cache[positions]",
        ROTARY_GPU,
    ),
    (
        *kernel_arms(rot.GEOMETRIES, partial(rot.launcher, neox=True), rot.describe),
        own("kerneltrial", rot.rotary_embedding, ROTARY_ENTRY),
        *torch_arms(partial(rot.eager, neox=True)),
        liger("liger_kernel.ops.rope", "LigerRopeFunction", rot.liger_rope),
        *rotary_peers(neox=True),
    ),
)

ROTARY_EMBEDDING_GPTJ = OperatorSpec(  # Liger-Kernel's rope rotates halves only (no GPT-J style)
    rotary_operator(
        rot.GPTJ_NAME,
        False,
        "GPT-J rotary embedding of Q and K in place: pairs [0::2], [1::2] rotated by cos_sin_cache[positions]",
        ROTARY_GPTJ_GPU,
    ),
    (
        *kernel_arms(rot.GEOMETRIES, partial(rot.launcher, neox=False), rot.describe),
        own("kerneltrial", rot.rotary_embedding_gptj, ROTARY_ENTRY),
        *torch_arms(partial(rot.eager, neox=False)),
        *rotary_peers(neox=False),
    ),
)

# In the order the registry has always listed them (`kerneltrial ops`, `check --all`).
SPECS = (
    RMSNORM,
    SIGMOID_GATE_MUL,
    SILU_AND_MUL,
    SOFTCAP_ROW_ARGMAX,
    ZIMAGE_QK_RMSNORM,
    ZIMAGE_QK_RMSNORM_PAIR,
    RMSNORM_FP32,
    FUSED_ADD_RMSNORM,
    GEMMA_FUSED_ADD_RMSNORM,
    ROTARY_EMBEDDING,
    ROTARY_EMBEDDING_GPTJ,
)
