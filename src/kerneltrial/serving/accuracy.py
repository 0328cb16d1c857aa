"""MATH-500 accuracy gate: query the server (k samples per problem), grade with math-verify, the
interval and the gate rule of serving/accuracy_stats.py.

Problems come from a local JSONL (fields: problem, answer, level, subject, unique_id), or
from the Hugging Face hub only when asked explicitly (`hf:HuggingFaceH4/MATH-500`).
Every sample's record (problem, sample number, prompt, response, extracted answer, verdict,
tokens, latency, error) is appended to records.jsonl as it is graded. The same samples are then
graded again by evalscope's math_500 benchmark (serving/crossgrade.py; the optional extra
kerneltrial[evalscope]) and accuracy.json's `cross_grade` keeps the agreement and every
disagreement, or the reason it did not run.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from kerneltrial.serving import accuracy_stats as stats
from kerneltrial.serving.accuracy_stats import GateRule
from kerneltrial.serving.crossgrade import GraderSource, cross_grade, evalscope_grader

PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HF_PREFIX = "hf:"
# Problems per level in MATH-500 (HuggingFaceH4/MATH-500 test split, counted in the test.jsonl the
# tests use; None: every level). Without a preregistered `limit` the gate needs the whole set.
FULL_SET_SIZE: dict[str | None, int] = {
    "Level 1": 43,
    "Level 2": 90,
    "Level 3": 105,
    "Level 4": 128,
    "Level 5": 134,
    None: 500,
}


# What grades an answer, recorded with every accuracy run (accuracy.json, summary.json) so that
# `verify` re-grades only with the same grader: grade()'s own rule (bump GRADE_RULE when grade()
# changes how it calls math-verify) and the packages that decide equivalence (math-verify, the
# LaTeX parser it calls, and sympy, which compares the parsed expressions).
GRADE_RULE = "kerneltrial.grade/1"
GRADER_PACKAGES = ("math-verify", "latex2sympy2_extended", "sympy")


class AccuracyError(RuntimeError):
    """Bad input or a broken pipeline; the message names the fix."""


class AccuracySpec(BaseModel):
    """The [accuracy] table of a serving protocol, or `serve accuracy`'s options."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    data: str = Field(
        description="MATH-500 test.jsonl (problem, answer, level, subject, unique_id; a relative path is taken "
        "from the protocol's folder), or hf:HuggingFaceH4/MATH-500 to load from the hub (needs `datasets`)."
    )
    level: str | None = Field(default="Level 3", description="Only problems of this level ('Level 3' or 3).")
    limit: int | None = Field(
        default=None,
        ge=1,
        description="Only the first N problems after the level filter, the preregistered n; unset: all, and the "
        "gate then needs the full MATH-500 set of the level (105 for Level 3).",
    )
    api: Literal["chat", "completions"] = Field(
        default="chat",
        description="chat: /v1/chat/completions (instruct models); completions: /v1/completions (base models).",
    )
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(
        default=0.95, gt=0, le=1, description="Nucleus sampling: smallest token set of this probability."
    )
    max_tokens: int = Field(default=4096, ge=1, description="Generation budget per problem, tokens.")
    concurrency: int = Field(default=16, ge=1, description="Requests in flight at once.")
    gate: float = Field(
        default=0.95,
        ge=0,
        le=1,
        description="Passes when the rule holds against this, no request failed and n reached the preregistered n "
        "(limit) or the full set.",
    )
    rule: GateRule = Field(
        default="point",
        description="point: accuracy >= gate; lower_bound: the interval's lower end >= gate (a model at the gate "
        "then rarely passes). pass_probability_at_gate, recorded with the result, is the probability that a model "
        "whose every sample is correct with probability exactly `gate` (independent samples) passes this rule "
        "with this n and samples: about one half for point.",
    )
    samples: int = Field(
        default=1,
        ge=1,
        description="Samples per problem (k); accuracy is the mean over problems of each problem's share "
        "correct. k = 1: Wilson interval; k > 1: Wilson on n k / design effect, the effect estimated from "
        "the per-problem shares (samples of one problem are correlated).",
    )
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Confidence level of the interval reported.")
    seed: int = Field(
        default=0, description=f"Sampling seed of problem i's sample j: seed + i + j * {stats.SEED_STRIDE}."
    )
    request_timeout_s: float = Field(default=1800.0, gt=0, description="Seconds one request may take.")

    @field_validator("level", mode="before")
    @classmethod
    def _level_number(cls, level: Any) -> Any:
        return str(level) if isinstance(level, int) and not isinstance(level, bool) else level

    @field_validator("data")
    @classmethod
    def _from_protocol_folder(cls, data: str, info: ValidationInfo) -> str:
        if not data:
            raise ValueError("must not be empty; point it at MATH-500 test.jsonl")
        base: Path | None = (info.context or {}).get("base_dir")
        if base is not None and not data.startswith(HF_PREFIX) and not Path(data).is_absolute():
            return str((base / data).resolve())
        return data


@dataclass
class Problem:
    index: int
    unique_id: str
    problem: str
    answer: str
    level: str
    subject: str


@dataclass
class Record:
    index: int
    unique_id: str
    level: str
    subject: str
    reference: str
    prompt: str
    response: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    error: str = ""
    extracted: list[str] = field(default_factory=list)
    correct: bool = False
    sample: int = 0  # j of the problem's k samples; written only when k > 1 (absent: 0)

    def row(self, samples: int) -> dict[str, Any]:
        """records.jsonl's line: with one sample per problem, the line of the runs before samples."""
        out = asdict(self)
        if samples == 1:
            del out["sample"]
        return out


def level_label(level: Any) -> str:
    s = str(level).strip()
    return f"Level {s}" if s.isdigit() else s


# Where the caller took the data path and the level from, for the fix an error names: `serve
# accuracy`'s options, or a protocol's [accuracy] keys (`serve trial` has no --data option).
CLI_KEYS = ("--data", "--level")
PROTOCOL_KEYS = ("[accuracy] data (relative to the protocol's folder)", "[accuracy] level")


def load_problems(
    source: str, level: str | None = "Level 3", limit: int | None = None, keys: tuple[str, str] = CLI_KEYS
) -> list[Problem]:
    """Problems from a JSONL path (or `hf:NAME` to load from the hub), filtered by level; errors
    name `keys` (the data path's and the level's) as what to fix."""
    data_key, level_key = keys
    rows: list[dict[str, Any]]
    if source.startswith(HF_PREFIX):
        try:
            import datasets  # type: ignore[import-not-found]
        except ImportError:
            raise AccuracyError(
                "loading from the hub needs `pip install datasets`; or pass a local JSONL path"
            ) from None
        rows = [dict(r) for r in datasets.load_dataset(source[len(HF_PREFIX) :], split="test")]
    else:
        path = Path(source)
        if not path.is_file():
            raise AccuracyError(f"MATH-500 file {source} not found; set {data_key} to the path of a test.jsonl")
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise AccuracyError(f"{source} line {n} is not JSON; set {data_key} to a JSONL file") from None
    want = level_label(level) if level else None
    out: list[Problem] = []
    for i, r in enumerate(rows):
        if "problem" not in r or "answer" not in r:
            raise AccuracyError(f"{source} row {i} lacks 'problem'/'answer'; is this MATH-500?")
        lv = level_label(r.get("level", ""))
        if want and lv != want:
            continue
        out.append(
            Problem(i, str(r.get("unique_id", i)), str(r["problem"]), str(r["answer"]), lv, str(r.get("subject", "")))
        )
    if not out:
        raise AccuracyError(f"no problem of level {want!r} in {source}; check {level_key} (e.g. 'Level 3' or 3)")
    return out[:limit] if limit else out


def build_prompt(problem: str) -> str:
    return PROMPT.format(problem=problem)


def load_grader() -> ModuleType:
    """math-verify, imported on use: it is the optional dependency kerneltrial[serve]."""
    try:
        import math_verify  # type: ignore[import-untyped]
    except ImportError:
        raise AccuracyError(
            "grading MATH-500 needs math-verify, which is not installed: pip install 'kerneltrial[serve]'"
        ) from None
    return math_verify


def grader_version() -> dict[str, str]:
    """The grader that grade() runs here: GRADE_RULE and each of GRADER_PACKAGES' installed version."""
    load_grader()
    return {"rule": GRADE_RULE} | {name: importlib.metadata.version(name) for name in GRADER_PACKAGES}


def grade(response: str, reference: str) -> tuple[list[str], bool]:
    """(extracted answers, correct) with math-verify; the gold is parsed as \\boxed{reference}."""
    mv = load_grader()
    try:
        gold = mv.parse("\\boxed{" + reference + "}")
        if not gold:
            gold = mv.parse("$" + reference + "$")
        pred = mv.parse(response)
        ok = bool(pred) and bool(mv.verify(gold, pred))
    except Exception:  # math-verify raises on pathological input: count as wrong, keep the text
        return [], False
    return [str(p) for p in pred[:2]], ok


def request_body(
    spec: AccuracySpec, model_id: str, prompt: str, index: int, sample: int = 0
) -> tuple[str, dict[str, Any]]:
    common = {
        "model": model_id,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "max_tokens": spec.max_tokens,
        "seed": stats.sample_seed(spec.seed, index, sample),
    }
    if spec.api == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


async def _query_all(
    base_url: str,
    model_id: str,
    problems: list[Problem],
    spec: AccuracySpec,
    on_done: Callable[[Record], None],
) -> list[Record]:
    sem = asyncio.Semaphore(max(1, spec.concurrency))
    limits = httpx.Limits(max_connections=max(1, spec.concurrency))
    async with httpx.AsyncClient(base_url=base_url, timeout=spec.request_timeout_s, limits=limits) as client:

        async def one(p: Problem, sample: int) -> Record:
            prompt = build_prompt(p.problem)
            rec = Record(p.index, p.unique_id, p.level, p.subject, p.answer, prompt, sample=sample)
            path, body = request_body(spec, model_id, prompt, p.index, sample)
            async with sem:
                t0 = time.monotonic()
                try:
                    r = await client.post(path, json=body)
                    rec.latency_s = time.monotonic() - t0
                    if r.status_code // 100 != 2:
                        rec.error = f"HTTP {r.status_code}: {r.text[:200]}"
                    else:
                        data = r.json()
                        choice = data["choices"][0]
                        rec.response = choice["message"]["content"] if spec.api == "chat" else choice["text"]
                        rec.response = rec.response or ""
                        rec.finish_reason = choice.get("finish_reason")
                        rec.completion_tokens = (data.get("usage") or {}).get("completion_tokens")
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                    rec.latency_s = time.monotonic() - t0
                    rec.error = f"{type(e).__name__}: {e}"[:300]
            on_done(rec)
            return rec

        return list(await asyncio.gather(*(one(p, j) for j in range(spec.samples) for p in problems)))


def required_n(spec: AccuracySpec) -> tuple[int | None, str]:
    """How many graded problems the gate needs, and why: the protocol's preregistered `limit`,
    else the full MATH-500 set of the level (a gate on fewer problems says nothing)."""
    if spec.limit is not None:
        return spec.limit, f"preregistered n = {spec.limit} (limit), not the full set"
    level = level_label(spec.level) if spec.level else None
    full = FULL_SET_SIZE.get(level)
    return full, f"the full {level or 'MATH-500'} set ({full} problems)" if full else "n not checked (unknown level)"


def problem_counts(records: list[Record]) -> list[int]:
    """Correct samples per problem, in the order of the problems' first records."""
    counts: dict[int, int] = {}
    for r in records:
        counts[r.index] = counts.get(r.index, 0) + bool(r.correct)
    return list(counts.values())


def summarise(records: list[Record], spec: AccuracySpec) -> dict[str, Any]:
    """The gate's figures: n = problems, correct = correct samples, the stated rule decides."""
    fig = stats.gate_figures(problem_counts(records), spec.samples, spec.confidence)
    errors = sum(1 for r in records if r.error)
    need, n_rule = required_n(spec)
    n = fig.n
    rule_ok = stats.rule_passes(fig, spec.gate, spec.rule)
    return {
        "n": n,
        "correct": fig.correct,
        "errors": errors,
        "accuracy": fig.accuracy,
        "ci_low": fig.ci_low,
        "ci_high": fig.ci_high,
        "confidence": spec.confidence,
        "gate": spec.gate,
        "required_n": need,
        "n_rule": n_rule,
        "passed": bool(n > 0 and errors == 0 and rule_ok and (need is None or n >= need)),
        "truncated": sum(1 for r in records if r.finish_reason == "length"),
        "samples": spec.samples,
        "rule": spec.rule,
        "interval": fig.interval,
        "design_effect": fig.design_effect,
        "pass_probability_at_gate": stats.pass_probability(n, spec.samples, spec.gate, spec.confidence, spec.rule),
        "pass_probability_assumption": stats.PASS_PROBABILITY_ASSUMPTION,
    }


def run_accuracy(
    base_url: str,
    model_id: str,
    spec: AccuracySpec,
    out_dir: Path,
    on_done: Callable[[Record], None] | None = None,
    cross_grader: GraderSource = evalscope_grader,
) -> dict[str, Any]:
    """Query, grade, write records.jsonl (appended as graded) and accuracy.json; return the summary,
    with the cross-grade of the same samples by `cross_grader`'s grader (serving/crossgrade.py)."""
    problems = load_problems(spec.data, spec.level, spec.limit)
    grader = grader_version()  # before the first request, not at the first graded answer
    out_dir.mkdir(parents=True, exist_ok=True)
    records_path = out_dir / "records.jsonl"
    fh = open(records_path, "a", encoding="utf-8")
    done: list[Record] = []

    def graded(rec: Record) -> None:
        if not rec.error:
            rec.extracted, rec.correct = grade(rec.response, rec.reference)
        fh.write(json.dumps(rec.row(spec.samples), ensure_ascii=False) + "\n")
        fh.flush()
        done.append(rec)
        if on_done:
            on_done(rec)

    try:
        records = asyncio.run(_query_all(base_url, model_id, problems, spec, graded))
    finally:
        fh.close()
    result = {
        "spec": spec.model_dump(),
        "base_url": base_url,
        "model_id": model_id,
        "grader": grader,
        **summarise(records, spec),
        "cross_grade": cross_grade(records, cross_grader).record(),
    }
    (out_dir / "accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
