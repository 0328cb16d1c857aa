"""The figures `kerneltrial report` and `plot` add to a kernel run directory (kernel/derived.py):
verify draws each again and compares the bytes where this matplotlib drew it, and says plainly
where it cannot (another matplotlib, none, or one that does not import)."""

from __future__ import annotations

import io
import shutil
import struct
import zlib
from pathlib import Path

import matplotlib
import matplotlib.image
import pytest
from rundir_factory import RunSpec, default_per_call, write_checked_run

from kerneltrial.kernel import derived
from kerneltrial.kernel.plots import FIGURES, plot_against_size, plot_speedups
from kerneltrial.kernel.report import write_report
from kerneltrial.kernel.verify import verify_run_dir
from kerneltrial.kernel.verify.run import kernel_figures
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.layout import ADDED_FIGURES, CEILING_PNG, SIZE_PNG, SPEEDUP_PNG, VERDICTS_PNG
from kerneltrial.rundir.summary_doc import read_summary
from tests.kt import run_cli

INSTALLED = matplotlib.__version__
SAME = f"drawn again from summary.json with matplotlib {INSTALLED}: the same pixels"


@pytest.fixture(scope="module")
def figured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sealed run of the timed-check contract with report.md, the report's three PNGs and size.png."""
    run = write_checked_run(tmp_path_factory.mktemp("figured") / "run")
    write_report(run)
    plot_against_size(read_summary(run), run / SIZE_PNG)
    return run


def _copy(figured: Path, tmp_path: Path, keep: tuple[str, ...] = ()) -> Path:
    """A copy of the figured run holding only the figures `keep` (each figure checked costs a rendering)."""
    run = Path(shutil.copytree(figured, tmp_path / "run"))
    for name in set(ADDED_FIGURES) - set(keep):
        (run / name).unlink()
    return run


def _checks(result: VerifyResult) -> dict[str, tuple[bool, bool, str]]:
    """{check name: (ok, applicable, detail)} of the figure checks of a verify result."""
    return {c.name: (c.ok, c.applicable, c.detail) for c in result.checks if c.name in ADDED_FIGURES}


def _with_software(data: bytes, software: bytes) -> bytes:
    """The PNG `data` with its `Software` text replaced by `software` (the chunk's CRC recomputed)."""
    at = 8
    while True:
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind == b"tEXt" and data[at + 8 : at + 8 + length].startswith(b"Software\0"):
            body = b"Software\0" + software
            chunk = struct.pack(">I4s", len(body), kind) + body + struct.pack(">I", zlib.crc32(kind + body))
            return data[:at] + chunk + data[at + 12 + length :]
        at += 12 + length


def test_honest_figures_verify(figured: Path, tmp_path: Path) -> None:
    result = verify_run_dir(_copy(figured, tmp_path, keep=ADDED_FIGURES))
    assert result.ok and _checks(result) == dict.fromkeys(ADDED_FIGURES, (True, True, SAME))


def test_a_figure_titled_unverified_is_accepted(figured: Path, tmp_path: Path) -> None:
    """Like the page: a figure drawn with `--unverified` says so in its title and claims less."""
    run = _copy(figured, tmp_path, keep=(SPEEDUP_PNG,))
    plot_speedups(read_summary(run), run / SPEEDUP_PNG, unverified=True)
    assert (run / SPEEDUP_PNG).read_bytes() != (figured / SPEEDUP_PNG).read_bytes()
    result = verify_run_dir(run)
    assert result.ok and _checks(result) == {SPEEDUP_PNG: (True, True, SAME)}


def test_a_run_without_figures_lists_one_line(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path)
    (check,) = [c for c in verify_run_dir(run).checks if c.name == "figures added"]
    assert check.ok and not check.applicable
    assert check.detail == "not applicable: no speedup.png, verdicts.png, ceiling.png, size.png in this directory"


def _failed(run: Path) -> dict[str, str]:
    return {c.name: c.detail for c in verify_run_dir(run).failures}


def test_a_doctored_figure_fails_naming_it_and_the_fix(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(SPEEDUP_PNG,))
    pixels = matplotlib.image.imread(run / SPEEDUP_PNG)
    pixels[10:20, 10:40, :3] = 0.0  # a black bar painted over the figure; matplotlib writes it back
    matplotlib.image.imsave(run / SPEEDUP_PNG, pixels)
    assert _failed(run) == {
        SPEEDUP_PNG: f"figure speedup.png does not match the run's data as `kerneltrial report` renders it (drawn "
        f"again from summary.json with matplotlib {INSTALLED}, titled and UNVERIFIED): it was edited, or drawn "
        f"from other data, by another kerneltrial or by a matplotlib {INSTALLED} built with another FreeType; "
        f"remove it, then draw it again with `kerneltrial report {run}`"
    }


def test_a_figure_compressed_otherwise_with_its_pixels_and_text_passes(figured: Path, tmp_path: Path) -> None:
    """Another Pillow (its zlib) compresses the same figure to other bytes: what is compared is the image."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    run = _copy(figured, tmp_path, keep=(SPEEDUP_PNG,))
    with Image.open(run / SPEEDUP_PNG) as image:
        image.load()
    info = PngInfo()
    info.add_text("Software", image.info["Software"])
    before = (run / SPEEDUP_PNG).read_bytes()
    image.save(run / SPEEDUP_PNG, pnginfo=info, compress_level=1)
    assert (run / SPEEDUP_PNG).read_bytes() != before
    assert _checks(verify_run_dir(run)) == {SPEEDUP_PNG: (True, True, SAME)}


def test_another_runs_figure_swapped_in_fails(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(SIZE_PNG,))
    other = write_checked_run(tmp_path / "other", RunSpec(per_call=lambda c, a, s, r: default_per_call(c, a, s, r) * 2))
    shutil.copy(plot_against_size(read_summary(other), other / SIZE_PNG), run / SIZE_PNG)
    detail = _failed(run)[SIZE_PNG]
    assert detail.startswith("figure size.png does not match the run's data as `kerneltrial plot` renders it")
    assert detail.endswith(f"remove it, then draw it again with `kerneltrial plot {run}`")


def test_a_figure_of_another_matplotlib_is_passed_but_said_not_checked(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(VERDICTS_PNG,))
    path = run / VERDICTS_PNG
    path.write_bytes(_with_software(path.read_bytes(), b"Matplotlib version3.9.0, https://matplotlib.org/"))
    not_checked = (
        f"not checked: drawn by matplotlib 3.9.0, matplotlib {INSTALLED} is installed here, and another version "
        f"draws other bytes; verify compares it where matplotlib 3.9.0 is installed, or after "
        f"`kerneltrial report {run}` draws it again here"
    )
    assert _checks(verify_run_dir(run)) == {VERDICTS_PNG: (True, False, not_checked)}
    done = run_cli("verify", run)
    assert done.exit_code == 0 and f"n/a verdicts.png: {not_checked}" in " ".join(done.output.split())
    render = kernel_figures(run)
    assert derived.figure_problems(path, render, None)[1].startswith(
        "not checked: drawn by matplotlib 3.9.0, matplotlib is not installed here,"
    )


def test_a_matplotlib_that_does_not_import_is_said(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(CEILING_PNG,))

    def broken(name: str, unverified: bool) -> bytes:
        raise ImportError("libfreetype.so.6: cannot open shared object file")

    assert derived.figure_problems(run / CEILING_PNG, broken, INSTALLED) == (
        None,
        f"not checked: matplotlib {INSTALLED} is installed here but does not import "
        "(libfreetype.so.6: cannot open shared object file)",
    )


def test_a_figure_no_kerneltrial_command_made_fails(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(CEILING_PNG, SPEEDUP_PNG))
    (run / CEILING_PNG).write_bytes(b"GIF89a a GIF under a PNG's name")
    speedup = run / SPEEDUP_PNG
    speedup.write_bytes(_with_software(speedup.read_bytes(), b"GIMP 2.10.36"))
    assert _failed(run) == {
        name: f"figure {name} is not a PNG that matplotlib wrote (no `Software: Matplotlib version...` text "
        f"before its image), so no kerneltrial command made it; remove it, then draw it with "
        f"`kerneltrial report {run}`"
        for name in (CEILING_PNG, SPEEDUP_PNG)
    }


def test_the_environments_matplotlibrc_does_not_reach_the_png(figured: Path) -> None:
    summary = read_summary(figured)
    plain, styled = io.BytesIO(), io.BytesIO()
    FIGURES[VERDICTS_PNG](summary, plain, False)
    with matplotlib.rc_context({"font.size": 20.0, "patch.linewidth": 3.0, "axes.grid": True}):
        FIGURES[VERDICTS_PNG](summary, styled, False)
        assert matplotlib.rcParams["font.size"] == 20.0  # the caller's style is back after drawing
    assert plain.getvalue() == styled.getvalue() == (figured / VERDICTS_PNG).read_bytes()


def test_every_figure_a_command_adds_has_a_renderer_and_a_command() -> None:
    assert set(FIGURES) == set(derived.FIGURE_COMMANDS) == set(ADDED_FIGURES)
    assert derived.png_software(b"\x89PNG\r\n\x1a\n") is None and derived.png_software(b"not a png") is None
