"""Human views of kernel runs: report.md + PNG figures, and each run's section of PERFORMANCE.md
(analysis/performance.py renders the rest of PERFORMANCE.md: the overview and earlier runs).

Every figure is drawn from summary.json (nothing is recomputed here); provenance.json and
protocol.toml only supply the device, versions and operator name. Runs without a GPU are
labelled "NOT GPU performance" in every heading and figure title. A run directory may hold
an ERRATA.md (corrections written after the run; the raw files are never edited): its text
is quoted under "Errata (written by hand ...; not checked ...)" in the run's section, so that no
line of it reads as a measured figure, and the overview marks the run "(errata)".
report.md is a derived file: `report_text` is a function of the run directory, and verify
renders it again and compares (kernel/derived.py). With `unverified` every title says so.
A line `Superseded by: RUN` (and, optionally, `Reason: ...`) in it retires the run
(`superseded_by`; analysis/performance.py).
A schema-4 summary (a run with timed checks) adds to a run's section: when the protocol was
frozen (or a loud NOT FROZEN line), the timed checks, the plausibility limits, wins/ties/losses/inconclusive counts
with the cases failed while timed or implausible, and each arm's ulp histogram.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kerneltrial.kernel.cells import rate
from kerneltrial.kernel.throughput_cells import PEAK_NOTE, peak_cell, tflops_cell, with_peak, with_tflops
from kerneltrial.publication import titled
from kerneltrial.rundir.documents import Provenance, read_provenance
from kerneltrial.rundir.layout import (
    CEILING_PNG,
    ERRATA,
    PROTOCOL,
    PROVENANCE,
    REPORT,
    SPEEDUP_PNG,
    VERDICTS_PNG,
)
from kerneltrial.rundir.layout import ERRATA_SUPERSEDED as SUPERSEDED
from kerneltrial.rundir.summary_doc import AACalibration, ArmFigures, Ceilings, SlowCalibration, Summary, read_summary

# ERRATA.md is written by hand after the run: pages quote it under this heading, never as figures
ERRATA_HEADING = "Errata (written by hand after the run; `kerneltrial verify` does not check this text)"
# markers at speedup 1 for the cases an arm has no speedup because it was disqualified
SCOPE = (
    "Confidence intervals cover noise within this session (machine state, clocks) only; "
    "a re-run on another machine may differ by more."
)


# ---------------------------------------------------------------- loading


def optional_provenance(run_dir: Path) -> Provenance | None:
    """The run's provenance.json, or None when it has none."""
    return read_provenance(Path(run_dir)) if (Path(run_dir) / PROVENANCE).is_file() else None


def errata(run_dir: Path) -> str | None:
    """The text of the run directory's ERRATA.md, or None when it has none."""
    path = Path(run_dir) / ERRATA
    return path.read_text().strip() if path.is_file() else None


def errata_field(run_dir: Path, prefix: str) -> str | None:
    for line in (errata(run_dir) or "").splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip().strip("`") or None
    return None


def superseded_by(run_dir: Path) -> str | None:
    """The run directory name an ERRATA.md line `Superseded by: RUN` names, else None."""
    return errata_field(run_dir, SUPERSEDED)


def operator_name(run_dir: Path, summary: Summary) -> str:
    """summary's `op`, else the protocol's `op`/`operator` key, else the directory name."""
    if summary.op:
        return summary.op
    path = Path(run_dir) / PROTOCOL
    protocol = tomllib.loads(path.read_text()) if path.is_file() else {}
    return str(protocol.get("op") or protocol.get("operator") or Path(run_dir).name)


# ---------------------------------------------------------------- formatting


def num_cell(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def speedup_cell(entry: ArmFigures) -> str:
    if entry.speedup is None or entry.ci_low is None or entry.ci_high is None:
        return "–"
    return f"{entry.speedup:.3f} [{entry.ci_low:.3f}, {entry.ci_high:.3f}]"


def _status_cell(entry: ArmFigures, is_control: bool) -> str:
    if entry.status == "failed correctness":
        return "**failed correctness**: " + "; ".join(entry.messages)
    if entry.status == "failed while timed":  # one row per failed sample: the first, and how many
        messages = entry.messages
        more = f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""
        return f"**failed while timed** in {len(messages)} sample(s): {messages[0]}{more}"
    if entry.status == "implausible":
        return "**implausible**: " + (entry.reason or "").removeprefix("implausible: ")
    if entry.status in ("unavailable", "not timed"):
        return f"{entry.status}: {entry.reason}"
    return "control" if is_control else (entry.verdict or "no control timing")


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def _spread_cell(entry: ArmFigures) -> str:
    return "–" if entry.spread is None else f"{100 * entry.spread:.1f}%"


def host_cell(entry: ArmFigures) -> str:
    """Median host µs per call; samples that ended with the device still busy are named (device-bound)."""
    if entry.host_ns_per_call is None:
        return "–"
    bound = f" (device-bound in {entry.host_behind} of {entry.host_samples})" if entry.device_bound else ""
    return f"{entry.host_ns_per_call / 1e3:,.2f}{bound}"


HOST_NOTE = (
    "Host µs = median over host samples of the wall time per call a caller is blocked, {calls} back-to-back "
    "calls on the same inputs with nothing synchronised inside a sample; device-bound samples ended with the "
    "device still busy (the device, not the host, set the pace)."
)


def case_table(summary: Summary) -> list[str]:
    """One row per (case, arm), every arm including failed and unavailable ones.

    The host column appears when the run measured host cost (summary/5); TFLOPS where a case has
    a FLOP count and extra peak MiB where the run records peak memory (issue 40); the spread column
    (p90 - p10 over the median, run to run) when the summary has spreads (not summary/1); the
    throttled column only when some sample was throttled.
    """
    with_host = summary.host is not None
    with_spread = summary.records_spreads
    with_throttled = any(e.throttled_samples for c in summary.cases for e in c.arms.values())
    flops, peak = with_tflops(summary), with_peak(summary)
    rows = []
    for case in summary.cases:
        for name, entry in case.arms.items():
            row = [
                f"`{case.case}`",
                f"`{name}`",
                us_cell(entry.median_ns_per_call, ",.2f"),
                *([host_cell(entry)] if with_host else []),
                speedup_cell(entry),
                _status_cell(entry, name == summary.control),
                rate(entry.gbps),
                rate(entry.pct_of_copy_ceiling),
                *([tflops_cell(entry)] if flops else []),
                *([peak_cell(summary, name, entry)] if peak else []),
            ]
            if with_spread:
                row.append(_spread_cell(entry))
            if with_throttled:
                row.append(f"{entry.throttled_samples} of {entry.n_samples}" if entry.n_samples else "–")
            rows.append(row)
    confidence = int(round(100 * summary.bootstrap.confidence))
    header = ["case", "arm", "median µs", *["host µs"] * with_host, f"speedup [{confidence}% CI]", "verdict"]
    header += ["GB/s", "% of copy ceiling"] + ["TFLOPS"] * flops + ["extra peak MiB"] * peak
    header += ["spread p10–p90"] * with_spread + ["throttled samples"] * with_throttled
    note = ["", HOST_NOTE.format(calls=summary.host.calls)] if summary.host is not None else []
    note += ["", PEAK_NOTE] if flops or peak else []
    return markdown_table(header, rows) + note


def clocks_line(summary: Summary) -> str | None:
    """The clock bullet of a run; None for a summary/1 without clock figures."""
    clocks = summary.clocks
    if clocks is None:
        return None
    if not clocks.samples_with_clock:
        return "- clocks: no SM clock recorded per sample (no NVML); throttling not checked"
    threshold = (
        "no maximum SM clock known, throttling not checked"
        if clocks.threshold_mhz is None
        else (
            f"{clocks.throttled_samples} throttled (SM clock below {clocks.threshold_mhz:g} MHz = "
            f"{clocks.throttle_fraction:g} x max {clocks.max_sm_mhz} MHz)"
        )
    )
    return f"- clocks: {clocks.samples_with_clock} samples with an SM clock reading; {threshold}"


def rounds_line(summary: Summary) -> str | None:
    """Rounds per case when they differ between cases or a noise rule is preregistered."""
    rounds = {c.case: c.rounds for c in summary.cases}
    rule = summary.noise_rule
    target = rule.target_ci_width if rule else None
    if None in rounds.values() or (len(set(rounds.values())) <= 1 and target is None):
        return None
    text = "- rounds per case: " + ", ".join(f"`{case}` {n}" for case, n in rounds.items())
    if rule is not None and rule.target_ci_width is not None:
        text += (
            f" (noise rule: rounds added until the CI width is at most {rule.target_ci_width:g}, "
            f"up to {rule.max_rounds} rounds or {rule.time_budget_s} s)"
        )
    return text


def calibration_lines(summary: Summary, h: str) -> list[str]:
    """The calibration section: A/A false-positive rates and the power to see an injected slowdown."""
    calibration = summary.calibration
    if calibration is None:
        return []
    rows = [
        [
            f"`{name}`",
            "A/A copy",
            f"`{f.base}`",
            _aa_verdicts(f),
            num_cell(f.false_positive_rate, ".2f"),
            f"≤ {calibration.max_false_positive_rate:g}",
            num_cell(f.mean_ci_width, ".4f"),
        ]
        for name, f in calibration.arms.items()
        if isinstance(f, AACalibration)
    ]
    delay = f"+{100 * calibration.injected_slowdown:g}% delay"
    rows += [
        [
            f"`{name}`",
            delay + _realized_note(f),
            f"`{f.base}`",
            f"{f.losses} of {f.n_cases} loss",
            num_cell(f.power, ".2f"),
            f"≥ {calibration.min_power:g}",
            "–",
        ]
        for name, f in calibration.arms.items()
        if isinstance(f, SlowCalibration)
    ]
    delays = [f"`{c.case}` {c.injected_delay_ns:,.1f} ns" for c in summary.cases if c.injected_delay_ns is not None]
    lines = [
        "",
        f"{h}# Calibration: {'passed' if calibration.passed else '**FAILED**'}",
        "",
        calibration.sentence,
        "",
        *markdown_table(["arm", "what", "base", "verdicts", "rate", "required", "mean CI width"], rows),
    ]
    if delays:
        lines += ["", "Injected delay per call: " + ", ".join(delays)]
    return lines


def _aa_verdicts(figures: AACalibration) -> str:
    """An A/A arm's claimed differences: wins or losses and inconclusive (summary/3, without an
    inconclusive verdict: "not tie", its name then)."""
    if figures.inconclusive is None:
        return f"{figures.false_positives} of {figures.n_cases} not tie"
    return f"{figures.false_positives} of {figures.n_cases} win or loss, {figures.inconclusive} inconclusive"


def _realized_note(figures: SlowCalibration) -> str:
    """The slowdown a slowed arm really had, when the summary records it."""
    if figures.realized_min is None or figures.realized_max is None:
        return ""
    return f" ({100 * figures.realized_min:.1f}–{100 * figures.realized_max:.1f}% realized)"


def aggregate_table(summary: Summary) -> list[str]:
    """One row per compared arm; a run with timed checks adds inconclusive verdicts (wins/ties/losses/inconclusive)
    and the cases failed while timed or implausible."""
    checked = summary.timed_checks is not None
    rows = []
    for name in summary.compared_arms():
        agg = summary.aggregates[name]
        gate = summary.gate.arms[name]
        ci = "–" if agg.geomean is None else f"{agg.geomean:.3f} [{agg.geomean_ci_low:.3f}, {agg.geomean_ci_high:.3f}]"
        worst = "–" if agg.worst is None else f"{agg.worst:.3f} (`{agg.worst_case}`)"
        verdict = "pass" if gate.passed else "FAIL: " + "; ".join(gate.reasons)
        counts = [agg.wins, agg.ties, agg.losses] + ([agg.inconclusive] if checked else [])
        disqualified = [agg.failed_correctness] + ([agg.failed_while_timed, agg.implausible] if checked else [])
        rows.append(
            [
                f"`{name}`",
                ci,
                num_cell(agg.mean, ".3f"),
                worst,
                "/".join(map(str, counts)),
                *map(str, disqualified),
                verdict,
            ]
        )
    header = [
        "arm",
        "geomean [CI]",
        "mean",
        "worst case",
        "wins/ties/losses/inconclusive" if checked else "wins/ties/losses",
        "failed correctness",
    ] + ["failed while timed", "implausible"] * checked
    return markdown_table([*header, f"gate `{summary.gate.rule}`"], rows)


def ulp_table(summary: Summary, h: str) -> list[str]:
    """How far each arm's outputs were from the official formula, over all its correctness checks."""
    rows = [
        [f"`{name}`", *(f"{n:,}" for n in agg.ulp_hist)]
        for name, agg in summary.aggregates.items()
        if agg.ulp_hist is not None
    ]
    if not rows:
        return []
    return [
        "",
        f"{h}# Distance from the reference (output elements, in ulps of the output dtype)",
        "",
        *markdown_table(["arm", "0", "≤ 1", "≤ 2", "≤ 4", "≤ 16", "> 16"], rows),
    ]


def freeze_record(run_dir: Path, summary: Summary) -> tuple[bool, str | None]:
    """(whether the run records its freeze, when the protocol was frozen or None): summary
    `frozen_at` (runs with timed checks), else the provenance freeze record of an older run."""
    if summary.timed_checks is not None:
        return True, summary.frozen_at
    provenance = optional_provenance(run_dir)
    if provenance is None or not provenance.records_freeze:
        return False, None
    return True, provenance.freeze.frozen_at if provenance.freeze else None


def freeze_line(run_dir: Path, summary: Summary) -> str | None:
    """When the protocol was frozen, or a loud line that it was not; None when the run does not say."""
    recorded, frozen_at = freeze_record(run_dir, summary)
    if not recorded:
        return None
    if frozen_at is None:
        return "- **NOT FROZEN**: the protocol was not frozen before the run: its settings were not preregistered"
    return f"- protocol frozen at {frozen_at}"


def checks_lines(summary: Summary) -> list[str]:
    """Timed checks, exactness and plausibility limits of a run with timed checks (none before)."""
    counts, rule = summary.timed_checks, summary.plausibility
    if counts is None or rule is None:
        return []
    lines = [
        f"- timed checks: {counts.rows:,} timing samples, the last call of each checked on fresh values; {counts.failed} failed"
    ]
    if summary.exact:
        lines.append("- exact: outputs must equal the reference bit for bit")
    if not rule.applied:
        return [*lines, "- plausibility: not judged (not a GPU run timed with CUDA events)"]
    limits = []
    if rule.bandwidth_limit_gbps is not None:
        limits.append(
            f"above {rate(rule.bandwidth_limit_gbps)} GB/s ({100 * rule.bandwidth_margin:g}% over the best ceiling)"
        )
    if rule.time_limit_ns is not None:
        limits.append(
            f"below {rule.time_limit_ns:,.0f} ns per call ({rule.launch_floor_fraction:g} x the launch floor)"
        )
    return [*lines, "- plausibility: implausible " + (" or ".join(limits) if limits else "(no limit measured)")]


def isolation_lines(summary: Summary, h: str) -> list[str]:
    """The isolated arms' own figures beside the harness's wall bound of the same samples (summary/7)."""
    figures = summary.isolation
    if figures is None or not figures.arms:
        return []
    rows = [
        [
            b.case,
            f"`{b.arm}`",
            str(b.samples),
            us_cell(b.claimed_ns_per_call, ".4g"),
            us_cell(b.bound_ns_per_call, ".4g"),
            "n/a"
            if b.ratio is None
            else (f"**{b.ratio:.1f}x**" if b.ratio > figures.far_inside else f"{b.ratio:.1f}x"),
            "n/a" if b.floor_ns_per_call is None else us_cell(b.floor_ns_per_call, ".4g"),
            "n/a" if b.under_samples is None else f"{b.under_samples} of {b.samples}",
        ]
        for b in figures.bounds
    ]
    return [
        "",
        f"{h}# Isolated arms: their own clock and the harness's bound",
        "",
        f"Arms {_names(figures.arms)} ran in a worker process each, apart from kerneltrial's. Each timed itself; "
        "the harness vouches only for the wall clock around each sample, which bounds the claim. "
        f"**Bold**: the bound is more than {figures.far_inside:g}x the claim, which then rests on the arm's own clock. "
        "The floor (host clock): each sample's wall clock less the tie band and the largest round trip of "
        "kerneltrial's own worker in the case; an arm below it in most of its samples is implausible.",
        "",
        *markdown_table(
            [
                "case",
                "arm",
                "samples",
                "claimed µs/call",
                "harness bound µs/call",
                "bound / claim",
                "floor µs/call",
                "below floor",
            ],
            rows,
        ),
    ]


def _ceilings_line(ceilings: Ceilings) -> str:
    line = (
        f"- ceilings: copy {rate(ceilings.copy_gbps)} GB/s, read {rate(ceilings.read_gbps)} GB/s "
        f"(medians of {ceilings.copy_samples} and {ceilings.read_samples} samples)"
    )
    if ceilings.launch_floor_ns is not None:
        line += (
            f", launch floor {ceilings.launch_floor_ns:,.0f} ns (median of {ceilings.launch_samples} empty launches)"
        )
    if ceilings.triton_launch_floor_ns is not None:
        line += (
            f", Triton launch floor {ceilings.triton_launch_floor_ns:,.0f} ns "
            f"(median of {ceilings.triton_launch_samples} one-element Triton launches)"
        )
    return line


def us_cell(ns: float | None, spec: str) -> str:
    """A median in ns per call shown in µs (– when there is none)."""
    return num_cell(None if ns is None else ns / 1000.0, spec)


def banner(summary: Summary) -> str:
    """The timing label; loud when the run is not GPU performance."""
    return summary.label if summary.is_gpu else f"**{summary.label}**"


def _provenance_lines(provenance: Provenance | None) -> list[str]:
    """Device, versions and git as recorded (the fields the run wrote, in its order)."""
    if provenance is None:
        return []
    return [
        f"- device: {_compact(provenance.device.model_dump(exclude_unset=True))}",
        f"- versions: {_compact(provenance.versions)}",
        f"- git: {_compact(provenance.git.model_dump(exclude_unset=True))}",
    ]


def _names(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _compact(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_compact(v)}" for k, v in value.items())
    return str(value)


# ---------------------------------------------------------------- figures


def errata_lines(run_dir: Path, h: str) -> list[str]:
    """ERRATA.md quoted under its heading (nothing when the run has none): hand-written text, set
    apart so that no line of it reads as a figure of the run."""
    corrections = errata(run_dir)
    if not corrections:
        return []
    return [f"{h}# {ERRATA_HEADING}", "", *(f"> {line}".rstrip() for line in corrections.splitlines()), ""]


def run_section(
    run_dir: Path, summary: Summary, level: int = 1, unverified: bool = False, freeze: bool = True
) -> list[str]:
    """The markdown body shared by report.md and PERFORMANCE.md for one run; `unverified`: its
    title says the run was rendered without passing `kerneltrial verify`; `freeze` False: without
    the freeze line, which PERFORMANCE.md gives in one table."""
    h = "#" * level
    lines = [
        titled(f"{h} {operator_name(run_dir, summary)}: `{Path(run_dir).name}`", unverified),
        "",
        f"Timing: {banner(summary)}",
        "",
        *errata_lines(run_dir, h),
        SCOPE,
        "",
        f"- protocol sha256: `{summary.protocol_sha256}`",
        f"- backend `{summary.backend}`, L2 `{summary.l2}`, control `{summary.control}`, "
        f"tie band ±{summary.tie_band:g}",
        *[line for line in (freeze_line(run_dir, summary) if freeze else None,) if line],
        _ceilings_line(summary.ceilings),
        *[line for line in (clocks_line(summary), rounds_line(summary)) if line],
        *checks_lines(summary),
        *_provenance_lines(optional_provenance(run_dir)),
        f"- gate `{summary.gate.rule}`: passed by {_names(summary.gate.passed_arms) or 'no arm'}",
        "",
        f"{h}# Per arm",
        "",
        *aggregate_table(summary),
        *ulp_table(summary, h),
        *calibration_lines(summary, h),
        *isolation_lines(summary, h),
        "",
        f"{h}# Per case (every case and arm; regressions included)",
        "",
        *case_table(summary),
    ]
    unavailable = [a for a in summary.arms if not a.available]
    if unavailable:
        lines += ["", "Unavailable arms: " + "; ".join(f"`{a.name}` ({a.reason})" for a in unavailable)]
    if summary.warnings:
        lines += ["", f"{h}# Warnings", "", *(f"- {w}" for w in summary.warnings)]
    return lines


def report_text(run_dir: Path, unverified: bool = False) -> str:
    """report.md of a kernel run: a function of the run directory alone (verify renders it again
    and compares, kernel/derived.py)."""
    run_dir = Path(run_dir)
    lines = run_section(run_dir, read_summary(run_dir), unverified=unverified) + [
        "",
        "## Figures",
        "",
        f"![speedup per case]({SPEEDUP_PNG})",
        "",
        f"![verdicts per arm]({VERDICTS_PNG})",
        "",
        f"![% of copy ceiling]({CEILING_PNG})",
        "",
        "Figures are drawn from summary.json; `kerneltrial verify` rebuilds every figure from the raw rows.",
    ]
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, unverified: bool = False) -> Path:
    """Write report.md and its PNG figures into the run directory; returns report.md's path.
    `unverified`: every title says the run was rendered without passing `kerneltrial verify`."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    from kerneltrial.kernel.plots import plot_ceiling, plot_speedups, plot_verdicts  # matplotlib: only here

    plot_speedups(summary, run_dir / SPEEDUP_PNG, unverified)
    plot_verdicts(summary, run_dir / VERDICTS_PNG, unverified)
    plot_ceiling(summary, run_dir / CEILING_PNG, unverified)
    path = run_dir / REPORT
    path.write_text(report_text(run_dir, unverified))
    return path
