"""softcap_row_argmax: first index on ties, saturation ties, exact span merge, bounded grid."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kerneltrial.ops import launch
from kerneltrial.ops import softcap_argmax as sa
from kerneltrial.ops import softcap_inputs as si
from kerneltrial.ops.registry import Case, Impl, get_op
from kerneltrial.trial.gate import check
from kerneltrial.trial.timed import Unit

OP = get_op(sa.NAME)
KERNELS = [name for name, impl in OP.impls.items() if impl.kind in ("control", "candidate")]


def expected(logits: torch.Tensor, cap: float = si.CAP) -> torch.Tensor:
    return si.reference(logits, cap)[0]


def drawn(case: Case, seed: int) -> tuple[torch.Tensor, float]:
    """make_inputs' logits and the cap it drew for them."""
    values = si.make_inputs(case, seed=seed, device=torch.device("cpu"))
    return values["logits"], values["cap"]


def test_reference_and_oracle_take_the_first_tied_index():
    row = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0]], dtype=torch.bfloat16)
    assert expected(row).tolist() == [1]
    assert si.oracle(row, si.CAP)[0].tolist() == [1]


def test_saturated_logits_tie_after_capping():
    """300 and 360 both cap to exactly 30.0 in fp32: the earlier one wins, though argmax of
    the raw logits (or of float64 capped values) is the later one. Row 0 puts them in one
    4096-chunk, row 1 in different chunks (one span of the rows_skip kernels)."""
    logits = si.LOGIT_SCALE * si.CAP * torch.randn(2, 20000, generator=torch.Generator().manual_seed(0))
    logits = logits.to(torch.bfloat16)
    low, high = (m * si.CAP for m in si.SATURATED)
    logits[0, [700, 2100]] = torch.tensor([low, high], dtype=torch.bfloat16)
    logits[1, [700, 9000]] = torch.tensor([low, high], dtype=torch.bfloat16)
    assert expected(logits).tolist() == [700, 700]
    assert torch.argmax(logits, dim=-1).tolist() == [2100, 9000]
    assert torch.argmax(si.CAP * torch.tanh(logits.double() / si.CAP), dim=-1).tolist() == [2100, 9000]
    for name in KERNELS:
        assert OP.impl(name).resolve()(logits, si.CAP).tolist() == [700, 700], name


@pytest.mark.parametrize("seed", [0, 1])
def test_make_inputs_plants_ties_saturation_and_special_rows(seed):
    """Every finite row but the tail row holds tied maxima; saturated ties (raw argmax != answer)
    in the odd rows for even seeds and the even rows for odd seeds, except the special rows:
    a zero row (answer 0), a tail row (answer: the last index), a tiny row, a large row (no
    logit where implementations of tanh disagree) and a row with a NaN or an Inf."""
    logits, cap = drawn(Case((16, 1536)), seed)
    first = expected(logits, cap)
    capped = cap * torch.tanh(logits.float() / cap)
    last = capped.shape[-1] - 1 - torch.argmax(capped.flip(-1), dim=-1)
    top = logits.float().abs().amax(dim=-1)
    zero, tail, tiny = (top == 0), (first == 1535), (top > 0) & (top < 1e-20)
    nonfinite = ~torch.isfinite(logits.float()).all(dim=-1)
    large = ((logits.float().abs() >= si.SAFE_BELOW * cap).sum(dim=-1) > 4) & ~nonfinite  # saturated rows: 2
    assert [int(m.sum()) for m in (zero, tail, tiny, large, nonfinite)] == [1, 1, 1, 1, 1]
    assert int(first[zero]) == 0
    ratio = logits[large].float().abs() / cap
    assert not bool(((ratio >= si.SAFE_BELOW) & (ratio < si.SATURATED[0])).any())
    assert bool((first < last)[~tail & ~nonfinite].all()), "every finite row but the tail row holds tied maxima"
    ordinary = ~(zero | tail | tiny | large | nonfinite)
    saturated = (torch.arange(16) + seed) % 2 == 1
    raw = torch.argmax(logits, dim=-1)
    assert bool((raw != first)[saturated & ordinary].all()) and bool((raw == first)[~saturated & ordinary].all())


def test_every_kernel_ranks_nan_above_every_value_as_torch_argmax_does():
    """torch.argmax answers the first NaN of a row; +-Inf caps to +-cap like a saturated logit.
    The NaN sits after a +Inf (the raw maximum does not grow there: the tanh skip must not pass
    over it), after a saturated logit in another span, and at a chunk's last lane."""
    nan, inf = float("nan"), float("inf")
    gen = torch.Generator().manual_seed(3)
    logits = (si.LOGIT_SCALE * si.CAP * torch.randn(4, 20000, generator=gen)).to(torch.bfloat16)
    logits[0, [100, 9000]] = torch.tensor([inf, nan], dtype=torch.bfloat16)
    logits[1, [5, 17000, 19999]] = torch.tensor([500.0, nan, nan], dtype=torch.bfloat16)
    logits[2, [8191, 8192]] = torch.tensor([nan, inf], dtype=torch.bfloat16)
    logits[3, [3, 7]] = torch.tensor([inf, -inf], dtype=torch.bfloat16)
    want = [9000, 17000, 8191, 3]
    assert expected(logits).tolist() == want and si.oracle(logits, si.CAP)[0].tolist() == want
    for name in KERNELS:
        assert OP.impl(name).resolve()(logits, si.CAP).tolist() == want, name


TIE_POSITIONS = [
    (3, 4, 9000),  # neighbours in one chunk and lane group, plus a later chunk
    (4100, 12, 8200),  # the first tie comes after a later-listed one: order is by index
    (1030, 1031, 19999),  # two spans of a 1024-chunk split; the last element
    (0, 8192, 16384),  # the first element; same lane of successive 8192-chunks
]


@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_returns_the_first_of_planted_ties(name):
    """Ties placed within a lane, across lanes, across chunks and across spans of a split row."""
    fn = OP.impl(name).resolve()
    gen = torch.Generator().manual_seed(5)
    logits = (si.LOGIT_SCALE * si.CAP * torch.randn(len(TIE_POSITIONS), 20000, generator=gen)).to(torch.bfloat16)
    for row, positions in enumerate(TIE_POSITIONS):
        logits[row, list(positions)] = logits[row].max() + 1
    assert fn(logits, si.CAP).tolist() == [min(p) for p in TIE_POSITIONS]


def adjacent_pairs(limit: float) -> torch.Tensor:
    """Rows [v, w] and [w, v] for every pair of neighbouring normal (or zero) bf16 values
    up to `limit` in magnitude."""
    bits = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values = torch.cat([-bits.flip(0), bits])
    magnitude = values.float().abs()
    values = values[(magnitude <= limit) & ((magnitude == 0) | (magnitude >= torch.finfo(torch.bfloat16).tiny))]
    pairs = torch.stack([values[:-1], values[1:]], dim=1)
    return torch.cat([pairs, pairs.flip(1)])


def test_softcap_orders_neighbouring_logits_like_torch_and_packs_over_65535_rows():
    """Outside the saturation edge (7 * cap < |x| < 9.1 * cap), the kernels' tanh and
    torch's agree on every pair of neighbouring normal bf16 logits (strictly larger, or tied).
    The rows (> 65535 of them, two wide) go through a packed kernel, many rows per step."""
    inner = adjacent_pairs(7 * si.CAP)
    saturated = adjacent_pairs(4096.0)
    saturated = saturated[(saturated.float().abs() >= 9.1 * si.CAP).all(dim=1)]
    pairs = torch.cat([inner, saturated])
    assert pairs.shape[0] > launch.MAX_GRID
    got = sa.argmax_rows(pairs, si.CAP, block_rows=1024, num_warps=8)
    want = expected(pairs)
    assert bool((got == want).all()), f"{int((got != want).sum())} pairs ordered differently"
    assert 0 < int(want.sum()) < pairs.shape[0], "both orders occur"


def test_launch_grid_stays_within_max_grid(monkeypatch):
    grids: list[int] = []
    bounded = launch.bounded_grid

    def recording(n_items: int, cap: int | None = None) -> tuple[int]:
        grids.append(bounded(n_items, cap)[0])
        return (grids[-1],)

    monkeypatch.setattr(launch, "MAX_GRID", 3)
    monkeypatch.setattr(launch, "bounded_grid", recording)
    logits, cap = drawn(Case((9, 3000)), 2)
    for name in ("control", "packed_r4_w4", "rows_skip_c4096_w8", "split_p16_c4096_w8"):
        assert OP.impl(name).resolve()(logits, cap).tolist() == expected(logits, cap).tolist(), name
    assert grids and max(grids) == 3


@pytest.mark.parametrize("n", [1, 37, 1024, 5120, 130560, 262144])
@pytest.mark.parametrize("parts,chunk", [(1, 4096), (16, 4096), (1056, 1024), (5000, 1024)])
def test_spans_cover_the_row_exactly(n, parts, chunk):
    n_parts, span, chunk = sa.span_geometry(n, parts, chunk)
    assert span % chunk == 0 and 1 <= n_parts <= sa.MAX_PARTS
    assert (n_parts - 1) * span < n <= n_parts * span


@pytest.mark.parametrize(
    "rows,n,geometry",
    [
        (1, 262144, sa.DISPATCH.short),
        (64, 262144, sa.DISPATCH.short),  # spans of 4096 and 32768 (in 4096-chunks): short
        (128, 262144, sa.DISPATCH.long),
        (256, 262144, sa.DISPATCH.long),  # one wave of 65536-131072 spans
        (2048, 130560, sa.DISPATCH.short),  # four rows per program slot: more than one wave
    ],
)
def test_dispatcher_stream_geometry(rows, n, geometry):
    assert sa.choose_stream(rows, n) == geometry


def test_dispatcher_fills_the_gpu_at_one_row():
    stream = sa.choose_stream(1, 262144)
    assert (
        sa.span_geometry(262144, sa.stream_parts(1, stream.programs), stream.chunk)[0] == 262144 // stream.chunk == 128
    )


@pytest.mark.parametrize("shape", [(1, 1536), (1, 5120), (1, 262144)])
@pytest.mark.parametrize("name", ["control", "kerneltrial"])
def test_gate_passes_edge_shapes(shape, name):
    result = check(OP, OP.impl(name), Case(shape), seed=11, device=launch.device())
    assert result.passed, result.message


def _arm(name: str, fn) -> Impl:
    return Impl(op=sa.NAME, name=name, kind="user", loader=lambda: fn)


def last_tied_index(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """Wrong: the dispatcher run on the mirrored rows returns the LAST maximal index."""
    return logits.shape[-1] - 1 - sa.softcap_row_argmax(logits.flip(-1), cap)


def skips_tanh(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """Wrong: with an infinite cap the capped values are the logits (tanh skipped)."""
    return sa.softcap_row_argmax(logits, 1e30)


@pytest.mark.parametrize("wrong", [last_tied_index, skips_tanh])
@pytest.mark.parametrize("layout", sa.LAYOUTS)
def test_gate_rejects_wrong_tie_semantics(wrong, layout):
    result = check(OP, _arm(wrong.__name__, wrong), Case((4, 5120), layout=layout), seed=3, device=launch.device())
    assert not result.passed
    assert result.message.startswith("output differs from the reference")


ONE_LAUNCH = [name for name in KERNELS if name.startswith("stream_")]


def test_one_launch_arms_are_registered():
    assert set(ONE_LAUNCH) == {"stream_c2048_w4", "stream_c4096_w4", "stream_c8192_w8"}


def counters_are_zero() -> bool:
    return all(int(s.cnt.abs().sum()) == 0 for s in sa._SCRATCH.values())


def planted_rows(seed: int, n: int = 40000) -> tuple[torch.Tensor, list[int]]:
    """Rows whose answers sit in different spans of every one-launch geometry: ties across
    spans (the first span's copy wins, listed later or earlier), and saturated pairs in both
    orders (300 then 360: the earlier 300 wins; 360 then 300: the earlier 360 wins)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (si.LOGIT_SCALE * si.CAP * torch.randn(6, n, generator=gen)).to(torch.bfloat16)
    low, high = (m * si.CAP for m in si.SATURATED)
    want = []
    for row, positions in enumerate([(17000, 3, 33000), (1023, 1024, 39999), (0, 16384, 32768)]):
        logits[row, list(positions)] = logits[row].max() + 1
        want.append(min(positions))
    shift = seed % 7  # a different answer on every call
    pairs = [  # (earlier position, its logit, later position, its logit); row 5: one 16384-span
        (8000, low, 30000, high),
        (9000, high, 31000, low),
        (2000, low, 12000, high),
    ]
    for row, (a, first, b, second) in enumerate(pairs, start=3):
        logits[row, a + shift], logits[row, b + shift] = first, second
        want.append(a + shift)
    return logits, want


@pytest.mark.parametrize("name", ONE_LAUNCH)
def test_one_launch_merge_is_exact_and_resets_its_counters(name):
    """Ties and saturation ties across spans; two calls in a row on different inputs both
    answer correctly (the last span left every counter at 0 for the next call)."""
    fn = OP.impl(name).resolve()
    for seed in (1, 2, 3):
        logits, want = planted_rows(seed)
        assert expected(logits).tolist() == want
        assert fn(logits, si.CAP).tolist() == want, (name, seed)
        assert counters_are_zero(), name
    # a strided view and a different row count share the cached counters
    wide, cap = drawn(Case((5, 20000), layout="row_strided"), 9)
    assert fn(wide, cap).tolist() == expected(wide, cap).tolist()
    assert counters_are_zero()


@pytest.mark.parametrize("name", ONE_LAUNCH)
def test_one_launch_merge_with_many_items_per_program(name, monkeypatch):
    """A grid of 3 programs walks every span of every row: each program merges the rows whose
    last ticket it draws, and the counters still end at 0."""
    monkeypatch.setattr(launch, "MAX_GRID", 3)
    logits, cap = drawn(Case((7, 9000)), 4)
    for _ in range(2):
        assert OP.impl(name).resolve()(logits, cap).tolist() == expected(logits, cap).tolist()
        assert counters_are_zero()


def test_stream_geometry_keeps_the_grid_near_its_program_count():
    for rows, parts in ((1, 264), (64, 4), (256, 1), (2048, 1)):
        assert sa.stream_parts(rows, 264) == parts
    assert sa.span_geometry(262144, sa.stream_parts(1, 264), 8192)[:2] == (32, 8192)
    assert sa.span_geometry(262144, sa.stream_parts(64, 132), 16384)[:2] == (2, 131072)
    assert sa.span_geometry(262144, 256, 1024)[0] == 256


@pytest.mark.parametrize("shape", [(1, 262144), (3, 5120), (2, 1536)])
@pytest.mark.parametrize("name", ONE_LAUNCH)
def test_gate_passes_one_launch_arms(shape, name):
    result = check(OP, OP.impl(name), Case(shape), seed=12, device=launch.device())
    assert result.passed, result.message
    assert counters_are_zero()


def test_dispatcher_streams_every_wide_row_count():
    """The measured rule: rows wider than DISPATCH.narrow go to the one-launch streaming kernel at
    every row count (the two-launch split was bimodal), in the geometry `choose_stream` picks;
    narrower rows are packed."""
    wide = sa.DISPATCH.narrow + 1
    for rows in (1, 63, 64, 300):
        s = sa.choose_stream(rows, wide)
        plan = sa.auto_launch(rows, wide, launch.MAX_GRID)
        assert plan == sa.span_launch(
            rows, wide, sa.stream_parts(rows, s.programs), s.chunk, s.num_warps, launch.MAX_GRID
        )
    assert isinstance(sa.auto_launch(3, sa.DISPATCH.narrow, launch.MAX_GRID), sa.RowsLaunch)


def test_cached_launches_are_keyed_on_the_grid_limit():
    """Planted: the same shape under another MAX_GRID is another launch (a cache keyed on the
    shape alone would keep the 65535-program grid when the limit drops to 3)."""
    assert sa.auto_launch(9, 3000, launch.MAX_GRID).grid == (9,)  # one row per step at 3000
    assert sa.auto_launch(9, 3000, 2).grid == (2,)


def test_scratch_is_reused_and_allocated_once_per_stream():
    """A call allocates only its output: the merge buffers of the one-launch kernel are the
    same tensors from call to call."""
    logits, cap = drawn(Case((2, 20000)), 1)
    sa.softcap_row_argmax(logits, cap)
    before = {key: (s.cnt.data_ptr(), s.val.data_ptr()) for key, s in sa._SCRATCH.items()}
    assert sa.softcap_row_argmax(logits, cap).tolist() == expected(logits, cap).tolist()
    assert {key: (s.cnt.data_ptr(), s.val.data_ptr()) for key, s in sa._SCRATCH.items()} == before


def edge_logits(values: dict, cap: float) -> int:
    """How many |logits| lie in [SAFE_BELOW, SATURATED[0]) * cap, where implementations may
    disagree on ties (the module doc): make_inputs draws none there for its own cap."""
    a = values["logits"].float().abs()
    return int(((a >= si.SAFE_BELOW * cap) & (a < si.SATURATED[0] * cap)).sum())


def test_timed_value_sets_are_drawn_for_the_cap_the_sample_keeps():
    """A timed sample keeps its seed's cap for every call (timed.Unit); each call's logits must be
    placed for that cap. Planted: the value sets drawn for their own caps and given the sample's
    (the defect a GPU run showed: false "wrong result while timed" rows, the control's too)."""
    op, case = get_op(sa.NAME), Case((6, 4096))
    unit = Unit.draw(op, case, seed=0, round_index=0, calls=8, device=torch.device("cpu"))
    cap = op.make_inputs(case, 0, torch.device("cpu"))["cap"]
    assert {v["cap"] for v in unit.pool} == {cap}
    assert [edge_logits(v, cap) for v in unit.pool] == [0] * 8
    planted = Unit.draw(replace(op, values_for=None), case, seed=0, round_index=0, calls=8, device=torch.device("cpu"))
    assert sum(edge_logits(v, cap) for v in planted.pool) > 0
    # the values are make_inputs' own wherever the caps agree: same seed, same cap, same tensors
    again = op.values_with(case, 5, torch.device("cpu"), {"cap": op.make_inputs(case, 5, torch.device("cpu"))["cap"]})
    assert torch.equal(again["logits"], op.make_inputs(case, 5, torch.device("cpu"))["logits"])
