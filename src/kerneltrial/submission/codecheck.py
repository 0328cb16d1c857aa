"""What `inspect` refuses in an archive's module source: code it would not have read, and names
that read as other names.

`inspect` vouches that the module's source is the code the target runs. Code the module loads
at run time from a data entry or a string (`exec(open("impl.txt").read())`) would run
uninspected, and a data entry's sha256 in the receipt says nothing about what it does; the
interface check would execute it identically (the archive runs unpacked as at the target),
but one panel of cases cannot show what hidden code does elsewhere. So these are refused, not
executed: no honest kernel module needs them (a dispatcher reads its rule file as data, with
tomllib or json, which stays allowed). Refused, each with its own message:

- `code from data`: the builtins that run text as code, named anywhere (called or passed on):
  exec, eval, compile, __import__, and the `__builtins__` that reaches them; imports of the
  modules that load or run code (`LOADERS`: importlib, runpy, marshal, pickle, subprocess, ...);
  attributes that reach code objects, loaders and compilers of source text (`CODE_ATTRIBUTES`:
  __code__, __self__, exec_module, load_inline, jiterator, ...), also as a literal getattr
  name; the import machinery's search path (sys.path, sys.meta_path, sys.path_hooks: where an
  import comes from); running a program (os.system, os.exec*, os.spawn*, os.popen);
- `computed name`: getattr/setattr/delattr with a name that is not a literal, and vars,
  globals, locals, __dict__: each reaches any of the above by a string built at run time;
- `look-alike name`: an identifier with a non-ASCII character, as written (Python folds
  `ｒｍｓｎｏｒｍ` to `rmsnorm` and keeps `rmsnοrm`, with a Greek omicron, distinct: either
  reads as another name to a reviewer), and an entry name with one;
- an import of kerneltrial (the target does not have it).

A list of routes cannot be complete in a language this dynamic (a third-party library's own
eval of a string the module hands it is not seen); what it misses, the interface check still
runs as the target would.
"""

from __future__ import annotations

import ast
import io
import tokenize
import unicodedata
from collections.abc import Iterator

DYNAMIC_BUILTINS = ("exec", "eval", "compile", "__import__", "__builtins__")
# module -> what it does that runs code inspect did not read
LOADERS = {
    "builtins": "reaches exec and eval",
    "importlib": "imports modules by a computed name or from a file path",
    "imp": "imports modules from a file path",
    "runpy": "runs a file or module as code",
    "pkgutil": "imports modules by a computed name",
    "zipimport": "imports modules from an archive",
    "code": "runs text as code",
    "codeop": "compiles text",
    "marshal": "loads code objects from bytes",
    "pickle": "runs code while loading bytes",
    "shelve": "unpickles (runs code while loading)",
    "dill": "unpickles (runs code while loading)",
    "cloudpickle": "unpickles (runs code while loading)",
    "ctypes": "loads native code",
    "cffi": "loads native code",
    "subprocess": "runs programs",
    "multiprocessing": "runs code in other processes",
}
CODE_ATTRIBUTES = frozenset(
    {
        "exec",  # on a module object reached another way (sys.modules["builtins"].exec)
        "__code__",  # a function's code object (replaceable with bytes read from a file)
        "__globals__",
        "__builtins__",
        "__self__",  # a builtin function's module: print.__self__ is builtins
        "__subclasses__",  # the classic walk from () to every loaded class
        "CodeType",
        "FunctionType",
        "exec_module",  # loaders
        "load_module",
        "get_code",
        "source_to_code",
        "load_inline",  # torch.utils.cpp_extension: compiles C++/CUDA source text
        "cpp_extension",
        "jiterator",  # torch.cuda.jiterator: compiles CUDA source text
        "meta_path",  # the import machinery (sys.path: SYS_PATH)
        "path_hooks",
        "path_importer_cache",
    }
)
# os functions that run a program (matched on `os.` and `from os import`)
OS_PROCESS = frozenset(
    {"system", "popen", "startfile", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)
COMPUTED = ("getattr", "setattr", "delattr")
SCOPES = ("vars", "globals", "locals", "__dict__")


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


def _code_from_data(module: str, node: ast.AST, what: str) -> str:
    return (
        f"code from data: {module} line {getattr(node, 'lineno', 0)} {what}, so code inspect did not read "
        "(a data entry, a string) could run; put the code in the module itself"
    )


def _module_route(root: str, leaf: str, source: str) -> str:
    """What importing `leaf` (a name or a submodule) of `source`, a module under `root`,
    reaches, when it is refused; else ''."""
    if root in LOADERS:
        return f"imports {root}, which {LOADERS[root]}"
    if leaf in CODE_ATTRIBUTES or (root, leaf) == ("sys", "path") or (root == "os" and leaf in OS_PROCESS):
        return f"imports {leaf} from {source}"
    return ""


def _imports(module: str, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [(alias.name, part) for alias in node.names for part in alias.name.split(".")]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [(node.module, alias.name) for alias in node.names]
        names += [(node.module, part) for part in node.module.split(".")[1:]]
    else:
        return
    for source, leaf in names:
        root = source.split(".")[0]
        if root == "kerneltrial":
            yield f"{module} imports kerneltrial, which the target does not have; inline what it uses"
        elif _module_route(root, leaf, source):
            yield _code_from_data(module, node, _module_route(root, leaf, source))


def _attribute_route(node: ast.Attribute) -> str:
    """What the attribute `node` reaches, when it is refused; else ''."""
    owner = node.value.id if isinstance(node.value, ast.Name) else ""
    if node.attr in CODE_ATTRIBUTES or (owner, node.attr) == ("sys", "path"):
        return f"uses the attribute {node.attr}"
    if owner == "os" and node.attr in OS_PROCESS:
        return f"uses os.{node.attr}, which runs a program"
    return ""


def _computed(module: str, node: ast.Call) -> str:
    """getattr/setattr/delattr with a name computed at run time, or a literal name refused itself."""
    if not (isinstance(node.func, ast.Name) and node.func.id in COMPUTED):
        return ""
    name = node.args[1] if len(node.args) > 1 else None
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        if name.value in CODE_ATTRIBUTES or name.value in DYNAMIC_BUILTINS:
            return _code_from_data(module, node, f"uses the attribute {name.value} through {node.func.id}")
        return ""
    return (
        f"computed name: {module} line {node.lineno} calls {node.func.id} with a name computed at run time, "
        "which can reach exec or eval; write the attribute"
    )


def _names(module: str, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS:
        yield _code_from_data(module, node, f"uses {node.id}, which runs text as code")
    elif (isinstance(node, ast.Name) and node.id in SCOPES) or (
        isinstance(node, ast.Attribute) and node.attr in SCOPES
    ):
        name = node.id if isinstance(node, ast.Name) else node.attr
        yield f"computed name: {module} line {node.lineno} uses {name}, a namespace looked up by string; name what it uses"
    elif isinstance(node, ast.Attribute) and _attribute_route(node):
        yield _code_from_data(module, node, _attribute_route(node))
    elif isinstance(node, ast.Call) and _computed(module, node):
        yield _computed(module, node)


def source_problem(module: str, data: bytes) -> str:
    """The first refusal of `module`'s source (see the module docstring), or '' (also when it
    does not decode or parse: the entry-point check says so)."""
    try:
        source = data.decode("utf-8")
        tree = ast.parse(source, filename=module)
        lookalikes = list(_identifiers(module, source))
    except (UnicodeDecodeError, SyntaxError, tokenize.TokenError):
        return ""
    if lookalikes:
        return min(lookalikes)[1]
    found = [
        (getattr(node, "lineno", 0), problem)
        for node in ast.walk(tree)
        for problem in (*_imports(module, node), *_names(module, node))
    ]
    return min(found)[1] if found else ""
