"""The figures `kerneltrial report` and `plot` add to a kernel run directory (kernel/derived.py):
verify draws each again and compares the decoded image, fails a difference where this matplotlib
drew it and warns where another did, fails a file too large, undecodable or that cannot be drawn
again (never a traceback), and `report` and `plot` replace a failing figure instead of refusing."""

from __future__ import annotations

import io
import os
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
        name: f"figure {name}: not a PNG that matplotlib wrote (no `Software: Matplotlib version...` text "
        f"before its image), so no kerneltrial command made it; remove it, then draw it again with "
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


def _doctor(path: Path) -> None:
    """A black bar painted over the figure at `path`, written back by matplotlib (its Software text kept)."""
    pixels = matplotlib.image.imread(path)
    pixels[10:20, 10:40, :3] = 0.0
    matplotlib.image.imsave(path, pixels)


def _png(width: int, height: int, software: bytes = b"Matplotlib version" + INSTALLED.encode()) -> bytes:
    """A PNG matplotlib could have named itself in, claiming `width` x `height` RGBA pixels over a few bytes of data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    text = b"Software\0" + software + b", https://matplotlib.org/"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"tEXt", text)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_plot_replaces_a_doctored_figure_that_verify_still_fails(figured: Path, tmp_path: Path) -> None:
    """A figure is derived data: `plot` draws a doctored one again from the raw rows and says so;
    verify, the independent judge, keeps failing the directory until then."""
    run = _copy(figured, tmp_path, keep=(SIZE_PNG, SPEEDUP_PNG))
    _doctor(run / SIZE_PNG)
    _doctor(run / SPEEDUP_PNG)
    judged = run_cli("verify", run)
    assert judged.exit_code == 1 and set(_failed(run)) == {SIZE_PNG, SPEEDUP_PNG}
    done = run_cli("plot", run)
    assert done.exit_code == 0, done.output
    for name in (SIZE_PNG, SPEEDUP_PNG):
        assert f"replaced {run / name}: it did not match the raw rows" in done.stderr
    assert f"wrote {run / SIZE_PNG}" in done.stdout
    result = verify_run_dir(run)
    assert result.ok and _checks(result) == dict.fromkeys((SPEEDUP_PNG, SIZE_PNG), (True, True, SAME))


def test_report_replaces_a_doctored_figure(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(VERDICTS_PNG,))
    _doctor(run / VERDICTS_PNG)
    done = run_cli("report", run)
    assert done.exit_code == 0, done.output
    assert f"replaced {run / VERDICTS_PNG}: it did not match the raw rows" in done.stderr
    assert (run / VERDICTS_PNG).read_bytes() == (figured / VERDICTS_PNG).read_bytes()


def test_plot_replaces_nothing_in_a_run_that_fails_otherwise(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(SIZE_PNG,))
    _doctor(run / SIZE_PNG)
    doctored = (run / SIZE_PNG).read_bytes()
    (run / "ERRATA.md").write_text("Superseded by: ../elsewhere\n")  # a failed check no command redraws
    done = run_cli("plot", run)
    assert done.exit_code == 1 and "replaced" not in done.output
    assert "1 check(s) failed: ERRATA.md" in " ".join(done.output.split())
    assert (run / SIZE_PNG).read_bytes() == doctored


def test_a_doctored_figure_still_stops_compare(figured: Path, tmp_path: Path) -> None:
    """Only the commands that draw figures replace them; the others refuse the run and name it."""
    run = _copy(figured, tmp_path, keep=(SIZE_PNG,))
    _doctor(run / SIZE_PNG)
    done = run_cli("compare", run, figured)
    assert done.exit_code == 1 and "size.png (figure size.png does not match" in " ".join(done.output.split())


def _another_version(path: Path) -> None:
    path.write_bytes(_with_software(path.read_bytes(), b"Matplotlib version3.9.0, https://matplotlib.org/"))


def test_a_figure_naming_another_matplotlib_with_the_same_pixels_passes(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(VERDICTS_PNG,))
    _another_version(run / VERDICTS_PNG)
    assert _checks(verify_run_dir(run)) == {
        VERDICTS_PNG: (
            True,
            True,
            f"drawn by matplotlib 3.9.0, drawn again from summary.json with matplotlib {INSTALLED}: the same pixels",
        )
    }


def test_a_forged_version_does_not_make_a_doctored_figure_pass(figured: Path, tmp_path: Path) -> None:
    """Another version's pixels may differ: not compared, a warning line, never counted as passed."""
    run = _copy(figured, tmp_path, keep=(VERDICTS_PNG,))
    _doctor(run / VERDICTS_PNG)
    _another_version(run / VERDICTS_PNG)
    ((ok, applicable, detail),) = _checks(verify_run_dir(run)).values()
    warning = f"figure verdicts.png: drawn by matplotlib 3.9.0, this install matplotlib {INSTALLED}: not compared"
    assert ok and not applicable and detail.startswith(warning + " (")
    done = run_cli("verify", run)
    assert done.exit_code == 0  # a warning: the run's measurements verify, this figure is no evidence
    lines = [" ".join(line.split()) for line in done.output.splitlines()]
    assert f"warn verdicts.png: {warning}" in " ".join(done.output.split())
    assert not any(line.startswith(("ok verdicts.png", "n/a verdicts.png")) for line in lines)
    assert "1 warning: a figure not compared" in lines[-1]
    render = kernel_figures(run)
    assert derived.figure_problems(run / VERDICTS_PNG, render, None)[1].startswith(
        "figure verdicts.png: drawn by matplotlib 3.9.0, this install has no matplotlib: not compared ("
    )


def test_an_oversized_figure_is_refused_unread(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(SPEEDUP_PNG,))
    os.truncate(run / SPEEDUP_PNG, 300_000_000)  # sparse: no disk written
    assert _failed(run) == {
        SPEEDUP_PNG: f"figure speedup.png: 300000000 bytes, above the limit {derived.FIGURE_MAX_BYTES} bytes; "
        f"remove it, then draw it again with `kerneltrial report {run}`"
    }


@pytest.mark.parametrize(
    ("width", "height", "error"),
    [
        (9000, 8000, f"9000 x 8000 pixels, above the limit {derived.FIGURE_MAX_PIXELS} pixels"),  # never decoded
        (20000, 20000, "cannot be decoded: DecompressionBombError: Image size (400000000 pixels) exceeds limit"),
    ],  # the second: Pillow's own guard, as the file is opened
)
def test_a_decompression_bomb_is_a_failed_check(
    figured: Path, tmp_path: Path, width: int, height: int, error: str
) -> None:
    run = _copy(figured, tmp_path, keep=(CEILING_PNG,))
    (run / CEILING_PNG).write_bytes(_png(width, height))
    detail = _failed(run)[CEILING_PNG]
    assert detail.startswith(f"figure ceiling.png: {error}")
    assert detail.endswith(f"remove it, then draw it again with `kerneltrial report {run}`")


def test_a_corrupt_png_is_a_failed_check(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(SPEEDUP_PNG,))
    data = (run / SPEEDUP_PNG).read_bytes()
    (run / SPEEDUP_PNG).write_bytes(data[: len(data) // 2])  # its image data cut short
    detail = _failed(run)[SPEEDUP_PNG]
    assert detail.startswith("figure speedup.png: cannot be decoded: OSError: ")
    assert detail.endswith(f"remove it, then draw it again with `kerneltrial report {run}`")


def test_a_figure_that_cannot_be_drawn_again_is_a_failed_check(figured: Path, tmp_path: Path) -> None:
    run = _copy(figured, tmp_path, keep=(SPEEDUP_PNG,))

    def broken(name: str, unverified: bool) -> bytes:
        raise ValueError("Axis limits cannot be NaN or Inf")

    problems, _ = derived.figure_problems(run / SPEEDUP_PNG, broken, INSTALLED)
    assert problems == [
        "figure speedup.png: cannot be drawn again from summary.json here (ValueError: Axis limits cannot be "
        f"NaN or Inf); remove it, then draw it again with `kerneltrial report {run}`"
    ]
