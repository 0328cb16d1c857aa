"""Submission archives: the layout the target expects, built byte for byte reproducibly, and
the static inspection that re-checks an archive without importing anything from it.

Layout: one Python module at the top level under its own name, whose top-level function
named after the operator is the entry point; the data files it reads beside it; nothing else.
"""

from __future__ import annotations

import ast
import io
import re
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

from kerneltrial.submission.codecheck import entry_name_problem, source_problem
from kerneltrial.submission.interface import mismatch, module_constants, params_of_def
from kerneltrial.submission.receipt import FileRecord, Receipt

# A kernel module is tens of KB (the largest in kerneltrial/ops is 27 KB), a dispatch rule a few
# KB: these limits leave two orders of magnitude of room, and keep a hostile archive (a zip bomb,
# thousands of entries) from exhausting memory while it is inspected. Sizes are uncompressed.
MAX_ENTRIES = 32
MAX_ENTRY_BYTES = 4 << 20
MAX_TOTAL_BYTES = 16 << 20
# Every entry's timestamp: the earliest a ZIP can hold, so the same files always give the same bytes.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644  # a regular file, rw-r--r--
# What a data file may be: text formats a module reads. Anything else (.pyc, .so, .pyd, .pth, a
# zip) could be imported or executed beside the one inspected module, so it is refused.
DATA_SUFFIXES = (".toml", ".json", ".txt", ".md", ".csv")


class Rejected(Exception):
    """An archive the target would refuse or kerneltrial cannot vouch for; one line of reason."""


def build(files: Mapping[str, bytes]) -> bytes:
    """The archive of `files` (name -> bytes): sorted entries, fixed times and modes, stored
    uncompressed (no compressor version can change the bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.create_system = 3  # Unix, so FILE_MODE is read as a mode everywhere
            info.external_attr = FILE_MODE << 16
            info.compress_type = zipfile.ZIP_STORED
            archive.writestr(info, files[name])
    return buffer.getvalue()


@dataclass(frozen=True)
class Inspection:
    """An accepted archive: its operator, module, files and digest."""

    op: str
    module: str
    files: tuple[FileRecord, ...]
    archive: FileRecord


def _entry_problem(info: zipfile.ZipInfo) -> str:
    name = info.orig_filename
    mode = info.external_attr >> 16
    if "\0" in name or "\\" in name:
        return f"entry {name!r} has a NUL or backslash in its name; archive paths use '/' only"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return f"entry {name!r} is an absolute path; every entry sits at the top level"
    if ".." in name.split("/"):
        return f"entry {name!r} climbs out of the archive (path traversal with '..')"
    if stat.S_ISLNK(mode):
        return f"entry {name!r} is a symbolic link; pack the file itself"
    if info.is_dir() or stat.S_ISDIR(mode):
        return f"entry {name!r} is a directory; the layout is flat: the module and its data files at the top level"
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: no file type recorded (Python's writestr, Windows tools)
        return f"entry {name!r} is not a regular file (mode {oct(mode)})"
    if "/" in name:
        return f"entry {name!r} is not at the top level; the layout is flat: the module and its data files beside it"
    if info.flag_bits & 0x1:
        return f"entry {name!r} is encrypted"
    if info.file_size > MAX_ENTRY_BYTES:
        return f"entry {name!r} holds {info.file_size} bytes; at most {MAX_ENTRY_BYTES} per entry"
    return ""


def read_entries(data: bytes) -> dict[str, bytes]:
    """Every entry's bytes, after refusing anything but a flat set of small regular files."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise Rejected(f"not a ZIP archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise Rejected(f"{len(infos)} entries; at most {MAX_ENTRIES}: the module and its data files")
        seen: set[str] = set()
        for info in infos:
            problem = _entry_problem(info)
            if problem:
                raise Rejected(problem)
            if info.orig_filename in seen:
                raise Rejected(f"entry {info.orig_filename!r} appears twice; which one is unpacked depends on the tool")
            seen.add(info.orig_filename)
        total = sum(info.file_size for info in infos)
        if total > MAX_TOTAL_BYTES:
            raise Rejected(f"the entries hold {total} bytes together; at most {MAX_TOTAL_BYTES}")
        try:  # reads stop at each entry's declared size, checked above; the CRC is verified
            return {info.orig_filename: archive.read(info) for info in infos}
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError) as exc:
            raise Rejected(f"an entry cannot be read: {exc}") from None


def _top_level_names(tree: ast.Module) -> list[str]:
    """Every name the module's top level binds, once per binding: defs and classes, assignment
    targets (`OP = other` is an alias entry point), imports (`import x as OP`)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [alias.asname or alias.name.split(".")[0] for alias in node.names]
    return names


def _entry_point(module: str, source: bytes, operators: Mapping[str, str], op: str | None) -> str:
    """The operator the module's entry point implements, after checking it (see `inspect_archive`)."""
    try:
        tree = ast.parse(source.decode("utf-8"), filename=module)
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise Rejected(f"{module} does not parse: {exc}") from None
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bound = _top_level_names(tree)
    named = sorted({name for name in bound if name in operators})
    if op is None:
        if len(named) != 1:
            found = ", ".join(named) or f"none (its top-level functions: {', '.join(defs) or 'none'})"
            raise Rejected(f"{module} needs exactly one top-level function named after an operator; found {found}")
        op = named[0]
    if op not in operators:
        raise Rejected(f"unknown operator {op!r}; known: {', '.join(operators)}")
    if op not in defs:
        raise Rejected(
            f"no entry point: {module} has no top-level function {op} (its top-level functions: "
            f"{', '.join(defs) or 'none'}); name the entry point {op}"
        )
    if isinstance(defs[op], ast.AsyncFunctionDef):
        raise Rejected(f"entry point {op} is `async def`; the target calls it as a plain function: `def {op}`")
    if bound.count(op) != 1:
        raise Rejected(
            f"{module} binds {op} {bound.count(op)} times at the top level (a def and an assignment, import or "
            "second def): the function inspected may not be the one called; bind it once"
        )
    others = [name for name in named if name != op]
    if others:
        raise Rejected(
            f"{module} also defines {others[0]}, named after another operator: a second entry point; "
            "rename it (a leading underscore keeps it private)"
        )
    problem = mismatch(operators[op], params_of_def(defs[op], module_constants(tree)))
    if problem:
        raise Rejected(f"entry point: {problem}")
    return op


def _receipt_problem(receipt: Receipt, inspection: Inspection) -> str:
    recorded = {f.name: f for f in receipt.files}
    held = {f.name: f for f in inspection.files}
    for name in sorted(recorded.keys() | held.keys()):
        if name not in held:
            return f"receipt mismatch: the receipt lists {name}, the archive does not hold it"
        if name not in recorded:
            return f"receipt mismatch: the archive holds {name}, the receipt does not list it"
        if held[name] != recorded[name]:
            return (
                f"receipt mismatch: {name} has sha256 {held[name].sha256} ({held[name].size} bytes), "
                f"the receipt records {recorded[name].sha256} ({recorded[name].size} bytes)"
            )
    if receipt.archive.sha256 != inspection.archive.sha256:
        return f"receipt mismatch: the archive has sha256 {inspection.archive.sha256}, the receipt records {receipt.archive.sha256}"
    if receipt.op != inspection.op or receipt.module != inspection.module:
        return f"receipt mismatch: the receipt is for {receipt.op} in {receipt.module}, the archive holds {inspection.op} in {inspection.module}"
    return ""


def inspect_archive(
    data: bytes, name: str, operators: Mapping[str, str], op: str | None = None, receipt: Receipt | None = None
) -> Inspection:
    """Re-check an archive without importing it: a flat set of small regular files (no path
    traversal, absolute path, link, directory or duplicate), byte for byte the archive `build`
    makes of them (nothing a local-header reader would see differently), names distinct when
    case is ignored, exactly one importable module and otherwise only data files
    (`DATA_SUFFIXES`), a top-level `def OP` bound once (OP given, from the receipt, or the one
    operator the module names)
    whose parameters match `operators[OP]` (a registry signature), no top-level function named
    after another operator, ASCII names, no import of kerneltrial and no code loaded from
    data (`codecheck`); the receipt, when given, must describe these bytes. Raises `Rejected`
    with a one-line reason."""
    entries = read_entries(data)
    for name in sorted(entries):
        problem = entry_name_problem(name)
        if problem:
            raise Rejected(problem)
    folded = sorted(n.casefold() for n in entries)
    if len(set(folded)) != len(folded):
        raise Rejected("two entries differ only in case; they collide on a case-insensitive file system")
    modules = sorted(n for n in entries if n.endswith(".py"))
    code = sorted(n for n in entries if not n.endswith((".py", *DATA_SUFFIXES)))
    if code:
        raise Rejected(
            f"entry {code[0]!r} is not a data file ({', '.join(DATA_SUFFIXES)}): compiled or other code beside "
            "the module would run uninspected; pack the module's source and text data only"
        )
    if len(modules) != 1:
        raise Rejected(
            f"the archive holds {len(modules)} Python modules ({', '.join(modules) or 'none'}); "
            "the layout is one module and its data files"
        )
    module = modules[0]
    if not module[:-3].isidentifier():
        raise Rejected(f"{module} cannot be imported by its name; name the file like a Python identifier")
    problem = source_problem(module, entries[module])
    if problem:
        raise Rejected(problem)
    op = _entry_point(module, entries[module], operators, op or (receipt.op if receipt else None))
    # last, so a hand-made archive gets the more specific reasons above first
    if build(entries) != data:
        raise Rejected(
            "not the archive `kerneltrial package` builds from its entries (extra bytes before or after it, "
            "a comment, compression, other times, modes or extra fields): other unzip tools may read it "
            "differently; rebuild it with kerneltrial package"
        )
    inspection = Inspection(
        op, module, tuple(FileRecord.of(n, entries[n]) for n in sorted(entries)), FileRecord.of(name, data)
    )
    if receipt is not None:
        problem = _receipt_problem(receipt, inspection)
        if problem:
            raise Rejected(problem)
    return inspection
