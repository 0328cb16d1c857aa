"""What every published page says about its verification.

`kerneltrial report`, `compare` and `performance` render a run only after the independent
verification passed (cli/analysis.py runs it and refuses a run that fails, exit 1). With
`--unverified` they render anyway, and every page they write says so in its title: the one
mark below, so that no page of an unverified run can be mistaken for a verified one.
"""

from __future__ import annotations

UNVERIFIED = "UNVERIFIED"
UNVERIFIED_NOTE = "rendered with --unverified: `kerneltrial verify` was not required to pass"


def titled(text: str, unverified: bool) -> str:
    """`text`, a page's or figure's title, with the unverified mark when `unverified`."""
    return f"{text} ({UNVERIFIED}: {UNVERIFIED_NOTE})" if unverified else text
