"""The PERFORMANCE.md overview: our entry point against the fastest timed peer, per case."""

from kerneltrial.analysis.peer_rows import best_peer_rows
from kerneltrial.rundir.summary_doc import ArmFigures, SummaryCase


def entry(kind: str, ns: float | None) -> ArmFigures:
    timed = ns is not None
    return ArmFigures(
        kind=kind,
        status="timed" if timed else "not timed",
        median_ns_per_call=ns,
        n_samples=21 if timed else 0,
        ci_units=None,
        speedup=None,
        ci_low=None,
        ci_high=None,
        verdict=None,
        gbps=None,
        pct_of_copy_ceiling=50.0 if timed else None,
        host_ns_per_call=None,
        host_samples=0,
        host_behind=None,
        fraction_of_floor=None,
        throttled_samples=0,
        spread=None,
        messages=[],
        reason=None if timed else "not installed",
    )


def case(name: str, arms: dict[str, ArmFigures]) -> SummaryCase:
    return SummaryCase(
        case=name, shape=[1, 2], layout="contiguous", dtype="bfloat16", bytes=8, calls=1, rounds=7,
        units_planned=21, injected_delay_ns=None, arms=arms, floor_ns=None,
    )  # fmt: skip


def test_best_peer_is_the_fastest_timed_peer():
    cases = [
        case(
            "a",
            {
                "control": entry("control", 10.0),
                "kerneltrial": entry("candidate", 8.0),
                "torch_compile": entry("peer", 12.0),
                "liger": entry("peer", 9.0),
                "flaggems": entry("peer", None),
            },
        ),
        case("b", {"control": entry("control", 10.0), "kerneltrial": entry("candidate", 10.0)}),
    ]
    rows = best_peer_rows(cases)
    assert len(rows) == 1  # case b has no timed peer
    assert rows[0].peer == "liger" and rows[0].ratio == 9.0 / 8.0 and rows[0].pct == 50.0
