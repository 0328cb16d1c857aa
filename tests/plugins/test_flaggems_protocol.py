"""protocols/serving/minicpm5-2b-flaggems.toml sets only variables vllm-plugin-FL really reads.

The names come from the plugin's source snapshot (../shared/vendor/vllm-plugin-FL), not from
its README: every `os.environ.get("X"` / `os.getenv("X"` in vllm_fl/. The per-op orders are
parsed by the snapshot's own policy parser.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.conftest import REPO
from tests.plugins.conftest import snapshot_dir

PROTOCOL = REPO / "protocols" / "serving" / "minicpm5-2b-flaggems.toml"
VLLM_OWN = {"VLLM_PLUGINS"}  # read by vLLM itself (vllm/envs.py), not by the plugin
READ = re.compile(r"""os\.(?:environ\.get|getenv)\(\s*["']([A-Z0-9_]+)["']""")
OPS = ("rms_norm", "silu_and_mul")


def names_read_by_plugin(root: Path) -> set[str]:
    return {m for p in (root / "vllm_fl").rglob("*.py") for m in READ.findall(p.read_text())}


def plugin_entry_points(root: Path) -> set[str]:
    """Entry-point names vllm-plugin-FL registers with vLLM (platform and general plugins)."""
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]
    return {name for group in ("vllm.platform_plugins", "vllm.general_plugins") for name in eps.get(group, {})}


def problems(env: dict[str, str], names: set[str], plugin_names: set[str]) -> list[str]:
    out = [f"{k} is read by neither vllm-plugin-FL nor vLLM" for k in sorted(env) if k not in names | VLLM_OWN]
    if "VLLM_PLUGINS" in env and not plugin_names & {x.strip() for x in env["VLLM_PLUGINS"].split(",")}:
        out.append(
            f"VLLM_PLUGINS={env['VLLM_PLUGINS']!r} loads none of the plugin's entry points {sorted(plugin_names)}"
        )
    return out


def arms() -> dict[str, dict]:
    return {a["role"]: a for a in tomllib.loads(PROTOCOL.read_text())["arms"]}


def test_protocol_variables_are_read_by_the_plugin():
    root = snapshot_dir()
    names, plugin_names = names_read_by_plugin(root), plugin_entry_points(root)
    assert {"USE_FLAGGEMS", "VLLM_FL_FLAGOS_WHITELIST", "VLLM_FL_PER_OP"} <= names and "fl" in plugin_names
    for role, arm in arms().items():
        assert problems(arm["env"], names, plugin_names) == [], role
    # planted: the protocol as first shipped (a whitelist name nobody reads, a baseline without the plugin)
    assert problems({"USE_FLAGGEMS": "1", "VLLM_FL_FLAGGEMS_WHITELIST": "rms_norm"}, names, plugin_names) == [
        "VLLM_FL_FLAGGEMS_WHITELIST is read by neither vllm-plugin-FL nor vLLM"
    ]
    assert "loads none of the plugin's entry points" in problems({"VLLM_PLUGINS": ""}, names, plugin_names)[0]


def test_arms_differ_only_in_operator_selection(fl):
    """Same argv and FlagGems settings; baseline selects vendor/reference, candidate FlagGems,
    one token per op (no fallback), as the snapshot's own parser reads VLLM_FL_PER_OP."""
    a = arms()
    base, cand = a["baseline"], a["candidate"]
    assert base["argv"] == cand["argv"]
    assert {k: v for k, v in base["env"].items() if k != "VLLM_FL_PER_OP"} == {
        k: v for k, v in cand["env"].items() if k != "VLLM_FL_PER_OP"
    }
    assert base["env"]["USE_FLAGGEMS"] == "1" and set(base["env"]["VLLM_FL_FLAGOS_WHITELIST"].split(",")) == set(OPS)
    parse = fl.PolicyManager._parse_per_op
    b, c = parse(base["env"]["VLLM_FL_PER_OP"]), parse(cand["env"]["VLLM_FL_PER_OP"])
    assert set(b) == set(c) == set(OPS)
    for op in OPS:
        assert len(b[op]) == 1 and (b[op][0] == "reference" or b[op][0].startswith("vendor")), b
        assert c[op] == ["flagos"], c
