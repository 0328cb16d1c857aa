"""The PERFORMANCE.md overview: our entry point against the fastest timed peer, per case."""

from kerneltrial.analysis.report import best_peer_rows


def entry(kind, ns):
    return {"kind": kind, "median_ns_per_call": ns, "pct_of_copy_ceiling": 50.0}


def test_best_peer_is_the_fastest_timed_peer():
    summary = {
        "cases": [
            {
                "case": "a",
                "arms": {
                    "control": entry("control", 10.0),
                    "kerneltrial": entry("candidate", 8.0),
                    "torch_compile": entry("peer", 12.0),
                    "liger": entry("peer", 9.0),
                    "flaggems": {"kind": "peer", "median_ns_per_call": None},
                },
            },
            {"case": "b", "arms": {"control": entry("control", 10.0), "kerneltrial": entry("candidate", 10.0)}},
        ]
    }
    rows = best_peer_rows(summary)
    assert len(rows) == 1  # case b has no timed peer
    assert rows[0]["peer"] == "liger" and rows[0]["ratio"] == 9.0 / 8.0
