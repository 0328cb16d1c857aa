"""Fleet runs: one protocol over several devices of a Ray cluster (`kerneltrial run --ray`).

A fleet directory holds protocol.toml (the protocol's bytes), pieces/<unit>.toml (the protocol
each work unit ran: the protocol with its cases cut to the unit's and its order seed; paths
rebased onto pieces/), workers/<unit> (each a complete kernel run directory, with its own
provenance: host, device and its UUID, versions), logs/<unit>.log, abandoned/<unit>-attemptN
(a unit's partial run that attempt N found started on another GPU or host: set aside, never
resumed, so no run mixes two chips' rows) and fleet.json: the work units with their status,
device, error and set-aside runs, the sha256 of what each protocol path named at plan time, and
the combined figures once every unit finished.

- replicas (`--replicas N`): units replica-1..N, each every case, order seed protocol + i
  (as `kerneltrial replicate`);
- shard (`--shard cases`): units shard-1..W, the cases dealt round-robin, each case's arms
  interleaved inside one unit (a speedup is never a ratio of times from two devices).

The combined figures reuse the replicate table's row (replicates/record.py case_row) per (case,
arm) over the units that ran the case: each unit's verdict, speedup and CI, the between-unit
range and sd of the speedup beside the mean within-unit CI width, and the pooled speedup (the
geometric mean over those units). Per arm: each unit's geomean with its CI and preregistered
gate, the pooled geomean over every (case, unit) speedup, and `passed_in_every_unit` (replicas,
one GPU each: "holds on every GPU"; shards: "gate passed in every shard", each shard's gate
judging only its cases). Shards also get `panel_gate`: the protocol's gate over the whole panel
from each case's entry in the shard that ran it, by the kernel summary's own rule. `verify DIR`
verifies every unit's run and `fleet_checks` below.
"""

from __future__ import annotations

import functools
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from kerneltrial.publication import titled
from kerneltrial.replicates.record import case_row
from kerneltrial.rundir.checks import VerifyResult
from kerneltrial.rundir.documents import Document, Freeze, Git, read_provenance, validate
from kerneltrial.rundir.files import read_json, write_json
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import FLEET, FLEET_LOGS, FLEET_PIECES, FLEET_WORKERS, PROTOCOL, REPORT, SUMMARY
from kerneltrial.rundir.summary_doc import read_summary

SCHEMA = "kerneltrial.fleet/1"
Mode = Literal["replicas", "shard"]
# pending: never started; running: started, not ended (a killed driver leaves it); finished: `run`
# exited 0 or 1 with a summary.json; failed: the worker raised, died or `run` exited otherwise;
# refused: the worker's device model is not the fleet's
UnitStatus = Literal["pending", "running", "finished", "failed", "refused"]
ABANDONED = "abandoned"  # partial unit runs started on another GPU or host, set aside


def protocol_paths(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, path) of every path a protocol's TOML names (relative to its folder: a piece
    rebases them onto pieces/), in order: `impl_modules[i]` (dotted
    module names too), `calibration_run`, `rule.path`, `derived_from[i].path`."""
    paths = [(f"impl_modules[{i}]", m) for i, m in enumerate(data.get("impl_modules", []))]
    if "calibration_run" in data:
        paths.append(("calibration_run", data["calibration_run"]))
    if "rule" in data:
        paths.append(("rule.path", data["rule"]["path"]))
    paths += [(f"derived_from[{i}].path", d["path"]) for i, d in enumerate(data.get("derived_from", []))]
    return paths


def _without_paths(data: dict[str, Any]) -> dict[str, Any]:
    """The protocol's keys but cases, order seed and path strings (a rule's sha256 stays)."""
    kept = {k: v for k, v in data.items() if k not in ("cases", "order_seed", "impl_modules", "calibration_run")}
    if "rule" in kept:
        kept["rule"] = {k: v for k, v in kept["rule"].items() if k != "path"}
    if "derived_from" in kept:
        kept["derived_from"] = [{k: v for k, v in d.items() if k != "path"} for d in kept["derived_from"]]
    return kept


class PathDigest(Document):
    """One path of the protocol, as every piece names it, with what it named at plan time."""

    key: str  # as protocol_paths names it
    path: str  # in the protocol, relative to its folder
    piece_path: str  # in every piece, relative to pieces/
    sha256: (
        str | None
    )  # a file's (a user module's as the runner records it), a run directory's manifest.json's; None: absent


class Abandoned(Document):
    path: str  # abandoned/<unit>-attemptN, relative to the fleet directory
    reason: str


class Unit(Document):
    id: str = Field(pattern=r"^(replica|shard)-[1-9][0-9]*$")
    case_indices: list[int]  # positions in the protocol's [[cases]]
    order_seed: int
    status: UnitStatus = "pending"
    attempts: int = 0
    exit_code: int | None = None  # of the unit's last `kerneltrial run`
    error: str | None = None  # why the last attempt failed or was refused
    host: str | None = None
    device: str | None = None  # the worker's device model: the GPU's name, or the CPU's
    device_uuid: str | None = None
    abandoned: list[Abandoned] = []  # partial runs set aside, never resumed (started on another chip)

    @property
    def piece(self) -> str:
        return f"{FLEET_PIECES}/{self.id}.toml"

    @property
    def run(self) -> str:
        return f"{FLEET_WORKERS}/{self.id}"

    @property
    def log(self) -> str:
        return f"{FLEET_LOGS}/{self.id}.log"

    def set_aside(self, attempt: int) -> str:
        """Where attempt `attempt` moves a partial run it must not resume."""
        return f"{ABANDONED}/{self.id}-attempt{attempt}"


class FleetCase(Document):
    case: str
    arm: str
    workers: list[str]  # the units that ran the case (replicas: all; shard: one)
    verdicts: list[str | None]
    speedups: list[float | None]
    ci_low: list[float | None]
    ci_high: list[float | None]
    wins: int
    between_worker_range: float | None  # max - min of the speedups (None unless 2+ units, every one with one)
    between_worker_sd: float | None
    within_worker_ci_width: float | None  # mean over units of ci_high - ci_low
    pooled_speedup: float | None  # geometric mean of the units' speedups (None unless every unit has one)
    same_verdict: bool


class PanelGate(Document):
    """The protocol's gate over the whole panel (shards): each case's entry from its shard."""

    passed: bool
    reasons: list[str]
    geomean: float | None
    geomean_ci_low: float | None
    geomean_ci_high: float | None


class FleetArm(Document):
    arm: str
    workers: list[str]
    gate_passed: list[bool]  # each unit's preregistered gate
    geomeans: list[float | None]  # each unit's geomean over its cases, with its CI
    geomean_ci_low: list[float | None]
    geomean_ci_high: list[float | None]
    pooled_geomean: float | None  # over every (case, unit) speedup
    passed_in_every_unit: bool  # each unit's gate passed (shards: each over its own cases only)
    panel_gate: PanelGate | None  # shards: the gate over the whole panel; replicas: None


class Combined(Document):
    control: str
    cases: list[FleetCase]
    arms: list[FleetArm]


class Fleet(Document):
    schema_: Literal["kerneltrial.fleet/1"] = Field(default=SCHEMA, alias="schema")
    mode: Mode
    requested: int  # replicas: N; shard: the units the cases were dealt to
    protocol_sha256: str
    freeze: Freeze | None  # the protocol's freeze record; None: not frozen
    mixed_devices: bool  # the protocol's key: units on different device models are accepted
    address: str | None  # the Ray cluster's address as given; None: a local cluster
    git: Git  # the driver's code; every unit's run must have run the same
    paths: list[PathDigest]  # the protocol's paths, as the pieces name them, with their sha256
    started_at: str
    finished_at: str | None  # None until every unit finished and the figures were combined
    units: list[Unit]
    combined: Combined | None

    @property
    def complete(self) -> bool:
        return all(u.status == "finished" for u in self.units)


def read_fleet(root: Path) -> Fleet:
    path = Path(root) / FLEET
    return validate(Fleet, read_json(path), path, f"schema {SCHEMA}")


def write_fleet(root: Path, fleet: Fleet) -> None:
    write_json(Path(root) / FLEET, fleet.model_dump(mode="json", by_alias=True))


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def combine(root: Path, fleet: Fleet) -> Combined:
    """The combined figures from the units' summary.json files (every unit finished)."""
    summaries = {u.id: read_json(Path(root) / u.run / SUMMARY) for u in fleet.units}
    first = summaries[fleet.units[0].id]
    control = first["control"]
    arms = [a["name"] for a in first["arms"] if a["name"] != control]
    n_cases = 1 + max(i for u in fleet.units for i in u.case_indices)
    cases: list[FleetCase] = []
    for index in range(n_cases):
        ran = [
            (u.id, summaries[u.id]["cases"][u.case_indices.index(index)])
            for u in fleet.units
            if index in u.case_indices
        ]
        for arm in arms:
            row = case_row(ran[0][1]["case"], arm, [entry["arms"].get(arm, {}) for _, entry in ran])
            known = [s for s in row.speedups if s is not None]
            cases.append(
                FleetCase(
                    case=row.case,
                    arm=arm,
                    workers=[unit for unit, _ in ran],
                    verdicts=row.verdicts,
                    speedups=row.speedups,
                    ci_low=row.ci_low,
                    ci_high=row.ci_high,
                    wins=row.wins,
                    # a case of one unit (a shard) has no spread between units
                    between_worker_range=row.between_run_range if len(ran) > 1 else None,
                    between_worker_sd=row.between_run_sd,
                    within_worker_ci_width=row.within_run_ci_width,
                    pooled_speedup=_geomean(known) if len(known) == len(row.speedups) else None,
                    same_verdict=len(set(row.verdicts)) == 1,
                )
            )
    panel = _panel_gates(root, fleet) if fleet.mode == "shard" else {}
    fleet_arms = []
    for arm in arms:
        aggregates = [summaries[u.id]["aggregates"].get(arm, {}) for u in fleet.units]
        gates = [arm in summaries[u.id]["gate"].get("passed_arms", []) for u in fleet.units]
        speedups = [s for c in cases if c.arm == arm for s in c.speedups if s is not None]
        fleet_arms.append(
            FleetArm(
                arm=arm,
                workers=[u.id for u in fleet.units],
                gate_passed=gates,
                geomeans=[a.get("geomean") for a in aggregates],
                geomean_ci_low=[a.get("geomean_ci_low") for a in aggregates],
                geomean_ci_high=[a.get("geomean_ci_high") for a in aggregates],
                pooled_geomean=_geomean(speedups),
                passed_in_every_unit=all(gates),
                panel_gate=panel.get(arm),
            )
        )
    return Combined(control=control, cases=cases, arms=fleet_arms)


def _panel_gates(root: Path, fleet: Fleet) -> dict[str, PanelGate]:
    """Shards: each arm's gate over the whole panel, every case's entry taken from the shard that
    ran it, judged by the kernel summary's own rule (its aggregates and gate, not a copy)."""
    from kerneltrial import stats
    from kerneltrial.kernel.summary_cases import aggregates_and_gate
    from kerneltrial.kernel.summary_inputs import load_run
    from kerneltrial.kernel.summary_schemas import schema_of

    typed = {u.id: read_summary(Path(root) / u.run) for u in fleet.units}
    ran_by = {i: u for u in fleet.units for i in u.case_indices}
    cases = [typed[ran_by[i].id].cases[ran_by[i].case_indices.index(i)] for i in sorted(ran_by)]
    first = fleet.units[0]
    run = load_run(Path(root) / first.run)  # the plan's gate and arms; the summary schema's gate rule
    bootstrap = typed[first.id].bootstrap
    rule = stats.BootstrapRule(bootstrap.resamples, bootstrap.seed, bootstrap.confidence)
    # no ceilings: they feed only the plausibility limits, already judged into each case's status
    aggregates, gate = aggregates_and_gate(cases, run.plan, typed[first.id].control, rule, schema_of(run, None, None))
    return {
        arm: PanelGate(
            passed=verdict.passed,
            reasons=verdict.reasons,
            geomean=aggregates[arm].geomean,
            geomean_ci_low=aggregates[arm].geomean_ci_low,
            geomean_ci_high=aggregates[arm].geomean_ci_high,
        )
        for arm, verdict in gate.arms.items()
    }


# ---------------------------------------------------------------- verify


def _coverage(parent: dict[str, Any], fleet: Fleet) -> list[str]:
    n = len(parent["cases"])
    units = fleet.units
    prefix = "replica" if fleet.mode == "replicas" else "shard"
    problems = []
    if [u.id for u in units] != [f"{prefix}-{i}" for i in range(1, fleet.requested + 1)]:
        problems.append(f"units {[u.id for u in units]} are not {prefix}-1..{fleet.requested}")
    base = parent.get("order_seed", 0)
    if fleet.mode == "replicas":
        partial = [u.id for u in units if u.case_indices != list(range(n))]
        if partial:
            problems.append(f"replicas {partial} do not run every case of the protocol exactly once")
        seeds = [base + i for i in range(1, len(units) + 1)]
        if [u.order_seed for u in units] != seeds:
            problems.append(f"order seeds {[u.order_seed for u in units]} are not {seeds} (the protocol's {base} + i)")
        return problems
    dealt = sorted(i for u in units for i in u.case_indices)
    missing = sorted(set(range(n)) - set(dealt))
    twice = sorted({i for i in dealt if dealt.count(i) > 1})
    if missing or twice or len(dealt) != n:
        problems.append(
            f"the shards cover case(s) {dealt} of the protocol's 0..{n - 1}: missing {missing}, more than once {twice}; "
            "every case runs in exactly one shard"
        )
    if any(u.order_seed != base for u in units):
        problems.append(f"shard order seeds {[u.order_seed for u in units]} are not the protocol's {base}")
    return problems


def _pieces(root: Path, parent: dict[str, Any], fleet: Fleet) -> list[str]:
    """Each unit's run ran its piece: the protocol with the unit's cases and order seed, its paths
    those recorded at plan time (the user modules' hashes its run recorded among them), nothing
    else changed."""
    problems = []
    kept = _without_paths(parent)
    recorded = [(d.key, d.path) for d in fleet.paths]
    if recorded != protocol_paths(parent):
        problems.append(f"fleet.json records paths {recorded}; {PROTOCOL} names {protocol_paths(parent)}")
    pieces = [(d.key, d.piece_path) for d in fleet.paths]
    modules = {d.piece_path: d.sha256 for d in fleet.paths if d.key.startswith("impl_modules[") and d.sha256}
    for u in fleet.units:
        ran_path = root / u.run / PROTOCOL
        if not ran_path.is_file():
            continue  # the units check names it
        if (root / u.piece).is_file() and sha256_file(root / u.piece) != sha256_file(ran_path):
            problems.append(f"{u.run}/{PROTOCOL} is not {u.piece}")
        ran = tomllib.loads(ran_path.read_text())
        if ran.get("cases") != [parent["cases"][i] for i in u.case_indices if i < len(parent["cases"])]:
            problems.append(f"{u.id} ran cases {ran.get('cases')}, not the protocol's cases {u.case_indices}")
        if ran.get("order_seed", 0) != u.order_seed:
            problems.append(f"{u.id} ran order seed {ran.get('order_seed', 0)}, listed {u.order_seed}")
        without = _without_paths(ran)
        other = sorted(k for k in {*kept, *without} if kept.get(k) != without.get(k))
        if other:
            problems.append(f"{u.id} ran a protocol that differs from the fleet's in {', '.join(other)}")
        if protocol_paths(ran) != pieces:
            problems.append(f"{u.id} ran paths {protocol_paths(ran)}; every piece names {pieces}")
        if (root / u.run / "provenance.json").is_file():
            loaded = read_provenance(root / u.run).impl_modules
            changed = sorted(m for m, digest in modules.items() if loaded.get(m) != digest)
            if changed:
                problems.append(f"{u.id} loaded {changed} with other sha256 than they had when the fleet was planned")
    return problems


def _units(root: Path, fleet: Fleet) -> list[str]:
    problems = [
        f"{u.id} did not finish (status {u.status}, exit {u.exit_code}{', ' + u.error if u.error else ''}): "
        "continue with `kerneltrial run ... --ray --resume`"
        for u in fleet.units
        if u.status != "finished" or not (root / u.run / SUMMARY).is_file()
    ]
    listed = {Path(u.run).name for u in fleet.units}
    present = (
        {d.name for d in (root / FLEET_WORKERS).iterdir() if d.is_dir()} if (root / FLEET_WORKERS).is_dir() else set()
    )
    if present - listed:
        problems.append(f"{FLEET_WORKERS}/ holds runs no unit lists: {', '.join(sorted(present - listed))}")
    set_aside = {a.path for u in fleet.units for a in u.abandoned}
    found = {f"{ABANDONED}/{d.name}" for d in (root / ABANDONED).iterdir()} if (root / ABANDONED).is_dir() else set()
    if found != set_aside:
        problems.append(
            f"{ABANDONED}/ holds {sorted(found)}, the units list {sorted(set_aside)} as set aside: "
            "a partial run moved aside is listed with its reason"
        )
    if fleet.finished_at is None:
        problems.append("the fleet did not end (finished_at is null)")
    return problems


def _devices_and_code(root: Path, fleet: Fleet) -> tuple[list[str], list[str]]:
    devices, code = [], []
    modules: dict[str, dict[str, str]] = {}
    chips: dict[str, list[str]] = {}
    for u in fleet.units:
        if not (root / u.run).is_dir():
            continue
        provenance = read_provenance(root / u.run)
        if provenance.device.uuid is not None:
            chips.setdefault(provenance.device.uuid, []).append(u.id)
        ran_on = provenance.device.gpu or provenance.device.cpu
        if (u.device, u.device_uuid, u.host) != (ran_on, provenance.device.uuid, provenance.hostname):
            devices.append(
                f"{u.id} lists device {u.device!r} ({u.device_uuid}) on {u.host!r}; its run recorded {ran_on!r} "
                f"({provenance.device.uuid}) on {provenance.hostname!r}"
            )
        if provenance.git.source_sha256 != fleet.git.source_sha256:
            code.append(
                f"{u.id} ran other code (source sha256 {str(provenance.git.source_sha256)[:12]}...) than the fleet"
            )
        modules[u.id] = {Path(name).name: digest for name, digest in provenance.impl_modules.items()}
    models = sorted({str(u.device) for u in fleet.units})
    if len(models) > 1 and not fleet.mixed_devices:
        devices.append(f"units ran on {models}; the protocol does not allow mixed devices (mixed_devices = true)")
    if fleet.mode == "replicas":  # one GPU per replica, or "holds on every GPU" counts a chip twice
        devices += [f"replicas {', '.join(ids)} ran on one GPU, {uuid}" for uuid, ids in chips.items() if len(ids) > 1]
    if len({tuple(sorted(m.items())) for m in modules.values()}) > 1:
        code.append(f"units loaded different user kernel modules: {modules}")
    return devices, code


def fleet_checks(root: Path) -> list[tuple[str, list[str], str]]:
    """(name, problems, detail when none) of each check of the combination; every unit's run is
    verified on its own by the kernel verifier (kernel/verify/)."""
    root = Path(root)
    fleet = read_fleet(root)
    parent = tomllib.loads((root / PROTOCOL).read_text())
    sha_problems = (
        [f"{PROTOCOL} is not the protocol the fleet ran (sha256 {sha256_file(root / PROTOCOL)[:12]}...)"]
        if sha256_file(root / PROTOCOL) != fleet.protocol_sha256
        else []
    )
    if bool(parent.get("mixed_devices", False)) != fleet.mixed_devices:
        sha_problems.append(f"fleet.json mixed_devices {fleet.mixed_devices} is not the protocol's")
    devices, code = _devices_and_code(root, fleet)
    units = _units(root, fleet)
    figures: list[str] = []
    if not units:
        recomputed = combine(root, fleet)
        if fleet.combined != recomputed:
            changed = [
                f"{c.case}/{c.arm}"
                for c, r in zip(fleet.combined.cases if fleet.combined else [], recomputed.cases, strict=False)
                if c != r
            ]
            changed += [
                a.arm
                for a, r in zip(fleet.combined.arms if fleet.combined else [], recomputed.arms, strict=False)
                if a != r
            ]
            figures.append(
                "fleet.json's combined figures differ from those recomputed from the units' summaries"
                + (f" in {', '.join(changed)}" if changed else " (missing, or other rows)")
            )
    return [
        ("fleet protocol", sha_problems, "protocol.toml is the protocol the fleet ran"),
        (
            "fleet units",
            units,
            "every unit finished into its listed run directory, none unlisted or set aside unlisted",
        ),
        ("fleet coverage", _coverage(parent, fleet), f"the units cover the protocol's cases as {fleet.mode} should"),
        (
            "fleet pieces",
            _pieces(root, parent, fleet),
            "each unit ran the protocol cut to its cases and order seed, its paths and modules as planned",
        ),
        (
            "fleet devices",
            devices,
            "each unit's device and host are its run's; one device model unless mixed; replicas on distinct GPUs",
        ),
        ("fleet code", code, "every unit ran the fleet's code and the same user kernel modules"),
        (
            "combined figures",
            figures if not units else ["not recomputed: some unit did not finish"],
            "fleet.json's figures are those recomputed from the units",
        ),
    ]


# ---------------------------------------------------------------- report


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _verdict(mode: Mode, arm: FleetArm) -> str:
    if mode == "replicas":
        return "holds on every GPU" if arm.passed_in_every_unit else "does NOT hold on every GPU"
    every = "gate passed in every shard" if arm.passed_in_every_unit else "gate NOT passed in every shard"
    panel = arm.panel_gate
    if panel is None:
        return every
    ci = f"[{_fmt(panel.geomean_ci_low)}, {_fmt(panel.geomean_ci_high)}]"
    judged = "passed" if panel.passed else f"FAILED ({'; '.join(panel.reasons)})"
    return f"gate over the whole panel {judged}, geomean {_fmt(panel.geomean)} {ci}; {every}"


def fleet_markdown(root: Path, unverified: bool = False) -> str:
    """The fleet's report.md (a function of the directory: verify renders it again and compares)."""
    fleet = read_fleet(root)
    lines = [
        titled(
            f"# Fleet run: {fleet.mode}, {len(fleet.units)} units of protocol {fleet.protocol_sha256[:12]}...",
            unverified,
        ),
        "",
        f"- cluster: {fleet.address or 'local'}; started {fleet.started_at}, finished {fleet.finished_at or 'NOT FINISHED'}",
        "",
        "| unit | status | host | device | uuid | cases | order seed | set aside |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for u in fleet.units:
        status = u.status + (f" ({u.error})" if u.error and u.status != "finished" else "")
        aside = "; ".join(f"{a.path}: {a.reason}" for a in u.abandoned) or "none"
        lines.append(
            f"| [`{u.id}`]({u.run}/{REPORT}) | {status} | {u.host} | {u.device} | {u.device_uuid} "
            f"| {len(u.case_indices)} | {u.order_seed} | {aside} |"
        )
    combined = fleet.combined
    if combined is None:
        return "\n".join([*lines, "", "Not every unit finished: no combined figures.", ""])
    lines += ["", f"## Per arm, against `{combined.control}`", ""]
    for a in combined.arms:
        per_unit = "; ".join(
            f"{w}: {_fmt(g)} [{_fmt(lo)}, {_fmt(hi)}] gate {'passed' if p else 'FAILED'}"
            for w, g, lo, hi, p in zip(
                a.workers, a.geomeans, a.geomean_ci_low, a.geomean_ci_high, a.gate_passed, strict=True
            )
        )
        lines.append(
            f"- `{a.arm}`: {_verdict(fleet.mode, a)}; pooled geomean {_fmt(a.pooled_geomean)}; per unit geomean [CI]: {per_unit}"
        )
    lines += [
        "",
        "## Per case",
        "",
        "Between-unit spread of the speedup (range, sd; replicas only) beside the mean within-unit CI width.",
        "",
        "| case | arm | units | speedups | verdicts | pooled | between range | between sd | within CI width |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in combined.cases:
        lines.append(
            f"| {c.case} | {c.arm} | {', '.join(c.workers)} | {' / '.join(_fmt(s) for s in c.speedups)} "
            f"| {' / '.join(v or 'n/a' for v in c.verdicts)} | {_fmt(c.pooled_speedup)} | {_fmt(c.between_worker_range)} "
            f"| {_fmt(c.between_worker_sd)} | {_fmt(c.within_worker_ci_width)} |"
        )
    return "\n".join(lines) + "\n"


def write_fleet_report(root: Path, unverified: bool = False) -> Path:
    """Each finished unit's report.md, then the fleet's report.md; returns its path.
    `unverified`: every title says the fleet was not required to verify."""
    from kerneltrial.kernel.report import write_report  # matplotlib: not on verify's path

    root = Path(root)
    for u in read_fleet(root).units:
        if (root / u.run / SUMMARY).is_file():
            write_report(root / u.run, unverified)
    path = root / REPORT
    path.write_text(fleet_markdown(root, unverified))
    return path


def verify_fleet(root: Path) -> VerifyResult:
    """A fleet directory (`run --ray`): every unit's run present verified (checks prefixed with the
    unit), then the combination (`fleet_checks`: coverage, pieces, devices, code, figures)."""
    from kerneltrial.kernel.verify import check_written_after, member_checks

    result = VerifyResult(root)
    for unit in read_fleet(root).units:
        if (root / unit.run).is_dir():  # else the fleet units check names it
            result.checks += member_checks(unit.id, root / unit.run)
    for name, problems, detail in fleet_checks(root):
        result.add(name, problems, detail)
    check_written_after(result, root, root / REPORT, functools.partial(fleet_markdown, root))
    return result
