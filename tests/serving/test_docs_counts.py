"""docs/serving.md states the size of the Track 2 trial as the shipped protocol makes it (issue 36, item 8):
the launches, benchmark runs, requests, tokens and hours are computed here from
protocols/serving/minicpm5-2b-t2.toml and must appear in the page, so the two cannot drift apart again
(the page said 3 launches per arm and 96 runs while the protocol made 4 and 128)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from kerneltrial.serving.protocol import Protocol, load_protocol

from .conftest import REPO

DOC = REPO / "docs" / "serving.md"
T2 = REPO / "protocols" / "serving" / "minicpm5-2b-t2.toml"
ASSUMED_TOK_S = 10_000  # a total token throughput for the hours, named as an assumption in the page
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


@dataclass(frozen=True)
class TrialSize:
    """What one trial of a serving protocol runs."""

    arms: int
    rounds: int
    cases: int
    repeats: int
    launches: int
    runs: int
    requests: int
    prompt_tokens: int
    generated_tokens: int
    accuracy_passes: int

    @classmethod
    def of(cls, p: Protocol) -> TrialSize:
        launches = len(p.arms) * p.rounds
        per_launch = p.repeats  # every case's runs, in every launch
        return cls(
            arms=len(p.arms),
            rounds=p.rounds,
            cases=len(p.bench.cases),
            repeats=p.repeats,
            launches=launches,
            runs=launches * len(p.bench.cases) * p.repeats,
            requests=launches * per_launch * sum(c.num_requests for c in p.bench.cases),
            prompt_tokens=launches * per_launch * sum(c.num_requests * c.input_len for c in p.bench.cases),
            generated_tokens=launches * per_launch * sum(c.num_requests * c.output_len for c in p.bench.cases),
            accuracy_passes=len(p.arms) if p.accuracy is not None else 0,
        )

    def hours(self, tok_s: float) -> float:
        return (self.prompt_tokens + self.generated_tokens) / tok_s / 3600

    def sentence(self) -> str:
        """The page's sentence on the trial's size."""
        return (
            f"With {self.arms} arms x {self.rounds} launches x {self.cases} cases x {self.repeats} runs the trial "
            f"makes {self.launches} launches and {self.runs} benchmark runs ({self.requests:,} requests: "
            f"{self.prompt_tokens:,} prompt and {self.generated_tokens:,} generated tokens) plus one MATH-500 pass "
            f"per arm ({self.accuracy_passes}); at an assumed {ASSUMED_TOK_S:,} total tok/s the benchmark runs alone "
            f"take {self.hours(ASSUMED_TOK_S):.1f} hours (hours = tokens / (your total tok/s x 3600); measure yours "
            "with `serve bench`), plus the server starts and the MATH-500 passes."
        )


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def t2() -> TrialSize:
    return TrialSize.of(load_protocol(T2)[0])


def test_the_page_states_the_shipped_protocols_trial_size(t2: TrialSize):
    page = flat(DOC.read_text())
    assert t2.sentence() in page, f"docs/serving.md must say, in 'Track 2 on a GPU machine':\n{t2.sentence()}"
    rounds = f"{WORDS[t2.rounds]} launches per arm interleaved in a seeded order"
    runs = f"{WORDS[t2.repeats]} runs per case per launch with run 0 dropped"
    assert rounds in page and runs in page, f"docs/serving.md's Track 2 summary must say: {runs}, {rounds}"


def test_a_drifted_count_is_caught():
    """Planted: the protocol the page used to describe (3 launches per arm) gives the page's old 96 runs, and
    its sentence is not what the page says."""
    shipped = load_protocol(T2)[0]
    old = TrialSize.of(shipped.model_copy(update={"rounds": 3}))
    assert (old.launches, old.runs) == (12, 96)
    assert "makes 12 launches and 96 benchmark runs" in old.sentence()
    assert old.sentence() not in flat(DOC.read_text())
