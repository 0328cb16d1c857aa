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
  no other name may be added) are derived too, from summary.json. verify draws each again (its
  verifier passes a `FigureRender`), titled and UNVERIFIED, and compares the decoded images
  (`same_image`: pixels, size, mode). The matplotlib that drew a PNG names itself in its `Software`
  text: where that is the one installed here, a difference fails; where it is another version, the
  same pixels pass and a difference is a warning, `figure X: drawn by matplotlib A, this install
  matplotlib B: not compared` (not applicable: never passed, and a forged version cannot make a
  doctored figure pass silently). A file above FIGURE_MAX_BYTES (never read whole), one claiming
  above FIGURE_MAX_PIXELS (never decoded), one that is not a PNG matplotlib wrote, one Pillow
  cannot decode, or one that cannot be drawn again, fails. `report` and `plot` replace a figure
  that fails (cli/analysis.py); verify keeps failing it until then.
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
import warnings
from collections.abc import Callable
from dataclasses import dataclass
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
FIGURE_MAX_BYTES = 20_000_000  # a larger figure file is refused unread (kerneltrial's are well under 1 MB)
FIGURE_MAX_PIXELS = 2**16 * 1_000  # a PNG claiming more is not decoded: Agg draws under 2^16 a side, ours < 1,000 tall


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


class FigureError(Exception):
    """A figure file that verify cannot compare and fails; the message names the bad value (the
    caller adds the figure's name and the fix)."""


@dataclass(frozen=True)
class DecodedPng:
    """A PNG's image as Pillow decodes it: what two figures must share to be the same figure."""

    size: tuple[int, int]
    mode: str
    pixels: bytes


def read_figure(path: Path) -> bytes:
    """The bytes of a figure file, never more than FIGURE_MAX_BYTES read; FigureError naming its
    size for a larger file (a figure kerneltrial draws is well under 1 MB)."""
    try:
        size = path.stat().st_size
        if size <= FIGURE_MAX_BYTES:
            with path.open("rb") as file:
                data = file.read(FIGURE_MAX_BYTES + 1)  # a file grown since its stat is still bounded
            size = len(data)
            if size <= FIGURE_MAX_BYTES:
                return data
    except OSError as error:
        raise FigureError(f"cannot be read: {error}") from error
    raise FigureError(f"{size} bytes, above the limit {FIGURE_MAX_BYTES} bytes")


def decode_png(data: bytes) -> DecodedPng:
    """The image of PNG `data`, decoded by Pillow (matplotlib's own dependency) only where its header
    claims at most FIGURE_MAX_PIXELS pixels, under Pillow's decompression-bomb guard raised to an
    error; FigureError for whatever Pillow cannot decode. ImportError where Pillow does not import."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
                width, height = image.size
                if width * height > FIGURE_MAX_PIXELS:
                    raise FigureError(f"{width} x {height} pixels, above the limit {FIGURE_MAX_PIXELS} pixels")
                return DecodedPng(image.size, image.mode, image.tobytes())
    except FigureError:
        raise
    except Exception as error:  # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError, zlib.error, ...
        raise FigureError(f"cannot be decoded: {type(error).__name__}: {error}") from error


def same_image(recorded: DecodedPng, drawn: DecodedPng) -> bool:
    """The one rule two figures are compared by: the same decoded pixels, size and mode (another
    Pillow's zlib compresses one figure to other bytes; the `Software` text is the drawing version's,
    which figure_problems reads to tell what a difference means)."""
    return recorded == drawn


def _recorded_figure(path: Path) -> tuple[str, DecodedPng]:
    """(the matplotlib version its `Software` text names, its image) of a figure file; FigureError
    for a file too large, not a PNG matplotlib wrote, or one that cannot be decoded."""
    data = read_figure(path)
    drawn_by = MATPLOTLIB_SOFTWARE.fullmatch(png_software(data) or "")
    if drawn_by is None:
        raise FigureError(
            "not a PNG that matplotlib wrote (no `Software: Matplotlib version...` text before its image), "
            "so no kerneltrial command made it"
        )
    return drawn_by.group(1), decode_png(data)


def _not_compared(name: str, version: str, here: str, again: str, why: str) -> str:
    """The warning line of a figure another matplotlib drew that verify could not compare."""
    return (
        f"figure {name}: drawn by matplotlib {version}, this install {here}: not compared ({why}; it is no "
        f"evidence until verify compares it where matplotlib {version} is installed, or after {again} draws "
        f"it again here)"
    )


def figure_problems(path: Path, render: FigureRender, installed: str | None) -> tuple[list[str] | None, str]:
    """(problems, detail) of a figure of FIGURE_COMMANDS against the PNGs `render` draws from the
    directory (titled, else UNVERIFIED), by `same_image`. Where the PNG names `installed` (this
    matplotlib's version), a difference fails; where it names another, the same pixels pass and a
    difference is not compared (problems None, a warning: another version may draw other pixels).
    A file too large, not a PNG matplotlib wrote, undecodable, or that cannot be drawn again, fails."""
    command = f"kerneltrial {FIGURE_COMMANDS[path.name]}"
    again = f"`{command} {path.parent}`"
    fix = f"remove it, then draw it again with {again}"
    try:
        version, recorded = _recorded_figure(path)
    except FigureError as error:
        return [f"figure {path.name}: {error}; {fix}"], ""
    except ImportError as error:
        return None, f"not checked: Pillow, which decodes the figure, does not import here ({error})"
    if installed is None:
        return None, _not_compared(path.name, version, "has no matplotlib", again, "it cannot be drawn again here")
    try:
        same = any(same_image(recorded, decode_png(render(path.name, unverified))) for unverified in (False, True))
    except ImportError as error:
        return None, f"not checked: matplotlib {installed} is installed here but does not import ({error})"
    except Exception as error:  # the drawing raised (matplotlib, the summary): this figure's failure, not verify's
        return [
            f"figure {path.name}: cannot be drawn again from summary.json here ({type(error).__name__}: {error}); {fix}"
        ], ""
    if same:
        by = "" if version == installed else f"drawn by matplotlib {version}, "
        return [], f"{by}drawn again from summary.json with matplotlib {installed}: the same pixels"
    if version != installed:
        why = "drawn again here, its pixels differ, as another version's may"
        return None, _not_compared(path.name, version, f"matplotlib {installed}", again, why)
    return [
        f"figure {path.name} does not match the run's data as `{command}` renders it (drawn again from "
        f"summary.json with matplotlib {version}, titled and UNVERIFIED): it was edited, or drawn from other "
        f"data, by another kerneltrial or by a matplotlib {version} built with another FreeType; {fix}"
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
