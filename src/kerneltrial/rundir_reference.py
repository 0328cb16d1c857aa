"""Every file of a run directory and every key of its typed JSON documents, generated:
`python -m kerneltrial.rundir_reference > docs/RUNDIR.md` (a test keeps the committed file equal to it).

The file lists name rundir/layout.py's and model/layout.py's constants; the keys of plan.json,
provenance.json and summary.json come from their readers' models (rundir/documents.py,
rundir/summary_doc.py, rundir/model_summary_doc.py, rundir/serving_summary_doc.py), each with its `Field` description.
Rendering refuses a key without one. Torch-free: it imports only the layouts and the document models.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kerneltrial.model import layout as model_layout
from kerneltrial.model_fields import nested_model, undocumented
from kerneltrial.rundir.documents import Plan, Provenance
from kerneltrial.rundir.integrity_notes import WALL_SLACK
from kerneltrial.rundir.layout import (
    ACCURACY_DIR,
    ATTRIBUTION,
    CEILINGS,
    CORRECTNESS,
    DISPATCH_DIR,
    ERRATA,
    FLEET,
    FLEET_LOGS,
    FLEET_PIECES,
    FLEET_WORKERS,
    HOST,
    LAUNCH_DIR,
    LAUNCHES,
    MANIFEST,
    PLAN,
    PROTOCOL,
    PROVENANCE,
    RAW_DIR,
    REPLICATES,
    REPLICATES_MD,
    REPORT,
    REPORT_FIGURES,
    REQUESTS,
    ROUNDTRIP,
    ROUNDTRIP_COLUMNS,
    RUNS,
    SIZE_PNG,
    SOURCE_ARCHIVE,
    SUITE,
    SUMMARY,
    TIMED_CHECKS,
    TIMINGS,
)
from kerneltrial.rundir.model_summary_doc import ModelSummary
from kerneltrial.rundir.serving_summary_doc import ServingSummary
from kerneltrial.rundir.summary_doc import Summary
from kerneltrial.serving.script_csv import RESULTS_DIR as SCRIPT_DIR

HEADER = (
    "# Run directory reference\n\n"
    "Generated from rundir/layout.py, model/layout.py and the document models (rundir/documents.py,\n"
    "rundir/summary_doc.py, rundir/model_summary_doc.py, rundir/serving_summary_doc.py) by\n"
    "`python -m kerneltrial.rundir_reference > docs/RUNDIR.md`; do not edit by hand\n"
    "(tests/test_rundir_reference.py checks it). Every run directory holds `provenance.json` with a\n"
    "`kind` (`kernel`, `serving` or `model`); replicate, suite and fleet directories hold kernel run\n"
    "directories and a record of their own, and `kerneltrial verify DIR` picks the verifier by\n"
    "rundir.layout.kind_of. Rows are appended and flushed as they are measured, so a killed run keeps\n"
    "what it measured and can be resumed; a finished run directory is never overwritten. What the files\n"
    "must say of each other, and how every figure follows from the raw rows: docs/VERIFY.md.\n"
)


@dataclass(frozen=True)
class RunFile:
    """One file (or a set written together) of a run directory: its names, when it is written, what it
    holds, and the model whose keys it holds, if it is a typed JSON document."""

    names: tuple[str, ...]
    written: str
    content: str
    model: type[BaseModel] | None = None


KERNEL_FILES = (
    RunFile(
        (PROTOCOL,),
        "at start",
        (
            "byte-exact copy of the protocol; `protocol_sha256` (sha256 of these bytes) appears in "
            "provenance.json, plan.json and summary.json"
        ),
    ),
    RunFile(
        (PROVENANCE,),
        "at start, updated at end",
        (
            "who, where and what ran: versions, device, git, argv, times, the freeze record, user modules' "
            "hashes, the inputs seed, isolation and the lead check's counts (keys below)"
        ),
        Provenance,
    ),
    RunFile(
        (PLAN,),
        "at start (case `rounds` updated as rounds are added)",
        (
            "everything verify needs besides the raw rows: arms, cases, seeds, rounds, the gate and every "
            "preregistered rule (keys below). Runs from issue 27 on also hold `floor`: {`launch`: "
            "`triton_launch`, `rate`: `copy`} (the speed-of-light model, named by the ceilings.csv kinds it "
            "reads; rundir.layout.FLOOR_MODEL), which the Plan model below does not declare yet"
        ),
        Plan,
    ),
    RunFile(
        (CORRECTNESS,),
        "appended per check",
        (
            "{`case`, `seed`, `arm`, `passed`, `max_abs`, `max_rel`, `ulp`, `message`}; in runs with inputs "
            "seeds also `inputs_seed` and `drawn` ({`offsets` (bytes per input tensor), `scalars`, "
            "`nonfinite` (NaN/Inf input elements), `absmax` (largest finite input), `other_offset` (the "
            "repeated call's offset), `extra` (the extra shapes checked)}: `make_inputs(case, seed)` under "
            "`inputs_seed` rebuilds the values); in runs with timed checks also `ulp_hist`: [n0, n1, n2, n4, "
            "n16, nmore], the numbers of output elements whose distance from the official formula is 0, (0, "
            "1], (1, 2], (2, 4], (4, 16] and > 16 ulps of the output dtype (integer outputs: 0 or nmore)"
        ),
    ),
    RunFile(
        (CEILINGS,),
        "appended per sample",
        (
            "`kind,sample,bytes,ns` with kind `copy` (device-to-device copy, bytes = read + written), `read` "
            "(read-only stream) or, in runs with timed checks, `launch` (bytes 0; ns = one call of an empty "
            "kernel, an in-place add of 0 to a 1-element tensor, timed like a 1-call sample); from issue 16 "
            "on also `triton_launch` (bytes 0; ns = one launch of a one-element Triton kernel, "
            "trial/floor.py, timed the same way: the least an entry point's Triton launch costs). Readers "
            "treat `triton_launch` as optional: earlier runs lack it; likewise `copy_matched` (bytes = a "
            "case's traffic rounded down to even; ns = one device-to-device copy of bytes/2, so `bytes` of "
            "traffic, timed one call at a time like the other ceilings: comparable with cases only under a "
            "cold L2, which is the only place PERFORMANCE.md uses it; one set per distinct case traffic, "
            "numbered 0..n-1 like the copy's samples)"
        ),
    ),
    RunFile(
        (TIMINGS,),
        "appended per sample",
        (
            "`case,seed,round,position,arm,calls,ns[,sm_mhz,mem_mhz[,wall_ns[,peak_bytes]]]`: `ns` is the total for "
            "`calls` back-to-back calls; one row per (case, seed, round, arm); the optional `sm_mhz`, `mem_mhz` are "
            "the SM and memory clocks (integer MHz, read through NVML right after the sample), empty when unknown (CPU "
            "runs); `wall_ns` (`checks` 3): for an isolated arm, whose worker measured `ns`, the harness's wall clock "
            "from sending the sample's request to reading its answer (the bound on `ns`), empty for an arm in "
            "kerneltrial's process; `peak_bytes` (plan `peak_memory`): trial/memory.py, empty where unmeasured"
        ),
    ),
    RunFile(
        (TIMED_CHECKS,),
        "appended per timing sample (runs with timed checks)",
        (
            "{`case`, `seed`, `round`, `arm`, `values_seed` (the seed of the fresh input values of the unit, "
            "the same for every arm of a (case, seed, round)), `passed`, `max_abs`, `max_rel`, `ulp`, "
            "`message`, `checked_call` (`checks` 2: the call of the sample whose output was checked, "
            "0..calls-1; it ran on value set `checked_call` of the unit)}: the check of one call's output "
            "(`checks` 1: the sample's last call, which ran on the unit's fresh values). A failed check's "
            "message starts with `wrong result while timed: `, `modified its inputs while timed: `, `wrote "
            "outside its output: `, `returns a persistent buffer: ` or `raised while timed: `"
        ),
    ),
    RunFile(
        (HOST,),
        "appended per sample, after the timing rounds (runs with plan.json `host`)",
        (
            "`case,arm,sample,calls,ns,behind`: the host cost stage. For every (case, arm) that passed "
            "correctness and did not raise while timed, `host.samples` samples 0..n-1; each is `calls` (= "
            "plan `host.calls`) back-to-back calls of the arm on one set of inputs (the first seed's, after "
            "`warmup` untimed calls; each call bumps the inputs' version counters first, as a timed call "
            "does, so a cache keyed on them cannot skip work): the device is synchronised, the host clock "
            "read (t0), the calls issued with nothing synchronised, the clock read again (t1); `ns` = t1 - "
            "t0, so `ns / calls` is how long the caller is blocked per call. `behind` (0/1): a CUDA event "
            "recorded right after t1 had not completed when queried right after it, i.e. at t1 the device was"
            " still running the sample's calls: they were issued faster than the device ran them "
            "(device-bound), and `ns` is the issue cost only while the launch queue had room, at most the "
            "device's time once it filled. Without a GPU (Triton interpreter; every call runs to completion) "
            "`behind` is 0 and `calls` is at most 2: NOT GPU performance. The backend of the run does not "
            "apply: calls are eager"
        ),
    ),
    RunFile(
        (ROUNDTRIP,),
        "appended per round that timed an isolated arm (runs with plan.json `roundtrip`)",
        (
            "`" + ",".join(ROUNDTRIP_COLUMNS) + "`: the round trip of issue 35 item 2 (host clock only). "
            "Before the arms of a (case, seed, round) and only where one of them is isolated, "
            "kerneltrial's own torch formula (plan `roundtrip`, e.g. `torch_eager`) in a trusted isolated "
            "worker of its own is timed twice on the same unit and `calls`: `ns` its own claim, `wall_ns` the "
            "harness's wall clock around the request, as for an isolated arm's timings row. The summary "
            "takes each case's median `wall_ns - ns` plus 3 median absolute deviations as the round trip "
            f"under every isolated arm's floor ((1 - tie_band - {WALL_SLACK}) * wall_ns - round trip, per sample); an "
            "arm whose median claim per call is below its median floor, with 2 of its samples below "
            "theirs, is implausible. A header only on a GPU "
            "or without isolated arms"
        ),
    ),
    RunFile(
        (SUMMARY,),
        "at end",
        (
            "every figure the report shows, computed only from the files above (keys below; the rules in "
            'docs/VERIFY.md, "Statistics"). With `checks` 3 the warning `case C: isolated arm A claims X us '
            "per call, Rx inside the harness's wall bound of Y us: the figure rests on the arm's own clock` "
            "where ratio > far_inside; isolated arms have no host.csv rows"
        ),
        Summary,
    ),
    RunFile(
        (SOURCE_ARCHIVE,),
        "at start (runs with timed checks)",
        (
            "the kerneltrial package's .py files that ran, members `kerneltrial/<relpath>`, sorted, mtime 0. "
            "provenance `git.source_sha256` is their digest: sha256 over relpath (posix, without "
            "`kerneltrial/`, utf-8) + NUL + bytes + NUL, paths in pathlib's order (component by component)"
        ),
    ),
    RunFile(
        (MANIFEST,),
        "last, at the end (runs with timed checks)",
        (
            "{`schema`: `kerneltrial.manifest/1`, `files`: {relative path: sha256}} over every file of the "
            "run directory (recursively) but itself"
        ),
    ),
    RunFile(
        (REPORT, *REPORT_FIGURES),
        "by `kerneltrial report`, after verify passed (or titled UNVERIFIED with `--unverified`)",
        (
            "drawn from summary.json. report.md is a derived file: a function of the run directory (ERRATA.md"
            " included), which verify renders again and compares byte for byte (`report.md` check; a page "
            "titled UNVERIFIED is accepted too); so are the PNGs (`figures added` check: their decoded pixels, "
            "size and mode; drawn by another matplotlib than the installed one and different, a warning naming "
            "both versions, never a pass; `report` and `plot` replace one that fails)"
        ),
    ),
    RunFile(
        (SIZE_PNG,),
        "by `kerneltrial plot` (its default --out), after verify passed (or with `--unverified`)",
        "each timed arm's time and rate against bytes per call, drawn from summary.json; drawn again and "
        "compared like the report's PNGs",
    ),
    RunFile(
        (ERRATA,),
        "optional, by hand after the run",
        (
            "corrections to a finished run (the raw files are never edited); report.md and PERFORMANCE.md "
            'quote it (`> ` lines) under "Errata (written by hand after the run; `kerneltrial verify` does '
            'not check this text)" right after the timing line, so that no line of it reads as a figure, and '
            'mark the run "(errata)" in the overview. It is neither derived nor in the manifest (written '
            "after the manifest, whose own hash receipts and confirmation links pin); verify's `ERRATA.md` "
            "check reads only the lines tools read: at most one `Superseded by:` naming another run directory"
            " by name, `Reason:` only beside it. A line `Superseded by: RUN` (with an optional `Reason: ...` "
            'line) retires the run: PERFORMANCE.md lists it under "Earlier runs" with its successor and '
            "reason, and refuses to render when the successor is not among the runs given. A committed run "
            "that is superseded moves to results/archive/ (same relative path): CI still verifies it, "
            "PERFORMANCE.md does not read it"
        ),
    ),
)

SERVING_FILES = (
    RunFile(
        (PROTOCOL,),
        "at start",
        (
            "byte copy of the protocol (`serve bench` writes the one it built from its options); its sha256 "
            "is `protocol_sha256` in provenance, plan, summary"
        ),
    ),
    RunFile(
        (PROVENANCE,),
        "at start, updated at end",
        (
            "kind, protocol_sha256, argv, hostname, python, git commit/dirty, GPU (nvidia-smi or null), "
            "devices (every vendor tool's answer), scope (official or proxy, hardware, reasons), client "
            "`vllm` path and versions, server versions (vllm, torch, triton, transformers, flag_gems, vLLM "
            "plugin entry points) per arm, operator environment (VLLM_*, USE_FLAGGEMS, FlagGems, ...), status"
            " (`running`/`finished`/`failed`/`interrupted`), error, started/finished, stopped_in (launch, "
            "arm; not when finished), timings"
        ),
    ),
    RunFile(
        (PLAN,),
        "at start",
        (
            "arms (argv, expanded argv, env), cases, rounds, repeats, seeding mode and bench seeds (run k's "
            "`--seed`), launch order, percentiles, model id, nonce (on or off), ledger (the served ledger, with the nonce), model_layers (config.json's "
            "`num_hidden_layers`, null when unknown), client (`completions`, `official` or `flagos-chat`), goodput SLOs, "
            "fl_platform, each arm's selection_files, pins and override_pins, imported_files (where each "
            "process's imports record lies: this runner records it), tokenizer, accuracy spec, "
            "acceptance rule, effective (the model path as resolved and the client: what verify derives the "
            "plan from beside protocol.toml)"
        ),
    ),
    RunFile(
        (LAUNCHES,),
        "one row per launch, appended",
        (
            "status (`ok`, `error`, `refused`: never spawned, `interrupted`), spawned, argv (with the nonce),"
            " nonce, answer_checks (before: readiness, each run, after the last run; probes; listeners), env set, "
            "operator env, pid/pgid, ready_s, stop_s, wall_s, signals sent, exit code, group_gone, served_lines "
            "(the ledger's lines kerneltrial read), status, error, log path; `dispatch` (launched servers): dir, valid, "
            "reason, intended (op -> implementation), processes, counts (op, impl, calls, errors), files "
            "(record name -> sha256)"
        ),
    ),
    RunFile(
        (f"{LAUNCH_DIR}/NN-ARM/server.log",),
        "during launch",
        "server stdout+stderr",
    ),
    RunFile(
        (f"{LAUNCH_DIR}/NN-ARM/served.jsonl",),
        "during launch (plan `ledger`)",
        (
            "the served ledger: one line per HTTP request the server answered, written by kerneltrial's "
            "middleware inside it (plugins/ledger.py) into a socket only kerneltrial reads: {`path`, `status`, "
            "`t0`, `t1`} (the server's monotonic clock at the request's start and end)"
        ),
    ),
    RunFile(
        (f"{LAUNCH_DIR}/NN-ARM/{DISPATCH_DIR}/dispatch-PID.json",),
        "by each server process",
        (
            "the plugins' call records (docs/serving.md, \"Kernels inside the served model: plugins and proof "
            'of dispatch")'
        ),
    ),
    RunFile(
        (f"{LAUNCH_DIR}/NN-ARM/{DISPATCH_DIR}/imports-PID.json",),
        "by each server process",
        (
            "the files the process imported from vLLM, FlagGems and vllm-plugin-FL, with their hashes and "
            "RECORD's (plugins/imports.py); launches.jsonl `pins.imported` checks them (serving/dist_imports.py)"
        ),
    ),
    RunFile(
        (f"{RAW_DIR}/NN-ARM/CASE/runK.json", f"{RAW_DIR}/NN-ARM/CASE/runK.log"),
        "per run",
        (
            "the `vllm bench serve --save-detailed` JSON (per-request `input_lens`, `output_lens`, `ttfts`, "
            "`itls`, `latencies`, `start_times`, `errors`, `generated_texts`) and the client's log"
        ),
    ),
    RunFile(
        (RUNS,),
        "per run, appended",
        (
            "launch, arm, case, run, seeding, seed, client_argv (the full `vllm bench serve` command), "
            "num_requests, status (`ok`/`FAILED`) and reason, raw path + sha256, window (the monotonic clock "
            "before the client started and after it ended) and served (completions the server's ledger holds "
            "inside it; plan `ledger`), every figure below"
        ),
    ),
    RunFile(
        (f"{SCRIPT_DIR}/NN-ARM/raw_runs_TIMESTAMP.csv", f"{SCRIPT_DIR}/NN-ARM/summary_TIMESTAMP.csv"),
        "per run, appended; the summary at the launch's end",
        (
            "the organisers' script's CSVs (benchmark_throughput_serve.py), one pair per launch in its "
            "columns and timestamp format: a row per run with its Run Status (SUCCESS when the run is `ok`), "
            "and per case the mean of the runs after the first, a case with a failed counted run left out "
            "(serving/script_csv.py)"
        ),
    ),
    RunFile(
        (REQUESTS,),
        "per run, appended",
        (
            "launch, arm, case, run, request, success, input_len, output_len, ttft_s, e2el_s, tpot_s, n_itl, "
            "itl_mean_s, start_time, error"
        ),
    ),
    RunFile(
        (f"{ACCURACY_DIR}/ARM/records.jsonl", f"{ACCURACY_DIR}/ARM/accuracy.json"),
        "records: a line per sample (k per problem) as it is graded; accuracy.json: at the accuracy run's end",
        "records per sample: the problem, `sample` (k > 1), prompt, response, extracted, correct, error; "
        "accuracy.json: the gate's figures, grader and `cross_grade` (evalscope's math_500 on the same samples: "
        'agreement, disagreements, or "cross-grade not run: REASON"); docs/serving.md, "Accuracy (MATH-500)"',
    ),
    RunFile(
        ("selection/ARM/VAR",),
        "at start",
        "copies of the files an arm's VLLM_FL_CONFIG / VLLM_FL_OP_CONFIG name (hashed in plan.json)",
    ),
    RunFile(
        (SUMMARY,),
        "at end (not when interrupted)",
        (
            "`kerneltrial.serving-summary/1` (none before it): per arm and case status, per-launch warm-up means "
            "and means over launches; accuracy per arm (with accuracy.json's cross_grade); `dispatch` per arm; "
            "acceptance (with `dispatch_ok`); scope; failures; status (keys below)"
        ),
        ServingSummary,
    ),
)


def _columns(columns: list[str]) -> str:
    return "columns `" + ",".join(columns) + "`"


MODEL_FILES = (
    RunFile((PROTOCOL,), "at start", 'byte copy of the model protocol (docs/PROTOCOL_KEYS.md, "Model protocol")'),
    RunFile((PROVENANCE,), "at start, updated at end", "as a kernel run's, with `kind` `model`"),
    RunFile(
        (PLAN,),
        "at start",
        (
            "the model config, the modules the patcher routed, each arm's implementation per operator and whether"
            " it passed the gate, every (case, mode) with its tokens per call and the bytes its weight-read floor"
            " counts, rounds, warm-up rounds, seed, tie band, confidence, the rules"
        ),
    ),
    RunFile(
        (CORRECTNESS,),
        "during the run",
        (
            "one row per available arm: routed calls per forward against those the config needs; teacher-forced"
            " distance to the float32 model and its limit, top-1 agreement and its limit, the arm's top-1 tokens,"
            " the distance to eager"
        ),
    ),
    RunFile(
        (model_layout.COPIES,),
        "during the run (schema 3)",
        "the run's copy rate: " + _columns(model_layout.COPY_COLUMNS),
    ),
    RunFile(
        (model_layout.INPUTS,),
        "during the run (schema 3)",
        "every call's fresh inputs (position -1 for prefill): " + _columns(model_layout.INPUT_COLUMNS),
    ),
    RunFile(
        (model_layout.CAPTURES,),
        "during the run (schema 3)",
        "each (case, arm)'s capture: its call counts or the named reason it failed",
    ),
    RunFile(
        (TIMINGS,),
        "appended per sample",
        "host clock between two device synchronisations (start_ns: since the first sample): "
        + _columns(model_layout.TIMING_COLUMNS),
    ),
    RunFile((model_layout.TIMED_CHECKS,), "during the run (schema 3)", "one checked call per round and arm"),
    RunFile(
        (ATTRIBUTION,),
        "during the run",
        "per routed operator, `total` device kernel time and `wall` of one profiled call: "
        + _columns(model_layout.ATTRIBUTION_COLUMNS),
    ),
    RunFile(
        (model_layout.KERNELS,),
        "during the run (GPU)",
        "the kernels each routed region launched in the profiled call: " + _columns(model_layout.KERNEL_COLUMNS),
    ),
    RunFile((f"{model_layout.PROFILES}/",), "during the run", "the profiler's table of each attributed call"),
    RunFile(
        (SUMMARY,),
        "at end",
        (
            "`kerneltrial.model-summary/3`: medians, tokens/s, paired speedups against eager, torch_eager and"
            " kerneltrial with a Student-t interval and the inconclusive rule, share, device busy, the floor and"
            " each arm's multiple of it, the arms each case excluded and why (docs/MODEL.md; keys below,"
            " `/1` and `/2` still read)"
        ),
        ModelSummary,
    ),
    RunFile((MANIFEST,), "last", "relative path -> sha256 of every other file"),
)

COMBINED_FILES = (
    RunFile(
        ("run-1..N/", REPLICATES, REPLICATES_MD),
        "by `kerneltrial replicate`",
        (
            "a replicate directory: N kernel run directories of one protocol and the cross-run table"
            ' (`kerneltrial.replicates/2`; docs/WORKFLOW.md, "From exploration to a confirmed dispatcher")'
        ),
    ),
    RunFile(
        ("<protocol stem>/", SUITE, REPORT),
        "by `kerneltrial suite`",
        'a suite directory: one kernel run directory per protocol and `kerneltrial.suite/1` (docs/WORKFLOW.md, "Suites")',
    ),
    RunFile(
        (
            FLEET,
            f"{FLEET_PIECES}/<unit>.toml",
            f"{FLEET_WORKERS}/<unit>/",
            f"{FLEET_LOGS}/<unit>.log",
            "abandoned/",
            REPORT,
        ),
        "by `kerneltrial run --ray`",
        (
            "a fleet directory: each work unit's protocol piece, kernel run directory and log, runs set aside,"
            ' and `kerneltrial.fleet/1` with the combined figures (docs/WORKFLOW.md, "Fleets")'
        ),
    ),
)

KINDS = (
    ("Kernel run directory", "`kerneltrial run`, `calibrate`, `demo`; provenance `kind` `kernel`.", KERNEL_FILES),
    (
        "Serving run directory",
        "`kerneltrial serve trial` and `serve bench`; provenance `kind` `serving` (docs/serving.md).",
        SERVING_FILES,
    ),
    ("Model run directory", "`kerneltrial model`; provenance `kind` `model` (docs/MODEL.md).", MODEL_FILES),
    (
        "Directories of kernel runs",
        "Replicates, suites and fleets: kernel run directories and a record.",
        COMBINED_FILES,
    ),
)


def _type(annotation: Any) -> str:
    """A field's type in JSON words: string, integer, number, boolean, object, list of ..., or null."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        kinds = [_type(a) for a in args if a is not type(None)]
        return " or ".join(kinds + (["null"] if type(None) in args else []))
    if origin in (list, tuple):
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"object of {_type(args[1])} by name"
    if nested_model(annotation):
        return "object"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _models(annotation: Any) -> list[type[BaseModel]]:
    """Every model a field may hold (`dict[str, A | B]` holds two), in order."""
    if nested_model(annotation) is annotation:
        return [annotation]
    return [m for a in get_args(annotation) for m in _models(a)]


def _absent(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    return f"`{json.dumps(info.get_default(call_default_factory=True))}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def keys(model: type[BaseModel], path: str, depth: int = 3) -> str:
    """Markdown: the keys of `model`, the object at `path` (key, type, value when absent, description),
    then a section per nested object. ValueError naming the keys without a description."""
    if missing := undocumented(model):
        raise ValueError(f"{path}: keys without a description: {', '.join(missing)}; add Field(description=...)")
    lines = [f"{'#' * depth} `{path}` ({model.__name__})", "", "| key | type | if absent | description |"]
    lines.append("|---|---|---|---|")
    sections: list[str] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        lines.append(f"| `{key}` | {_type(info.annotation)} | {_absent(info)} | {_cell(info.description or '')} |")
        subs = _models(info.annotation)
        for sub in subs:
            where = f"{path}: {key}" if depth == 3 else f"{path}.{key}"
            sections.append(keys(sub, where, depth + 1))
    return "\n".join([*lines, "", *sections]).rstrip("\n") + "\n"


def _files(files: tuple[RunFile, ...]) -> str:
    lines = ["| file | written | content |", "|---|---|---|"]
    for f in files:
        names = ", ".join(f"`{n}`" for n in f.names)
        lines.append(f"| {names} | {f.written} | {_cell(f.content)} |")
    return "\n".join(lines) + "\n"


def reference() -> str:
    """The whole reference: each kind's files, then the keys of every typed document."""
    parts = [HEADER]
    for title, intro, files in KINDS:
        parts.append(f"## {title}\n\n{intro}\n\n{_files(files)}")
        for f in files:
            if f.model is not None:
                parts.append(keys(f.model, f.names[0]))
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
