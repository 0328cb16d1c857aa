"""plan.json against protocol.toml (the run ran the preregistered trial), and a confirmation run's
links, candidate and fresh seeds."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from kerneltrial.kernel import links
from kerneltrial.rundir import streams
from kerneltrial.rundir.checks import VerifyResult

CPU_HOST_CALLS = 2  # host-cost calls per sample the runner uses at most without a GPU
CALIBRATION_DEFAULTS = {"injected_slowdown": 0.03, "max_false_positive_rate": 0.05, "min_power": 0.9}
# plausibility defaults the runner writes into plan.json (docs/VERIFY.md, "Statistics"):
PLAUSIBILITY_DEFAULTS = {
    # the highest honest figure in the committed H200 runs is 104.2% of the copy ceiling
    # (results/archive/h200/silu_and_mul-s2, 65536x12288, liger): 15% above the best ceiling is not real work
    "bandwidth_margin": 0.15,
    # a stated convention: the fastest honest kernel in the committed runs (4.06 us,
    # results/archive/h200/sigmoid_gate_mul-r2, 1x2048) is far above half an empty launch
    "launch_floor_fraction": 0.5,
}
# protocol.toml keys that plan.json copies, with the protocol's defaults
PROTOCOL_DEFAULTS = {
    "control": "control",
    "seeds": [0, 1, 2],
    "rounds": 7,
    "tie_band": 0.02,
    "gate": "no_loss",
    "bootstrap_resamples": 2000,
    "bootstrap_seed": 20261129,
    "confidence": 0.95,
    "l2": "cold",
    "layout": "contiguous",
    "dtype": "bfloat16",
    "throttle_fraction": 0.9,
    "target_ci_width": None,
    "max_rounds": 50,
    "time_budget_s": 600.0,
    "exact": False,
    "host_samples": 5,
    "host_calls": 200,
    **CALIBRATION_DEFAULTS,
    **PLAUSIBILITY_DEFAULTS,
}


def check_protocol(run_dir: Path, plan: dict[str, Any], result: VerifyResult) -> None:
    """plan.json says what protocol.toml says: the run ran the preregistered trial."""
    try:
        protocol = {**PROTOCOL_DEFAULTS, **tomllib.loads((run_dir / "protocol.toml").read_text())}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        result.add("plan matches protocol", [f"protocol.toml is not valid TOML ({error})"], "")
        return
    cases = [
        f"{'x'.join(str(n) for n in c.get('shape', []))}/{c.get('layout', PROTOCOL_DEFAULTS['layout'])}/"
        f"{c.get('dtype', PROTOCOL_DEFAULTS['dtype'])}"
        for c in protocol.get("cases", [])
    ]
    bootstrap = plan.get("bootstrap") or {}
    # (field, value in plan.json, value the protocol implies)
    pairs = [
        ("arms", [a.get("name") for a in plan.get("arms", [])], [protocol["control"], *protocol.get("candidates", [])]),
        ("cases", [str(c.get("case")) for c in plan.get("cases", [])], cases),
        ("seeds", plan.get("seeds"), protocol["seeds"]),
        ("rounds", plan.get("rounds"), protocol["rounds"]),
        ("tie_band", plan.get("tie_band"), protocol["tie_band"]),
        ("gate", plan.get("gate"), protocol["gate"]),
        ("bootstrap.resamples", bootstrap.get("resamples"), protocol["bootstrap_resamples"]),
        ("bootstrap.seed", bootstrap.get("seed"), protocol["bootstrap_seed"]),
        ("bootstrap.confidence", bootstrap.get("confidence"), protocol["confidence"]),
        ("l2", plan.get("l2"), protocol["l2"]),
    ]
    if "op" in plan and "op" in protocol:
        pairs.append(("op", plan["op"], protocol["op"]))
    if "order_seed" in plan and not plan.get("order_seed_override"):  # replicates override it (`run --order-seed`)
        pairs.append(("order_seed", plan["order_seed"], protocol.get("order_seed", 0)))
    if "exact" in plan:
        pairs.append(("exact", plan["exact"], protocol["exact"]))
    if isinstance(plan.get("host"), dict):
        declared_calls = int(protocol["host_calls"])
        pairs += [
            ("host.samples", plan["host"].get("samples"), protocol["host_samples"]),
            (
                "host.calls",
                plan["host"].get("calls"),
                declared_calls if plan.get("is_gpu") else min(declared_calls, CPU_HOST_CALLS),
            ),
        ]
    if isinstance(plan.get("plausibility"), dict):
        pairs += [
            (f"plausibility.{key}", plan["plausibility"].get(key), protocol[key]) for key in PLAUSIBILITY_DEFAULTS
        ]
    # the noise settings are optional in plan.json (older runs); compared where present
    for section, keys in (
        ("clocks", ("throttle_fraction",)),
        ("noise_rule", ("target_ci_width", "max_rounds", "time_budget_s")),
        ("calibration", tuple(CALIBRATION_DEFAULTS)),
    ):
        recorded = plan.get(section)
        if isinstance(recorded, dict):
            pairs += [(f"{section}.{key}", recorded[key], protocol[key]) for key in keys if key in recorded]
    problems = [
        f"{name}: plan.json has {planned!r}, protocol.toml says {declared!r}"
        for name, planned, declared in pairs
        if not _same_value(planned, declared)
    ]
    result.add(
        "plan matches protocol",
        problems,
        f"arms, {len(cases)} case ids, seeds, rounds, tie band, gate, bootstrap and L2 as protocol.toml says",
    )


def check_confirmation(run_dir: Path, provenance: dict[str, Any], plan: dict[str, Any], result: VerifyResult) -> None:
    """A confirmation run (protocol.toml phase "confirmation"): its links (provenance.json
    `confirmation`, relative to the run directory) resolve to the digests recorded, its one
    candidate is the `user:<stem>` arm of its one user module, whose rule is the linked one,
    and no linked run used one of its seeds (by a plan.json that hashes as that run's
    summary.json records it). Other runs get no such lines."""
    try:
        protocol = tomllib.loads((run_dir / "protocol.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return  # "plan matches protocol" already fails it
    if protocol.get("phase", "exploratory") != "confirmation":
        return
    record = provenance.get("confirmation")
    if not isinstance(record, dict):
        result.add("confirmation links", ["provenance.json has no `confirmation` links"], "")
        return
    found = links.Links.from_record(record)
    result.add(
        "confirmation links",
        links.link_problems(found, run_dir),
        f"the rule and {len(found.runs)} derived-from run(s) hash as recorded",
    )
    modules = list(provenance.get("impl_modules") or {})
    stem = Path(modules[0]).stem if len(modules) == 1 and modules[0].endswith(".py") else None
    candidates = protocol.get("candidates", [])
    result.add(
        "confirmation candidate",
        []
        if stem is not None and candidates == [f"user:{stem}"] and Path(found.rule.path).name == f"{stem}.rule.toml"
        else [
            f"candidates {candidates} with user modules {modules} and rule {found.rule.path}: a confirmation "
            "has one user module, its `user:<stem>` arm as the one candidate, and links that module's rule"
        ],
        f"the one candidate user:{stem} is the dispatcher whose rule is linked",
    )
    seeds = [int(s) for s in plan.get("seeds", [])]
    result.add(
        "confirmation seeds fresh",
        links.seed_problems(found, run_dir, seeds, streams.plan_bounds(plan)),
        f"seeds {seeds} draw inputs no derived-from run drew (its plan.json as its summary.json records it)",
    )


# the shapes plan.json and provenance.json may name (rundir/documents.py; absent in runs before the key)
DOCUMENT_SCHEMAS = {"plan.json": "kerneltrial.plan/1", "provenance.json": "kerneltrial.provenance/1"}


def check_document_schemas(plan: dict[str, Any], provenance: dict[str, Any], result: VerifyResult) -> None:
    """plan.json's and provenance.json's `schema`, where present, is the one shape kerneltrial writes."""
    problems = [
        f"{name} names schema {doc['schema']!r}; kerneltrial writes {DOCUMENT_SCHEMAS[name]!r} (or, before it, none)"
        for name, doc in (("plan.json", plan), ("provenance.json", provenance))
        if "schema" in doc and doc["schema"] != DOCUMENT_SCHEMAS[name]
    ]
    result.add(
        "document schemas", problems, "plan.json and provenance.json name no other shape than kerneltrial writes"
    )


def _same_value(a: Any, b: Any) -> bool:
    """Equal, with ints and floats compared by value (a TOML 600 and a JSON 600.0 agree); bools stay bools."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b
