"""The files of a run directory written after the run: report.md (derived) and ERRATA.md (by hand).

Neither can be in the manifest: `kerneltrial report` and people write them after the runner
sealed the directory, and the manifest's own sha256 is pinned elsewhere (receipts and
confirmation links), so it is never rewritten. Each has its own rule instead, part of
`kerneltrial verify`:

- report.md (and a replicate directory's replicates.md) is derived: a function of the directory
  alone (the report's `report_text`, `render`, `suite_markdown`, ...: each kind's verifier passes
  its own as a `Render`). verify renders it again
  and compares the bytes; an edited page, or one rendered by another kerneltrial, fails with the
  first line that differs and the fix (render it again). A page rendered with `--unverified`
  (its titles say UNVERIFIED) is accepted too: it claims less. The PNG figures are not compared
  (their bytes depend on matplotlib and fonts): only the report's own figure names may be added.
- ERRATA.md is human text, which no machine can check: every page quotes it under a heading
  that says so (report.ERRATA_HEADING), so that it can add words but never a line that reads
  as a measured figure, and verify checks the lines tools read from it: at most one
  `Superseded by: RUN` naming another run directory by its name, and `Reason:` only beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kerneltrial.rundir.layout import ERRATA
from kerneltrial.rundir.layout import ERRATA_REASON as REASON
from kerneltrial.rundir.layout import ERRATA_SUPERSEDED as SUPERSEDED

Render = Callable[[bool], str]  # unverified -> the page's text


def _first_difference(recorded: str, rendered: str) -> str:
    old, new = recorded.splitlines(), rendered.splitlines()
    for number, (a, b) in enumerate(zip(old, new, strict=False), 1):
        if a != b:
            return f"line {number} reads {a[:80]!r}, the rendering {b[:80]!r}"
    longer = "the file" if len(old) > len(new) else "the rendering"
    return f"{longer} has {abs(len(old) - len(new))} more line(s) after line {min(len(old), len(new))}"


def derived_problems(path: Path, render: Render) -> list[str] | None:
    """`path` against its rendering from the directory (verified or `--unverified`); None when
    the directory has no such file (nothing was rendered)."""
    if not path.is_file():
        return None
    try:
        recorded = path.read_text()
    except UnicodeDecodeError as error:
        return [f"{path.name} is not UTF-8 text ({error})"]
    plain, unverified = render(False), render(True)
    if recorded in (plain, unverified):
        return []
    # the difference from the rendering whose title it has
    rendered = unverified if recorded.partition("\n")[0] == unverified.partition("\n")[0] else plain
    return [
        f"{path.name} is not what `kerneltrial report` renders from this directory ({_first_difference(recorded, rendered)}): "
        f"it was edited after it was rendered, or rendered by another kerneltrial or before ERRATA.md changed; "
        f"render it again with `kerneltrial report {path.parent}`"
    ]


def errata_problems(run_dir: Path) -> list[str] | None:
    """The lines tools read from ERRATA.md, well formed; None when the run has none."""
    path = Path(run_dir) / ERRATA
    if not path.is_file():
        return None
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as error:
        return [f"{ERRATA} is not UTF-8 text ({error})"]
    successors = [line[len(SUPERSEDED) :].strip().strip("`") for line in lines if line.startswith(SUPERSEDED)]
    reasons = [line for line in lines if line.startswith(REASON)]
    problems = []
    if len(successors) > 1:
        problems.append(f"{ERRATA} has {len(successors)} `{SUPERSEDED}` lines; a run has one successor")
    for name in successors:
        if not name or "/" in name or "\\" in name or name in (".", "..") or name == Path(run_dir).name:
            problems.append(
                f"{ERRATA} `{SUPERSEDED} {name}` must name another run directory by its name (no path, not itself)"
            )
    if len(reasons) > 1 or (reasons and not successors):
        problems.append(f"{ERRATA}: one `{REASON}` line, and only beside a `{SUPERSEDED}` line (the reason it retires)")
    return problems
