"""verify's check of the proof of dispatch in a serving run directory.

Rereads every launch's call records (launches/NN-ARM/dispatch/dispatch-PID.json), rehashes
them, and decides again from the arm's environment in plan.json whether the launch ran what
the arm selects; then compares with the verdicts in launches.jsonl (`dispatch`) and
summary.json (`dispatch`). The decision is written out here from the rules in
docs/serving.md ("Kernels inside the served model"), not imported from dispatch_proof.py or
the plugins: a bug in the writer's rule must show up as a disagreement, not be repeated.
Run directories from before the proof existed (no `dispatch` in plan, summary or any
launch row) are not applicable: nothing is checked.
The same records' imports-PID.json give each launch's `pins.imported` again
(serving/dist_imports.py, the writer's own comparison: it is a definition, like the scope).

Call counts are bounded by what the launch's requests can produce (`call_bounds`, issue 26: a
consistent rewrite claiming 10^9 kernel calls for 8 requests passed): every forward pass
processes at least one token, so a launch made at most (tokens it was sent + start-up passes)
passes, each calling one kernel-level op at most CALLS_PER_LAYER times per decoder layer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.serving.dist_imports import imported_problems

# The documented format: variables, labels and the operators each dispatch op runs.
OPS_ENV, KERNELS_ENV, FL_PER_OP_ENV = "KERNELTRIAL_VLLM_OPS", "KERNELTRIAL_KERNELS", "VLLM_FL_PER_OP"
LOG_ENV, COMPILE_CACHE_ENV = "KERNELTRIAL_DISPATCH_LOG", "VLLM_DISABLE_COMPILE_CACHE"
OUR_MODULE, OUR_LABEL, FALLBACK_LABEL = "kerneltrial.plugins.kernels", "kerneltrial", "vllm-native"
FL_SELECTORS = ("vendor:kerneltrial", "impl:vendor.kerneltrial")
DISPATCH_OP_OF = {"rms_norm": "rms_norm", "fused_add_rms_norm": "rms_norm", "silu_and_mul": "silu_and_mul"}

Counts = dict[tuple[str, str], tuple[int, int]]  # (kernel op, implementation) -> (calls, errors)

# The plausibility bound on a launch's call counts (docs/serving.md, "Kernels inside the served model"); generous
# on purpose, it catches invented counts, not miscounts:
# - a decoder layer calls a norm or activation kernel a few times per forward pass (input and
#   post-attention RMSNorm, q/k norms in Qwen3-style attention, one SiLU-and-mul per MLP): 8 covers it,
#   and one more layer's worth covers the final norm;
CALLS_PER_LAYER = 8
# - vLLM's start-up runs passes of its own: the profile run, torch.compile warm-up and CUDA-graph
#   capture (up to 512 batch sizes, a few passes each);
STARTUP_PASSES = 10_000
# - a prompt's chat template and the client's initial test request add tokens beyond the case's;
TEMPLATE_TOKENS = 256
# - a model whose config.json the run could not read (plan.json model_layers null): the deepest
#   served models have about 128 layers.
UNKNOWN_LAYERS = 256


@dataclass
class Recount:
    """verify's own verdict on one launch: `broken` lists every rule the records break."""

    broken: list[str] = field(default_factory=list)
    intended: dict[str, str] = field(default_factory=dict)
    processes: int = 0
    counts: Counts = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    selection: dict[str, str] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.broken


FL_FILE_ENVS = ("VLLM_FL_CONFIG", "VLLM_FL_OP_CONFIG")
FL_BACKENDS = ("flagos", "vendor", "reference")
FL_DEFAULT = {"flagos": ["flagos", "vendor", "reference"], "vendor": ["vendor", "flagos", "reference"]}
FL_DEFAULT["reference"] = ["reference", "flagos", "vendor"]


@dataclass
class FlRead:
    """vllm-plugin-FL's policy as verify reads it again: per-op orders, their source, the filters."""

    per_op: dict[str, list[str]]
    source: str
    prefer: str
    allow: set[str] | None
    deny: set[str]
    known: bool  # False: the platform table would decide, and the run did not state it

    def order(self, op: str) -> tuple[list[str] | None, str]:
        if op in self.per_op:
            return self.per_op[op], self.source
        if not self.known:
            return None, "the platform table (not stated: [server.fl_platform])"
        return FL_DEFAULT[self.prefer], f"the default order (prefer {self.prefer})"

    @property
    def ours_passes(self) -> bool:
        return OUR_LABEL not in self.deny and (self.allow is None or OUR_LABEL in self.allow)


def _names(value: Any) -> set[str]:
    if isinstance(value, list):
        return {str(v).strip() for v in value if v}
    return {x.strip() for x in str(value or "").split(",") if x.strip()}


def fl_read(env: Mapping[str, str], platform: Mapping[str, Any] | None, texts: Mapping[str, str | None]) -> FlRead:
    """The policy's precedence (docs/serving.md, "Selection you can see"): VLLM_FL_CONFIG's file is
    the whole policy; else VLLM_FL_OP_CONFIG's file, else VLLM_FL_PER_OP, else the platform table."""
    config = env.get("VLLM_FL_CONFIG", "").strip()
    if config and texts.get("VLLM_FL_CONFIG") is not None:
        import yaml

        doc = yaml.safe_load(texts["VLLM_FL_CONFIG"] or "") or {}
        orders = {
            str(op): [str(t).strip() for t in (v.split("|") if isinstance(v, str) else v) if t and str(t).strip()]
            for op, v in (doc.get("op_backends") or {}).items()
        }
        prefer = str(doc.get("prefer", "flagos")).strip().lower()
        allow = _names(doc["allow_vendors"]) if doc.get("allow_vendors") else None
        fl_prefer = prefer if prefer in FL_BACKENDS else "flagos"
        return FlRead(orders, f"VLLM_FL_CONFIG {config}", fl_prefer, allow, _names(doc.get("deny_vendors")), True)
    plat = platform or {}
    env_prefer = env.get("VLLM_FL_PREFER", "").strip().lower()
    prefer = env_prefer if env_prefer in FL_BACKENDS else str(plat.get("prefer", "flagos"))
    deny = _names(env.get("VLLM_FL_DENY_VENDORS")) or _names(plat.get("deny_vendors"))
    allow_env = _names(env.get("VLLM_FL_ALLOW_VENDORS"))
    allow = allow_env or (_names(plat["allow_vendors"]) if plat.get("allow_vendors") else None)
    op_config = env.get("VLLM_FL_OP_CONFIG", "").strip()
    if op_config:
        text = texts.get("VLLM_FL_OP_CONFIG")
        if text is None:
            raise ValueError(f"VLLM_FL_OP_CONFIG file not found: {op_config} (vllm_fl refuses to import)")
        doc = json.loads(text)
        if not all(isinstance(v, str) and v.strip().lower() in FL_BACKENDS for v in doc.values()):
            raise ValueError(f"VLLM_FL_OP_CONFIG {op_config} names a backend other than {', '.join(FL_BACKENDS)}")
        if doc:
            orders = {str(op): [v.strip().lower()] for op, v in doc.items()}
            return FlRead(orders, f"VLLM_FL_OP_CONFIG {op_config}", prefer, allow, deny, True)
    per_op: dict[str, list[str]] = {}
    for part in env.get(FL_PER_OP_ENV, "").split(";"):
        op, _, order = part.partition("=")
        tokens = [t.strip() for t in order.split("|") if t.strip()]
        if op.strip() and tokens:
            per_op[op.strip()] = tokens
    if per_op:
        return FlRead(per_op, FL_PER_OP_ENV, prefer, allow, deny, True)
    if not plat:
        return FlRead({}, "the platform table (not stated)", prefer, allow, deny, False)
    table = {str(op): [str(t) for t in v] for op, v in (plat.get("op_backends") or {}).items()}
    return FlRead(table, f"platform {plat.get('name')}", prefer, allow, deny, True)


def intended(
    env: Mapping[str, str], platform: Mapping[str, Any] | None = None, texts: Mapping[str, str | None] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """(dispatch op -> implementation label the environment selects, dispatch op -> its FL order and
    source); ValueError on an unknown op or an unreadable selection file."""
    module = env.get(KERNELS_ENV, "").strip() or OUR_MODULE
    label = OUR_LABEL if module == OUR_MODULE else module
    ops = {x.strip() for x in env.get(OPS_ENV, "").split(",") if x.strip()}
    unknown = ops - set(DISPATCH_OP_OF.values())
    if unknown:
        raise ValueError(f"{OPS_ENV} names unknown op(s) {sorted(unknown)}")
    orders: dict[str, str] = {}
    if any(env.get(v) for v in (FL_PER_OP_ENV, *FL_FILE_ENVS)) or platform:
        fl = fl_read(env, platform, texts or {})
        for op in sorted(set(DISPATCH_OP_OF.values())):
            order, source = fl.order(op)
            if order and order[0] in FL_SELECTORS and fl.ours_passes:
                ops.add(op)
            drop = "" if fl.ours_passes else f"; the vendor filters drop {OUR_LABEL}"
            orders[op] = f"{'|'.join(order) if order is not None else 'unknown'} ({source}{drop})"
    return {op: label for op in sorted(ops)}, orders


def recount(
    directory: Path,
    env: Mapping[str, str],
    platform: Mapping[str, Any] | None = None,
    texts: Mapping[str, str | None] | None = None,
) -> Recount:
    files = sorted(directory.glob("dispatch-*.json")) if directory.is_dir() else []
    out = Recount(files={f.name: sha256_file(f) for f in files})
    try:
        out.intended, out.selection = intended(env, platform, texts)
    except ValueError as e:
        out.broken.append(str(e))
        return out
    loads: list[dict[str, Any]] = []
    for f in files:
        try:
            raw = json.loads(f.read_text())
            if raw["schema"] != 1:
                raise ValueError(f"schema {raw['schema']!r}")
            loads += [{"plugin": str(x["plugin"]), "error": x["error"]} for x in raw["loads"]]
            for c in raw["counts"]:
                n, e = out.counts.get((str(c["op"]), str(c["impl"])), (0, 0))
                out.counts[(str(c["op"]), str(c["impl"]))] = (n + int(c["calls"]), e + int(c["errors"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            out.broken.append(f"{f.name} is not a dispatch record ({e!r})")
            out.counts = {}
            return out
    out.processes = len(files)
    out.broken += [f"plugin {x['plugin']} failed to load: {x['error']}" for x in loads if x["error"]]
    if out.intended and not files:
        out.broken.append("no dispatch records although the arm selects kerneltrial kernels")
    for (op, impl), (n, e) in sorted(out.counts.items()):
        if impl == FALLBACK_LABEL:
            out.broken.append(f"{op}: {n} layer(s) fell back to vLLM's own code")
        if e:
            out.broken.append(f"{op}: {e} call(s) of {impl} raised")
        if n and out.intended.get(DISPATCH_OP_OF.get(op, op)) != impl:
            out.broken.append(f"{op}: {n} call(s) of {impl}, which the arm does not select")
    for op, label in out.intended.items():
        if not sum(n for (o, i), (n, _) in out.counts.items() if i == label and DISPATCH_OP_OF.get(o) == op):
            out.broken.append(f"{op}: the selected {label} served no call")
    return out


def call_bounds(path: Path, plan: dict[str, Any], launches: list[dict[str, Any]]) -> dict[int, int]:
    """Per launch, the most calls of one kernel-level op its requests can produce: CALLS_PER_LAYER
    x (layers + 1) x (tokens + STARTUP_PASSES). Tokens: every planned run's requests and the
    client's initial test request at the case's lengths (plus TEMPLATE_TOKENS each), and, in the
    arm's first launch, the accuracy run's prompts (bytes) and max_tokens per stored problem."""
    recorded = plan.get("model_layers")  # a forged count cannot lift the bound past the deepest model's
    layers = min(recorded, UNKNOWN_LAYERS) if isinstance(recorded, int) and recorded > 0 else UNKNOWN_LAYERS
    per_launch = sum(
        int(plan.get("repeats", 0))
        * (int(c["num_requests"]) + 1)
        * (int(c["input_len"]) + int(c["output_len"]) + TEMPLATE_TOKENS)
        for c in plan.get("cases", [])
    )
    first_of: dict[str, int] = {}
    for row in launches:
        if row.get("spawned", True) and "launch" in row:
            first_of.setdefault(str(row.get("arm")), int(row["launch"]))
    bounds = {}
    for row in launches:
        tokens = per_launch
        if plan.get("accuracy") and first_of.get(str(row.get("arm"))) == row.get("launch"):
            tokens += _accuracy_tokens(path / "accuracy" / str(row.get("arm")) / "records.jsonl", plan["accuracy"])
        bounds[int(row["launch"])] = CALLS_PER_LAYER * (layers + 1) * (tokens + STARTUP_PASSES)
    return bounds


def _accuracy_tokens(records: Path, spec: dict[str, Any]) -> int:
    if not records.is_file():
        return 0
    total = 0
    for line in records.read_text().splitlines():
        if line.strip():
            prompt = str(json.loads(line).get("prompt", ""))
            total += len(prompt.encode()) + TEMPLATE_TOKENS + int(spec.get("max_tokens", 0))
    return total


def selection_copies(path: Path, arm: Mapping[str, Any], problems: list[str]) -> dict[str, str | None]:
    """The text of the arm's selection files from their copies in the run directory, rehashed
    against plan.json (runs before issue 26 have none)."""
    out: dict[str, str | None] = {}
    for var, c in (arm.get("selection_files") or {}).items():
        if not c.get("copy"):
            out[var] = None
            continue
        copy = path / c["copy"]
        if not copy.is_file() or sha256_file(copy) != c.get("sha256"):
            problems.append(
                f"arm {arm['name']}: the copy of its {var} file {c['copy']} is missing or differs from plan.json"
            )
            out[var] = None
            continue
        out[var] = copy.read_text()
    return out


def _counts_of(rows: Any) -> Counts:
    return {(str(r["op"]), str(r["impl"])): (int(r["calls"]), int(r["errors"])) for r in rows or []}


def verdict_problems(
    where: str, got: Mapping[str, Any], r: Recount, rel: str, bound: int, layers: int | None
) -> list[str]:
    """A launch's recorded dispatch verdict against verify's recount of its records, and the bound
    on its call counts (call_bounds)."""
    out = []
    if got.get("dir") != rel:
        out.append(f"{where}: dispatch dir {got.get('dir')!r}, expected {rel!r}")
    if got.get("files") != r.files:
        out.append(f"{where}: dispatch record files or their sha256 differ from launches.jsonl")
    if got.get("valid") != r.valid:
        why = "; ".join(r.broken) or "no rule broken"
        out.append(f"{where}: dispatch verdict valid={got.get('valid')}, recomputed {r.valid} ({why})")
    if got.get("processes") != r.processes:
        out.append(f"{where}: dispatch processes {got.get('processes')}, recounted {r.processes}")
    if _counts_of(got.get("counts")) != r.counts:
        out.append(f"{where}: dispatch counts {got.get('counts')} differ from the records' {r.counts}")
    for (op, impl), (n, _) in sorted(r.counts.items()):
        if n > bound:
            out.append(
                f"{where}: {n} calls of {op} by {impl} in the dispatch records, more than the launch's requests can "
                f"produce (at most {bound}: {CALLS_PER_LAYER} per layer of {layers or UNKNOWN_LAYERS} (+1) per forward "
                f"pass, one pass per token sent plus {STARTUP_PASSES} start-up passes): the records were altered"
            )
    if got.get("intended") != r.intended:
        out.append(f"{where}: dispatch intended {got.get('intended')}, recomputed {r.intended}")
    if "selection" in got and got["selection"] != r.selection:
        out.append(f"{where}: dispatch selection {got.get('selection')}, the policy reads {r.selection}")
    return out


# plan.json keys that kerneltrial writes only since after the proof of dispatch existed (issue 26:
# the launch nonce, the model's layer count, the client): a plan holding one had `dispatch` too
WRITTEN_WITH_DISPATCH = ("nonce", "model_layers", "client")


def check_dispatch(
    path: Path, plan: dict[str, Any], launches: list[dict[str, Any]], summary: dict[str, Any], problems: list[str]
) -> dict[str, bool | None]:
    """Append the dispatch problems; return each arm's recomputed validity (empty: not applicable)."""
    if not ("dispatch" in plan or "dispatch" in summary or any("dispatch" in r for r in launches)):
        newer = [key for key in WRITTEN_WITH_DISPATCH if key in plan]
        if newer:  # no downgrade: a run this recent wrote its proof; deleting it must not pass
            problems.append(
                f"no proof of dispatch in plan.json, summary.json or launches.jsonl, but plan.json records "
                f"{', '.join(newer)}: kerneltrial has written the proof with those since before them, so it was deleted"
            )
        return {}
    arms = {a["name"]: a for a in plan["arms"]}
    by_launch = {r.get("launch"): r for r in launches}
    per_arm: dict[str, list[Recount]] = {name: [] for name in arms}
    bounds = call_bounds(path, plan, launches)
    texts = {name: selection_copies(path, arm, problems) for name, arm in arms.items()}
    never: set[str] = set()  # arms with a launch that was refused before it spawned
    for entry in plan["launches"]:
        i, name = entry["launch"], entry["arm"]
        row = by_launch.get(i)
        if not arms[name]["argv"] or row is None:  # an external server, or the trial stopped before
            continue
        where = f"launch {i} ({name})"
        got = row.get("dispatch")
        if row.get("spawned") is False:  # refused before it spawned: no server, no records, no verdict
            never.add(name)
            if got is not None or row.get("status") != "refused":
                problems.append(
                    f"{where}: launches.jsonl says it never spawned, but records status {row.get('status')!r} "
                    f"and {'a' if got is not None else 'no'} dispatch verdict (a refused launch has none)"
                )
            continue
        rel = f"launches/{i:02d}-{name}/dispatch"
        problems += imported_problems(where, row, path / rel)  # pins.imported from the same records
        if not isinstance(got, dict):
            problems.append(f"{where}: launches.jsonl has no dispatch verdict")
            continue
        r = recount(path / rel, arms[name].get("env", {}), plan.get("fl_platform"), texts[name])
        per_arm[name].append(r)
        problems += verdict_problems(where, got, r, rel, bounds.get(i, 0), plan.get("model_layers"))
        env = row.get("env_set", {})
        if Path(env.get(LOG_ENV, "")).parts[-3:] != Path(rel).parts:
            problems.append(f"{where}: the server's {LOG_ENV} {env.get(LOG_ENV)!r} is not {rel}")
        if env.get(COMPILE_CACHE_ENV) != arms[name].get("env", {}).get(COMPILE_CACHE_ENV, "1"):
            problems.append(f"{where}: the server ran with {COMPILE_CACHE_ENV}={env.get(COMPILE_CACHE_ENV)!r}")
    validity = {
        name: None
        if not arm["argv"]
        else bool(per_arm[name]) and all(r.valid for r in per_arm[name]) and name not in never
        for name, arm in arms.items()
    }
    problems += summary_problems(summary, per_arm, validity)
    return validity


def summary_problems(
    summary: Mapping[str, Any], per_arm: Mapping[str, list[Recount]], validity: Mapping[str, bool | None]
) -> list[str]:
    """summary.json's dispatch entry of every arm against the recounted launches."""
    out = []
    recorded = summary.get("dispatch") or {}
    for name, rs in per_arm.items():
        total: Counts = {}
        for r in rs:
            for k, (n, e) in r.counts.items():
                n0, e0 = total.get(k, (0, 0))
                total[k] = (n0 + n, e0 + e)
        s = recorded.get(name)
        if not isinstance(s, dict):
            out.append(f"summary.json has no dispatch entry for arm {name}")
            continue
        if s.get("valid") != validity[name]:
            out.append(f"summary dispatch {name}: valid={s.get('valid')}, recomputed {validity[name]}")
        if _counts_of(s.get("counts")) != total:
            out.append(f"summary dispatch {name}: counts {s.get('counts')} differ from the records' {total}")
    if any(v is False for v in validity.values()) and summary.get("status") == "ok":
        out.append("summary status ok although an arm's dispatch proof is invalid")
    return out
