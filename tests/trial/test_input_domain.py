"""Inputs the arm cannot predict: planted modules (tests/fixtures/planted/, each file's header
says what is wrong) that passed the check panel's old, fixed input domain are caught on the CPU
check panel (trial/panel.py), each with its named message, and pass when the item of the domain
that catches it is switched off (`old_domain`): storage offset 0, large rows, a drawn eps, a
drawn cap, NaN/Inf inputs, real model widths, drawn row counts, the number of distinct shapes,
more than 65535 rows, -0.0 under `exact`. Every planted arm is torch code: the checks cost the
CPU milliseconds."""

from __future__ import annotations

import json
from collections.abc import Iterable

import pytest
import torch

from kerneltrial.ops import inputs as inp
from kerneltrial.ops import softcap_argmax as sa
from kerneltrial.ops import softcap_inputs as si
from kerneltrial.ops.registry import Case, Impl, get_op, load_user_module
from kerneltrial.trial import gate, guard
from kerneltrial.trial.panel import beyond_grid_case, check_panel, skip_reason
from tests.conftest import REPO
from tests.kt import run_cli

PLANTED = REPO / "tests" / "fixtures" / "planted"
CPU = torch.device("cpu")
INPUTS_SEEDS = (11, 20261202)  # any inputs seed catches them; two show it is not one lucky draw


def planted(op_name: str, stem: str) -> Impl:
    return next(i for i in load_user_module(str(PLANTED / f"{stem}.py")) if i.op == op_name)


def first_failure(
    op_name: str, stem: str, inputs_seed: int, cases: Iterable[Case] | None = None, exact: bool = False
) -> tuple[Case, gate.CheckResult] | None:
    """The first failed check of the planted arm over the CPU check panel (or `cases`), seeds 0 and 1."""
    op, impl = get_op(op_name), planted(op_name, stem)
    with inp.drawing(inputs_seed):
        for case in check_panel(op, gpu=False) if cases is None else cases:
            for seed in (0, 1):
                result = gate.check(op, impl, case, seed, CPU, exact=exact)
                if not result.passed:
                    return case, result
    return None


def small_panel(op_name: str) -> list[Case]:
    """The CPU check panel without its 65537-row case (that one is tested on its own)."""
    op = get_op(op_name)
    return [c for c in check_panel(op, gpu=False) if c.shape != beyond_grid_case(op).shape]


@pytest.fixture
def old_domain(monkeypatch):
    """Switch one item of the input domain off: the check panel as it drew before issue 24."""

    def switch_off(*items: str) -> None:
        for item in items:
            one(item)

    def one(item: str) -> None:
        if item == "offset 0":  # every tensor at 256 bytes, the repeated call at 512
            monkeypatch.setattr(inp, "draw_offset", lambda dtype, gen: 256 // dtype.itemsize)
            monkeypatch.setattr(gate, "other_offset", lambda g: 512)
        elif item == "large rows":
            monkeypatch.setattr(inp, "LARGE_EXPONENTS", (0, 0))
        elif item == "drawn eps":  # 1e-6 or 1e-5, as the checks drew them before
            monkeypatch.setattr(inp, "draw_eps", lambda gen, default: (1e-6, 1e-5)[int(inp.uniform(gen) * 2)])
        elif item == "drawn cap":
            monkeypatch.setattr(si, "draw_cap", lambda gen: si.CAP)
        elif item == "non-finite rows":
            monkeypatch.setattr(inp, "NONFINITE_VALUES", (1.0,))
        elif item == "extra shapes":
            monkeypatch.setattr(inp, "extra_cases", lambda op, case, seed: [])
        else:
            raise ValueError(item)

    return switch_off


@pytest.mark.parametrize("inputs_seed", INPUTS_SEEDS)
def test_a_kernel_wrong_at_storage_offset_zero_is_caught(inputs_seed, old_domain):
    case, result = first_failure("rmsnorm", "wrong_at_offset_zero", inputs_seed, small_panel("rmsnorm"))
    at_zero = result.drawn is not None and result.drawn.offsets["x"] == 0
    assert "storage offset: with its inputs at offset 0 bytes the output differs" in result.message or (
        at_zero and "output differs from the reference" in result.message
    ), result.message
    old_domain("offset 0")
    assert first_failure("rmsnorm", "wrong_at_offset_zero", inputs_seed, [case]) is None


@pytest.mark.parametrize(
    ("op_name", "stem", "items", "message"),
    [
        ("rmsnorm", "clamps_large", ("large rows", "non-finite rows"), "output differs from the reference"),
        ("rmsnorm", "special_cases_eps", ("drawn eps",), "output differs from the reference"),
        ("softcap_row_argmax", "hard_coded_cap", ("drawn cap",), "output differs from the reference"),
        ("rmsnorm", "nan_to_zero", ("non-finite rows",), "finite element(s) where the reference is NaN or Inf"),
        ("rmsnorm", "wrong_at_model_widths", ("extra shapes",), "at the drawn shape"),
        ("rmsnorm", "wrong_between_panel_rows", ("extra shapes",), "at the drawn shape"),
    ],
)
def test_a_kernel_tuned_to_the_old_domain_is_caught(op_name, stem, items, message, old_domain):
    for inputs_seed in INPUTS_SEEDS:  # caught under each; passes without the items under the first
        _, result = first_failure(op_name, stem, inputs_seed, small_panel(op_name))
        assert message in result.message, result.message
    old_domain(*items)
    assert first_failure(op_name, stem, INPUTS_SEEDS[0], small_panel(op_name)) is None


def test_a_kernel_wrong_at_a_model_width_names_the_width():
    _, result = first_failure("rmsnorm", "wrong_at_model_widths", INPUTS_SEEDS[0], small_panel("rmsnorm"))
    width = result.message.split("at the drawn shape ")[1].split("/")[0].split("x")[-1]
    assert int(width) in (896, 3072, 3584), result.message


def test_a_kernel_wrong_from_its_17th_distinct_shape_is_caught(old_domain):
    """One `check rmsnorm` run (every panel case and seed, in one process) shows the arm more than
    16 distinct shapes: the panel's and the gate's extra shapes, a number drawn per run."""
    _, result = first_failure("rmsnorm", "wrong_from_17th_shape", INPUTS_SEEDS[0], small_panel("rmsnorm"))
    assert "output differs from the reference" in result.message, result.message
    old_domain("extra shapes")
    assert first_failure("rmsnorm", "wrong_from_17th_shape", INPUTS_SEEDS[0], small_panel("rmsnorm")) is None


def test_the_number_of_distinct_shapes_of_a_run_is_drawn():
    op = get_op("rmsnorm")
    counts = set()
    for inputs_seed in range(4):
        with inp.drawing(inputs_seed):
            shapes = {e.shape for c in check_panel(op, gpu=False) for s in (0, 1) for e in inp.extra_cases(op, c, s)}
        counts.add(len(shapes))
    assert len(counts) > 1 and min(counts) > 16, counts


def test_a_kernel_wrong_above_65535_rows_is_caught_on_the_cpu_panel():
    op = get_op("rmsnorm")
    beyond = [c for c in check_panel(op, gpu=False) if c.shape == beyond_grid_case(op).shape]
    case, result = first_failure("rmsnorm", "wrong_above_65535_rows", INPUTS_SEEDS[0], beyond)
    assert case.shape[0] > 65535, case
    assert "output differs from the reference" in result.message, result.message
    assert first_failure("rmsnorm", "wrong_above_65535_rows", INPUTS_SEEDS[0], small_panel("rmsnorm")) is None


def test_exact_compares_bits_so_negative_zero_is_caught():
    case, result = first_failure("rmsnorm", "negative_zero", INPUTS_SEEDS[0], small_panel("rmsnorm"), exact=True)
    assert "exact equality" in result.message, result.message
    assert first_failure("rmsnorm", "negative_zero", INPUTS_SEEDS[0], [case]) is None  # equal as values


# ---- what the domain draws -----------------------------------------------------------------


def draws(op_name: str, shape: tuple[int, ...], seeds: Iterable[int], inputs_seed: int = 5) -> list[dict]:
    op = get_op(op_name)
    with inp.drawing(inputs_seed):
        return [op.make_inputs(Case(shape), seed, CPU) for seed in seeds]


def test_make_inputs_draws_both_kinds_of_offset_and_a_range_of_eps():
    values = draws("rmsnorm", (7, 64), range(40))
    offsets = {v["x"].storage_offset() * 2 for v in values}
    assert 0 in offsets and len(offsets) > 5 and all(o % inp.OFFSET_ALIGN == 0 for o in offsets), offsets
    eps = {v["eps"] for v in values}
    assert len(eps) > 20 and 1e-6 in eps and all(inp.EPS_RANGE[0] <= e <= inp.EPS_RANGE[1] for e in eps - {1e-6})


def test_make_inputs_draws_large_and_non_finite_rows():
    largest = []
    for values in draws("rmsnorm", (7, 64), range(6)):
        x = values["x"].float()
        largest.append(float(x[torch.isfinite(x)].abs().max()))
        assert int((~torch.isfinite(x)).sum()) == 1
    assert min(largest) > 100 and max(largest) > 1000, largest


def test_softcap_draws_a_range_of_caps():
    caps = {v["cap"] for v in draws(sa.NAME, (6, 64), range(30))}
    assert len(caps) > 20 and all(si.CAP_RANGE[0] <= c <= si.CAP_RANGE[1] for c in caps)
    assert any(c < 27 for c in caps) and any(c > 57 for c in caps)


def test_the_inputs_seed_draws_other_values_and_the_same_again():
    a, b, again = (draws("rmsnorm", (4, 64), [0], inputs_seed)[0] for inputs_seed in (1, 2, 1))
    assert not torch.equal(a["x"], b["x"]) and torch.equal(a["x"], again["x"]) and a["eps"] == again["eps"]
    plain = get_op("rmsnorm").make_inputs(Case((4, 64)), 0, CPU)  # no inputs seed: the seed alone
    assert torch.equal(plain["x"], get_op("rmsnorm").make_inputs(Case((4, 64)), 0, CPU)["x"])
    assert not torch.equal(plain["x"], a["x"])


@pytest.mark.parametrize(
    ("op_name", "shape"),
    [
        ("rmsnorm", (7, 64)),
        ("fused_add_rmsnorm", (7, 64)),
        ("silu_and_mul", (7, 64)),
        ("sigmoid_gate_mul", (7, 64)),
        (sa.NAME, (7, 64)),
        ("zimage_qk_rmsnorm_pair", (7, 2, 64)),
    ],
)
def test_torch_eager_passes_the_new_domain(op_name, shape):
    """torch eager (the official formula) in every layout, with NaN, Inf, large rows and the
    extra shapes: the reference's propagation of non-finite inputs is the rule."""
    op = get_op(op_name)
    with inp.drawing(INPUTS_SEEDS[1]):
        for layout in op.layouts:
            result = gate.check(op, op.impl("torch_eager"), Case(shape, op.dtypes[0], layout), 0, CPU)
            assert result.passed and result.drawn.nonfinite > 0, (layout, result.message)


def test_a_check_records_what_it_drew():
    op = get_op("rmsnorm")
    with inp.drawing(7):
        result = gate.check(op, op.impl("torch_eager"), Case((7, 64)), 1, CPU)
        values = op.make_inputs(Case((7, 64)), 1, CPU)  # what a reviewer rebuilds from the row
        extras = [c.id for c in inp.extra_cases(op, Case((7, 64)), 1)]
    row = result.row()
    assert row["inputs_seed"] == 7 and row["drawn"]["scalars"] == {"eps": values["eps"]}
    assert row["drawn"]["offsets"]["x"] == values["x"].storage_offset() * 2  # the guard keeps the drawn offset
    assert row["drawn"]["nonfinite"] == 1 and row["drawn"]["other_offset"] in (0, gate.OTHER_OFFSET_BYTES)
    assert row["drawn"]["extra"] == extras


# ---- the guard's offsets and the comparison of non-finite values and bits -----------------


def test_the_guard_can_put_inputs_at_offset_zero_with_the_canary_right_before():
    op = get_op("rmsnorm")
    values = op.make_inputs(Case((4, 64)), 0, CPU)
    for offset in (0, 48):
        g = guard.guard(values, offset_bytes=offset)
        x = g.inputs["x"]
        assert x.storage_offset() * 2 == offset and torch.equal(x, values["x"]), offset
        assert guard.problems(op, g, values) == ""
        view = g.views["x"]
        torch.as_strided(g.buffers[view.buffer], (1,), (1,), view.offset - 1).fill_(7)  # a pointer one element back
        assert guard.problems(op, g, values).startswith("wrote outside its output")


NAN, INF = float("nan"), float("inf")


def compared(got: list[float], want: list[float], exact: bool = False) -> str:
    op, case = get_op("rmsnorm"), Case((1, len(want)))
    g, r = (torch.tensor([v], dtype=torch.bfloat16) for v in (got, want))
    return gate.compare(op, case, (g,), (r,), (r.double(),), exact=exact)[1]


def test_non_finite_outputs_must_be_where_the_reference_has_them():
    assert compared([NAN, INF, -INF, 1.0], [NAN, INF, -INF, 1.0]) == ""
    assert "finite element(s) where the reference is NaN or Inf" in compared(
        [0.0, INF, -INF, 1.0], [NAN, INF, -INF, 1.0]
    )
    assert "finite element(s) where the reference is NaN or Inf" in compared(
        [NAN, 3e38, -INF, 1.0], [NAN, INF, -INF, 1.0]
    )
    assert "differs from the reference" in compared([NAN, -INF, -INF, 1.0], [NAN, INF, -INF, 1.0])
    assert "NaN element(s)" in compared([NAN, INF, NAN, 1.0], [NAN, INF, -INF, 1.0])


def test_exact_compares_bits_but_not_nan_payloads():
    assert compared([0.0, 1.0], [-0.0, 1.0]) == ""
    assert "exact equality" in compared([0.0, 1.0], [-0.0, 1.0], exact=True)
    negative_nan = torch.tensor([0xFFC1], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).item()
    assert compared([negative_nan, 1.0], [NAN, 1.0], exact=True) == ""


def test_check_prints_its_inputs_seed_and_draws_the_same_inputs_again(tmp_path):

    def check(*extra: str) -> tuple[str, list[dict]]:
        out = tmp_path / f"rows{len(list(tmp_path.iterdir()))}.jsonl"
        args = ["check", "rmsnorm", "--impl", "torch_eager", "--shape", "7x64", "--jsonl", str(out), *extra]
        result = run_cli(*args)
        assert result.exit_code == 0, result.output
        return result.output, [json.loads(line) for line in out.read_text().splitlines()]

    output, rows = check()
    seed = int(output.split("inputs seed ")[1].split()[0])
    assert {r["inputs_seed"] for r in rows} == {seed}
    again_output, again = check("--inputs-seed", str(seed))
    assert [r["drawn"] for r in again] == [r["drawn"] for r in rows] and f"inputs seed {seed}" in again_output
    _, other = check("--inputs-seed", str(seed + 1))
    assert [r["drawn"] for r in other] != [r["drawn"] for r in rows]


def test_the_cpu_check_panel_holds_65537_rows_that_only_interpreted_shipped_kernels_skip():
    for op_name in ("rmsnorm", "silu_and_mul", "zimage_qk_rmsnorm", sa.NAME):
        op = get_op(op_name)
        big = [c for c in check_panel(op, gpu=False) if inp.numel(c.shape[:-1]) > 65535]
        assert len(big) == len(op.layouts) and all(not op.refusal(c) for c in big), op_name
        assert skip_reason(op.impl("control"), big[0]) and skip_reason(op.impl("kerneltrial"), big[0])
        assert not skip_reason(op.impl("torch_eager"), big[0])
        assert not any(inp.numel(c.shape[:-1]) > 65535 for c in check_panel(op, gpu=False) if c not in big)
