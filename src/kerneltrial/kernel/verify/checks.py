"""A verifier's result: named checks, each passed, failed with its problems, or not applicable."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    applicable: bool = True  # False: the check does not apply to this run (listed, never failed)


@dataclass
class VerifyResult:
    run_dir: Path
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def add(self, name: str, problems: list[str], ok_detail: str) -> None:
        """Record a check that passed when `problems` is empty, else failed with them listed."""
        self.checks.append(Check(name, not problems, ok_detail if not problems else "; ".join(problems)))

    def not_applicable(self, name: str, why: str) -> None:
        self.checks.append(Check(name, True, why, applicable=False))

    def record(self, name: str, problems: list[str] | None, detail: str) -> None:
        """`add`, or, when `problems` is None, `not_applicable` with `detail` as the reason."""
        if problems is None:
            self.not_applicable(name, detail)
        else:
            self.add(name, problems, detail)
