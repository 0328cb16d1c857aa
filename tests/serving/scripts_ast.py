"""The vendored benchmark scripts, read from their syntax trees (never imported, run or copied): what
`--client official` (the organisers' benchmark_throughput_serve.py) and `--client flagos-chat` (the
fork's benchmark_throughput_flagos.py) must reproduce. A test that needs a script skips, naming the
path, when it is absent."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.serving.bench import Case


def _tree(path: Path) -> ast.Module:
    if not path.is_file():
        pytest.skip(f"vendored script not found at {path} (set KERNELTRIAL_SHARED to the shared folder)")
    return ast.parse(path.read_text())


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"the script has no function {name}: its structure changed, read it again"
    return found[0]


def _assigned(func: ast.FunctionDef, name: str) -> ast.expr:
    """The value of the first `name = ...` in func."""
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name:
            return node.value
    raise AssertionError(f"{func.name} assigns no {name}: the script's structure changed, read it again")


class Evaluator:
    """Module constants evaluated from literals, names of earlier constants and starred lists; an
    argv element may also be `str(NAME)` of a function parameter, left as `{NAME}`."""

    def __init__(self, tree: ast.Module) -> None:
        self.constants: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                try:
                    self.constants[node.targets[0].id] = self.value(node.value)
                except ValueError:
                    pass  # not a constant (a call, a regex table with f-strings, ...)

    def value(self, e: ast.expr) -> Any:
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Name):
            if e.id not in self.constants:
                raise ValueError(e.id)
            return self.constants[e.id]
        if isinstance(e, ast.List | ast.Tuple):
            out: list[Any] = []
            for x in e.elts:
                out += list(self.value(x.value)) if isinstance(x, ast.Starred) else [self.value(x)]
            return out if isinstance(e, ast.List) else tuple(out)
        if isinstance(e, ast.Dict):
            return {self.value(k): self.value(v) for k, v in zip(e.keys, e.values, strict=True) if k is not None}
        raise ValueError(ast.dump(e))

    def word(self, e: ast.expr) -> str:
        """An argv element: a constant, a module constant, or `str(param)` as `{param}`."""
        if isinstance(e, ast.Call) and getattr(e.func, "id", "") == "str":
            inner = e.args[0]
            if isinstance(inner, ast.Name) and inner.id not in self.constants:
                return "{" + inner.id + "}"
            return str(self.value(inner))
        if isinstance(e, ast.Name) and e.id not in self.constants:
            return "{" + e.id + "}"
        return str(self.value(e))


def fill(template: list[str], site: dict[str, str], values: dict[str, int]) -> list[str]:
    """A script's argv template with its parameters filled and its site values replaced by ours."""
    out = [str(values[x[1:-1]]) if x.startswith("{") and x[1:-1] in values else x for x in template]
    for flag, value in site.items():
        out[out.index(flag) + 1] = value
    return out


@dataclass(frozen=True)
class Upstream:
    """benchmark_throughput_serve.py: its constants, run_once's argv, its status values, the summary's
    skip rule and rounding, and its CSV file names."""

    constants: dict[str, Any]
    template: list[str]  # COMMON_ARGS + run_once's options, `{input_len}` ... for the case's values
    statuses: tuple[str, str]  # the "Run Status" of a run whose successful requests equal num_prompts, and else
    counted_from: str  # the lower bound of the slice of runs the summary counts (all_runs[X:])
    skips_failed: bool  # main() leaves out (continue) a case whose counted runs include a failed one
    digits: int  # round(mean(values), digits) in average_metrics
    stamp_format: str  # datetime.now().strftime(...) in main
    files: tuple[str, str]  # the raw and summary CSV names, with {timestamp}
    output_dir: str
    format_columns: tuple[str, ...]  # the columns format_result fills, in its order
    format_keys: dict[str, str]  # column -> the PATTERNS key format_result reads it from (metrics.get(KEY))

    @classmethod
    def read(cls, path: Path) -> Upstream:
        tree = _tree(path)
        ev = Evaluator(tree)
        run_once = _function(tree, "run_once")
        cmd = _assigned(run_once, "cmd")
        assert isinstance(cmd, ast.BinOp) and isinstance(cmd.op, ast.Add) and isinstance(cmd.right, ast.List)
        template = [str(x) for x in ev.value(cmd.left)] + [ev.word(e) for e in cmd.right.elts]
        test_case, main = _function(tree, "run_test_case"), _function(tree, "main")
        return cls(
            ev.constants,
            template,
            _statuses(test_case),
            _counted_from(test_case),
            _skips_failed(main),
            _round_digits(_function(tree, "average_metrics")),
            _stamp_format(main),
            (_file_name(main, "raw_csv"), _file_name(main, "summary_csv")),
            str(ev.value(_assigned(main, "output_dir"))),
            _format_columns(_function(tree, "format_result")),
            _format_keys(_function(tree, "format_result")),
        )

    def argv(self, vllm: str, site: dict[str, str], case: Case) -> list[str]:
        values = {"input_len": case.input_len, "output_len": case.output_len}
        values |= {"concurrency": case.concurrency, "num_prompts": case.num_requests}
        return [vllm, *fill(self.template, site, values)[1:]]


def _format_columns(func: ast.FunctionDef) -> tuple[str, ...]:
    value = _assigned(func, "result")
    assert isinstance(value, ast.Dict)
    return tuple(str(k.value) for k in value.keys if isinstance(k, ast.Constant))


def _format_keys(func: ast.FunctionDef) -> dict[str, str]:
    value = _assigned(func, "result")
    assert isinstance(value, ast.Dict)
    out = {}
    for k, v in zip(value.keys, value.values, strict=True):
        if isinstance(k, ast.Constant) and isinstance(v, ast.Call) and isinstance(v.args[0], ast.Constant):
            out[str(k.value)] = str(v.args[0].value)  # "Benchmark Duration (s)": metrics.get("benchmark_duration")
    return out


def _statuses(func: ast.FunctionDef) -> tuple[str, str]:
    found = [n for n in ast.walk(func) if isinstance(n, ast.IfExp)]
    assert len(found) == 1, "run_test_case's Run Status is no longer one `A if ... else B`: read it again"
    e = found[0]
    assert isinstance(e.body, ast.Constant) and isinstance(e.orelse, ast.Constant)
    test = e.test
    assert isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Eq), "the SUCCESS rule is not an =="
    return str(e.body.value), str(e.orelse.value)


def _counted_from(func: ast.FunctionDef) -> str:
    value = _assigned(func, "valid_runs")
    assert isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice)
    lower = value.slice.lower
    assert isinstance(lower, ast.Name) and value.slice.upper is None
    return lower.id


def _skips_failed(func: ast.FunctionDef) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "has_failed_run":
            return any(isinstance(x, ast.Continue) for x in node.body)
    return False


def _round_digits(func: ast.FunctionDef) -> int:
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "round"]
    assert len(calls) == 1 and isinstance(calls[0].args[1], ast.Constant)
    return int(calls[0].args[1].value)


def _stamp_format(func: ast.FunctionDef) -> str:
    value = _assigned(func, "timestamp")
    assert isinstance(value, ast.Call) and isinstance(value.args[0], ast.Constant)
    return str(value.args[0].value)


def _file_name(func: ast.FunctionDef, name: str) -> str:
    """`os.path.join(output_dir, f"raw_runs_{timestamp}.csv")` as `raw_runs_{timestamp}.csv`."""
    value = _assigned(func, name)
    assert isinstance(value, ast.Call) and isinstance(value.args[1], ast.JoinedStr)
    parts = value.args[1].values
    return "".join(
        str(p.value) if isinstance(p, ast.Constant) else "{" + getattr(p.value, "id", "?") + "}"  # type: ignore[attr-defined]
        for p in parts
    )


@dataclass(frozen=True)
class ForkChat:
    """benchmark_throughput_flagos.py (the fork's chat script): constants and run_benchmark's argv."""

    constants: dict[str, Any]
    template: list[str]
    num_prompts_from: str

    @classmethod
    def read(cls, path: Path) -> ForkChat:
        tree = _tree(path)
        ev = Evaluator(tree)
        func = _function(tree, "run_benchmark")
        cmd = _assigned(func, "cmd")
        assert isinstance(cmd, ast.List)
        prompts = _assigned(func, "num_prompts")
        assert isinstance(prompts, ast.Name)
        return cls(ev.constants, [ev.word(e) for e in cmd.elts], prompts.id)

    def argv(self, vllm: str, site: dict[str, str], case: Case) -> list[str]:
        values = {"input_len": case.input_len, "output_len": case.output_len}
        values |= {"concurrency": case.concurrency, "num_prompts": case.num_requests}
        return [vllm, *fill(self.template, site, values)[1:]]


def argv_differences(ours: list[str], script: list[str], allowed_tail: tuple[str, ...]) -> list[str]:
    """How our argv departs from the script's: each position of the script's argv that differs (named
    by the option it belongs to), and any option after it that is not one of `allowed_tail`."""
    out = []
    for i, want in enumerate(script):
        got = ours[i] if i < len(ours) else "(missing)"
        if got != want:
            owner = next((script[j] for j in range(i, -1, -1) if script[j].startswith("--")), "the command")
            out.append(f"{owner}: {got!r} where the script has {want!r}")
    extra = [x for x in ours[len(script) :] if x.startswith("--") and x not in allowed_tail]
    return out + [f"{x}: not in the script's argv nor a recording option" for x in extra]
