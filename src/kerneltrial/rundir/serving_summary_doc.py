"""The typed, frozen record of a serving run's summary.json (`ServingSummary`), its reader
(`read_serving_summary`) and its writer (Document.as_json, rundir/documents.py write_document):
serving/summary.py builds the record, serving/trial.py writes it, serving/report_data.py, the
serving commands and the calibration read it.

`kerneltrial.serving-summary/1` is the first version to name itself; a summary from before it has
no `schema` (read as None). Keys older trials did not record are optional: the reader leaves them
unset (or at the default the report reads them with) and the writer does not write them back, so
that a document read and written again is its own bytes. `kerneltrial verify` reads summary.json
as raw JSON on purpose: it must report a malformed document field by field, where this reader
refuses it whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from kerneltrial.rundir.documents import Document, document_data, validate
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.layout import SUMMARY

SERVING_SUMMARY_V1 = "kerneltrial.serving-summary/1"
NOT_RUN = "cross-grade not run: "  # the start of a cross-grade record's `reason` when it did not run
SHOWN = 20  # disagreements printed; accuracy.json keeps them all


class Figures(Document):
    """The figures a launch (and an arm's case) averages, each present only where every run has it:
    the mean over the kept runs (a launch) or over the launches (a case)."""

    total_token_throughput: float | None = Field(default=None, description="Input and output tokens per second.")
    output_throughput: float | None = Field(default=None, description="Output tokens per second.")
    max_output_tokens_per_s: float | None = Field(
        default=None, description="vLLM's peak output tokens in one second; absent without request start times."
    )
    request_throughput: float | None = Field(default=None, description="Completed requests per second.")
    mean_ttft_ms: float | None = Field(default=None, description="Mean time to first token (ms).")
    median_ttft_ms: float | None = Field(default=None, description="Median time to first token (ms).")
    p99_ttft_ms: float | None = Field(default=None, description="99th percentile of the time to first token (ms).")
    mean_tpot_ms: float | None = Field(default=None, description="Mean time per output token after the first (ms).")
    median_tpot_ms: float | None = Field(default=None, description="Median time per output token (ms).")
    p99_tpot_ms: float | None = Field(default=None, description="99th percentile of the time per output token (ms).")
    mean_itl_ms: float | None = Field(default=None, description="Mean inter-token latency (ms).")
    median_itl_ms: float | None = Field(default=None, description="Median inter-token latency (ms).")
    p99_itl_ms: float | None = Field(default=None, description="99th percentile of the inter-token latency (ms).")
    mean_e2el_ms: float | None = Field(default=None, description="Mean end-to-end request latency (ms).")
    median_e2el_ms: float | None = Field(default=None, description="Median end-to-end request latency (ms).")
    p99_e2el_ms: float | None = Field(default=None, description="99th percentile of the end-to-end latency (ms).")
    request_goodput: float | None = Field(
        default=None, description="Requests per second meeting every SLO; only where the plan sets `goodput`."
    )

    def figure(self, key: str) -> float | None:
        """The figure `key` (e.g. `median_tpot_ms`); None when the run did not record it."""
        value = getattr(self, key) if key in FIGURE_KEYS else None
        return None if value is None else float(value)

    def needed(self, key: str) -> float:
        """The figure `key`, which the acceptance rule needs; RunDirError when it is absent."""
        value = self.figure(key)
        if value is None:
            raise RunDirError(f"summary.json: a launch's figures lack {key}")
        return value

    def latency_ms(self, stat: str, metric: str) -> float | None:
        """The figure `{stat}_{metric}_ms` (e.g. median_tpot_ms, p99_e2el_ms)."""
        return self.figure(f"{stat}_{metric}_ms")


FIGURE_KEYS: tuple[str, ...] = tuple(Figures.model_fields)


class LaunchKeys(Document):
    launch: int = Field(description="The launch (plan.json `launches`).")
    kept_runs: list[int] = Field(description="The launch's runs the warm-up rule keeps (all but the first).")


class LaunchResult(Figures, LaunchKeys):  # LaunchKeys' fields first, then the figures
    """One launch of an arm in a case: the mean of each figure over its kept runs."""


class CaseKeys(Document):
    runs: int = Field(description="Rows of runs.jsonl for the arm and case.")
    failed_runs: int = Field(description="Those whose status is not `ok`.")
    launches: list[LaunchResult] = Field(
        default=[], description="Each launch's figures, in launch order; empty unless the status is `ok`."
    )
    status: Literal["ok", "FAILED", "INCOMPLETE"] = Field(
        description="`ok`; `FAILED`: a run failed; `INCOMPLETE`: a launch lacks runs or the rounds lack a launch."
    )


class CaseResult(Figures, CaseKeys):  # CaseKeys' fields first, then the figures
    """One arm in one case: the figures are the mean over launches of the launches' figures (status `ok` only)."""


class Warmup(Document):
    drop_first: int = Field(description="Runs dropped at the start of each launch and case.")
    rule: str = Field(description="The warm-up rule, in words.")


class SummaryCase(Document):
    case: str = Field(
        description="The case id (`in{input}-out{output}-c{concurrency}-n{requests}`, rate and burstiness)."
    )
    input_len: int = Field(description="Input tokens per request.")
    output_len: int = Field(description="Output tokens per request.")
    concurrency: int = Field(description="Requests in flight at once.")
    num_requests: int = Field(description="Requests per run.")
    label: str | None = Field(default=None, description="The built-in case set it comes from; empty for none.")
    request_rate: float | None = Field(default=None, description="Requests per second; null: all sent at once.")
    burstiness: float | None = Field(default=None, description="The arrival gaps' gamma shape; null: none.")


@dataclass(frozen=True)
class Disagreement:
    """One sample the two graders grade differently."""

    unique_id: str
    sample: int
    reference: str
    ours: bool  # math-verify, the gate's grade
    theirs: bool  # evalscope's math_500
    our_extracted: list[str]
    their_extracted: str


@dataclass(frozen=True)
class CrossGrade:
    """The cross-grade of one accuracy run (serving/crossgrade.py), or why it did not run (`ran` False,
    `reason` says why)."""

    ran: bool
    grader: str  # "evalscope VERSION math_500"; empty when it did not run
    graded: int = 0  # samples graded by both (failed requests are left out)
    agree: int = 0
    correct_ours: int = 0
    correct_theirs: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)
    reason: str = ""  # "cross-grade not run: REASON" when it did not run; empty when it ran

    @classmethod
    def not_run(cls, why: str) -> CrossGrade:
        return cls(False, "", reason=NOT_RUN + why)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> CrossGrade:
        """accuracy.json's (or summary.json's) cross_grade read back; TypeError when it is not one."""
        return cls(**{**d, "disagreements": [Disagreement(**x) for x in d.get("disagreements", [])]})

    def lines(self) -> list[str]:
        """What `serve accuracy`, `serve trial` and the report print: the counts, then up to SHOWN
        disagreements."""
        if not self.ran:
            return [self.reason]
        out = [
            f"cross-grade with {self.grader}: {self.agree}/{self.graded} agree; correct {self.correct_ours} "
            f"(math-verify) vs {self.correct_theirs} (evalscope); {len(self.disagreements)} disagreement(s)"
        ]
        out += [
            f"  {d.unique_id} sample {d.sample}: reference {d.reference!r}, math-verify {d.ours} "
            f"{d.our_extracted}, evalscope {d.theirs} {d.their_extracted!r}"
            for d in self.disagreements[:SHOWN]
        ]
        if len(self.disagreements) > SHOWN:
            out.append(f"  ... {len(self.disagreements) - SHOWN} more in accuracy.json (cross_grade)")
        return out


class ArmAccuracy(Document):
    """One arm's MATH-500 gate: accuracy.json's figures (docs/serving.md, "Accuracy (MATH-500)")."""

    n: int = Field(description="Problems graded.")
    correct: int = Field(description="Correct samples over all problems.")
    errors: int = Field(description="Samples whose request failed.")
    accuracy: float = Field(description="correct / (n x samples).")
    ci_low: float = Field(description="The interval's lower end.")
    ci_high: float = Field(description="The interval's upper end.")
    confidence: float = Field(description="The interval's confidence.")
    gate: float | None = Field(default=None, description="The accuracy the gate asks for.")
    required_n: int | None = Field(default=None, description="Problems the gate needs; null: not checked.")
    n_rule: str | None = Field(default=None, description="Why that n.")
    passed: bool = Field(description="Whether the gate passed (n reached, no errors, the rule held).")
    truncated: int | None = Field(default=None, description="Samples cut at max_tokens.")
    grader: dict[str, str] | None = Field(
        default=None, description="The grading rule and the grader packages' versions; absent in runs before it."
    )
    samples: int = Field(default=1, description="Samples per problem; absent in runs before samples (1).")
    rule: Literal["point", "lower_bound"] | None = Field(
        default=None, description="`point` (the accuracy) or `lower_bound` (the interval's lower end) against the gate."
    )
    interval: str = Field(
        default="wilson", description="The interval's method; absent in runs before samples (Wilson)."
    )
    design_effect: float | None = Field(default=None, description="The k samples' design effect (1 for one sample).")
    pass_probability_at_gate: float | None = Field(
        default=None, description="The probability of passing for a model exactly at the gate; null: not computed."
    )
    cross_grade: CrossGrade | None = Field(
        default=None,
        description="accuracy.json's cross-grade (evalscope's math_500 on the same samples), or why it did not run; absent before the trial ran one.",
    )


class DispatchCount(Document):
    op: str = Field(description="The kernel-level op.")
    impl: str = Field(description="The implementation that served it.")
    calls: int = Field(description="Calls over the arm's launches and processes.")
    errors: int = Field(default=0, description="Calls that raised.")


class ArmDispatch(Document):
    valid: bool | None = Field(description="Every launch of the arm proved its dispatch; null for an external server.")
    reason: str = Field(description="Why, in words.")
    launches: list[int] | None = Field(default=None, description="The arm's launches.")
    counts: list[DispatchCount] = Field(default=[], description="Calls per op and implementation, summed over them.")


class AcceptanceCase(Document):
    status: str = Field(description="`ok`, `FAILED` (a side has no figures) or `INCONCLUSIVE` (no interval).")
    rounds: int = Field(description="Rounds both arms ran.")
    gain: float | None = Field(description="Candidate / baseline total tok/s, minus 1 (the paired geometric mean).")
    gain_low: float | None = Field(description="The gain's interval, lower end.")
    gain_high: float | None = Field(description="The gain's interval, upper end.")
    ttft_ratio: float | None = Field(description="Candidate / baseline mean TTFT.")
    ttft_ratio_low: float | None = Field(description="Its interval, lower end.")
    ttft_ratio_high: float | None = Field(description="Its interval, upper end.")
    throughput_ok: bool = Field(description="The gain's lower end is above the noise band.")
    ttft_ok: bool = Field(description="The TTFT ratio's upper end is at most ttft_ratio_max.")


class Acceptance(Document):
    """The candidate against the baseline by serving/acceptance.py's rule."""

    baseline: str = Field(description="The baseline arm.")
    candidate: str = Field(description="The candidate arm.")
    noise_band: float = Field(description="The protocol's noise band.")
    ttft_ratio_max: float = Field(description="The protocol's largest TTFT ratio.")
    confidence: float = Field(default=0.95, description="The intervals' confidence; absent before intervals (0.95).")
    method: str | None = Field(default=None, description="How the intervals are computed.")
    cases: dict[str, AcceptanceCase] = Field(default={}, description="Each case's comparison.")
    reasons: list[str] = Field(default=[], description="Why the candidate is not accepted; empty when it is.")
    accuracy_ok: bool | None = Field(default=None, description="The candidate's accuracy gate; null without one.")
    dispatch_ok: bool | None = Field(default=None, description="No dispatch proof of the two arms is invalid.")
    verdict: Literal["ACCEPTED", "REJECTED", "INCONCLUSIVE"] | None = Field(
        default=None, description="The verdict; absent before intervals (read `accepted`)."
    )
    accepted: bool = Field(description="Whether the verdict is ACCEPTED.")


class Scope(Document):
    kind: Literal["official", "proxy"] = Field(description="`official`, or `proxy` with the reasons.")
    hardware: str = Field(description="The accelerator the vendor tools report, or the CPU.")
    reasons: list[str] = Field(default=[], description="Why the run is a proxy (serving/pins.py).")


class ServingSummary(Document):
    schema_: Literal["kerneltrial.serving-summary/1"] | None = Field(
        default=None, alias="schema", description="`kerneltrial.serving-summary/1`; absent before it."
    )
    kind: Literal["serving"] = Field(description="`serving`.")
    protocol_sha256: str = Field(description="sha256 of protocol.toml.")
    warmup: Warmup = Field(description="The warm-up rule.")
    arms: list[str] = Field(description="The arms, in the protocol's order.")
    cases: list[SummaryCase] = Field(description="The cases, in the protocol's order.")
    results: dict[str, dict[str, CaseResult]] = Field(description="Per arm and case: status and figures.")
    accuracy: dict[str, ArmAccuracy] = Field(default={}, description="Per arm measured: its accuracy gate.")
    dispatch: dict[str, ArmDispatch] | None = Field(
        default=None, description="Per arm: its proof of dispatch; absent before the proof."
    )
    acceptance: Acceptance | None = Field(
        default=None, description="The candidate against the baseline; null without both."
    )
    failures: list[str] = Field(default=[], description="Each failure of a launch, a run or a dispatch proof.")
    status: Literal["ok", "failed"] = Field(description="`ok`: no failure and every (arm, case) ok.")
    scope: Scope | None = Field(default=None, description="Official or proxy, with the hardware; absent before it.")


def read_serving_summary(run_dir: Path) -> ServingSummary:
    """summary.json of the serving run at `run_dir`; RunDirError naming the file and its first bad key."""
    data = document_data(run_dir, SUMMARY)
    if data.get("schema", SERVING_SUMMARY_V1) != SERVING_SUMMARY_V1:
        raise RunDirError(
            f"{Path(run_dir) / SUMMARY}: schema {data.get('schema')!r}; serving reads {SERVING_SUMMARY_V1}"
        )
    return validate(ServingSummary, data, Path(run_dir) / SUMMARY)
