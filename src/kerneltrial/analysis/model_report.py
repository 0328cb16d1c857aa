"""Reports of model trials (src/kerneltrial/model), drawn from summary.json and plan.json alone:
report.md of one run, and its section in PERFORMANCE.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kerneltrial.publication import titled
from kerneltrial.rundir.files import read_json, read_jsonl
from kerneltrial.rundir.model_summary_doc import ModelCase, ModelSummary, PairedRatio, read_model_summary
from kerneltrial.stats import Interval, verdict

HOST_BOUND = 0.8  # device busy below this share of the wall time: the call waits on the host
SERVED_BAND = 0.01  # Track 2: a throughput gain must clear 1%; TTFT may be at most the baseline's + 1%
TRACK2_ARMS = ("E1", "E2", "E3")
DESCRIPTION = (
    "The eager arm runs the model's own (Hugging Face) code; torch_eager runs the routed structure with torch "
    "formulas, so `vs torch_eager` isolates the kernels, and `vs kerneltrial` compares every other arm with ours "
    "(> 1: the reference is slower). Speedups are the geometric mean of per-round ratios with a Student-t interval; "
    "a tie needs the whole interval inside the tie band, otherwise it is inconclusive. `torch_compile` compiles each "
    "operator's formula on its own, not the model. FlagGems' SiLU-and-mul reads the two halves of the shared "
    "gate/up buffer (a strided layout it would not see behind two separate GEMMs). Share: time inside the routed "
    "operators over the median wall time per call; device busy: all kernels' time over that wall time. Where the "
    "device is busy less than 80% of the call (host-bound), the GPU waits on Python and a faster kernel changes little; "
    "eager's share leaves out its residual adds (Hugging Face's layer code), so it understates what a fused add saves."
)


def _ratio(ratio: PairedRatio | None) -> str:
    if ratio is None:
        return ""
    if ratio.ci is None:
        return f"{ratio.speedup:.3f} (no interval) {ratio.verdict}"
    low, high = ratio.ci
    return f"{ratio.speedup:.3f} [{low:.3f}, {high:.3f}] {ratio.verdict}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def case_lines(cid: str, case: ModelCase) -> list[str]:
    drift, floor = case.drift, case.floor  # floor: summary schema 3 (modes, the weight-read floor, exclusions)
    mode = f", {case.mode} mode" if case.mode else ""
    lines = [f"### {cid} ({case.phase}{mode}, {case.tokens_per_call} tokens per call)", ""]
    if drift is not None and abs(drift - 1) > 0.05:
        lines += [
            f"**Drift:** the second half of the rounds ran {drift:.2f}x the first half's time (every arm's median): the machine changed during this case.",
            "",
        ]
    if floor:
        lines += [
            f"Weight-read floor: {floor.bytes / 1e9:.3f} GB at the run's copy rate = "
            f"{floor.ns / 1e6:.3f} ms (x floor: the median over it; device x floor: the profiled call's "
            "device time over it).",
            "",
        ]
    floor_head, floor_rule = (" x floor | device x floor |", "---:|---:|") if floor else ("", "")
    lines += [
        "| arm | median ms | tokens/s | vs eager [CI] | vs torch_eager [CI] | vs kerneltrial [CI] | share | device busy | ops' time (ms) |"
        + floor_head,
        "|---|---:|---:|---|---|---|---:|---:|---|" + floor_rule,
    ]
    for arm, e in case.arms.items():
        attr = e.attribution
        regions = ", ".join(f"{op} {ns / 1e6:.3f}" for op, ns in (attr.regions_ns if attr else {}).items())
        busy = attr.device_busy if attr else None
        busy_cell = _pct(busy) + (" (host-bound)" if busy is not None and busy < HOST_BOUND else "")
        floor_cells = f" {_times(e.vs_floor)} | {_times(e.device_vs_floor)} |" if floor else ""
        lines.append(
            f"| {arm} | {e.median_ns / 1e6:.3f} | {e.tokens_per_s:.1f} | {_ratio(e.vs_eager)} | "
            f"{_ratio(e.vs_torch_eager)} | {_ratio(e.vs_kerneltrial)} | {_pct(attr.share if attr else None)} | "
            f"{busy_cell} | {regions} |" + floor_cells
        )
    excluded = case.excluded or {}
    if excluded:
        lines += ["", "Not timed here: " + "; ".join(f"{arm} ({why})" for arm, why in excluded.items()) + "."]
    return [*lines, ""]


def _times(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def correctness_lines(run_dir: Path, summary: ModelSummary) -> list[str]:
    """The gate's table: teacher-forced rows (schema 3), or the free-running greedy rows of older runs."""
    rows = read_jsonl(run_dir / "correctness.jsonl")
    if rows and "top1_agreement" in rows[0]:
        lines = [
            "Teacher-forced: every arm's logits on the same prompts + float32-chosen tokens, against the float32 "
            "model (max distance relative to its max logit; limit `oracle_factor` x eager's) and its top-1 tokens "
            "(agreement at least eager's minus `top1_margin`).",
            "",
            "| arm | passed | calls per forward | to float32 (limit) | to eager | top-1 agreement (limit) | note |",
            "|---|---|---|---:|---:|---:|---|",
        ]
        for row in rows:
            limit = row.get("top1_limit")
            top1 = f"{row['top1_agreement']:.3f}" + ("" if limit is None else f" ({limit:.3f})")
            lines.append(_gate_cells(row) + f" {top1} | {row['message']} |")
    else:
        lines = [
            "Logits: distance of the prompts' last-position logits to the float32 model (relative to its max "
            "logit; an arm passes at most `oracle_factor` x eager's own distance) and to eager's.",
            "",
            "| arm | passed | calls per forward | to float32 (limit) | to eager | identical greedy steps | note |",
            "|---|---|---|---:|---:|---:|---|",
        ]
        for row in rows:
            note = row["message"]
            div = row.get("first_divergence")
            if div and div["near_tie"]:
                note = note or f"near-tie divergence at step {div['step']} (margin {div['margin']:.2g})"
            lines.append(_gate_cells(row) + f" {row.get('greedy_identical_steps', '')} | {note} |")
    return lines + [f"| {arm} | not run | | | | | {reason} |" for arm, reason in summary.unavailable.items()]


def _gate_cells(row: dict[str, Any]) -> str:
    calls = ", ".join(f"{k} {v}" for k, v in row["calls_per_forward"].items())
    rel, oracle, limit = row.get("logits_rel_diff"), row.get("oracle_rel_error"), row.get("oracle_rel_error_limit")
    to_oracle = "" if oracle is None else f"{oracle:.3g}" + ("" if limit is None else f" ({limit:.3g})")
    return (
        f"| {row['arm']} | {'yes' if row['passed'] else '**no**'} | {calls} | {to_oracle} | "
        f"{'' if rel is None else f'{rel:.3g}'} |"
    )


def render(run_dir: Path, unverified: bool = False) -> str:
    """report.md of a model run: a function of the run directory alone (verify renders it again
    and compares, kernel/derived.py); `unverified`: the title says it was not verified."""
    plan = read_json(run_dir / "plan.json")
    summary = read_model_summary(run_dir)
    lines = [
        titled(f"# Model trial: {plan['model']} ({plan['dtype']})", unverified),
        "",
        f"Timing: {summary.timing_label}. {plan['rounds']} interleaved rounds per case after "
        f"{plan.get('warmup', 0)} untimed ones, {plan['calls_per_sample']} call(s) per sample; "
        f"{summary.method or 'ratio of medians, paired bootstrap'}, tie band ±{plan['tie_band']:.0%}.",
        DESCRIPTION,
    ]
    if (line := run_line(summary)) is not None:
        lines += ["", line]
    lines += ["", "## Correctness (before timing)", "", *correctness_lines(run_dir, summary), "", "## Timing", ""]
    for cid, case in summary.cases.items():
        lines += case_lines(cid, case)
    return "\n".join(lines)


def run_line(summary: ModelSummary) -> str | None:
    """Schema 3's run-wide facts: the graph mode, the fresh inputs and their checks, the copy rate;
    None for older runs, which recorded none of them."""
    checks, copy = summary.timed_checks, summary.copy_rate
    if checks is None or copy is None:
        return None
    graphs = any(case.mode == "graph" for case in summary.cases.values())
    return (
        (f"Graph mode (cases ending in -graph): {summary.graph_label}. " if graphs else "")
        + "Every timed call ran on fresh inputs (inputs.csv: each round's "
        f"from its seed); one call of every round was checked against the float32 model: {checks.failed} of "
        f"{checks.rows} checks failed. Copy rate (the floor's): {copy.gbps:.1f} GB/s, "
        f"{copy.samples} copies of {copy.bytes / 2**30:.3g} GiB (read + written)."
    )


def ours_against(ratio: PairedRatio, tie_band: float) -> PairedRatio:
    """A peer's `vs_kerneltrial` (kerneltrial's time over the peer's) turned round: ours against the
    peer, its verdict called again on the turned interval (the band is not symmetric in log scale)."""
    if ratio.ci is None:
        return PairedRatio(speedup=1 / ratio.speedup, ci=None, verdict="inconclusive", rounds=ratio.rounds)
    low, high = 1 / ratio.ci[1], 1 / ratio.ci[0]
    called = verdict(Interval(low, high), tie_band)
    return PairedRatio(speedup=1 / ratio.speedup, ci=(low, high), verdict=called, rounds=ratio.rounds)


def spread_of(twin: PairedRatio | None) -> float:
    """How far apart two arms that run the same operators came out (E3 against kerneltrial), as a
    fraction: the far end of its interval (its point without one)."""
    if twin is None:
        return 0.0
    low, high = twin.ci or (twin.speedup, twin.speedup)
    return max(high, 1 / low) - 1


def served_reading(phase: str, ours: PairedRatio | None, spread: float) -> str:
    """What kerneltrial against flaggems says for Track 2's gates, where its interval clears the 1% band
    and `spread` (the difference between identical arms): a decode step for throughput, a prefill for TTFT."""
    if ours is None or ours.ci is None:
        return "no interval against flaggems: no reading"
    low, high = ours.ci
    if phase == "decode":
        gain = 1 + SERVED_BAND
        if low > gain * (1 + spread):
            return "decode step ahead of flaggems by more than the 1% band and the spread"
        if high * (1 + spread) < gain:
            return "decode step not ahead of flaggems by the 1% band and the spread"
        return "decode step undecided against the 1% band and the spread"
    limit = 1 / (1 + SERVED_BAND)
    if low / (1 + spread) >= limit:
        return "prefill within flaggems' + 1% (TTFT's gate) beyond the spread"
    if high * (1 + spread) < limit:
        return "prefill slower than flaggems' + 1% beyond the spread: the TTFT gate may fail"
    return "prefill undecided against TTFT's + 1% and the spread"


def track2_lines(summary: ModelSummary, tie_band: float, flaggems: str | None) -> list[str]:
    """Per case: what E1/E2/E3 gain over eager (E0 here), kerneltrial (the operators of E3) against
    flaggems and torch_compile, E3 against kerneltrial (the spread between identical arms), and the
    reading against Track 2's 1% rules; [] without E arms. `flaggems`: the version the run recorded."""
    rows = []
    for cid, case in summary.cases.items():
        arms = case.arms
        if not any(e in arms for e in TRACK2_ARMS):
            continue
        gains = "; ".join(f"{e} {_ratio(arms[e].vs_eager)}" for e in TRACK2_ARMS if e in arms and arms[e].vs_eager)
        against = {
            p: ours_against(r, tie_band)
            for p in ("flaggems", "torch_compile")
            if p in arms and (r := arms[p].vs_kerneltrial)
        }
        twin = arms["E3"].vs_kerneltrial if "E3" in arms else None
        reading = served_reading(case.phase, against.get("flaggems"), spread_of(twin))
        cells = (gains, _ratio(against.get("flaggems")), _ratio(against.get("torch_compile")), _ratio(twin), reading)
        rows.append(f"| {cid} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "#### Track 2 reading",
        "",
        f"E0 is eager here (the model's own code). The flaggems arm is FlagGems {flaggems or '(version not recorded)'} "
        "through kerneltrial's adapter; a served E0 reaches FlagGems through vllm-plugin-FL at the serving "
        "protocol's pinned version, so kerneltrial against flaggems is a proxy for the served gain. E3 runs "
        "kerneltrial's operators (model/arms.py): `E3 vs kerneltrial` is the spread between two identical arms, "
        "which a reading must clear besides the band (its interval may exclude 1: the difference is systematic, "
        "from the arms' positions or allocations, not noise). A decode case is one decode step: served throughput "
        "also counts the prefill of the Track 2 cases' long inputs, which a run of decode cases does not time, and "
        "the served cases run at 4096-16384 input tokens and concurrency 64 against this run's contexts and batches.",
        "",
        "| case | E1, E2, E3 vs eager [CI] | kerneltrial vs flaggems [CI] | kerneltrial vs torch_compile [CI] "
        "| E3 vs kerneltrial [CI] | reading |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def performance_section(run_dir: Path, unverified: bool = False) -> list[str]:
    """The run's section in PERFORMANCE.md: its timing tables under the run's name."""
    plan = read_json(run_dir / "plan.json")
    summary = read_model_summary(run_dir)
    lines = [
        titled(f"### {run_dir.name}: {plan['model']} ({plan['dtype']}), whole model", unverified),
        "",
        f"Timing: {summary.timing_label}; {plan['rounds']} interleaved rounds. Arms not timed: "
        + (", ".join(f"{a} ({why})" for a, why in summary.unavailable.items()) or "none")
        + ". Correctness: "
        + ", ".join(f"{a} {'passed' if c.passed else 'FAILED'}" for a, c in summary.correctness.items())
        + ".",
        "",
    ]
    if (line := run_line(summary)) is not None:
        lines += [line, ""]
    for cid, case in summary.cases.items():
        lines += ["#" + line if line.startswith("### ") else line for line in case_lines(cid, case)]
    flaggems = (read_json(run_dir / "provenance.json").get("versions") or {}).get("flag-gems")
    return lines + track2_lines(summary, plan["tie_band"], flaggems)


def write_model_report(run_dir: Path, unverified: bool = False) -> Path:
    path = run_dir / "report.md"
    path.write_text(render(run_dir, unverified))
    return path
