"""The files of a run directory written after the run: report.md and the figures (derived) and
ERRATA.md (by hand).

None can be in the manifest: `kerneltrial report`, `kerneltrial plot` and people write them after the runner
sealed the directory, and the manifest's own sha256 is pinned elsewhere (receipts and
confirmation links), so it is never rewritten. Each has its own rule instead, part of
`kerneltrial verify`:

- report.md (and a replicate directory's replicates.md) is derived: a function of the directory
  alone (the report's `report_text`, `render`, `suite_markdown`, ...: each kind's verifier passes
  its own as a `Render`). verify renders it again
  and compares the bytes; an edited page, or one rendered by another kerneltrial, fails with the
  first line that differs and the fix (render it again). A page rendered with `--unverified`
  (its titles say UNVERIFIED) is accepted too: it claims less.
- a kernel run's figures (rundir.layout.ADDED_FIGURES: the report's PNGs and `plot`'s size.png;
  no other name may be added) are derived too, from summary.json. A PNG's bytes are a function of
  the figure's data and the matplotlib that drew it, which names itself in the PNG's `Software`
  text: where that is the matplotlib installed here, verify draws the figure again (its verifier
  passes a `FigureRender`) and compares the bytes, titled or UNVERIFIED; a mismatch fails. Where
  it is another version, or none is installed, the figure is not checked, and the check's line
  says so and why. A file that is not a PNG matplotlib wrote fails.
- ERRATA.md is human text, which no machine can check: every page quotes it under a heading
  that says so (report.ERRATA_HEADING), so that it can add words but never a line that reads
  as a measured figure, and verify checks the lines tools read from it: at most one
  `Superseded by: RUN` naming another run directory by its name, and `Reason:` only beside it.
"""

from __future__ import annotations

import importlib.metadata
import io
import re
import struct
from collections.abc import Callable
from pathlib import Path

from kerneltrial.rundir.layout import ERRATA, REPORT_FIGURES, SIZE_PNG
from kerneltrial.rundir.layout import ERRATA_REASON as REASON
from kerneltrial.rundir.layout import ERRATA_SUPERSEDED as SUPERSEDED

Render = Callable[[bool], str]  # unverified -> the page's text
FigureRender = Callable[[str, bool], bytes]  # (figure's file name, unverified) -> the PNG's bytes
# the command that draws each figure a kernel run directory may hold
FIGURE_COMMANDS = {**dict.fromkeys(REPORT_FIGURES, "report"), SIZE_PNG: "plot"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MATPLOTLIB_SOFTWARE = re.compile(r"Matplotlib version(\S+), https://matplotlib\.org/")  # Agg's `Software` text


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


def png_software(data: bytes) -> str | None:
    """The `Software` text of a PNG, read from its chunks before the image data; None when `data`
    is not a PNG or has no such text there."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind in (b"IDAT", b"IEND"):
            return None
        key, _, text = data[at + 8 : at + 8 + length].partition(b"\0")
        if kind == b"tEXt" and key == b"Software":
            return text.decode("latin-1")
        at += 12 + length  # length, type, data, CRC
    return None


def installed_matplotlib() -> str | None:
    """The version of the matplotlib installed here (its metadata: nothing is imported), or None."""
    try:
        return importlib.metadata.version("matplotlib")
    except importlib.metadata.PackageNotFoundError:
        return None


def same_image(recorded: bytes, drawn: bytes) -> bool:
    """Whether two PNGs hold the same pixels and text: the bytes alike, or decoded alike (Pillow,
    matplotlib's own dependency, compresses with the zlib it was built with, so one figure may be
    compressed to other bytes by another Pillow); a PNG Pillow cannot read is not the same."""
    if recorded == drawn:
        return True
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(recorded)) as a, Image.open(io.BytesIO(drawn)) as b:
            return (a.size, a.mode, a.info.get("Software")) == (b.size, b.mode, b.info.get("Software")) and (
                a.tobytes() == b.tobytes()
            )
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return False


def figure_problems(path: Path, render: FigureRender, installed: str | None) -> tuple[list[str] | None, str]:
    """(problems, detail) of a figure of FIGURE_COMMANDS: the PNG `render` draws from the directory
    (titled, else UNVERIFIED), pixel for pixel (`same_image`), where `installed` (this matplotlib's version) is the
    one the PNG names; problems None (not checked, detail says why) where it is another or none."""
    command = f"kerneltrial {FIGURE_COMMANDS[path.name]}"
    again = f"`{command} {path.parent}`"
    data = path.read_bytes()
    drawn_by = MATPLOTLIB_SOFTWARE.fullmatch(png_software(data) or "")
    if drawn_by is None:
        return [
            f"figure {path.name} is not a PNG that matplotlib wrote (no `Software: Matplotlib version...` text "
            f"before its image), so no kerneltrial command made it; remove it, then draw it with {again}"
        ], ""
    version = drawn_by.group(1)
    if version != installed:
        here = f"matplotlib {installed} is installed here" if installed else "matplotlib is not installed here"
        return None, (
            f"not checked: drawn by matplotlib {version}, {here}, and another version draws other bytes; "
            f"verify compares it where matplotlib {version} is installed, or after {again} draws it again here"
        )
    try:
        same = any(same_image(data, render(path.name, unverified)) for unverified in (False, True))
    except ImportError as error:
        return None, f"not checked: matplotlib {installed} is installed here but does not import ({error})"
    if same:
        return [], f"drawn again from summary.json with matplotlib {installed}: the same pixels"
    return [
        f"figure {path.name} does not match the run's data as `{command}` renders it (drawn again from "
        f"summary.json with matplotlib {version}, titled and UNVERIFIED): it was edited, or drawn from other "
        f"data, by another kerneltrial or by a matplotlib {version} built with another FreeType; remove it, "
        f"then draw it again with {again}"
    ], ""


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
