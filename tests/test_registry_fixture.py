"""The autouse fixture in conftest.py restores the global operator registry after every test."""

from dataclasses import replace

from kerneltrial.ops.registry import Impl, all_ops, get_op, load_user_module, register_impl, register_op
from tests.conftest import REPO, restore_registry, snapshot_registry

GOOD = str(REPO / "tests" / "fixtures" / "good_rmsnorm.py")


def _state() -> list[tuple[str, list[tuple[str, Impl]]]]:
    return [(op.name, list(op.impls.items())) for op in all_ops()]


def test_restore_undoes_added_operators_added_arms_and_removed_arms():
    before = _state()
    snapshot = snapshot_registry()
    rmsnorm = get_op("rmsnorm")
    load_user_module(GOOD)
    register_impl("rmsnorm", "probe")(lambda x, weight, eps=1e-6: x)
    register_op(replace(rmsnorm, name="probe_op", impls={}))
    del get_op("silu_and_mul").impls["control"]
    assert _state() != before

    restore_registry(snapshot)

    assert _state() == before  # the same Impl objects, in the same order
    assert get_op("rmsnorm") is rmsnorm and "user:good_rmsnorm" not in rmsnorm.impls


def test_a_test_that_registers_an_arm():
    """With the next test: the autouse fixture undoes this registration (pytest runs a file in order)."""
    load_user_module(GOOD)
    register_impl("rmsnorm", "leak_probe")(lambda x, weight, eps=1e-6: x)
    assert "leak_probe" in get_op("rmsnorm").impls


def test_the_next_test_does_not_see_it():
    impls = get_op("rmsnorm").impls
    assert "leak_probe" not in impls and "user:good_rmsnorm" not in impls
