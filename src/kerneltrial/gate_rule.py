"""The grammar of a protocol's decision gate: `no_loss`, `geomean>=X`, or both joined by ` and `.

Apart from stats.py (which judges an arm against a parsed gate) so that a protocol
is validated without numpy or scipy: `run` refuses a bad protocol before any heavy import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    """A parsed gate rule: `no_loss`, `geomean>=X`, or both joined by ` and `."""

    rule: str
    no_loss: bool
    min_geomean: float | None


_GEOMEAN_TERM = re.compile(r"geomean>=(\d+(?:\.\d+)?)")


def parse_gate(rule: str) -> Gate:
    """Parse a preregistered gate: `no_loss`, `geomean>=X`, or both joined by ` and `."""
    fix = "use 'no_loss', 'geomean>=X' (e.g. 'geomean>=1.02'), or both joined by ' and '"
    no_loss = False
    min_geomean: float | None = None
    terms = [term.strip() for term in rule.split(" and ")]
    if len(terms) != len(set(terms)):
        raise ValueError(f"gate {rule!r} repeats a term; {fix}")
    for term in terms:
        match = _GEOMEAN_TERM.fullmatch(term)
        if term == "no_loss":
            no_loss = True
        elif match and min_geomean is None and float(match.group(1)) > 0:
            min_geomean = float(match.group(1))
        else:
            raise ValueError(f"unknown gate term {term!r} in gate {rule!r}; {fix}")
    return Gate(rule=rule, no_loss=no_loss, min_geomean=min_geomean)
