"""The per-run overview against issue 16's targets (results/PERFORMANCE-runs.md): regimes, bands,
marks, the one-row case, host cost, on constructed summaries."""

from __future__ import annotations

from kerneltrial.analysis import peer_rows
from kerneltrial.analysis import performance as perf
from kerneltrial.analysis.peer_rows import MET, MISSED, UNKNOWN, UNRESOLVED
from kerneltrial.rundir.summary_doc import ArmFigures, SummaryCase
from kerneltrial.stats import Interval

MIB = 1 << 20


def arm(
    kind: str,
    ns: float | None,
    ci: tuple[float, float] | None = None,
    pct: float | None = None,
    host_ns: float | None = None,
    behind: int = 0,
    status: str = "timed",
) -> ArmFigures:
    return ArmFigures(
        kind=kind, status=status if ns is not None else "not timed", median_ns_per_call=ns, n_samples=21,
        ci_units=21, speedup=None, ci_low=ci[0] if ci else None, ci_high=ci[1] if ci else None, verdict=None,
        gbps=None, pct_of_copy_ceiling=pct, throttled_samples=0, spread=None, messages=[], reason=None,
        host_ns_per_call=host_ns, host_samples=5 if host_ns else 0, host_behind=behind if host_ns else None, fraction_of_floor=None,
    )  # fmt: skip


def case(shape: list[int], nbytes: int, arms: dict[str, ArmFigures], layout: str = "contiguous") -> SummaryCase:
    name = "x".join(map(str, shape)) + f"/{layout}/bfloat16"
    return SummaryCase(
        case=name, shape=shape, layout=layout, dtype="bfloat16", bytes=nbytes, calls=1, rounds=7,
        units_planned=21, injected_delay_ns=None, arms=arms, floor_ns=None,
    )  # fmt: skip


def test_regimes_split_at_4_and_64_mib() -> None:
    assert [peer_rows.regime(n) for n in (0, 4 * MIB - 1, 4 * MIB, 64 * MIB - 1, 64 * MIB, 10**12)] == [
        "small", "small", "mid", "mid", "large", "large",
    ]  # fmt: skip


def test_marks_use_the_band_when_there_is_one() -> None:
    assert peer_rows.mark_at_least(1.10, 1.2) == MET and peer_rows.mark_at_least(1.10, 1.05) == MISSED
    assert peer_rows.mark_at_least(1.10, 1.2, Interval(1.12, 1.3)) == MET
    assert peer_rows.mark_at_least(1.10, 1.2, Interval(1.05, 1.3)) == UNRESOLVED  # straddles: not claimed either way
    assert peer_rows.mark_at_least(1.10, 1.05, Interval(1.0, 1.09)) == MISSED
    assert peer_rows.mark_at_least(1.10, None) == UNKNOWN
    assert peer_rows.mark_at_most(1.15, 1.15) == MET and peer_rows.mark_at_most(1.15, 1.2) == MISSED
    assert peer_rows.mark_at_most(15.0, None) == UNKNOWN


def test_the_fastest_peer_is_the_timed_peer_of_smallest_median_and_its_band_comes_from_both_cis() -> None:
    arms = {
        "control": arm("control", 1000.0),
        "kerneltrial": arm("candidate", 800.0, ci=(1.2, 1.3)),
        "liger": arm("peer", 900.0, ci=(1.0, 1.2)),
        "cheat": arm("peer", 10.0, ci=(90.0, 110.0), status="implausible"),  # no honest median: never the best
        "flaggems": arm("peer", None),
    }
    (row,) = peer_rows.best_peer_rows([case([1, 2048], 8192, arms)])
    assert row.peer == "liger" and row.ratio == 900.0 / 800.0
    assert row.interval == Interval(1.2 / 1.2, 1.3 / 1.0)


def test_the_fastest_peers_band_covers_the_pick_among_peers() -> None:
    """The fastest peer is picked by point median; its band uses every peer's CI (the largest low and
    the largest high), since a slower-looking peer may be the fastest within the noise."""
    arms = {
        "kerneltrial": arm("candidate", 800.0, ci=(1.2, 1.3)),
        "liger": arm("peer", 900.0, ci=(1.0, 1.2)),  # fastest by median
        "flaggems": arm("peer", 950.0, ci=(0.9, 1.25)),  # its CI high is the largest
    }
    (row,) = peer_rows.best_peer_rows([case([1, 2048], 8192, arms)])
    assert row.peer == "liger" and row.interval == Interval(1.2 / 1.25, 1.3 / 1.0)


def test_the_worst_case_mark_reads_every_cases_band() -> None:
    """Planted: the worst point ratio has a tight band above the target, another case a wide band across it."""
    rows = [
        perf.PeerRow("a", "contiguous", MIB, 100.0, "liger", 96.0, None, Interval(0.955, 0.965)),
        perf.PeerRow("b", "contiguous", MIB, 100.0, "liger", 99.0, None, Interval(0.90, 1.08)),
    ]
    assert peer_rows.mark_every_case(0.95, rows) == UNRESOLVED
    assert peer_rows.mark_every_case(0.95, rows[:1]) == MET
    assert (
        peer_rows.mark_every_case(0.95, [*rows, perf.PeerRow("c", "contiguous", MIB, 100.0, "liger", 90.0, None, None)])
        == MISSED
    )


def test_a_case_where_ours_is_not_timed_marks_its_group_missed() -> None:
    """Planted: our entry point failed correctness in one case; leaving that case out would improve every
    figure, so the group is missed and says why."""
    good = {"kerneltrial": arm("candidate", 500.0, ci=(1.5, 1.6)), "liger": arm("peer", 900.0, ci=(0.9, 1.0))}
    failed = {"kerneltrial": arm("candidate", None, status="failed correctness"), "liger": arm("peer", 900.0)}
    cases = [case([1, 2048], MIB, good), case([2, 2048], MIB, failed), case([3, 2048], MIB, failed, "row_strided")]
    rows = perf.device_rows("run", peer_rows.best_peer_rows(cases), peer_rows.untimed_cases(cases))
    assert rows[0][3:] == ["1 (ours not timed: 1)", rows[0][4], MISSED, rows[0][6], MISSED]
    assert rows[1] == ["run", "`row_strided`", "small", "0 (ours not timed: 1)", "–", MISSED, "–", MISSED]


def test_device_rows_separate_layouts_and_regimes() -> None:
    def two(ours: float, peer: float, ci: tuple[float, float], peer_ci: tuple[float, float]) -> dict:
        return {"kerneltrial": arm("candidate", ours, ci=ci), "torch_compile": arm("peer", peer, ci=peer_ci)}

    cases = [
        case([1, 2048], MIB, two(500.0, 600.0, (1.15, 1.25), (0.95, 1.0))),  # small: 1.2 [1.15, 1.316]
        case([4, 2048], 2 * MIB, two(500.0, 550.0, (1.05, 1.15), (0.95, 1.0))),  # small: 1.1 [1.05, 1.21]
        case([4096, 2048], 100 * MIB, two(1000.0, 940.0, (0.9, 0.95), (1.0, 1.02))),  # large: 0.94 [0.882, 0.95]
        case([4096, 2048], 100 * MIB, two(1000.0, 1300.0, (1.3, 1.35), (1.0, 1.01)), layout="row_strided"),
    ]
    rows = perf.device_rows("run", peer_rows.best_peer_rows(cases), peer_rows.untimed_cases(cases))
    assert [row[1:4] for row in rows] == [
        ["`contiguous`", "small", "2"],
        ["`contiguous`", "large", "1"],
        ["`row_strided`", "large", "1"],
    ]
    small, large, strided = rows
    # geomean 1.149 with band [gmean(1.15, 1.05), gmean(1.25/0.95, 1.15/0.95)] = [1.099, 1.262]: straddles 1.10
    assert small[4] == "1.149 [1.099, 1.262]" and small[5] == UNRESOLVED
    assert small[6].startswith("1.100 [1.050, 1.211] (`4x2048/contiguous/bfloat16` vs `torch_compile`)")
    assert small[7] == MET  # the worst case's band is above 0.95
    assert large[5] == MISSED and large[7] == UNRESOLVED  # 0.94 [0.882, 0.950]: the band touches 0.95
    assert strided[4].startswith("1.300") and strided[5] == MET


def test_bandwidth_rows_give_median_and_worst_from_4_mib_up() -> None:
    cases = [
        case([1, 2048], MIB, {"kerneltrial": arm("candidate", 1.0, pct=10.0)}),  # small: not counted
        case([512, 2048], 8 * MIB, {"kerneltrial": arm("candidate", 1.0, pct=60.0)}),
        case([1024, 2048], 16 * MIB, {"kerneltrial": arm("candidate", 1.0, pct=70.0)}),
        case([8192, 2048], 128 * MIB, {"kerneltrial": arm("candidate", 1.0, pct=95.0)}),
    ]
    assert perf.bandwidth_row("run", "contiguous", cases) == [
        "run", "`contiguous`",
        "2", "65.0", "60.0 (`512x2048/contiguous/bfloat16`)",  # mid: median, worst
        "1", "95.0", "95.0 (`8192x2048/contiguous/bfloat16`)",  # large
        MISSED,  # the worst from 4 MiB up is 60% < 80%
        "–", "–", "–",  # no size-matched copies in these runs
    ]  # fmt: skip
    only_large = perf.bandwidth_row("run", "contiguous", cases[3:])
    assert only_large is not None and only_large[2:5] == ["0", "–", "–"] and only_large[8] == MET
    assert perf.bandwidth_row("run", "contiguous", cases[:1]) is None  # nothing from 4 MiB up


def test_bandwidth_rows_judge_each_case_against_the_copy_of_its_own_traffic() -> None:
    def timed(gbps: float, pct: float) -> ArmFigures:
        return arm("candidate", 1.0, pct=pct).model_copy(update={"gbps": gbps})

    cases = [
        case([512, 2048], 8 * MIB, {"kerneltrial": timed(1200.0, 29.0)}).model_copy(
            update={"matched_copy_gbps": 1250.0}
        ),  # 96% of its own copy, 29% of the 1 GiB copy
        case([8192, 2048], 128 * MIB, {"kerneltrial": timed(2800.0, 67.0)}).model_copy(
            update={"matched_copy_gbps": 4000.0}
        ),  # 70% of its own copy: the worst
    ]
    row = perf.bandwidth_row("run", "contiguous", cases)
    assert row is not None
    assert row[8] == MISSED  # 29% of the 1 GiB copy
    assert row[9:] == ["83.0", "70.0 (`8192x2048/contiguous/bfloat16`)", MISSED]
    cases[1] = cases[1].model_copy(update={"matched_copy_gbps": 3000.0})  # 93%: every case at or above 80%
    assert perf.bandwidth_row("run", "contiguous", cases)[9:] == ["94.7", "93.3 (`8192x2048/contiguous/bfloat16`)", MET]


def test_the_one_row_case_is_the_small_case_of_fewest_rows() -> None:
    ours = {"kerneltrial": arm("candidate", 4600.0)}
    cases = [
        case([64, 2048], 512 * 1024, ours),
        case([1, 2048], 8192, ours, layout="row_gate"),
        case([1, 2048], 12288, ours),
        case([1, 2048], 8192, {"kerneltrial": arm("candidate", None)}, layout="row_strided"),  # not timed
    ]
    picked = peer_rows.one_row_case(cases)
    assert picked is not None and picked.case == "1x2048/row_gate/bfloat16"
    assert peer_rows.one_row_case([case([1024, 16384], 64 * MIB, ours)]) is None  # no small case: no claim


def test_host_cost_leaves_out_device_bound_cases() -> None:
    cases = [
        case([1, 2048], 8192, {"kerneltrial": arm("candidate", 1.0, host_ns=12000.0),
                               "torch_eager": arm("peer", 1.0, host_ns=15000.0)}),
        case([64, 2048], MIB, {"kerneltrial": arm("candidate", 1.0, host_ns=16000.0),
                               "torch_eager": arm("peer", 1.0, host_ns=14000.0)}),
        case([65536, 2048], 512 * MIB, {"kerneltrial": arm("candidate", 1.0, host_ns=90000.0, behind=5),
                                        "torch_eager": arm("peer", 1.0, host_ns=95000.0, behind=5)}),
    ]  # fmt: skip
    row = perf.host_row("run", cases)
    # two cases count; ours / eager 0.8 and 1.143: geomean 0.956, worst 1.14 > 1; worst 16 µs > 15
    assert row[:7] == ["run", "2", "14.0 (16.0)", "14.5", "0.96 (1.14)", MISSED, MISSED]
    # torch_eager is the only peer, so the fastest peer's columns repeat its ratios, the worst case named
    assert row[7:] == ["0.96", "1.14 (`64x2048/contiguous/bfloat16` vs `torch_eager`)", MISSED]
    assert perf.host_row("run", cases[2:]) is None  # device-bound only: no host figure


def test_the_fastest_peer_on_the_host_is_the_one_of_least_host_time_not_of_least_device_time() -> None:
    fast_device = arm("peer", 0.5, host_ns=30000.0)  # the fastest on the device, slow to call
    cases = [
        case([1, 2048], 8192, {"kerneltrial": arm("candidate", 1.0, host_ns=12000.0), "sglang": fast_device,
                               "torch_eager": arm("peer", 2.0, host_ns=10000.0),
                               "control": arm("control", 2.0, host_ns=1000.0)}),  # the control is no peer
        case([64, 2048], MIB, {"kerneltrial": arm("candidate", 1.0, host_ns=8000.0), "sglang": fast_device,
                               "torch_eager": arm("peer", 2.0, host_ns=10000.0, behind=5)}),  # device-bound: out
    ]  # fmt: skip
    rows = peer_rows.fastest_host_rows(cases)
    assert [(r.case, r.peer, r.ratio) for r in rows] == [
        ("1x2048/contiguous/bfloat16", "torch_eager", 1.2),
        ("64x2048/contiguous/bfloat16", "sglang", 8000.0 / 30000.0),
    ]
    assert peer_rows.host_cells(rows) == [
        f"{(1.2 * 8 / 30) ** 0.5:.2f}",
        "1.20 (`1x2048/contiguous/bfloat16` vs `torch_eager`)",
        MISSED,
    ]
    assert peer_rows.host_cells(rows[1:])[2] == MET and peer_rows.host_cells([])[2] == "–"
