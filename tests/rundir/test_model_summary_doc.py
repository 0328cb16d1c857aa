"""rundir/model_summary_doc.py: a model run's summary.json of every committed version read as one record,
a schema 3 document held to every key schema 3 writes, and what the reader refuses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import write_json
from kerneltrial.rundir.model_summary_doc import (
    MODEL_SUMMARY_V1,
    MODEL_SUMMARY_V2,
    MODEL_SUMMARY_V3,
    read_model_summary,
)
from tests.conftest import REPO

RESULTS = REPO / "results"
V1 = RESULTS / "archive" / "h200" / "minicpm5-2b-model-r1"  # bootstrap intervals, total_ns and wall_ns
V2 = RESULTS / "h200" / "minicpm5-2b-model"  # paired ratios, device time, drift
V3 = RESULTS / "h200" / "minicpm5-2b-track2-decode"  # graph mode, the floor, timed checks


def test_each_version_reads_with_what_it_recorded() -> None:
    first, second, third = (read_model_summary(run) for run in (V1, V2, V3))
    assert (first.schema_, second.schema_, third.schema_) == (MODEL_SUMMARY_V1, MODEL_SUMMARY_V2, MODEL_SUMMARY_V3)
    old = next(iter(first.cases.values()))
    arm = old.arms["eager"]
    assert first.method is None and old.mode is None and old.floor is None and old.drift is None
    assert arm.attribution is not None and arm.attribution.total_ns and arm.attribution.device_ns is None
    assert set(arm.against()) == {"torch_eager"}
    assert next(iter(second.cases.values())).drift is not None and second.copy_rate is None
    case = next(iter(third.cases.values()))
    assert case.mode in ("eager", "graph") and case.floor is not None and case.excluded is not None
    assert third.copy_rate is not None and third.timed_checks is not None


def _edited(tmp_path: Path, run: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads((run / "summary.json").read_text())
    edit(data)
    write_json(tmp_path / "summary.json", data)
    return tmp_path


def _first_arm(data: dict[str, Any]) -> dict[str, Any]:
    return next(iter(next(iter(data["cases"].values()))["arms"].values()))


def _drop_v3_keys(data: dict[str, Any]) -> None:
    data["copy"] = None
    del next(iter(data["cases"].values()))["mode"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop_v3_keys, r"lacks copy, cases\.decode-b1-c512-graph\.mode; rebuild it"),
        (lambda data: data.update(schema="kerneltrial.model-summary/9"), "model reports read"),
        (lambda data: _first_arm(data).update(vs_e1={}), r"vs_e1: Extra inputs are not permitted"),
        (lambda data: _first_arm(data).pop("median_ns"), r"median_ns: Field required"),
        (lambda data: _first_arm(data)["vs_kerneltrial"].update(verdict="won"), "verdict: Input should be"),
    ],
    ids=["schema-3-keys", "unknown-schema", "unknown-key", "missing-key", "bad-verdict"],
)
def test_the_reader_names_what_it_refuses(tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(RunDirError, match=message):
        read_model_summary(_edited(tmp_path, V3, edit))
