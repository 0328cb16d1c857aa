"""The import graph of src/kerneltrial: no circle, no upward arrow, no loop between folders,
`rundir` on the ground floor.

The rule, as data, in one place: LAYERS (each folder's floor) and WHAT (each floor in words)
below; docs/DESIGN.md's "Floors" table is drawn from them (`floors_table`, checked here). A module
may import its own group (a folder, or the command line: the `cli` package and the modules in
CLI_MODULES) and any group on a lower floor; nothing else. The graph holds every import, at
module level and inside functions (a lazy import is still an arrow); no two modules may import
each other through any chain, and no two folders either. `rundir` imports no torch, numpy,
pandas or matplotlib, so that every command can read a run directory without them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kerneltrial"
LAYERS = {
    "kerneltrial": 0,
    "rundir": 0,
    "model_fields": 0,
    "gate_rule": 0,
    "publication": 0,
    "ops": 1,
    "stats": 1,
    "kernel": 2,
    "analysis": 3,
    "replicates": 4,
    "suite": 4,
    "trial": 5,
    "plugins": 5,
    "serving": 6,
    "submission": 6,
    "model": 6,
    "fleet": 6,
    "protocol_keys": 7,
    "rundir_reference": 7,
    "cli": 8,
}
WHAT = {
    0: "the run directory (no torch, numpy, pandas or matplotlib); pydantic field walking; the gate's grammar; the UNVERIFIED mark",
    1: "operators; pure statistics",
    2: "a kernel run's summary, independent verifier and report",
    3: "what spans runs and kinds: performance pages, compare, dispatch rules",
    4: "records of kernel runs combined",
    5: "the kernel, replicate and suite runners; vLLM plugins serving our ops",
    6: "serving trials; packages; whole-model trials; Ray fleets",
    7: "the generated references",
    8: "the `cli/` package (one module per command group), `serving/__main__.py`",
}
# the command line's module outside the `cli` package: `python -m kerneltrial.serving`
CLI_MODULES = {"kerneltrial.serving.__main__"}
HEAVY = {"torch", "numpy", "pandas", "matplotlib"}

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], root: Path = PACKAGE) -> set[str]:
    """Every name `path` imports, anywhere in the file; kerneltrial names resolved to the module
    they load (`from kerneltrial.ops import launch` is kerneltrial.ops.launch)."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return found


def import_graph(root: Path = PACKAGE) -> Graph:
    """module -> the kerneltrial modules it imports (external imports are dropped here)."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in files}
    graph: Graph = {}
    for path in files:
        name = module_name(path, root)
        graph[name] = {target for target in imports_of(path, modules, root) if target in modules} - {name}
    return graph


def group_of(module: str) -> str:
    if module in CLI_MODULES or module == "kerneltrial.cli" or module.startswith("kerneltrial.cli."):
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: Graph) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward_arrows(graph: Graph, layers: dict[str, int] = LAYERS) -> list[str]:
    """`a -> b` for each import of a group other than a's own that is not on a lower floor."""
    wrong = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = group_of(source), group_of(target)
            if mine != theirs and layers[theirs] >= layers[mine]:
                wrong.append(f"{source} (floor {layers[mine]}) -> {target} (floor {layers[theirs]})")
    return wrong


def folder_graph(graph: Graph) -> Graph:
    """group -> the other groups its modules import."""
    folders: Graph = {}
    for source, targets in graph.items():
        folders.setdefault(group_of(source), set()).update(group_of(t) for t in targets)
    return {group: targets - {group} for group, targets in folders.items()}


def floors_table(layers: dict[str, int] = LAYERS) -> str:
    """docs/DESIGN.md's "Floors" table, drawn from LAYERS and WHAT."""
    rows = ["| floor | groups | what |", "|---|---|---|"]
    for floor in sorted(set(layers.values())):
        groups = ", ".join(f"`{g}`" for g, f in layers.items() if f == floor and g not in ("kerneltrial", "cli"))
        rows.append(f"| {floor} | {groups or 'the command line'} | {WHAT[floor]} |")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- the tree


def test_every_package_has_a_floor() -> None:
    assert {group_of(module) for module in import_graph()} <= set(LAYERS)


def test_no_circle() -> None:
    assert cycles(import_graph()) == []


def test_no_upward_arrow() -> None:
    assert upward_arrows(import_graph()) == []


def test_no_loop_between_folders() -> None:
    assert cycles(folder_graph(import_graph())) == []


def test_design_draws_the_floors_from_the_declaration() -> None:
    design = (PACKAGE.parents[1] / "docs" / "DESIGN.md").read_text()
    assert floors_table() in design, "docs/DESIGN.md's Floors table: paste tests/test_architecture.py floors_table()"


def test_rundir_is_the_ground_floor() -> None:
    graph = import_graph()
    rundir = [module for module in graph if group_of(module) == "rundir"]
    assert rundir, "no rundir modules found"
    assert {(m, t) for m in rundir for t in graph[m] if group_of(t) != "rundir"} == set()
    heavy = {
        (path.name, name)
        for path in (PACKAGE / "rundir").glob("*.py")
        for name in imports_of(path, set())
        if name.split(".")[0] in HEAVY
    }
    assert heavy == set()


def test_rundir_loads_without_heavy_packages() -> None:
    code = (
        "import sys, kerneltrial.rundir.documents, kerneltrial.rundir.files, kerneltrial.rundir.layout, "
        "kerneltrial.rundir.provenance; print(sorted(m for m in " + repr(HEAVY) + " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def kerneltrial_imports(path: Path, top_only: bool) -> set[str]:
    """The kerneltrial modules `path` imports (`top_only`: at its top level only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else list(ast.walk(tree))
    names = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in nodes if isinstance(n, ast.ImportFrom)}
    return {name for name in names if name.split(".")[0] == "kerneltrial"}


def test_the_isolated_worker_and_the_files_it_loads_import_nothing_of_kerneltrial() -> None:
    """trial/worker.py runs in a process where kerneltrial is not importable (trial/isolation.py):
    it imports nothing of it anywhere (its MODE registry reaches the built-in kernels through
    importlib, by name), and the self-contained files it loads by path import none at their top."""
    from kerneltrial.trial.isolation import SHIMS, WORKER

    assert kerneltrial_imports(WORKER, top_only=False) == set()
    assert {name: kerneltrial_imports(path, top_only=True) for name, path in SHIMS.items()} == {n: set() for n in SHIMS}


def test_the_worker_check_finds_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "worker.py"
    planted.write_text("import torch\n\ndef f():\n    from kerneltrial.trial import gate\n")
    assert kerneltrial_imports(planted, top_only=False) == {"kerneltrial.trial"}
    assert kerneltrial_imports(planted, top_only=True) == set()


# ---------------------------------------------------------------- the checker itself


def test_the_checker_finds_a_planted_circle() -> None:
    planted = {
        "kerneltrial.trial.a": {"kerneltrial.trial.b"},
        "kerneltrial.trial.b": {"kerneltrial.trial.c"},
        "kerneltrial.trial.c": {"kerneltrial.trial.a"},
        "kerneltrial.trial.d": {"kerneltrial.trial.a"},
    }
    assert cycles(planted) == [["kerneltrial.trial.a", "kerneltrial.trial.b", "kerneltrial.trial.c"]]
    assert cycles({"kerneltrial.trial.a": {"kerneltrial.trial.b"}, "kerneltrial.trial.b": set()}) == []


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("kerneltrial.suite.record", "kerneltrial.replicates.record"),  # same floor, another group
        ("kerneltrial.rundir.files", "kerneltrial.kernel.summary"),  # the ground floor reaching up
        ("kerneltrial.stats", "kerneltrial.ops.registry"),  # same floor: stats stays pure
        ("kerneltrial.kernel.verify", "kerneltrial.analysis.performance"),  # a run kind into the cross-kind floor
        ("kerneltrial.kernel.verify", "kerneltrial.suite.record"),  # a run kind into a combination of runs
        ("kerneltrial.ops.rms_norm", "kerneltrial.trial.runner"),  # floor 1 -> floor 5
        ("kerneltrial.trial.runner", "kerneltrial.cli.analysis"),  # into the command line
    ],
)
def test_the_checker_finds_a_planted_upward_arrow(source: str, target: str) -> None:
    assert upward_arrows({source: {target}, target: set()}) == [
        f"{source} (floor {LAYERS[group_of(source)]}) -> {target} (floor {LAYERS[group_of(target)]})"
    ]


def test_the_checker_allows_downward_and_sideways_within_a_group() -> None:
    graph = {
        "kerneltrial.cli": {"kerneltrial.cli.analysis", "kerneltrial.cli.trial"},
        "kerneltrial.cli.analysis": {"kerneltrial.serving.verify", "kerneltrial.rundir.layout"},
        "kerneltrial.trial.runner": {"kerneltrial.kernel.summary", "kerneltrial.trial.gate"},
        "kerneltrial.suite.record": {"kerneltrial.analysis.performance", "kerneltrial.kernel.verify"},
        "kerneltrial.kernel.summary": {"kerneltrial.stats", "kerneltrial.rundir.files"},
    }
    assert upward_arrows(graph) == []


def test_the_checker_finds_a_planted_folder_loop_through_a_command_module(tmp_path: Path) -> None:
    """Before the `cli` package every */cli.py counted as the roof, so trial/cli.py importing model
    and model importing trial hid a loop between the two folders: both checks now catch it."""
    root = tmp_path / "kerneltrial"
    for folder in ("trial", "model"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "trial" / "protocol.py").write_text("")
    (root / "trial" / "cli.py").write_text("from kerneltrial.model import spec\n")
    (root / "model" / "spec.py").write_text("from kerneltrial.trial import protocol\n")
    graph = import_graph(root)
    assert cycles(graph) == []  # no module circle: only the folders loop
    assert cycles(folder_graph(graph)) == [["model", "trial"]]
    assert upward_arrows(graph) == ["kerneltrial.trial.cli (floor 5) -> kerneltrial.model.spec (floor 6)"]


def test_the_graph_resolves_function_level_imports(tmp_path: Path) -> None:
    root = tmp_path / "kerneltrial"
    (root / "trial").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "trial" / "__init__.py").write_text("")
    (root / "trial" / "a.py").write_text("def f():\n    from kerneltrial.trial import b\n")
    (root / "trial" / "b.py").write_text("from kerneltrial.trial.a import f\n")
    graph = import_graph(root)
    assert graph["kerneltrial.trial.a"] == {"kerneltrial.trial.b"}
    assert cycles(graph) == [["kerneltrial.trial.a", "kerneltrial.trial.b"]]


MAX_FUNCTION_LINES = 80  # issue 28: a newcomer reads a function at a glance
MAX_MODULE_LINES = 600  # issue 39


def oversized(root: Path = PACKAGE) -> list[str]:
    """Every module over MAX_MODULE_LINES and every function over MAX_FUNCTION_LINES under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(root)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}: {node.name} has {length} lines")
    return found


def test_no_module_or_function_is_too_long() -> None:
    assert oversized() == []


def test_the_size_check_finds_a_planted_long_function_and_module(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def planted():\n{body}" + "\n" * MAX_MODULE_LINES)
    assert oversized(tmp_path) == [
        f"long.py: {MAX_MODULE_LINES + MAX_FUNCTION_LINES + 1} lines",
        f"long.py: planted has {MAX_FUNCTION_LINES + 1} lines",
    ]
