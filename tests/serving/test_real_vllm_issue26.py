"""Issue 26 against a real vLLM CPU server (the tiny model): the two-trials-one-port race refused.

Needs `bash .ci/serving-setup.sh` (skips cleanly otherwise).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kerneltrial.serving.launcher import free_port
from kerneltrial.serving.lifecycle import read_record

from .test_who_answers import hold_in_another_kerneltrial, refused_while_unbound

pytestmark = [pytest.mark.serving, pytest.mark.slow]


def test_two_trials_one_port_refused_while_the_first_vllm_has_not_bound(vllm_server_cmd, tmp_path: Path):
    """The issue's race: the first kerneltrial's vLLM is starting (tens of seconds before it binds);
    a second launch on its port is refused at once, not let in because nothing listens yet."""
    make, env, _ = vllm_server_cmd
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)  # the first kerneltrial passes its environment to its vLLM
        first = hold_in_another_kerneltrial(port, tmp_path / "first", *make(port))
    try:
        refused_while_unbound(port, tmp_path, make(port), tmp_path / "first")
    finally:
        first.send_signal(signal.SIGTERM)  # kerneltrial stops its vLLM (SIGINT to the group, ...) and exits 130
        assert first.wait(timeout=120) == 130
    assert read_record(port) is None
