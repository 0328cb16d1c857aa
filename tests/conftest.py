"""Shared test set-up: kernels run through the Triton interpreter on a CPU (kerneltrial.ops sets it)."""

from pathlib import Path

import pytest

import kerneltrial.ops  # noqa: F401  (selects the interpreter before any kernel is defined)
from kerneltrial.ops import launch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def device():
    return launch.device()
