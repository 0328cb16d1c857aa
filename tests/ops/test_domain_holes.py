"""The rest of the input domain (issue 35, item 8): misaligned data pointers, argmax indices past
65535 on the CPU panel, 4-D and 1-D inputs, row counts between and beyond the panels'.

Each hole has a planted module (tests/fixtures/planted/, its header says what is wrong) that is
right everywhere but in the hole: it passes the CPU check panel with the draw that covers the hole
switched off (the domain as it was) and is caught with it, named. Every planted arm is torch code:
a check costs the CPU milliseconds. What the draws are: ops/inputs.py, "Coverage"."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import placement
from kerneltrial.ops import softcap_argmax as sa
from kerneltrial.ops.registry import Case, Impl, all_ops, get_op, load_user_module
from kerneltrial.ops.spec import INTERPRETED_EXTRA_ROWS
from kerneltrial.trial import gate, guard
from kerneltrial.trial.panel import beyond_grid_case, check_panel
from tests.conftest import REPO
from tests.kt import run_cli

PLANTED = REPO / "tests" / "fixtures" / "planted"
CPU = torch.device("cpu")
INPUTS_SEEDS = (11, 20261202)  # any inputs seed catches them; two show it is not one lucky draw
# (each planted arm is caught under both; it passes without the draw under the first: that half
# checks the whole panel and is the costly one)


def planted(op_name: str, stem: str) -> Impl:
    return next(i for i in load_user_module(str(PLANTED / f"{stem}.py")) if i.op == op_name)


def small_panel(op_name: str) -> list[Case]:
    """The CPU check panel without its 65537-row case (tests/trial/test_input_domain.py tests that one)."""
    op = get_op(op_name)
    return [c for c in check_panel(op, gpu=False) if c.shape != beyond_grid_case(op).shape]


def first_failure(
    op_name: str, stem: str, inputs_seed: int, cases: Iterable[Case] | None = None
) -> tuple[Case, gate.CheckResult] | None:
    """The first failed check of the planted arm over the CPU check panel but its 65537-row case
    (or over `cases`), seeds 0 and 1."""
    op, impl = get_op(op_name), planted(op_name, stem)
    with inp.drawing(inputs_seed):
        for case in small_panel(op_name) if cases is None else cases:
            for seed in (0, 1):
                result = gate.check(op, impl, case, seed, CPU)
                if not result.passed:
                    return case, result
    return None


def drawn_shape(message: str) -> tuple[int, ...]:
    """The shape of the extra case a message names ("at the drawn shape 3x5x64/...: ...")."""
    return tuple(int(s) for s in message.split("at the drawn shape ")[1].split("/")[0].split("x"))


def without(monkeypatch: pytest.MonkeyPatch, draw: str) -> None:
    """The domain without one of the draws of issue 35 (the others drawn as before)."""
    monkeypatch.setattr(inp, "DOMAIN_DRAWS", tuple(d for d in inp.DOMAIN_DRAWS if d != draw))


# ---- each hole: a planted module, passed without its draw, caught with it --------------------


def test_a_kernel_wrong_at_a_misaligned_pointer_is_caught(monkeypatch):
    for inputs_seed in INPUTS_SEEDS:
        _, result = first_failure("rmsnorm", "wrong_when_misaligned", inputs_seed)
        assert "/misaligned+" in result.message and "output differs from the reference" in result.message, (
            result.message
        )
    without(monkeypatch, inp.MISALIGNED)
    assert first_failure("rmsnorm", "wrong_when_misaligned", INPUTS_SEEDS[0]) is None


def test_a_kernel_wrong_on_4d_inputs_is_caught(monkeypatch):
    for inputs_seed in INPUTS_SEEDS:
        _, result = first_failure("rmsnorm", "wrong_on_4d", inputs_seed)
        assert len(drawn_shape(result.message)) == 4, result.message
    without(monkeypatch, inp.RANK_4)
    assert first_failure("rmsnorm", "wrong_on_4d", INPUTS_SEEDS[0]) is None


def test_a_kernel_wrong_on_1d_inputs_is_caught(monkeypatch):
    for inputs_seed in INPUTS_SEEDS:
        _, result = first_failure("rmsnorm", "wrong_on_1d", inputs_seed)
        (n,) = drawn_shape(result.message)
        assert f"output has shape (1, {n}), expected ({n},)" in result.message, result.message
    without(monkeypatch, inp.RANK_1)
    assert first_failure("rmsnorm", "wrong_on_1d", INPUTS_SEEDS[0]) is None


def test_a_kernel_wrong_on_row_counts_between_the_panels_is_caught(monkeypatch):
    for inputs_seed in INPUTS_SEEDS:
        _, result = first_failure("rmsnorm", "wrong_last_row_off_panel", inputs_seed)
        rows = inp.numel(drawn_shape(result.message)[:-1])
        assert 100 <= rows <= 60000 and "output differs from the reference" in result.message, result.message
    without(monkeypatch, inp.DRAWN_ROWS)
    assert first_failure("rmsnorm", "wrong_last_row_off_panel", INPUTS_SEEDS[0]) is None


@pytest.mark.slow  # seconds of interpreted kernels or a worker process
def test_a_softcap_kernel_with_16_bit_indices_is_caught_on_the_cpu_panel():
    case, result = first_failure(sa.NAME, "argmax_in_16_bits", INPUTS_SEEDS[0])
    assert case.shape[-1] > 65536 and "exact equality" in result.message, (case, result.message)
    assert f"expected {case.shape[-1] - 1}" in result.message, result.message  # the tail row's answer
    narrow = [c for c in small_panel(sa.NAME) if c.shape[-1] <= 65536]  # the CPU panel as it was
    assert first_failure(sa.NAME, "argmax_in_16_bits", INPUTS_SEEDS[0], narrow) is None


def test_every_softcap_draw_of_the_wide_case_answers_past_65535():
    op = get_op(sa.NAME)
    (wide,) = [c for c in op.small_cases if c.shape[-1] > 65536]
    for seed in range(6):
        for layout in op.layouts:
            with inp.drawing(seed):
                values = op.make_inputs(Case(wide.shape, wide.dtype, layout), seed, CPU)
            assert int(op.reference(*values.values())[0].max()) > 65535, (seed, layout)


@pytest.mark.slow  # seconds of interpreted kernels or a worker process
def test_check_names_the_misaligned_case_of_an_isolated_arm():
    """`kerneltrial check OP --impl-module FILE --shape S` (the arm in its own worker) catches it too."""
    module = PLANTED / "wrong_when_misaligned.py"
    args = ["check", "rmsnorm", "--impl-module", module, "--impl", "user:wrong_when_misaligned", "--shape", "7x64"]
    result = run_cli(*args, "--inputs-seed", str(INPUTS_SEEDS[0]))
    assert result.exit_code == 1 and "/misaligned+" in result.output, result.output


# ---- what the draws are ------------------------------------------------------------------


def test_a_misaligned_case_puts_every_data_pointer_off_16_bytes_in_the_guard():
    for op_name, shape, layout in (
        ("rmsnorm", (7, 64), "row_strided"),
        ("fused_add_rmsnorm", (5, 64), "contiguous"),
        ("zimage_qk_rmsnorm_pair", (3, 2, 64), "qkv_slice"),
    ):
        op = get_op(op_name)
        aligned = op.make_inputs(Case(shape, "bfloat16", layout), 0, CPU)
        values = op.make_inputs(Case(shape, "bfloat16", layout, misalign=3), 0, CPU)
        arm = guard.guard(values)
        for name, t in values.items():
            if isinstance(t, torch.Tensor):
                same = torch.equal(t.view(torch.int16), aligned[name].view(torch.int16))  # bits: NaN rows too
                assert same and t.stride() == aligned[name].stride(), (op_name, name)
                assert not placement.aligned(arm.inputs[name]), (op_name, name, arm.inputs[name].data_ptr())
        assert guard.problems(op, arm, values) == ""
    pair = get_op("zimage_qk_rmsnorm_pair").make_inputs(Case((3, 2, 64), "bfloat16", "qkv_slice", misalign=5), 0, CPU)
    assert gate.shares_storage(pair["q"], pair["k"])  # Q and K stay slices of one QKV tensor


def test_misaligned_refuses_an_even_count():
    with pytest.raises(ValueError, match="odd positive count"):
        placement.misaligned({"x": torch.zeros(4)}, 2)


def test_every_check_draws_its_case_misaligned_and_a_row_count_past_the_panel():
    op = get_op("rmsnorm")
    counts = set()
    for inputs_seed in range(6):
        with inp.drawing(inputs_seed):
            for case in op.small_cases:
                extras = inp.extra_cases(op, case, 0)
                assert extras[0] == Case(case.shape, case.dtype, case.layout, extras[0].misalign), extras[0]
                assert extras[0].misalign % 2 == 1 and extras[0].id.endswith(f"/misaligned+{extras[0].misalign}")
                counts |= {e.shape[0] for e in extras[1:] if len(e.shape) == 2 and e.shape[-1] <= inp.ROWS_WIDTHS[1]}
    low, high = inp.ROWS_RANGE_INTERPRETED
    assert len(counts) > 20 and min(counts) >= 11 and max(counts) <= high, sorted(counts)
    assert any(c > 100 for c in counts) and any(low <= c < 100 for c in counts), sorted(counts)


def test_the_drawn_row_counts_reach_2_to_the_17_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    rows = [inp.drawn_rows(random.Random(k)) for k in range(400)]
    assert min(rows) >= inp.ROWS_RANGE[0] and max(rows) <= inp.ROWS_RANGE[1] and max(rows) > 70001, max(rows)


@pytest.mark.parametrize("op", all_ops(), ids=lambda op: op.name)
def test_4d_and_1d_shapes_are_drawn_where_the_shape_rule_takes_them(op):
    ranks = set()
    with inp.drawing(3):
        for seed in range(8):
            ranks |= {len(e.shape) for e in inp.extra_cases(op, op.small_cases[0], seed)}
    accepts_1d = not op.refusal(Case(op.extra_shape(1, 64)[-1:]))
    accepts_4d = not op.refusal(Case((2, 2, 3, 64)))
    assert (4 in ranks) == accepts_4d and (1 in ranks) == accepts_1d, (op.name, ranks)
    # [rows, vocab], [..., heads, head_dim] and (tokens, q_heads, kv_heads, rotary_dim) refuse 1-D shapes
    refuse_1d = (sa.NAME, "zimage_qk_rmsnorm", "zimage_qk_rmsnorm_pair", "rotary_embedding", "rotary_embedding_gptj")
    assert accepts_1d == (op.name not in refuse_1d)
    assert accepts_4d == (op.name != sa.NAME)  # softcap_row_argmax's contract is [rows, vocab]


def test_arms_that_take_aligned_pointers_only_are_not_drawn_a_misaligned_case():
    misaligned, wide = Case((7, 64), misalign=1), Case((INTERPRETED_EXTRA_ROWS + 1, 8))
    peer = Impl("rmsnorm", "peer", "peer", lambda: None, aligned=True)
    assert not peer.draws_extra(misaligned) and peer.draws_extra(Case((7, 64))) and peer.draws_extra(wide)
    control = get_op("rmsnorm").impl("control")  # interpreted here: no extra shape of many rows
    assert control.draws_extra(misaligned) and not control.draws_extra(wide)
    assert get_op("rmsnorm").impl("torch_eager").draws_extra(wide)


def _domain_cases(op_name: str) -> list[Case]:
    """A 4-D, a 1-D and a misaligned case (each in every layout) where the operator takes them."""
    op = get_op(op_name)
    shapes = [(inp.rank_4(op, random.Random(1)), 0), (op.extra_shape(1, 37)[-1:], 0), (op.extra_shape(3, 41), 3)]
    cases = [Case(s, op.dtypes[0], layout, k) for s, k in shapes for layout in op.layouts]
    return [c for c in cases if not op.refusal(c)]


@pytest.mark.slow  # seconds of interpreted kernels or a worker process
@pytest.mark.parametrize("op_name", [op.name for op in all_ops()])
def test_shipped_kernels_and_torch_take_4d_1d_and_misaligned_inputs(op_name):
    op = get_op(op_name)
    for impl in (op.impl("control"), op.impl("kerneltrial"), op.impl("torch_eager")):
        for case in _domain_cases(op_name):
            result = gate.check(op, impl, case, 0, CPU, thorough=False)
            assert result.passed, (impl.name, case.id, result.message)
