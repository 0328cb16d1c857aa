"""What `inspect` refuses in an archive's module source: code it would not have read, and names
that read as other names.

`inspect` vouches that the module's source is the code the target runs. Code the module loads
at run time from a data entry or a string (`exec(open("impl.txt").read())`) would run
uninspected, and a data entry's sha256 in the receipt says nothing about what it does; the
interface check would execute it identically (the archive runs unpacked as at the target),
but one panel of cases cannot show what hidden code does elsewhere. So these are refused, not
executed: no honest kernel module needs them (a dispatcher reads its rule file as data, with
tomllib or json, which stays allowed). Every route from data to code reaches one of a few
things: the builtins that run text (exec, eval, compile, __import__), a code object, a loader,
a program, or an unpickler; and a name built at run time reaches any of them through a lookup
by string. Each function below refuses one kind of route, with its own message:

- `code from data` (`_names`, `_imports`, `_attributes`): the builtins that run text as code,
  named anywhere (called or passed on): exec, eval, compile, __import__, breakpoint (it calls
  what PYTHONBREAKPOINT names), and the `__builtins__` that reaches them; imports of the
  modules that load or run code (`LOADERS`: importlib, runpy, marshal, pickle, subprocess, gc,
  site, sympy, ...), also reached as an attribute (`torch.serialization.pickle`); attributes
  that reach code objects, loaders and compilers of source text (`CODE_ATTRIBUTES`: __code__,
  __self__, exec_module, load_inline, jiterator, Triton's _src, ...), also as a literal name
  of a lookup (getattr, attrgetter, methodcaller); the import machinery's search path
  (sys.path, sys.meta_path, sys.path_hooks); running a program (os.system, os.exec*, ...);
- `computed name` (`_computed`, `_indirect_lookup`): getattr/setattr/delattr, operator's
  attrgetter and methodcaller, inspect's getattr_static with a name that is not a literal, and
  __getattribute__, vars, globals, locals, __dict__: each reaches any of the above by a string
  built at run time;
- `lookup passed on` (`_lookup_passed_on`): one of those lookups used as a value
  (`g = getattr`, `reduce(getattr, names, obj)`), so its name is never seen where it is called;
- `module table` (`_module_table`): sys.modules and inspect.getmodule, which hand out any
  loaded module (builtins among them) by a name or an object, and `import __main__`, the
  importing program (at the check, the check's worker: a module reading it can tell);
- `frame namespace` (`_frame_namespace`): a frame's or generator's globals, locals, builtins
  and code (f_builtins holds exec), and the calls that return frames or a function's namespaces;
- `name in a string` (`_string_route`): a string that names a route, looked up as a key
  (`d["__builtins__"]`, `.get("exec")`), a dotted name a resolver imports and calls
  ("builtins.exec"), or an environment switch that turns a call into one (PYTHONBREAKPOINT,
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD);
- `unpickling load` (`_unpickling`): torch.load without a literal weights_only=True, numpy's
  allow_pickle, a pickle_module, torch.jit.load, read_pickle: unpickling runs code held in data;
- `star import` (`_star_import`): `from types import *` binds CodeType without naming it;
- `source encoding` (`_encoding`): a coding line other than UTF-8 makes Python decode other
  text than inspect reads (a utf-7 comment `#+AAo-` hides a line of code);
- `look-alike name`: an identifier with a non-ASCII character, as written (Python folds
  `ｒｍｓｎｏｒｍ` to `rmsnorm` and keeps `rmsnοrm`, with a Greek omicron, distinct: either
  reads as another name to a reviewer), and an entry name with one;
- an import of kerneltrial (the target does not have it).

A list of routes cannot be complete in a language this dynamic (a third-party library's own
eval of a string the module hands it is not seen, nor a module object passed on under another
name); what it misses, the interface check still runs as the target would.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

DYNAMIC_BUILTINS = ("exec", "eval", "compile", "__import__", "__builtins__")
# module (or dotted submodule) -> what it does that runs code inspect did not read
LOADERS = {
    "builtins": "reaches exec and eval",
    "importlib": "imports modules by a computed name or from a file path",
    "imp": "imports modules from a file path",
    "_imp": "imports modules from a file path",
    "_frozen_importlib": "imports modules by a computed name",
    "_frozen_importlib_external": "imports modules from a file path",
    "runpy": "runs a file or module as code",
    "pkgutil": "imports modules by a computed name",
    "zipimport": "imports modules from an archive",
    "code": "runs text as code",
    "codeop": "compiles text",
    "marshal": "loads code objects from bytes",
    "pickle": "runs code while loading bytes",
    "_pickle": "runs code while loading bytes",
    "shelve": "unpickles (runs code while loading)",
    "dill": "unpickles (runs code while loading)",
    "cloudpickle": "unpickles (runs code while loading)",
    "ctypes": "loads native code",
    "_ctypes": "loads native code",
    "cffi": "loads native code",
    "subprocess": "runs programs",
    "_posixsubprocess": "runs programs",
    "pty": "runs programs",
    "multiprocessing": "runs code in other processes",
    "_xxsubinterpreters": "runs text as code in a subinterpreter",
    "gc": "reaches every live object by search, the builtins module among them",
    "site": "runs the import lines of .pth files (site.addsitedir)",
    "timeit": "runs text as code",
    "doctest": "runs text (docstrings) as code",
    "pdb": "runs text as code",
    "bdb": "runs text as code",
    "trace": "runs text as code",
    "profile": "runs text as code",
    "cProfile": "runs text as code",
    "rlcompleter": "evaluates text",
    "pydoc": "imports objects by a dotted name (pydoc.locate)",
    "unittest": "imports objects by a dotted name (unittest.mock.patch)",
    "logging.config": "calls what a configuration names ('()': 'builtins.exec')",
    "sympy": "evaluates text as Python (sympify, parse_expr)",
    "torch.hub": "imports a repository's hubconf.py",
    "torch.package": "imports code packed in an archive",
}
# the LOADERS reached as an attribute of another module (torch.serialization.pickle), but for the
# names other objects commonly have (torch.jit.trace, torch.profiler.profile, an object's .code)
LOADER_ATTRIBUTES = frozenset(name for name in LOADERS if "." not in name) - {"code", "imp", "trace", "profile"}
CODE_ATTRIBUTES = frozenset(
    {
        "exec",  # on a module object reached another way (sys.modules["builtins"].exec)
        "exec_",  # six.exec_
        "__import__",
        "__code__",  # a function's code object (replaceable with bytes read from a file)
        "__globals__",
        "__builtins__",
        "__closure__",  # the values a function captured, and their cells
        "cell_contents",
        "__defaults__",
        "__kwdefaults__",
        "__self__",  # a builtin function's module: print.__self__ is builtins
        "__subclasses__",  # the classic walk from () to every loaded class
        "__annotations__",  # string annotations are evaluated (get_type_hints, singledispatch)
        "get_type_hints",
        "get_annotations",
        "ForwardRef",
        "_evaluate",
        "CodeType",
        "FunctionType",
        "LambdaType",
        "exec_module",  # loaders
        "load_module",
        "get_code",
        "source_to_code",
        "import_module",
        "spec_from_file_location",
        "spec_from_loader",
        "module_from_spec",
        "resolve_name",
        "locate",
        "dictConfig",
        "fileConfig",
        "addsitedir",
        "InteractiveInterpreter",
        "InteractiveConsole",
        "runsource",
        "runcode",
        "breakpointhook",
        "load_inline",  # torch.utils.cpp_extension: compiles C++/CUDA source text
        "cpp_extension",
        "jiterator",  # torch.cuda.jiterator: compiles CUDA source text
        "CompilationUnit",  # torch.jit: compiles TorchScript source text
        "load_library",  # torch.ops, numpy.ctypeslib: native code from a file
        "PackageImporter",
        "RawKernel",  # cupy, pycuda: CUDA source text
        "RawModule",
        "SourceModule",
        "_src",  # a Triton kernel's source text, compiled at its first launch
        "_unsafe_update_src",
        "meta_path",  # the import machinery (sys.path: SYS_PATH)
        "path_hooks",
        "path_importer_cache",
    }
)
# os functions that run a program (matched on `os.`, `posix.` and `from os import`)
OS_PROCESS = frozenset(
    {"system", "popen", "startfile", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)
OS_MODULES = ("os", "posix", "nt")
COMPUTED = ("getattr", "setattr", "delattr")
SCOPES = ("vars", "globals", "locals", "__dict__")
# lookups by a string: the argument that is the name (None: every argument is one, dotted)
NAME_ARGUMENT: dict[str, int | None] = {
    "getattr": 1,
    "setattr": 1,
    "delattr": 1,
    "getattr_static": 1,
    "attrgetter": None,
    "methodcaller": 0,
}
LOOKUP_DUNDERS = ("__getattribute__", "__getattr__", "get_field")  # get_field: string.Formatter's
FRAME_ATTRIBUTES = frozenset(
    {"f_globals", "f_locals", "f_builtins", "f_code", "gi_code", "cr_code", "ag_code"}
    | {"_getframe", "currentframe", "getclosurevars"}
)
MODULE_TABLES = ("modules", "getmodule")
# looked up by these as a key, a namespace hands out what runs code; "eval" and "compile" stay
# allowed as keys (a rule's "compile" flag): the namespaces that hold them are refused themselves
KEY_NAMES = frozenset(
    {"__builtins__", "builtins", "exec", "exec_", "__import__", "breakpoint", "importlib", "marshal", "pickle", "runpy"}
)
# a dotted name's parts that make it a route ("builtins.exec", "marshal:loads"); "eval" and
# "compile" alone do not ("torch.compile"): the modules that hold the builtin ones are refused
DOTTED_NAMES = frozenset({"exec", "__import__", "__builtins__", "breakpoint"} | LOADER_ATTRIBUTES | CODE_ATTRIBUTES)
DOTTED = re.compile(r"[A-Za-z_]\w*(?:[.:][A-Za-z_]\w*)+")
SWITCHES = {
    "PYTHONBREAKPOINT": "makes breakpoint() import and call the function it names",
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "makes torch.load unpickle (run code held in data)",
    "PYTHONSTARTUP": "names a file run as code",
}
UNPICKLING = {
    "torch.load": "unpickles unless weights_only=True is passed (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns the default off)",
    "torch.serialization.load": "unpickles unless weights_only=True is passed",
    "torch.jit.load": "loads TorchScript code from data",
    "torch.jit._load_for_lite_interpreter": "loads TorchScript code from data",
}
UTF8 = ("utf-8", "utf-8-sig")


@dataclass(frozen=True)
class Source:
    """A module's source as the checks read it: its file name, which nodes are a call's
    function, and what each imported name stands for (`import torch as t`: t -> torch;
    `from operator import attrgetter as ag`: ag -> operator.attrgetter)."""

    module: str
    called: frozenset[int]  # id() of every node that is a call's function
    imported: Mapping[str, str]

    @classmethod
    def of(cls, module: str, tree: ast.AST) -> Source:
        imported: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.asname: a.name for a in node.names if a.asname}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        called = frozenset(id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call))
        return cls(module, called, imported)

    def qualified(self, node: ast.AST) -> str:
        """`node`'s dotted name with its imports resolved (t.jit.load -> torch.jit.load), or ''."""
        if isinstance(node, ast.Name):
            return self.imported.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            owner = self.qualified(node.value)
            return f"{owner}.{node.attr}" if owner else ""
        return ""

    def leaf(self, node: ast.AST) -> str:
        """The last part of `node`'s name: an attribute's, or the name an import bound it as."""
        return self.qualified(node).rsplit(".", 1)[-1] if isinstance(node, (ast.Name, ast.Attribute)) else ""

    def code_from_data(self, node: ast.AST, what: str) -> str:
        return (
            f"code from data: {self.module} line {getattr(node, 'lineno', 0)} {what}, so code inspect did not read "
            "(a data entry, a string) could run; put the code in the module itself"
        )

    def at(self, node: ast.AST) -> str:
        return f"{self.module} line {getattr(node, 'lineno', 0)}"


def _lookalike(text: str) -> str:
    """The first non-ASCII character of `text`, described: `'ο' (U+03BF GREEK SMALL LETTER OMICRON)`."""
    char = next(c for c in text if not c.isascii())
    return f"{char!r} (U+{ord(char):04X} {unicodedata.name(char, 'unnamed')})"


def entry_name_problem(name: str) -> str:
    """Why an archive entry's name is refused as a look-alike, or ''."""
    if name.isascii():
        return ""
    return f"look-alike name: entry {name!r} has the non-ASCII character {_lookalike(name)}; name files in ASCII"


def _identifiers(module: str, source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and not token.string.isascii():
            folded = unicodedata.normalize("NFKC", token.string)
            reads = f"Python reads it as {folded!r}" if folded != token.string else "another name than it looks"
            yield (
                token.start[0],
                f"look-alike name: {module} line {token.start[0]}: identifier {token.string!r} has the non-ASCII "
                f"character {_lookalike(token.string)} ({reads}); write identifiers in ASCII",
            )


def _encoding(module: str, data: bytes) -> str:
    """A coding line other than UTF-8: Python decodes the bytes with it, inspect reads UTF-8."""
    try:
        encoding, lines = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown coding, or a first line that is not UTF-8
        return f"source encoding: {module}: {exc}; save the module as UTF-8 without a coding line"
    if encoding in UTF8:
        return ""
    return (
        f"source encoding: {module} line {len(lines)} declares the coding {encoding!r}, so Python decodes other "
        "text than inspect reads as UTF-8 (in utf-7 a comment can hide a line of code); drop the coding line "
        "and save the module as UTF-8"
    )


def _refused_attribute(name: str) -> bool:
    """Whether reaching the attribute `name`, by any route, is refused by one of the checks."""
    return (
        name in DYNAMIC_BUILTINS
        or name in CODE_ATTRIBUTES
        or name in LOADER_ATTRIBUTES
        or name in FRAME_ATTRIBUTES
        or name in MODULE_TABLES
        or name in LOOKUP_DUNDERS
        or name in OS_PROCESS
        or name in SCOPES
        or name == "breakpoint"
    )


def _module_route(full: str, source: str, leaf: str) -> str:
    """What importing `leaf` (a name or a submodule) of `source` reaches, when it is refused;
    else ''. `full`: the dotted name imported (a LOADERS entry or one of its submodules)."""
    parts = full.split(".")
    for loader in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
        if loader in LOADERS:
            return f"imports {loader}, which {LOADERS[loader]}"
    root = source.split(".")[0]
    if leaf in CODE_ATTRIBUTES or (root, leaf) == ("sys", "path") or (root in OS_MODULES and leaf in OS_PROCESS):
        return f"imports {leaf} from {source}"
    return ""


def _imports(src: Source, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [(alias.name, alias.name, part) for alias in node.names for part in alias.name.split(".")]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [(f"{node.module}.{alias.name}", node.module, alias.name) for alias in node.names]
        names += [(node.module, node.module, part) for part in node.module.split(".")[1:]]
    else:
        return
    for full, source, leaf in names:
        if source.split(".")[0] == "kerneltrial":
            yield f"{src.module} imports kerneltrial, which the target does not have; inline what it uses"
        elif _module_route(full, source, leaf):
            yield src.code_from_data(node, _module_route(full, source, leaf))


def _attributes(src: Source, node: ast.AST) -> Iterator[str]:
    """An attribute that reaches code, a loader module or a program."""
    if not isinstance(node, ast.Attribute):
        return
    owner = src.leaf(node.value)
    if node.attr in CODE_ATTRIBUTES or (owner, node.attr) == ("sys", "path"):
        yield src.code_from_data(node, f"uses the attribute {node.attr}")
    elif node.attr in LOADER_ATTRIBUTES:
        yield src.code_from_data(node, f"reaches the module {node.attr} as an attribute, which {LOADERS[node.attr]}")
    elif owner in OS_MODULES and node.attr in OS_PROCESS:
        yield src.code_from_data(node, f"uses {owner}.{node.attr}, which runs a program")


def _computed(src: Source, node: ast.AST) -> Iterator[str]:
    """getattr/setattr/delattr, attrgetter, methodcaller, getattr_static called with a name
    computed at run time, or with a literal name refused itself."""
    if not isinstance(node, ast.Call) or src.leaf(node.func) not in NAME_ARGUMENT:
        return
    lookup = src.leaf(node.func)
    position = NAME_ARGUMENT[lookup]
    names = node.args if position is None else node.args[position : position + 1]
    literal = [n.value for n in names if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    if not names or len(literal) != len(names):
        yield (
            f"computed name: {src.at(node)} calls {lookup} with a name computed at run time, "
            "which can reach exec or eval; write the attribute"
        )
        return
    for part in (part for name in literal for part in name.split(".")):
        if _refused_attribute(part):
            yield src.code_from_data(node, f"uses the attribute {part} through {lookup}")


def _indirect_lookup(src: Source, node: ast.AST) -> Iterator[str]:
    """__getattribute__, __getattr__ and string.Formatter's get_field: attributes looked up by a string."""
    if isinstance(node, ast.Attribute) and node.attr in LOOKUP_DUNDERS:
        yield (
            f"computed name: {src.at(node)} uses {node.attr}, which looks an attribute up by a string "
            "(one built at run time reaches exec or eval); write the attribute"
        )


def _lookup_passed_on(src: Source, node: ast.AST) -> Iterator[str]:
    """A lookup by string used as a value: its name argument is not seen where it is called."""
    if not isinstance(node, (ast.Name, ast.Attribute)) or id(node) in src.called:
        return
    lookup = src.leaf(node)
    if lookup in NAME_ARGUMENT and isinstance(getattr(node, "ctx", None), ast.Load):
        yield (
            f"lookup passed on: {src.at(node)} passes {lookup} on as a value (g = {lookup}, "
            f"reduce({lookup}, names, obj)), so it can be called with a name built at run time; "
            f"call {lookup} where it is written, with a literal name"
        )


def _imports_main(node: ast.AST) -> bool:
    """`import __main__` or `from __main__ import ...` (importlib, which could import it by a string,
    is refused as `code from data`)."""
    if isinstance(node, ast.Import):
        return any(alias.name == "__main__" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.module == "__main__"
    return False


def _module_table(src: Source, node: ast.AST) -> Iterator[str]:
    """sys.modules (not called: nn.Module.modules() stays allowed), inspect.getmodule, __main__."""
    if _imports_main(node):
        yield (
            f"module table: {src.at(node)} imports __main__, the program that imported this module (the "
            "interface check's own worker, not the target's program); a submission reads nothing of its importer"
        )
        return
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [alias.name for alias in node.names if alias.name in MODULE_TABLES]
        name = names[0] if names and (names[0] == "getmodule" or node.module == "sys") else ""
    elif isinstance(node, ast.Attribute) and node.attr in MODULE_TABLES:
        name = "" if node.attr == "modules" and id(node) in src.called else node.attr
    else:
        name = ""
    if name == "modules":
        yield (
            f"module table: {src.at(node)} uses sys.modules, every loaded module by its name "
            "(sys.modules['builtins'] holds exec and eval); import what it uses by name"
        )
    elif name:
        yield (
            f"module table: {src.at(node)} uses getmodule, which hands back an object's module "
            "(getmodule(print) is builtins); import what it uses by name"
        )


def _frame_namespace(src: Source, node: ast.AST) -> Iterator[str]:
    """A frame's namespaces and code, and what returns frames or a function's namespaces."""
    if isinstance(node, ast.ImportFrom):
        names = [alias.name for alias in node.names if alias.name in FRAME_ATTRIBUTES]
    elif isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES:
        names = [node.attr]
    else:
        return
    for name in names:
        yield (
            f"frame namespace: {src.at(node)} uses {name}, which reaches a frame's or function's globals, "
            "builtins or code (a frame's f_builtins holds exec and eval); name what it uses"
        )


def _key_lookup(node: ast.AST) -> ast.AST | None:
    """The key of a subscript or of a dict-style .get/.pop/.setdefault/__getitem__ call."""
    if isinstance(node, ast.Subscript):
        return node.slice
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        return node.args[0] if node.func.attr in ("get", "pop", "setdefault", "__getitem__") else None
    return None


def _string_route(src: Source, node: ast.AST) -> Iterator[str]:
    """A string naming a route: a key of a namespace, a dotted name, an environment switch."""
    key = _key_lookup(node)
    if isinstance(key, ast.Constant) and key.value in KEY_NAMES:
        yield (
            f"name in a string: {src.at(node)} looks up {key.value!r} by a string key, as in a namespace "
            f"(d['{key.value}'] reaches exec or a loader); name what it uses"
        )
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return
    if node.value in SWITCHES:
        yield (
            f"name in a string: {src.at(node)} names the environment switch {node.value}, which "
            f"{SWITCHES[node.value]}; leave the environment to the caller"
        )
    elif DOTTED.fullmatch(node.value) and DOTTED_NAMES & set(re.split(r"[.:]", node.value)):
        yield (
            f"name in a string: {src.at(node)} holds the dotted name {node.value!r}, which resolvers "
            "(breakpoint, pydoc.locate, logging.config, mock.patch) import and call; name what it uses"
        )


def _unpickling(src: Source, node: ast.AST) -> Iterator[str]:
    """Loads that unpickle (and so run code held in data), or load code: torch.load without
    weights_only=True, allow_pickle, pickle_module, torch.jit.load, read_pickle."""
    if not isinstance(node, ast.Call):
        return
    keywords = {k.arg: k.value for k in node.keywords if k.arg}
    safe = {"weights_only": True, "allow_pickle": False}
    for name, value in keywords.items():
        if name in safe and not (isinstance(value, ast.Constant) and value.value is safe[name]):
            yield (
                f"unpickling load: {src.at(node)} passes {name}={ast.unparse(value)}, so the load unpickles, "
                f"which runs code held in the data; pass {name}={safe[name]} or read the data as text"
            )
        elif name == "pickle_module":
            yield f"unpickling load: {src.at(node)} passes pickle_module, whose load runs code held in the data; drop it"
    callee = src.qualified(node.func)
    loaded = UNPICKLING.get(callee, "unpickles" if src.leaf(node.func) == "read_pickle" else "")
    if loaded and not (callee.endswith(".load") and "jit" not in callee and "weights_only" in keywords):
        fix = "pass weights_only=True" if "weights_only" in loaded else "read the data as text (json, toml)"
        yield f"unpickling load: {src.at(node)} calls {callee or 'read_pickle'}, which {loaded}; {fix}"


def _star_import(src: Source, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
        yield (
            f"star import: {src.at(node)} imports * from {'.' * node.level}{node.module or ''}, which binds names "
            "inspect cannot see (from types import * binds CodeType); import each name it uses"
        )


def _names(src: Source, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS:
        yield src.code_from_data(node, f"uses {node.id}, which runs text as code")
    elif isinstance(node, ast.Name) and node.id == "breakpoint":
        yield src.code_from_data(
            node, "uses breakpoint, which calls the function PYTHONBREAKPOINT names (builtins.exec)"
        )
    elif (isinstance(node, ast.Name) and node.id in SCOPES) or (
        isinstance(node, ast.Attribute) and node.attr in SCOPES
    ):
        name = node.id if isinstance(node, ast.Name) else node.attr
        yield f"computed name: {src.at(node)} uses {name}, a namespace looked up by string; name what it uses"


DEFECTS: tuple[Callable[[Source, ast.AST], Iterator[str]], ...] = (
    _names,
    _imports,
    _attributes,
    _computed,
    _indirect_lookup,
    _lookup_passed_on,
    _module_table,
    _frame_namespace,
    _string_route,
    _unpickling,
    _star_import,
)


def source_problems(module: str, data: bytes) -> list[str]:
    """Every refusal of `module`'s source (see the module docstring), first by line; [] when
    there is none, also when it does not decode or parse (the entry-point check says so)."""
    encoding = _encoding(module, data)
    if encoding:
        return [encoding]
    try:
        source = data.decode("utf-8")
        tree = ast.parse(source, filename=module)
        lookalikes = list(_identifiers(module, source))
    except (UnicodeDecodeError, SyntaxError, tokenize.TokenError):
        return []
    if lookalikes:
        return [problem for _, problem in sorted(lookalikes)]
    src = Source.of(module, tree)
    found = {
        (getattr(node, "lineno", 0), problem)
        for node in ast.walk(tree)
        for defect in DEFECTS
        for problem in defect(src, node)
    }
    return [problem for _, problem in sorted(found)]


def source_problem(module: str, data: bytes) -> str:
    """The first refusal of `module`'s source, or ''."""
    problems = source_problems(module, data)
    return problems[0] if problems else ""
