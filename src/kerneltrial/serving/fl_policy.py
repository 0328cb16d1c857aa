"""vllm-plugin-FL's operator selection, read as its policy reads it (issue 26, item 5).

The snapshot's `vllm_fl/dispatch/policy.py` (`PolicyManager._policy_from_env`) decides each
operator's order of backends from, in precedence:

1. `VLLM_FL_CONFIG`: a YAML file (when it is a file) replaces everything: its `op_backends`,
   `prefer`, `allow_vendors`, `deny_vendors`; the variables below and the platform table are
   not read;
2. `VLLM_FL_OP_CONFIG`: a JSON file {op: "flagos" | "vendor" | "reference"} (read by
   vllm_fl/utils.py at import; a path that is not a file makes vllm_fl fail to import) gives those
   ops a one-token order and replaces every other per-op order;
3. `VLLM_FL_PER_OP` (`op=a|b;op2=c`) replaces the platform table's whole `op_backends`: an op it
   does not name gets the default order, not the platform's;
4. the platform table (`vllm_fl/dispatch/config/PLATFORM.yaml`, stated in a protocol as
   `[server.fl_platform]`);
5. the default order by `prefer` (`VLLM_FL_PREFER` > the platform's `prefer` > flagos):
   flagos -> [flagos, vendor, reference], vendor -> [vendor, flagos, reference], reference ->
   [reference, flagos, vendor].

Vendor filters (`VLLM_FL_DENY_VENDORS`, `VLLM_FL_ALLOW_VENDORS` > the platform's) drop vendor
implementations before the order is applied. The dispatcher takes the first token of the order
that matches an available implementation: our vendor `kerneltrial` (priority 0, below every
built-in vendor) serves an op for certain only when the first token names it (`vendor:kerneltrial`
or `impl:vendor.kerneltrial`) and the filters let it through; a generic `vendor` token picks a
higher-priority vendor where one exists, so it does not count as selecting ours.

Pure functions over the environment, the platform table and the bytes of the two files (the caller
reads them: the trial from the server's host, verify from the run directory's copies).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

CONFIG_ENV, OP_CONFIG_ENV, PER_OP_ENV = "VLLM_FL_CONFIG", "VLLM_FL_OP_CONFIG", "VLLM_FL_PER_OP"
PREFER_ENV, ALLOW_ENV, DENY_ENV = "VLLM_FL_PREFER", "VLLM_FL_ALLOW_VENDORS", "VLLM_FL_DENY_VENDORS"
FILE_ENVS = (CONFIG_ENV, OP_CONFIG_ENV)  # the variables that name files the policy reads
PREFERS = ("flagos", "vendor", "reference")
DEFAULT_ORDERS = {
    "flagos": ("flagos", "vendor", "reference"),
    "vendor": ("vendor", "flagos", "reference"),
    "reference": ("reference", "flagos", "vendor"),
}
OUR_VENDOR = "kerneltrial"
OUR_TOKENS = (f"vendor:{OUR_VENDOR}", f"impl:vendor.{OUR_VENDOR}")


class SelectionError(ValueError):
    """A selection file the policy reads is missing or malformed; the message names it and the fix."""


@dataclass(frozen=True)
class Platform:
    """The platform table vllm-plugin-FL loads by default (protocol `[server.fl_platform]`)."""

    name: str
    op_backends: Mapping[str, tuple[str, ...]]
    prefer: str = "flagos"
    allow_vendors: frozenset[str] | None = None
    deny_vendors: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Selection:
    """The policy an environment gives: per-op orders with where they came from, the default order,
    the vendor filters."""

    per_op: Mapping[str, tuple[str, ...]]
    per_op_source: str  # VLLM_FL_CONFIG, VLLM_FL_OP_CONFIG, VLLM_FL_PER_OP, platform NAME, or none
    prefer: str
    allow_vendors: frozenset[str] | None
    deny_vendors: frozenset[str]
    complete: bool  # False: the platform table would apply but was not stated (orders unknown)

    def order(self, op: str) -> tuple[tuple[str, ...] | None, str]:
        """(order, source) of one op; order None when it comes from a platform table not stated."""
        if op in self.per_op:
            return self.per_op[op], self.per_op_source
        if not self.complete:
            return None, "the platform table (not stated: [server.fl_platform])"
        return DEFAULT_ORDERS[self.prefer], f"the default order (prefer {self.prefer})"

    def ours_allowed(self) -> bool:
        return OUR_VENDOR not in self.deny_vendors and (self.allow_vendors is None or OUR_VENDOR in self.allow_vendors)

    def selects_ours(self, op: str) -> bool:
        order, _ = self.order(op)
        return bool(order) and order[0] in OUR_TOKENS and self.ours_allowed()  # type: ignore[index]


def _csv(value: str) -> frozenset[str]:
    return frozenset(x.strip() for x in value.split(",") if x.strip())


def parse_per_op(value: str) -> dict[str, tuple[str, ...]]:
    """`op1=a|b|c;op2=x` as the policy parses it (an op with no token is dropped)."""
    out: dict[str, tuple[str, ...]] = {}
    for part in (p.strip() for p in value.split(";") if p.strip()):
        if "=" not in part:
            continue
        op, order = part.split("=", 1)
        tokens = tuple(x.strip() for x in order.split("|") if x.strip())
        if op.strip() and tokens:
            out[op.strip()] = tokens
    return out


def _from_config(text: str, path: str) -> Selection:
    """A VLLM_FL_CONFIG file: the complete policy."""
    try:
        import yaml
    except ImportError:
        raise SelectionError(f"reading {CONFIG_ENV} {path} needs pyyaml: pip install 'kerneltrial[serve]'") from None
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise SelectionError(f"{CONFIG_ENV} {path} is not YAML ({e}); the plugin cannot load it either") from None
    prefer = str(doc.get("prefer", "flagos")).strip().lower()
    per_op = {}
    for op, order in (doc.get("op_backends") or {}).items():
        tokens = order.split("|") if isinstance(order, str) else order if isinstance(order, list) else []
        per_op[str(op)] = tuple(str(t).strip() for t in tokens if t and str(t).strip())

    def vendors(key: str) -> frozenset[str] | None:
        raw = doc.get(key)
        if not raw:
            return None
        return frozenset(str(v).strip() for v in raw if v) if isinstance(raw, list) else _csv(str(raw))

    return Selection(
        per_op,
        f"{CONFIG_ENV} {path}",
        prefer if prefer in PREFERS else "flagos",
        vendors("allow_vendors"),
        vendors("deny_vendors") or frozenset(),
        True,
    )


def _op_config(text: str, path: str) -> dict[str, tuple[str, ...]]:
    """A VLLM_FL_OP_CONFIG file: {op: backend}, each a one-token order."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise SelectionError(f"{OP_CONFIG_ENV} {path} is not JSON: vllm_fl refuses to import; fix the file") from None
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise SelectionError(f"{OP_CONFIG_ENV} {path} must map op names to strings: vllm_fl refuses to import")
    bad = [v for v in doc.values() if v.strip().lower() not in PREFERS]
    if bad:
        raise SelectionError(f"{OP_CONFIG_ENV} {path}: backend {bad[0]!r} is not one of {', '.join(PREFERS)}")
    return {op: (v.strip().lower(),) for op, v in doc.items()}


def selection(env: Mapping[str, str], platform: Platform | None, files: Mapping[str, str | None]) -> Selection:
    """The policy `env` gives, in the plugin's precedence. `files`: the text of the files named by
    VLLM_FL_CONFIG and VLLM_FL_OP_CONFIG (None: not a file where the server runs)."""
    config = env.get(CONFIG_ENV, "").strip()
    if config and files.get(CONFIG_ENV) is not None:
        return _from_config(files[CONFIG_ENV] or "", config)
    op_config_path = env.get(OP_CONFIG_ENV, "").strip()
    op_config: dict[str, tuple[str, ...]] = {}
    if op_config_path:
        text = files.get(OP_CONFIG_ENV)
        if text is None:
            raise SelectionError(f"{OP_CONFIG_ENV} file not found: {op_config_path} (vllm_fl refuses to import)")
        op_config = _op_config(text, op_config_path)
    prefer_env = env.get(PREFER_ENV, "").strip().lower()
    prefer = prefer_env if prefer_env in PREFERS else platform.prefer if platform else "flagos"
    deny = _csv(env.get(DENY_ENV, "")) or (platform.deny_vendors if platform else frozenset())
    allow = _csv(env.get(ALLOW_ENV, "")) or (platform.allow_vendors if platform else None)
    per_op_env = parse_per_op(env.get(PER_OP_ENV, "").strip())
    if op_config:
        return Selection(op_config, f"{OP_CONFIG_ENV} {op_config_path}", prefer, allow, deny, True)
    if per_op_env:
        return Selection(per_op_env, PER_OP_ENV, prefer, allow, deny, True)
    if platform is None:
        return Selection({}, "the platform table (not stated)", prefer, allow, deny, False)
    return Selection(dict(platform.op_backends), f"platform {platform.name}", prefer, allow, deny, True)
