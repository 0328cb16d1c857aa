"""Confirmation protocols: one derived dispatcher, fresh seeds, linked to its evidence.

`write_confirmation` writes the protocol `kerneltrial protocol confirm` prints: exactly one
candidate (the dispatcher module as a user arm, in `impl_modules`), the control and the cases
of the runs the rule was derived from, those runs' settings (the preregistered gate
included), seeds none of them used, and links (kernel/links.py): the rule's sha256 and each
run's summary.json (and manifest.json) sha256. `check_confirmation` is what `run` asks before
any work: links present and resolving, the rule the one the module loads, that module's arm
the one candidate, seeds fresh.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from kerneltrial.kernel.links import Links, link_problems, seed_problems
from kerneltrial.ops.registry import Case
from kerneltrial.rundir.documents import Link, RunLink
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.trial import protocol as proto

# Settings a confirmation takes from the first run it confirms: what was measured is measured
# the same way (name, phase, arms, cases, seeds and links are the confirmation's own).
COPIED_SETTINGS = (
    "rounds",
    "warmup",
    "calls_per_sample",
    "target_sample_us",
    "l2",
    "backend",
    "tie_band",
    "gate",
    "bootstrap_resamples",
    "bootstrap_seed",
    "confidence",
    "throttle_fraction",
    "target_ci_width",
    "max_rounds",
    "time_budget_s",
    "exact",
    "bandwidth_margin",
    "launch_floor_fraction",
)


def rule_of(module: Path) -> Path:
    """The rule file a dispatcher module loads: `<stem>.rule.toml` next to it."""
    return module.with_name(module.stem + ".rule.toml")


def _relative(path: Path, folder: Path) -> str:
    return Path(os.path.relpath(path.resolve(), folder.resolve())).as_posix()


def write_confirmation(
    rule: Path, module: Path, out: Path, seeds: list[int] | None = None, name: str | None = None
) -> str:
    """Write the confirmation protocol of `rule` as loaded by `module` to `out`; return its text."""
    if out.exists():
        raise proto.ProtocolError(f"{out} exists; protocols are never overwritten: choose another --out")
    if not module.is_file() or module.suffix != ".py":
        raise proto.ProtocolError(f"--module {module} is not a .py file")
    if not rule.is_file():
        raise proto.ProtocolError(f"rule {rule} does not exist; write it with kerneltrial dispatch derive")
    if rule_of(module).resolve() != rule.resolve():
        raise proto.ProtocolError(f"{module} loads {rule_of(module)}, not {rule}; confirm the rule the module loads")
    data = tomllib.loads(rule.read_text())
    runs = [(rule.parent / r["path"], r["summary_sha256"]) for r in data.get("runs", [])]
    if not runs:
        raise proto.ProtocolError(f"{rule} cites no runs; a confirmation confirms a rule derived from runs")
    for run, recorded in runs:
        if not (run / "summary.json").is_file() or sha256_file(run / "summary.json") != recorded:
            raise proto.ProtocolError(
                f"{run}/summary.json is missing or no longer hashes as {rule} cites it ({recorded[:12]}...)"
            )
    first = tomllib.loads((runs[0][0] / "protocol.toml").read_text())
    used = sorted({int(s) for run, _ in runs for s in json.loads((run / "plan.json").read_text())["seeds"]})
    fresh = seeds or list(range(max(used) + 1, max(used) + 1 + len(first.get("seeds", [0, 1, 2]))))
    cases: dict[str, Case] = {}
    for run, _ in runs:
        for c in json.loads((run / "plan.json").read_text())["cases"]:
            case = Case(tuple(c["shape"]), c["dtype"], c["layout"])
            cases.setdefault(case.id, case)
    folder = out.resolve().parent
    links = Links(
        Link(path=_relative(rule, folder), sha256=sha256_file(rule)),
        tuple(
            RunLink(
                path=_relative(run, folder),
                summary_sha256=recorded,
                manifest_sha256=sha256_file(run / "manifest.json") if (run / "manifest.json").is_file() else None,
            )
            for run, recorded in runs
        ),
    )
    text = proto.new(
        data["op"],
        name or f"{data['op']}-confirmation",
        [f"user:{module.stem}"],
        list(cases.values()),
        phase="confirmation",
        control=first.get("control", "control"),
        impl_modules=[_relative(module, folder)],
        seeds=fresh,
        exploratory_seeds=used,
        **{key: first[key] for key in COPIED_SETTINGS if key in first},
        **links.record(),
    )
    out.write_text(text)
    return text


def check_confirmation(protocol_path: Path, p: proto.Protocol) -> Links | None:
    """The links of a confirmation (None for an exploratory protocol), refused with one line
    naming every problem when they are missing, do not resolve, point to another rule than
    the module's, when the one candidate is not that module's arm, or when a seed was used by
    a linked run (or a linked run's plan.json is missing or no longer hashes as its summary)."""
    if p.phase != "confirmation":
        return None
    if p.rule is None or not p.derived_from:
        raise proto.ProtocolError(
            f"{protocol_path}: a confirmation links the rule it confirms and the runs it was derived from; "
            "write it with kerneltrial protocol confirm"
        )
    links = Links.from_record({"rule": p.rule.model_dump(), "derived_from": [r.model_dump() for r in p.derived_from]})
    base = protocol_path.resolve().parent
    problems = link_problems(links, base)
    # every entry counts (a dotted module too): a second user module would ride along unconfirmed
    if len(p.impl_modules) != 1 or not p.impl_modules[0].endswith(".py"):
        problems.append(
            f"impl_modules {p.impl_modules}: a confirmation loads exactly one user module, the dispatcher (.py)"
        )
    else:
        module = base / p.impl_modules[0]
        if rule_of(module).resolve() != (base / links.rule.path).resolve():
            problems.append(f"rule {links.rule.path} is not the rule of the one dispatcher module in impl_modules")
        if p.candidates != [f"user:{module.stem}"]:
            problems.append(
                f"candidates {p.candidates}: a confirmation confirms the dispatcher it links, "
                f"so its one candidate is user:{module.stem}"
            )
    problems += seed_problems(links, base, p.seeds, p.stream_bounds())
    if problems:
        raise proto.ProtocolError(f"{protocol_path}: {'; '.join(problems)}")
    return links
