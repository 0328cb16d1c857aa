"""Protocols: validation errors name the field; freezing pins the bytes; confirmation rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneltrial.ops.registry import get_op
from kerneltrial.trial import protocol as proto
from kerneltrial.trial.runner import check_arms
from tests.kt import write_protocol

BASE = """
name = "t"
op = "rmsnorm"
candidates = ["packed_r4_w4"]
[[cases]]
shape = [4, 64]
"""


@pytest.mark.parametrize(
    "extra,field",
    [
        ("rounds = 1\n", "rounds"),
        ('gate = "geomean>=x"\n', "gate"),
        ('l2 = "lukewarm"\n', "l2"),
        ("tie_band = -0.1\n", "tie_band"),
        ("tie_band = 0.95\n", "tie_band"),  # the isolation floor would keep nothing of a wall clock
        ("calls_per_sample = 0\n", "calls_per_sample"),
        ("seeds = [1, 1]\n", "seeds"),
        ('gate = "no_loss and no_loss"\n', "gate"),
        ('gate = "geomean>=0"\n', "gate"),
        ("colour = 3\n", "colour"),
        ('phase = "confirmation"\nexploratory_seeds = [0]\nseeds = [0, 5]\n', "seeds"),
        ('phase = "confirmation"\nseeds = [5]\n', "exploratory_seeds"),
    ],
)
def test_validation_names_the_field(extra, field):
    with pytest.raises(proto.ProtocolError) as info:
        proto.parse(extra + BASE)
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("seeds", "how"),
    [
        (2**32, "equal modulo 2**32"),  # a CPU generator keeps the seed's low 32 bits
        (7919, "gate stream 0 of seed 7919 is gate stream 1 of seed 0"),  # seed 0's fresh-buffer inputs
    ],
)
def test_confirmation_seeds_must_draw_fresh_streams_not_just_other_numbers(seeds, how):
    text = f'phase = "confirmation"\nexploratory_seeds = [0]\nseeds = [{seeds}]\n' + BASE
    with pytest.raises(proto.ProtocolError, match="seed .* draws inputs of the exploratory phase") as info:
        proto.parse(text)
    assert how in str(info.value)
    assert proto.parse(text.replace(f"seeds = [{seeds}]", "seeds = [5]")).seeds == [5]


def test_confirmation_names_one_candidate():
    text = 'phase = "confirmation"\nexploratory_seeds = [0, 1]\nseeds = [7]\n' + BASE.replace(
        '["packed_r4_w4"]', '["packed_r4_w4", "wide"]'
    )
    with pytest.raises(proto.ProtocolError, match="exactly one candidate"):
        proto.parse(text)


def test_bad_case_shape_and_toml():
    with pytest.raises(proto.ProtocolError, match="cases\\[0\\]\\.shape"):
        proto.parse(BASE.replace("[4, 64]", "[4, 0]"))
    with pytest.raises(proto.ProtocolError, match="not valid TOML"):
        proto.parse("name = ")


def test_freeze_then_change_is_refused(tmp_path):
    path = write_protocol(tmp_path / "p.toml", BASE)
    record = proto.freeze(path)
    assert proto.load(path).name == "t"
    assert len(record["sha256"]) == 64
    path.write_text(BASE.replace("[4, 64]", "[4, 128]"))
    with pytest.raises(proto.ProtocolError, match="changed after it was frozen"):
        proto.load(path)
    with pytest.raises(proto.ProtocolError, match="never re-frozen"):
        proto.freeze(path)


def test_confirmation_must_be_frozen(tmp_path):
    path = write_protocol(
        tmp_path / "c.toml", 'phase = "confirmation"\nexploratory_seeds = [0, 1]\nseeds = [7]\n' + BASE
    )
    with pytest.raises(proto.ProtocolError, match="must be frozen"):
        proto.load(path)
    proto.freeze(path)
    assert proto.load(path).phase == "confirmation"


def test_new_writes_a_valid_protocol():
    from kerneltrial.ops.registry import Case

    text = proto.new("rmsnorm", "x", ["wide"], [Case((8, 32))], seeds=[3], rounds=4)
    parsed = proto.parse(text)
    assert parsed.cases[0].shape == [8, 32] and parsed.rounds == 4 and parsed.seeds == [3]


def test_a_case_listed_twice_is_refused():
    with pytest.raises(proto.ProtocolError, match="listed twice"):
        proto.parse(BASE + "[[cases]]\nshape = [4, 64]\n")


def test_every_shipped_protocol_names_registered_arms_and_valid_cases():
    """A protocol in protocols/ is runnable as shipped: every arm exists, every case passes
    its operator's shape and dtype rules (a removed kernel must take its protocols along)."""
    root = Path(__file__).resolve().parents[2] / "protocols"
    paths = [p for p in root.rglob("*.toml") if not {"serving", "model"} & set(p.parts)]  # kernel protocols only
    assert paths
    for path in paths:
        p = proto.load(path)
        op = get_op(p.op)
        check_arms(path, p)  # user modules load, every arm exists, the control is a control
        for spec in p.cases:
            op.validate(spec.case())
