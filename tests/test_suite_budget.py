"""The quick subset's measured durations: scripts/test_durations.py reads a junit file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.conftest import DURATIONS, QUICK_LIMIT_S, REPO

spec = importlib.util.spec_from_file_location("test_durations", REPO / "scripts" / "test_durations.py")
assert spec and spec.loader
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.ops.test_a" name="test_fast[x-1]" time="0.04"/>
<testcase classname="tests.trial.test_b" name="test_slow" time="12.345"/>
<testcase classname="tests.trial.test_b" name="test_skipped" time="0.001"><skipped message="no GPU"/></testcase>
<testcase classname="tests.serving.test_c" name="test_grouped[a@b]@vllm" time="3.0"/>
<testcase classname="tests.serving.test_c" name="test_at[a@b]" time="0.2"/>
</testsuite></testsuites>
"""


def test_durations_are_read_per_node_id_and_skipped_tests_left_out(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert script.durations(junit) == {
        "tests/ops/test_a.py::test_fast[x-1]": 0.0,
        "tests/trial/test_b.py::test_slow": 12.3,
        "tests/serving/test_c.py::test_grouped[a@b]": 3.0,  # xdist's loadgroup suffix dropped
        "tests/serving/test_c.py::test_at[a@b]": 0.2,
    }


def test_the_script_refuses_a_missing_or_empty_junit(tmp_path: Path, capsys) -> None:
    assert script.main([str(tmp_path / "none.xml")]) == 2
    empty = tmp_path / "empty.xml"
    empty.write_text('<testsuites><testsuite name="pytest"/></testsuites>')
    assert script.main([str(empty)]) == 1
    assert "holds no test case that ran" in capsys.readouterr().err


def test_the_committed_durations_mark_the_slowest_tests_slow(request) -> None:
    """The committed file names real tests, and collection marked a recorded-slow one."""
    measured = json.loads(DURATIONS.read_text())
    slow = [node for node, seconds in measured.items() if seconds >= QUICK_LIMIT_S]
    assert slow and all(Path(REPO / node.split("::")[0]).is_file() for node in slow[:50])
    assert measured.get(request.node.nodeid, 0.0) < QUICK_LIMIT_S  # this test is quick
    collected = [item for item in request.session.items if item.nodeid in set(slow)]
    assert all(item.get_closest_marker("slow") for item in collected)
    if not request.config.option.markexpr and len(request.session.items) > 1000:  # the whole suite collected
        assert len(collected) >= len(slow) // 2
