"""The catalog is the registry: every built-in operator is declared once (ops/catalog.py) and
registered through one path; arm names say the geometry they launch; modules register nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import pytest

from kerneltrial.ops import fused_add_rms_norm as fa
from kerneltrial.ops import rms_norm as rn
from kerneltrial.ops import sigmoid_gate as sg
from kerneltrial.ops import silu_and_mul as sam
from kerneltrial.ops import softcap_argmax as sa
from kerneltrial.ops import zimage_qk_rmsnorm as zimage
from kerneltrial.ops.catalog import SPECS
from kerneltrial.ops.registry import RegistryError, all_ops, get_op, register_spec
from kerneltrial.ops.spec import OperatorSpec, own

FAMILIES = {"rms_norm": rn, "fused_add_rms_norm": fa, "sigmoid_gate": sg, "silu_and_mul": sam, "softcap_argmax": sa}
# what a number in an arm's name is: `packed_r4_w8` is 4 rows per step and 8 warps
NAME_FIELDS = {
    "r": ("block_rows", "most_rows"),
    "w": ("num_warps",),
    "c": ("chunk",),
    "p": ("parts",),
    "tile": ("block", "block_d"),
    "rowtile": ("block_d",),
}


def name_mismatches(geometries: dict[str, object]) -> list[str]:
    """Arms whose name states a number their geometry record does not hold."""
    found = []
    for name, geometry in geometries.items():
        for key, value in re.findall(r"(?:^|_)(rowtile|tile|[rwcp])(\d+)", name):
            held = [getattr(geometry, f) for f in NAME_FIELDS[key] if hasattr(geometry, f)]
            if held != [int(value)]:
                found.append(f"{name}: {key}{value} but {geometry}")
    return found


def test_the_registry_holds_the_catalog_in_order():
    assert [o.name for o in all_ops()] == [s.operator.name for s in SPECS]
    for spec in SPECS:
        op = get_op(spec.operator.name)
        assert op is spec.operator
        declared = [(a.name, a.kind, a.doc, a.layouts, a.widths) for a in spec.arms]
        assert [(i.name, i.kind, i.doc, i.layouts, i.widths) for i in op.impls.values()] == declared


@pytest.mark.parametrize("family", [*FAMILIES, "zimage_qk_rmsnorm"])
def test_arm_names_say_the_geometry_they_launch(family):
    geometries = zimage.GEOMETRIES if family == "zimage_qk_rmsnorm" else FAMILIES[family].GEOMETRIES
    assert next(iter(geometries)) == "control"
    assert name_mismatches(geometries) == []


def test_a_misnamed_geometry_is_caught():
    planted = {"packed_r4_w8": rn.RowsConfig(4, 4), "stream_c2048_w4": sa.StreamConfig(4096, 4, 528)}
    assert name_mismatches(planted) == [
        "packed_r4_w8: w8 but RowsConfig(block_rows=4, num_warps=4)",
        "stream_c2048_w4: c2048 but StreamConfig(chunk=4096, num_warps=4, programs=528)",
    ]


def test_a_spec_with_two_arms_of_one_name_is_refused():
    operator = replace(get_op("rmsnorm"), name="probe_op", impls={})
    twice = OperatorSpec(operator, (own("a", rn.rms_norm_auto, "first"), own("a", rn.rms_norm_auto, "second")))
    with pytest.raises(RegistryError, match="implementation 'a' of probe_op is registered twice"):
        register_spec(twice)


def test_importing_an_operator_module_registers_nothing():
    """Registration is the registry's: a family module defines its kernels and declares nothing."""
    code = (
        "from kerneltrial.ops import registry, fused_add_rms_norm, softcap_argmax, zimage_qk_norm\n"
        "assert registry._OPERATORS == {}, list(registry._OPERATORS)\n"
        "assert [o.name for o in registry.all_ops()][:2] == ['rmsnorm', 'sigmoid_gate_mul']\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
