"""`inspect` refuses code loaded from data and look-alike names (issue 24, item 3), and every
route from data to code that does not name exec (issue 35, item 6: attrgetter, methodcaller,
getattr passed on, sys.modules, frames, keys and dotted names in strings, unpickling loads,
star imports, a coding line), each with its named message, and still accepts what honest
kernel modules do (read a rule file as data)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kerneltrial.ops.registry import all_ops
from kerneltrial.submission.archive import Rejected, build, inspect_archive
from kerneltrial.submission.codecheck import source_problems
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
        ("import operator\nf = operator.attrgetter('exec')", "line 2 uses the attribute exec through attrgetter"),
        (
            "import operator\nf = operator.attrgetter('f.__globals__')",
            "uses the attribute __globals__ through attrgetter",
        ),
        ("import operator\nf = operator.methodcaller('exec', 'x = 1')", "uses the attribute exec through methodcaller"),
        ("import sys\nm = getattr(sys, 'modules')", "uses the attribute modules through getattr"),
        (
            "import inspect\nf = inspect.getattr_static(len, '__self__')",
            "uses the attribute __self__ through getattr_static",
        ),
        ("run = breakpoint", "line 1 uses breakpoint, which calls the function PYTHONBREAKPOINT names"),
        ("import gc", "imports gc, which reaches every live object by search"),
        ("import site", "imports site, which runs the import lines of .pth files"),
        ("import pty", "imports pty, which runs programs"),
        ("from logging import config", "imports logging.config, which calls what a configuration names"),
        ("import logging.config", "imports logging.config"),
        ("import sympy", "imports sympy, which evaluates text as Python"),
        ("import timeit", "imports timeit, which runs text as code"),
        ("from torch import hub", "imports torch.hub, which imports a repository's hubconf.py"),
        ("import torch\np = torch.serialization.pickle", "reaches the module pickle as an attribute, which runs code"),
        ("import posix\nposix.system('x')", "line 2 uses posix.system, which runs a program"),
        ("import types\nf = types.LambdaType", "uses the attribute LambdaType"),
        ("import typing\nh = typing.get_type_hints", "uses the attribute get_type_hints"),
        ("def f():\n    pass\nf.__annotations__['x'] = 'y'", "line 3 uses the attribute __annotations__"),
        ("import torch\nk = torch.jit.CompilationUnit", "uses the attribute CompilationUnit"),
        ("import torch\ntorch.ops.load_library('k.so')", "uses the attribute load_library"),
        ("def k():\n    pass\nk._src = 'x'", "line 3 uses the attribute _src"),
        ("import torch\nm = torch.__import__", "uses the attribute __import__"),
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
        (
            "import operator\nf = operator.attrgetter('ex' + 'ec')",
            "line 2 calls attrgetter with a name computed at run time",
        ),
        ("from operator import methodcaller as mc\nf = mc(name)", "line 2 calls methodcaller with a name computed"),
        ("import inspect\nv = inspect.getattr_static(inspect, n)", "calls getattr_static with a name computed"),
        (
            "f = object.__getattribute__(len, n)",
            "line 1 uses __getattribute__, which looks an attribute up by a string",
        ),
        ("import string\nf = string.Formatter().get_field", "uses get_field, which looks an attribute up"),
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
FLAGS = {"compile": False, "eval": True, "dtype": "torch.float16"}
USE_COMPILE = FLAGS["compile"]


def _table(path):
    return torch.load(path, weights_only=True), json.load(open(path))


def _children(model):
    return list(model.modules())


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


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("g = getattr", "lookup passed on: m.py line 1 passes getattr on as a value"),
        ("import functools\nf = functools.partial(getattr, len)", "lookup passed on: m.py line 2 passes getattr on"),
        ("import operator\nf = map(operator.attrgetter, ['a'])", "lookup passed on: m.py line 2 passes attrgetter on"),
        (
            "import sys\nb = sys.modules['torch']",
            "module table: m.py line 2 uses sys.modules, every loaded module by its name",
        ),
        ("from sys import modules", "module table: m.py line 1 uses sys.modules"),
        ("import os\nb = os.sys.modules.get('torch')", "module table: m.py line 2 uses sys.modules"),
        ("import inspect\nb = inspect.getmodule(len)", "module table: m.py line 2 uses getmodule, which hands back"),
        ("import sys\nf = sys._getframe(0)", "frame namespace: m.py line 2 uses _getframe"),
        ("def g():\n    yield\nc = g().gi_code", "frame namespace: m.py line 3 uses gi_code"),
        ("from inspect import currentframe", "frame namespace: m.py line 1 uses currentframe"),
        ("import inspect\nv = inspect.getclosurevars(len)", "frame namespace: m.py line 2 uses getclosurevars"),
        ("def f(frame):\n    return frame.f_builtins", "frame namespace: m.py line 2 uses f_builtins"),
        ("d = {}\nx = d['__builtins__']", "name in a string: m.py line 2 looks up '__builtins__' by a string key"),
        ("d = {}\nx = d.get('exec')", "name in a string: m.py line 2 looks up 'exec' by a string key"),
        (
            "import os\nos.environ['PYTHONBREAKPOINT'] = 'x'",
            "name in a string: m.py line 2 names the environment switch PYTHONBREAKPOINT",
        ),
        (
            "import os\nos.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] = '1'",
            "name in a string: m.py line 2 names the environment switch TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        ),
        ("target = 'builtins:exec'", "name in a string: m.py line 1 holds the dotted name 'builtins:exec'"),
        ("target = 'marshal.loads'", "name in a string: m.py line 1 holds the dotted name 'marshal.loads'"),
        (
            "import torch\nt = torch.load('w.json')",
            "unpickling load: m.py line 2 calls torch.load, which unpickles unless",
        ),
        (
            "import torch\nt = torch.load('w.json', weights_only=False)",
            "unpickling load: m.py line 2 passes weights_only=False",
        ),
        (
            "import torch as t\nm = t.jit.load('m.json')",
            "unpickling load: m.py line 2 calls torch.jit.load, which loads TorchScript",
        ),
        (
            "import numpy\na = numpy.load('a.json', allow_pickle=True)",
            "unpickling load: m.py line 2 passes allow_pickle=True",
        ),
        ("import pandas as pd\nd = pd.read_pickle('d.csv')", "unpickling load: m.py line 2 calls pandas.read_pickle"),
        (
            "import torch\nt = torch.load('w', weights_only=True, pickle_module=None)",
            "unpickling load: m.py line 2 passes pickle_module",
        ),
        ("from os import *", "star import: m.py line 1 imports * from os, which binds names inspect cannot see"),
        ("# -*- coding: latin-1 -*-\nimport torch", "source encoding: m.py line 1 declares the coding 'iso-8859-1'"),
    ],
)
def test_each_route_without_a_literal_exec_is_refused_with_its_named_message(source, message):
    """Issue 35, item 6: exec, the builtins, a module table, a frame, a lookup by string or an
    unpickler reached without writing their names; each refused with the message of its route."""
    reason = rejection({"m.py": (source + ENTRY).encode()})
    assert reason.startswith(message), reason


# planted module -> (its data entries, the first refusal, other refusals of its other routes)
PLANTED_ROUTES = {
    "attrgetter_exec.py": (
        ["exec_from_data.txt"],
        "code from data: attrgetter_exec.py line 13 uses the attribute exec through attrgetter",
        ["module table: attrgetter_exec.py line 22 uses sys.modules", "name in a string: attrgetter_exec.py line 22"],
    ),
    "attrgetter_computed_name.py": (
        ["exec_from_data.txt"],
        "computed name: attrgetter_computed_name.py line 11 calls attrgetter with a name computed at run time",
        ["module table: attrgetter_computed_name.py line 11 uses getmodule"],
    ),
    "methodcaller_exec.py": (
        ["exec_from_data.txt"],
        "code from data: methodcaller_exec.py line 12 uses the attribute exec through methodcaller",
        ["module table: methodcaller_exec.py line 21 uses getmodule"],
    ),
    "getattr_passed_on.py": (
        ["exec_from_data.txt"],
        "lookup passed on: getattr_passed_on.py line 12 passes getattr on as a value",
        ["module table: getattr_passed_on.py line 12 uses getmodule"],
    ),
    "getattribute_exec.py": (
        ["exec_from_data.txt"],
        "computed name: getattribute_exec.py line 9 uses __getattribute__",
        ["module table: getattribute_exec.py line 9 uses getmodule"],
    ),
    "frame_builtins.py": (
        ["exec_from_data.txt"],
        "frame namespace: frame_builtins.py line 10 uses currentframe",
        ["frame namespace: frame_builtins.py line 10 uses f_builtins"],
    ),
    "breakpoint_exec.py": (
        ["exec_from_data.txt"],
        "name in a string: breakpoint_exec.py line 11 holds the dotted name 'builtins.exec'",
        [
            "name in a string: breakpoint_exec.py line 11 names the environment switch PYTHONBREAKPOINT",
            "code from data: breakpoint_exec.py line 20 uses breakpoint",
        ],
    ),
    "unpickles_data.py": (
        ["unpickles_data.txt"],
        "unpickling load: unpickles_data.py line 10 passes allow_pickle=True, so the load unpickles",
        [],
    ),
    "star_import_code.py": (
        ["star_import_code.txt"],
        "star import: star_import_code.py line 9 imports * from types",
        [],
    ),
    "coding_utf7.py": ([], "source encoding: coding_utf7.py line 1 declares the coding 'utf-7'", []),
    "reads_its_importer.py": ([], "module table: reads_its_importer.py line 8 imports __main__", []),
}


@pytest.mark.parametrize("name", sorted(PLANTED_ROUTES))
def test_each_planted_route_from_data_to_code_is_refused_with_its_message(name):
    data, first, others = PLANTED_ROUTES[name]
    files = {entry: (PACKAGE / entry).read_bytes() for entry in (name, *data)}
    assert rejection(files).startswith(first)
    problems = source_problems(name, files[name])
    assert all(any(p.startswith(other) for p in problems) for other in others), problems


# Each planted module, imported by a plain python where no kerneltrial module is loaded, runs its
# hidden code: every output 11 times the reference (the routes are real, not just refused names).
PROBE = """
import importlib, json, sys
import torch
sys.path.insert(0, sys.argv[1])
x, w = torch.randn(4, 64), torch.randn(64)
ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
ratios = {n: round(float((importlib.import_module(n).rmsnorm(x, w, 1e-6) / ref).mean())) for n in sys.argv[2:]}
print(json.dumps(ratios | {"kerneltrial loaded": any("kerneltrial" in n for n in sys.modules)}))
"""


def test_each_planted_route_runs_its_hidden_code_in_a_plain_python():
    names = [n[:-3] for n in sorted(PLANTED_ROUTES) if n != "star_import_code.py" or sys.version_info[:2] == (3, 11)]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(PACKAGE), *names], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == dict.fromkeys(names, 11) | {"kerneltrial loaded": False}
