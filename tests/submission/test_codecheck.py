"""`inspect` refuses code loaded from data and look-alike names (issue 24, item 3), each with its
named message, and still accepts what honest kernel modules do (read a rule file as data)."""

from __future__ import annotations

import pytest

from kerneltrial.ops.registry import all_ops
from kerneltrial.submission.archive import Rejected, build, inspect_archive
from tests.conftest import REPO

OPERATORS = {o.name: o.signature for o in all_ops()}
PACKAGE = REPO / "tests" / "fixtures" / "planted" / "package"
ENTRY = "\n\ndef rmsnorm(x, weight, eps=1e-6):\n    return x * weight\n"


def rejection(files: dict[str, bytes]) -> str:
    with pytest.raises(Rejected) as caught:
        inspect_archive(build(files), "s.zip", OPERATORS, "rmsnorm")
    return str(caught.value)


def test_the_planted_stub_that_execs_its_packed_txt_is_refused():
    """The hole: a .py stub whose real code is a packed .txt data entry, exec()'d at import."""
    files = {name: (PACKAGE / name).read_bytes() for name in ("exec_from_data.py", "exec_from_data.txt")}
    assert rejection(files).startswith("code from data: exec_from_data.py line 6 uses exec, which runs text as code")


def test_the_planted_look_alike_name_is_refused():
    source = (PACKAGE / "lookalike_name.py").read_bytes()
    assert rejection({"lookalike_name.py": source}) == (
        "look-alike name: lookalike_name.py line 8: identifier 'rmsnοrm' has the non-ASCII character 'ο' "
        "(U+03BF GREEK SMALL LETTER OMICRON) (another name than it looks); write identifiers in ASCII"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "import os\nfrom pathlib import Path\nexec(Path('impl.txt').read_text())",
            "line 3 uses exec, which runs text",
        ),
        ("run = eval", "line 1 uses eval, which runs text as code"),
        ("code = compile('1', 'f', 'eval')", "line 1 uses compile"),
        ("torch = __import__('torch')", "line 1 uses __import__"),
        ("b = __builtins__", "line 1 uses __builtins__"),
        ("import importlib", "line 1 imports importlib, which imports modules by a computed name or from a file path"),
        ("from importlib import util", "imports importlib"),
        ("import importlib.util", "imports importlib"),
        ("import runpy", "imports runpy, which runs a file or module as code"),
        ("import pickle", "imports pickle, which runs code while loading bytes"),
        ("import marshal", "imports marshal, which loads code objects from bytes"),
        ("import builtins", "imports builtins, which reaches exec and eval"),
        ("import subprocess", "imports subprocess, which runs programs"),
        ("import ctypes", "imports ctypes, which loads native code"),
        ("import os\nos.system('python impl.txt')", "line 2 uses os.system, which runs a program"),
        ("from os import execv", "imports execv from os"),
        ("import sys\nsys.path.insert(0, '/tmp')", "line 2 uses the attribute path"),
        ("from sys import path", "imports path from sys"),
        ("import sys\nsys.meta_path.append(None)", "uses the attribute meta_path"),
        ("def f():\n    pass\nf.__code__ = None", "line 3 uses the attribute __code__"),
        ("root = print.__self__", "uses the attribute __self__"),
        ("from types import CodeType", "imports CodeType from types"),
        ("import torch.utils.cpp_extension", "imports cpp_extension from torch.utils.cpp_extension"),
        ("from torch.utils.cpp_extension import load_inline", "from torch.utils.cpp_extension, so"),
        ("import torch\nk = torch.cuda.jiterator", "uses the attribute jiterator"),
        ("import sys\nx = getattr(sys.modules['builtins'], 'exec')", "uses the attribute exec through getattr"),
        ("import sys\nx = sys.modules['builtins'].exec", "uses the attribute exec"),
    ],
)
def test_each_route_to_code_inspect_did_not_read_is_refused(source, message):
    reason = rejection({"m.py": (source + ENTRY).encode()})
    assert reason.startswith("code from data: m.py") and message in reason, reason


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "import sys\nname = 'ex' + 'ec'\nf = getattr(sys, name)",
            "line 3 calls getattr with a name computed at run time",
        ),
        ("setattr(object(), 'a' * 1, 1)", "calls setattr with a name computed at run time"),
        ("g = globals()", "line 1 uses globals, a namespace looked up by string"),
        ("v = vars()", "uses vars"),
        ("import torch\nd = torch.__dict__", "uses __dict__"),
    ],
)
def test_a_name_computed_at_run_time_is_refused(source, message):
    reason = rejection({"m.py": (source + ENTRY).encode()})
    assert reason.startswith("computed name: m.py") and message in reason, reason


def test_a_fullwidth_identifier_is_refused_though_python_reads_it_as_ascii():
    """NFKC folds fullwidth letters: `ｒｍｓｎｏｒｍ` *is* rmsnorm to Python, so a reviewer's
    grep for `def rmsnorm` misses the entry point."""
    source = "def ｒｍｓｎｏｒｍ(x, weight, eps=1e-6):\n    return x * weight\n"
    assert rejection({"m.py": source.encode()}) == (
        "look-alike name: m.py line 1: identifier 'ｒｍｓｎｏｒｍ' has the non-ASCII character 'ｒ' "
        "(U+FF52 FULLWIDTH LATIN SMALL LETTER R) (Python reads it as 'rmsnorm'); write identifiers in ASCII"
    )


def test_a_non_ascii_entry_name_is_refused():
    good = (REPO / "tests" / "fixtures" / "good_rmsnorm.py").read_bytes()
    assert rejection({"good_rmsnorm.py": good, "rulе.toml": b""}) == (
        "look-alike name: entry 'rulе.toml' has the non-ASCII character 'е' (U+0435 CYRILLIC SMALL LETTER IE); "
        "name files in ASCII"
    )
    assert "look-alike name: entry 'rmsnοrm.py'" in rejection({"rmsnοrm.py": good})


def test_what_honest_modules_do_stays_accepted():
    """Reading a packed data file as data (tomllib, json, the loader's get_data), compiling a
    regex or a function with torch.compile, a literal getattr, non-ASCII text in strings and
    comments: none of these runs code inspect did not read."""
    source = '''"""rmsnorm, with eps from the rule beside it (ε ≥ 0; comments may say “so”)."""
import json
import re
import tomllib
from pathlib import Path

import torch

RULE = tomllib.loads(__loader__.get_data(str(Path(__file__).with_suffix(".toml"))).decode())
EXTRA = json.loads(Path(__file__).with_suffix(".json").read_text())
PATTERN = re.compile(r"\\d+")
PEER = getattr(torch, "rsqrt")


def rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * PEER(xf.pow(2).mean(-1, keepdim=True) + max(eps, RULE["eps_floor"]))).to(x.dtype) * weight


compiled = torch.compile(rmsnorm)
'''
    files = {"m.py": source.encode(), "m.toml": b"eps_floor = 0.0\n", "m.json": b"{}"}
    assert inspect_archive(build(files), "s.zip", OPERATORS).op == "rmsnorm"
    shipped = REPO / "src" / "kerneltrial" / "ops" / "zimage_qk_rmsnorm.py"
    rule = shipped.with_suffix(".rule.toml")
    shipped_files = {shipped.name: shipped.read_bytes(), rule.name: rule.read_bytes()}
    assert inspect_archive(build(shipped_files), "s.zip", OPERATORS).op == "zimage_qk_rmsnorm"
