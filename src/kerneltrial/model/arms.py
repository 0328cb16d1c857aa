"""Model arms: which implementation of each replaceable operator an arm runs.

An arm other than `eager` takes its three operators from the operator registry under the
arm's name, the same implementations the operator trials measure: `kerneltrial` (our
dispatchers), `torch_eager` (the torch formulas), `torch_compile`, `liger`, `flaggems`.
`user:PATH.py` loads a user's module (functions named after the operators, as in operator
trials); an operator it does not define runs the torch formula, and the plan records that.
An arm missing an implementation is unavailable, with the registry's reason.

The Track 2 serving arms as model arms (issue 30): E1 takes kerneltrial's RMSNorm and
residual-add + RMSNorm (vllm-plugin-FL's `rms_norm` covers both), E2 kerneltrial's
SiLU-and-mul, E3 both; an operator an arm does not replace runs the torch formula, so E1-E3
differ from torch_eager only in what they replace (E0, the unpatched model, is `eager`).
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

from kerneltrial.model.build import OPS, OpTable
from kerneltrial.ops.registry import get_op, load_user_module

FALLBACK = "torch_eager"  # what a user module's missing operator, and what a Track 2 arm does not replace, runs
OURS = "kerneltrial"
TRACK2: dict[str, dict[str, str]] = {
    "E1": {"rmsnorm": OURS, "fused_add_rmsnorm": OURS, "silu_and_mul": FALLBACK},
    "E2": {"rmsnorm": FALLBACK, "fused_add_rmsnorm": FALLBACK, "silu_and_mul": OURS},
    "E3": {"rmsnorm": OURS, "fused_add_rmsnorm": OURS, "silu_and_mul": OURS},
}


class ArmUnavailable(RuntimeError):
    """An arm whose implementations cannot run here; the message says which and why."""


def near_miss(arm: str, path: Path, missing: list[str]) -> None:
    """Refuse a user module whose function names miss an operator's by a little (`rms_norm`
    for `rmsnorm`): that operator would silently run the torch formula, and the arm would be
    timed as if the user's kernel ran."""
    defined = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)]
    for op in missing:
        close = difflib.get_close_matches(op, defined, n=1, cutoff=0.75)
        if close:
            raise ArmUnavailable(
                f"arm {arm}: {path.name} defines {close[0]}, not {op}: rename it to {op}, or it is not used "
                f"(an operator the module does not define runs {FALLBACK})"
            )


def op_table(arm: str, base_dir: Path) -> OpTable:
    """The arm's three implementations, resolved now (so an unavailable one fails early)."""
    names = dict(TRACK2[arm]) if arm in TRACK2 else dict.fromkeys(OPS, arm)
    if arm.startswith("user:"):
        spec = arm.removeprefix("user:")
        path = Path(spec) if Path(spec).is_absolute() else base_dir / spec
        added = {impl.op: impl.name for impl in load_user_module(str(path))}
        near_miss(arm, path, missing=[op for op in OPS if op not in added])
        names = {op: added.get(op, FALLBACK) for op in OPS}
    resolved = {}
    for op, name in names.items():
        impl = get_op(op).impls.get(name)
        if impl is None:
            raise ArmUnavailable(f"arm {arm}: {op} has no implementation {name!r}")
        fn = impl.resolve()
        if fn is None:
            raise ArmUnavailable(f"arm {arm}: {op}/{name} is unavailable: {impl.reason}")
        resolved[op] = fn
    return OpTable(
        rmsnorm=resolved["rmsnorm"],
        fused_add_rmsnorm=resolved["fused_add_rmsnorm"],
        silu_and_mul=resolved["silu_and_mul"],
        sources={op: f"{op}/{name}" for op, name in names.items()},
    )
