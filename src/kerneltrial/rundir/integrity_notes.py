"""The two warnings that say a run's verdict rests on less than the whole isolation (issue 35,
item 4): a `user:` arm left in kerneltrial's process, and isolated arms without a piece of the
sandbox. The summary writes them (kernel/bounds.py), verify recomputes them from plan.json, and
report.md, `performance` and `compare` show every warning that starts with one of `PREFIXES`."""

from __future__ import annotations

from typing import Any

IN_PROCESS = "not isolated: "
SANDBOX = "partial sandbox: "
PREFIXES = (IN_PROCESS, SANDBOX)


def in_process_warning(arm: str) -> str:
    return (
        f"{IN_PROCESS}arm {arm} ran in kerneltrial's process (`isolate` leaves it there): nothing stopped its code from "
        "patching the harness, so its verdict rests on its good faith"
    )


def sandbox_warning(missing: dict[str, str]) -> str:
    pieces = "; ".join(f"{piece} ({why})" for piece, why in missing.items())
    return f"{SANDBOX}isolated arms ran without these sandbox pieces: {pieces}"


def integrity_warnings(plan: dict[str, Any]) -> list[str]:
    """The warnings plan.json calls for: every `user:` arm not in `isolated`, then the sandbox's
    missing pieces (plan `sandbox`)."""
    isolated = set(plan.get("isolated") or [])
    names = [str(a.get("name")) for a in plan.get("arms", []) if isinstance(a, dict)]
    found = [in_process_warning(n) for n in names if n.startswith("user:") and n not in isolated]
    sandbox = plan.get("sandbox") or {}
    if sandbox.get("missing"):
        found.append(sandbox_warning(dict(sandbox["missing"])))
    return found


def integrity_lines(warnings: list[str]) -> list[str]:
    """The warnings of a summary that are about isolation, for pages that show a verdict."""
    return [w for w in warnings if w.startswith(PREFIXES)]
