"""Record each test's measured duration for the quick subset: `tests/durations.json`.

    python -m pytest --junitxml=junit.xml        # the whole suite (README's test command)
    python scripts/test_durations.py junit.xml   # rewrites tests/durations.json

tests/conftest.py marks every test recorded at QUICK_LIMIT_S seconds or more `slow`, so
`python -m pytest -m "not slow and not serving"` (the quick subset a developer runs before
each commit) keeps only the tests measured fast. A test not yet recorded counts as quick
until the next full run records it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def node_id(classname: str, name: str) -> str:
    """pytest's node id from a junit testcase (`tests.ops.test_x` + `test_y[p]`), without the
    `@GROUP` that xdist's --dist loadgroup appends to a grouped test's name (as xdist splits it: an
    `@` after the last `]`; collection, where tests/conftest.py reads the file, has no suffix)."""
    if name.rfind("@") > name.rfind("]"):
        name = name[: name.rfind("@")]
    return f"{classname.replace('.', '/')}.py::{name}"


def durations(junit: Path) -> dict[str, float]:
    """Seconds per node id (setup + call + teardown, as junit sums them), rounded to 0.1 s."""
    found: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is None:
            found[node_id(case.get("classname", ""), case.get("name", ""))] = round(float(case.get("time", 0)), 1)
    return dict(sorted(found.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print(f"usage: python scripts/test_durations.py JUNIT.xml (got {argv}); see the module doc", file=sys.stderr)
        return 2
    measured = durations(Path(argv[0]))
    if not measured:
        print(f"{argv[0]} holds no test case that ran; run the whole suite with --junitxml first", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(measured, indent=0) + "\n")
    print(f"{len(measured)} durations written to {OUT.relative_to(OUT.parents[1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
