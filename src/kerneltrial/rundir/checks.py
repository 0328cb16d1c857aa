"""The result of every verifier (kernel, serving, model, replicates, suite, fleet): named checks,
each passed, failed with the problems it found, or not applicable to the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # passed: what was checked; failed: the problems, joined with "; "; not applicable: why
    applicable: bool = True  # False: the check does not apply to this run (listed, never failed)
    problems: tuple[str, ...] = ()  # failed: each problem found

    def renamed(self, name: str) -> Check:
        """The same check under `name` (a run's checks inside a replicate, suite or fleet directory)."""
        return Check(name, self.ok, self.detail, self.applicable, self.problems)


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

    @property
    def problems(self) -> list[str]:
        """Every problem of the failed checks, check by check (empty: the run verifies)."""
        return [problem for check in self.failures for problem in check.problems]

    def add(self, name: str, problems: list[str], ok_detail: str) -> None:
        """Record a check that passed when `problems` is empty, else failed with them listed."""
        detail = ok_detail if not problems else "; ".join(problems)
        self.checks.append(Check(name, not problems, detail, problems=tuple(problems)))

    def not_applicable(self, name: str, why: str) -> None:
        self.checks.append(Check(name, True, why, applicable=False))

    def record(self, name: str, problems: list[str] | None, detail: str) -> None:
        """`add`, or, when `problems` is None, `not_applicable` with `detail` as the reason."""
        if problems is None:
            self.not_applicable(name, detail)
        else:
            self.add(name, problems, detail)
