"""The serving runner: launches (interleaved, seeded), throughput runs, accuracy, summary.

Run directory (see docs/serving.md):
    protocol.toml      byte copy of the protocol; sha256 in provenance/plan/summary
    provenance.json    kind "serving", versions, GPU, argv, client, timings, status
    plan.json          arms, cases, launch order, seeds, warm-up rule
    launches.jsonl     one row per launch (command, env, timings, exit, dispatch verdict), appended
    launches/NN-ARM/server.log
    launches/NN-ARM/dispatch/dispatch-PID.json   the plugins' call records (proof of dispatch)
    raw/NN-ARM/CASE/runK.json + runK.log   the `vllm bench serve --save-detailed` result
    runs.jsonl         one row per run (status, raw file + sha256, figures), appended
    requests.csv       one row per request of every run, appended
    accuracy/ARM/records.jsonl + accuracy.json
    summary.json       derived from the files above (recomputed by verify.py)
"""

from __future__ import annotations

import os
import platform
import random
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kerneltrial.plugins import LOG_ENV
from kerneltrial.rundir import layout
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import append_jsonl, csv_appender, now, write_json
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.rundir.provenance import git_state, nvidia_smi
from kerneltrial.serving import metrics
from kerneltrial.serving.acceptance import (
    METHOD,
    LaunchFigure,
    Rule,
    accuracy_check,
    case_record,
    compare_case,
    dispatch_check,
    judge,
)
from kerneltrial.serving.accuracy import run_accuracy
from kerneltrial.serving.bench import (
    BenchError,
    bench_argv,
    case_dict,
    request_rows,
    run_bench,
)
from kerneltrial.serving.dispatch_proof import Served, check_launch
from kerneltrial.serving.launcher import (
    LaunchError,
    Server,
    ServerSpec,
    operator_env,
    probe_versions,
)
from kerneltrial.serving.preflight import check_inputs
from kerneltrial.serving.protocol import Arm, Protocol
from kerneltrial.serving.vllm_platform import interpreter_of

Event = Callable[..., None]
# vLLM keys its compiled-model cache on model and config, not on plugins: without this an E1
# launch can load the graph E0 saved and serve it without our ops (docs/serving.md).
COMPILE_CACHE_ENV = "VLLM_DISABLE_COMPILE_CACHE"
GPU_FIELDS = ("name", "driver_version", "memory.total", "clocks.max.sm", "clocks.sm", "power.limit", "pci.bus_id")
REQUEST_FIELDS = [
    "launch",
    "arm",
    "case",
    "run",
    "request",
    "success",
    "input_len",
    "output_len",
    "ttft_s",
    "e2el_s",
    "tpot_s",
    "n_itl",
    "itl_mean_s",
    "start_time",
    "error",
]


def williams_rows(k: int) -> list[list[int]]:
    """The k rows of a Williams square: row r is (0, 1, k-1, 2, k-2, ...) + r mod k. Every index
    is at every position once; for even k each index follows every other once (carry-over
    balance); for odd k the rows with their reverses (the second half of each block) balance it."""
    first = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    return [[(i + r) % k for i in first] for r in range(k)]


def launch_order(arms: list[Arm], rounds: int, seed: int) -> list[tuple[int, int, str]]:
    """(round, position, arm name): every round launches every arm once, in counterbalanced
    reversed-pair blocks. Block b is rounds 2b and 2b+1: row b mod k of a Williams square, then
    the same row reversed (two arms: A B B A, then B A A B). The arms' labels are shuffled once
    by the seed, so the order is a pure function of (arm names, rounds, seed). Over a complete
    design (k blocks, 2k rounds) every arm is at every position equally often; within a block
    every arm's mean position is the same, so a linear drift cancels from each arm's mean."""
    names = [a.name for a in arms]
    random.Random(seed).shuffle(names)
    rows = williams_rows(len(names))
    order = []
    for r in range(rounds):
        block, second = divmod(r, 2)
        row = [names[i] for i in rows[block % len(names)]]
        order += [(r, pos, n) for pos, n in enumerate(row[::-1] if second else row)]
    return order


def block_of(round_: int) -> int:
    """The counterbalanced block (launch_order) a round belongs to."""
    return round_ // 2


@dataclass(frozen=True)
class PlannedLaunch:
    """One launch of launch_order: plan.json lists them, each launches.jsonl row begins with one,
    and verify recomputes them from protocol.toml."""

    launch: int
    round: int
    block: int
    position: int
    arm: str


def planned_launches(arms: list[Arm], rounds: int, seed: int) -> list[PlannedLaunch]:
    """launch_order numbered, each round with its block."""
    return [PlannedLaunch(i, r, block_of(r), p, n) for i, (r, p, n) in enumerate(launch_order(arms, rounds, seed))]


@dataclass(frozen=True)
class LaunchProof:
    """One launch's dispatch verdict, as launches.jsonl stores it under `dispatch`."""

    launch: int
    arm: str
    dir: str  # the records' folder, relative to the run directory
    valid: bool
    reason: str
    intended: dict[str, str]  # dispatch op -> implementation the arm selects (empty: baseline)
    processes: int  # server processes that left a record
    counts: tuple[Served, ...]  # calls per kernel-level op and implementation, over the processes
    files: dict[str, str]  # record file name -> sha256


def dispatch_dir(out: Path, tag: str) -> Path:
    return out / layout.LAUNCH_DIR / tag / layout.DISPATCH_DIR


def server_env(arm: Arm, records: Path) -> dict[str, str]:
    """The arm's environment plus where the plugins write their call records, and no compile
    cache unless the arm sets it (see COMPILE_CACHE_ENV)."""
    return {COMPILE_CACHE_ENV: "1", **arm.env, LOG_ENV: str(records.resolve())}


def prove_launch(out: Path, launch: int, tag: str, arm: Arm) -> LaunchProof:
    """The verdict on a stopped launch's call records (every process has written its last)."""
    records = dispatch_dir(out, tag)
    v = check_launch(records, arm.env)
    files = {p.name: sha256_file(p) for p in sorted(records.glob("dispatch-*.json"))}
    rel = str(records.relative_to(out))
    return LaunchProof(launch, arm.name, rel, v.valid, v.reason, v.intended, v.processes, v.served, files)


def dispatch_summary(proto: Protocol, proofs: list[LaunchProof]) -> dict[str, dict[str, Any]]:
    """Per arm: valid only if every launch of it was (None for an external server: no records)."""
    out: dict[str, dict[str, Any]] = {}
    for arm in proto.arms:
        mine = [p for p in proofs if p.arm == arm.name]
        totals: dict[tuple[str, str], list[int]] = {}
        for p in mine:
            for c in p.counts:
                t = totals.setdefault((c.op, c.impl), [0, 0])
                t[0] += c.calls
                t[1] += c.errors
        bad = [p for p in mine if not p.valid]
        valid: bool | None
        if arm.external:
            valid, reason = None, "external server: not launched by the trial, no dispatch records"
        elif not mine:
            valid, reason = False, "not launched"
        elif bad:
            valid, reason = False, f"launch {bad[0].launch}: {bad[0].reason}"
        else:
            valid, reason = True, f"all {len(mine)} launch(es) valid"
        out[arm.name] = {
            "valid": valid,
            "reason": reason,
            "launches": [p.launch for p in mine],
            "counts": [asdict(Served(op, impl, n, e)) for (op, impl), (n, e) in sorted(totals.items())],
        }
    return out


def prepare_dir(out: Path, protocol_bytes: bytes) -> str:
    if out.exists() and any(out.iterdir()):
        raise RunDirError(
            f"run directory {out} already holds files; a run directory is never overwritten, pick a new --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / layout.PROTOCOL).write_bytes(protocol_bytes)
    return sha256_bytes(protocol_bytes)


def summarise(
    proto: Protocol,
    runs: list[dict[str, Any]],
    acc: dict[str, dict[str, Any]],
    sha: str,
    failures: list[str],
    proofs: list[LaunchProof],
) -> dict[str, Any]:
    """Every figure of the report, from the run rows, accuracy summaries and dispatch verdicts."""
    results: dict[str, dict[str, Any]] = {}
    for arm in proto.arms:
        results[arm.name] = {}
        for case in proto.bench.cases:
            rows = [r for r in runs if r["arm"] == arm.name and r["case"] == case.id]
            failed = [r for r in rows if r["status"] != "ok"]
            launches = sorted({r["launch"] for r in rows})
            entry: dict[str, Any] = {"runs": len(rows), "failed_runs": len(failed), "launches": []}
            complete = (
                all(len([r for r in rows if r["launch"] == L]) == proto.repeats for L in launches)
                and len(launches) == proto.rounds
            )
            if failed or not rows or not complete:
                entry["status"] = "FAILED" if failed else "INCOMPLETE"
                results[arm.name][case.id] = entry
                continue
            per_launch = []
            for L in launches:
                lrows = sorted((r for r in rows if r["launch"] == L), key=lambda r: r["run"])
                s = metrics.summarise_case(lrows, drop_first=1)
                per_launch.append({"launch": L, "kept_runs": [r["run"] for r in lrows[1:]], **s})
            entry["launches"] = per_launch
            entry["status"] = "ok"
            for k in metrics.SUMMARY_KEYS:
                if all(k in g for g in per_launch):
                    entry[k] = metrics.pooled_mean(per_launch, k)
            results[arm.name][case.id] = entry
    dispatch = dispatch_summary(proto, proofs)
    summary: dict[str, Any] = {
        "kind": "serving",
        "protocol_sha256": sha,
        "warmup": {
            "drop_first": 1,
            "rule": "per launch and case: drop run 0, mean of the rest; then mean over launches",
        },
        "arms": [a.name for a in proto.arms],
        "cases": [case_dict(c) for c in proto.bench.cases],
        "results": results,
        "accuracy": acc,
        "dispatch": dispatch,
        "acceptance": acceptance(proto, results, acc, dispatch),
        "failures": failures,
    }
    ok = not failures and all(e["status"] == "ok" for a in results.values() for e in a.values())
    summary["status"] = "ok" if ok else "failed"
    return summary


def acceptance_rule(proto: Protocol) -> Rule:
    a = proto.acceptance
    return Rule(a.noise_band, a.ttft_ratio_max, a.confidence)


def launch_figures(entry: Mapping[str, Any], rounds: Mapping[int, int]) -> list[LaunchFigure] | None:
    """The per-launch figures of a summarised (arm, case), each with its round; None unless ok."""
    if entry["status"] != "ok":
        return None
    return [
        LaunchFigure(rounds[g["launch"]], g["total_token_throughput"], g["mean_ttft_ms"]) for g in entry["launches"]
    ]


def acceptance(
    proto: Protocol,
    results: dict[str, Any],
    acc: dict[str, dict[str, Any]],
    dispatch: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any] | None:
    """The candidate against the baseline by serving/acceptance.py's rule, as summary.json stores it."""
    base, cand = proto.arm("baseline"), proto.arm("candidate")
    if base is None or cand is None:
        return None
    rule = acceptance_rule(proto)
    rounds = {x.launch: x.round for x in planned_launches(proto.arms, proto.rounds, proto.seed)}
    cases = [
        compare_case(
            case.id,
            launch_figures(results[cand.name][case.id], rounds),
            launch_figures(results[base.name][case.id], rounds),
            rule,
        )
        for case in proto.bench.cases
    ]
    checks = []
    accuracy_ok: bool | None = None
    if proto.accuracy is not None:
        a = acc.get(cand.name)
        accuracy_ok = bool(a and a.get("passed"))
        checks.append(
            accuracy_check(a["accuracy"] if a else None, a["errors"] if a else 0, accuracy_ok, proto.accuracy.gate)
        )
    # an arm that did not demonstrably run its operators is not the arm it claims to be: a
    # candidate whose kernel served no call, or a baseline that ran ours, compares nothing
    proofs = [
        dispatch_check(role, a.name, dispatch[a.name]["valid"], dispatch[a.name]["reason"])
        for role, a in (("baseline", base), ("candidate", cand))
    ]
    v = judge(cand.name, base.name, cases, [*checks, *proofs], rule)
    return {
        "baseline": base.name,
        "candidate": cand.name,
        "noise_band": rule.noise_band,
        "ttft_ratio_max": rule.ttft_ratio_max,
        "confidence": rule.confidence,
        "method": METHOD,
        "cases": {c.case: case_record(c) for c in v.cases},
        "reasons": list(v.reasons),
        "accuracy_ok": accuracy_ok,
        "dispatch_ok": all(p.passed for p in proofs),
        "verdict": v.verdict,
        "accepted": v.accepted,
    }


def run_protocol(
    proto: Protocol,
    protocol_bytes: bytes,
    out: Path,
    vllm: str,
    argv: list[str] | None = None,
    event: Event | None = None,
) -> dict[str, Any]:
    """Run every launch of the protocol into `out`; return summary.json's content.

    Raises PreflightError before writing anything; LaunchError / BenchError (after writing what
    was measured) or KeyboardInterrupt. provenance.json says "running" until the end, then
    "finished", "failed" (with the error) or "interrupted", with the time and the launch it
    stopped in: a directory still "running" is a run that was killed (verify refuses it).
    """
    emit: Event = event or (lambda *a, **k: None)
    check_inputs(proto, vllm)  # bad input is exit 2 before anything is written or launched
    sha = prepare_dir(out, protocol_bytes)
    order = planned_launches(proto.arms, proto.rounds, proto.seed)
    arms = {a.name: a for a in proto.arms}
    plan = {
        "protocol_sha256": sha,
        "arms": [a.model_dump() | {"argv_expanded": proto.expand(a)} for a in proto.arms],
        "cases": [case_dict(c) for c in proto.bench.cases],
        "rounds": proto.rounds,
        "repeats": proto.repeats,
        "seed": proto.seed,
        "seeding": proto.bench.seeding,  # official: one prompt seed for every run of a case (docs/serving.md)
        "bench_seeds": [proto.bench.run_seed(k) for k in range(proto.repeats)],
        "launches": [asdict(x) for x in order],
        "warmup": {"drop_first": 1},
        "percentiles": list(proto.bench.percentiles),
        "model_id": proto.server.model_id,
        "tokenizer": proto.server.effective_tokenizer,
        "base_url": proto.url(),
        "accuracy": proto.accuracy.model_dump() if proto.accuracy else None,
        "acceptance": proto.acceptance.model_dump(),
        "dispatch": {"records": f"{layout.LAUNCH_DIR}/NN-ARM/{layout.DISPATCH_DIR}", "env": LOG_ENV},
    }
    write_json(out / layout.PLAN, plan)
    prov: dict[str, Any] = {
        "kind": "serving",
        "protocol_sha256": sha,
        "argv": argv if argv is not None else sys.argv,
        "started_at": now(),
        "finished_at": None,
        "status": "running",
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git": git_state(),
        "gpu": nvidia_smi(GPU_FIELDS, units=True),
        "client": {"vllm": vllm, "versions": probe_versions(interpreter_of(vllm))},
        "server_versions": {},
        "environment": operator_env(os.environ),
        "timings": {},
    }
    write_json(out / layout.PROVENANCE, prov)
    runs: list[dict[str, Any]] = []
    acc: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    proofs: list[LaunchProof] = []
    with csv_appender(out / layout.REQUESTS, REQUEST_FIELDS):
        pass  # the header, before any run: an empty table says no request was made
    (out / layout.RUNS).touch()  # likewise: a trial whose first launch failed still has its (empty) run table
    total = len(order) * len(proto.bench.cases) * proto.repeats
    emit("start", total=total)
    t_all = time.monotonic()
    summarised = True  # a failure the runner knows (a gate) still gets its summary
    try:
        for planned in order:
            launch, name = planned.launch, planned.arm
            arm = arms[name]
            prov["stopped_in"] = {"launch": launch, "arm": name}  # kept only if the run stops here
            tag = f"{launch:02d}-{name}"
            row: dict[str, Any] = asdict(planned) | {"status": "running"}
            t0 = time.monotonic()
            server: Server | None = None
            proof: LaunchProof | None = None
            try:
                if arm.external:
                    base_url = proto.url()
                    ctx: Any = _Null()
                else:
                    argv_x = proto.expand(arm)
                    if name not in prov["server_versions"]:
                        prov["server_versions"][name] = probe_versions(interpreter_of(argv_x[0]))
                    spec = ServerSpec(
                        argv_x,
                        proto.server.model_id,
                        proto.server.host,
                        proto.server.port,
                        server_env(arm, dispatch_dir(out, tag)),
                        proto.server.ready_timeout_s,
                        proto.server.stop_grace_s,
                        proto.server.port_wait_s,
                    )
                    server = Server(spec, out / layout.LAUNCH_DIR / tag / "server.log", run_dir=out)
                    base_url = spec.base_url
                    ctx = server
                    emit("launch", launch=launch, arm=name, argv=argv_x)
                with ctx:
                    if server is not None:
                        row["ready_s"] = server.timings.get("ready_s")
                    _bench_launch(proto, arm, launch, tag, base_url, vllm, server, out, runs, failures, emit)
                    if proto.accuracy is not None and name not in acc:
                        emit("accuracy", arm=name)
                        t_acc = time.monotonic()
                        res = run_accuracy(
                            base_url, proto.server.model_id, proto.accuracy, out / layout.ACCURACY_DIR / name
                        )
                        if server is not None:
                            server.check_alive("the accuracy run")
                        acc[name] = {
                            k: res[k]
                            for k in (
                                "n",
                                "correct",
                                "errors",
                                "accuracy",
                                "ci_low",
                                "ci_high",
                                "confidence",
                                "gate",
                                "required_n",
                                "n_rule",
                                "passed",
                                "truncated",
                                "grader",
                            )
                        }
                        row["accuracy_s"] = time.monotonic() - t_acc
                if server is not None:  # stopped: its processes have written their last records
                    proof = prove_launch(out, launch, tag, arm)
                row["status"] = "ok"
            except (LaunchError, BenchError) as e:
                row["status"] = "error"
                row["error"] = str(e)
                failures.append(f"launch {launch} ({name}): {e}")
                if server is not None:
                    proof = prove_launch(out, launch, tag, arm)
                    if not proof.valid:  # e.g. a plugin that failed to load stopped the server: say why
                        raise type(e)(f"{e}; dispatch proof: {proof.reason}") from e
                raise
            except KeyboardInterrupt:
                row["status"] = "interrupted"
                raise
            finally:
                row["wall_s"] = time.monotonic() - t0
                if server is not None:
                    row.update({k: v for k, v in server.record.items()})
                    row["timings"] = dict(server.timings)
                if proof is not None:
                    proofs.append(proof)
                    row["dispatch"] = asdict(proof)
                    if not proof.valid:
                        failures.append(f"launch {launch} ({name}): dispatch proof invalid: {proof.reason}")
                append_jsonl(out / layout.LAUNCHES, row)
        prov["status"] = "finished"
        del prov["stopped_in"]
    except KeyboardInterrupt:  # Ctrl-C, and SIGTERM (install_sigterm_as_interrupt)
        prov["status"] = "interrupted"
        summarised = False
        raise
    except (LaunchError, BenchError) as e:
        prov["status"] = "failed"
        prov["error"] = str(e)
        raise
    except Exception as e:  # anything else: recorded as the failure it is, never left "running"
        prov["status"] = "failed"
        prov["error"] = f"{type(e).__name__}: {e}"
        summarised = False
        raise
    finally:
        prov["finished_at"] = now()
        prov["timings"]["total_s"] = time.monotonic() - t_all
        write_json(out / layout.PROVENANCE, prov)
        if summarised:
            summary = summarise(proto, runs, acc, sha, failures, proofs)
            write_json(out / layout.SUMMARY, summary)
            emit("done", summary=summary)
    return summary


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _bench_launch(
    proto: Protocol,
    arm: Arm,
    launch: int,
    tag: str,
    base_url: str,
    vllm: str,
    server: Server | None,
    out: Path,
    runs: list[dict[str, Any]],
    failures: list[str],
    emit: Event,
) -> None:
    for case in proto.bench.cases:
        for k in range(proto.repeats):
            seed = proto.bench.run_seed(k)
            rdir = out / layout.RAW_DIR / tag / case.id
            argv = bench_argv(
                vllm,
                base_url,
                proto.server.model_id,
                proto.server.effective_tokenizer,
                case,
                rdir,
                f"run{k}.json",
                seed,
                proto.bench.percentiles,
            )
            emit("run", launch=launch, arm=arm.name, case=case.id, run=k)
            t0 = time.monotonic()
            row: dict[str, Any] = {
                "launch": launch,
                "arm": arm.name,
                "case": case.id,
                "run": k,
                "seeding": proto.bench.seeding,
                "seed": seed,
                "client_argv": argv,
                "num_requests": case.num_requests,
                "raw": str((rdir / f"run{k}.json").relative_to(out)),
            }
            try:
                raw = run_bench(argv, rdir / f"run{k}.json", rdir / f"run{k}.log", proto.bench.timeout_s, server)
            except (LaunchError, BenchError) as e:
                row.update({"status": "FAILED", "reason": str(e), "wall_s": time.monotonic() - t0})
                if (rdir / f"run{k}.json").is_file():
                    row["raw_sha256"] = sha256_file(rdir / f"run{k}.json")
                runs.append(row)
                append_jsonl(out / layout.RUNS, row)
                raise
            row["raw_sha256"] = sha256_file(rdir / f"run{k}.json")
            row["wall_s"] = time.monotonic() - t0
            m = metrics.run_metrics(raw, proto.bench.percentiles)
            if m["completed"] != case.num_requests:
                row["status"] = "FAILED"
                row["reason"] = f"completed {m['completed']} of {case.num_requests} requests"
                failures.append(f"launch {launch} {arm.name} {case.id} run {k}: {row['reason']}")
            else:
                row["status"] = "ok"
            row.update(m)
            runs.append(row)
            append_jsonl(out / layout.RUNS, row)
            with csv_appender(out / layout.REQUESTS, REQUEST_FIELDS) as append:
                for rq in request_rows(raw):
                    cells = {"launch": launch, "arm": arm.name, "case": case.id, "run": k, **rq}
                    append([cells.get(field, "") for field in REQUEST_FIELDS])
            emit("ran", row=row)
