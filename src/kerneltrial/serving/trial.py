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
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kerneltrial.plugins import LOG_ENV
from kerneltrial.rundir import layout
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import append_jsonl, csv_appender, now, write_json
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.rundir.provenance import git_state, nvidia_smi
from kerneltrial.serving import metrics
from kerneltrial.serving.accuracy import run_accuracy
from kerneltrial.serving.bench import (
    BenchError,
    bench_argv,
    case_dict,
    foreign_answers,
    request_rows,
    run_bench,
)
from kerneltrial.serving.dispatch_proof import check_launch
from kerneltrial.serving.launcher import (
    LaunchError,
    Server,
    ServerSpec,
    operator_env,
    probe_versions,
)
from kerneltrial.serving.order import planned_launches
from kerneltrial.serving.preflight import check_inputs
from kerneltrial.serving.protocol import Arm, Protocol
from kerneltrial.serving.summary import LaunchProof, summarise
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


def prepare_dir(out: Path, protocol_bytes: bytes) -> str:
    if out.exists() and any(out.iterdir()):
        raise RunDirError(
            f"run directory {out} already holds files; a run directory is never overwritten, pick a new --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / layout.PROTOCOL).write_bytes(protocol_bytes)
    return sha256_bytes(protocol_bytes)


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
        "nonce": proto.server.nonce,  # each launch's nonce is in launches.jsonl, its runs send it (issue 26)
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
                        proto.server.nonce,
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
                        model = server.served_name if server is not None else proto.server.model_id
                        res = run_accuracy(base_url, model, proto.accuracy, out / layout.ACCURACY_DIR / name)
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
                server.served_name if server is not None else None,
            )
            emit("run", launch=launch, arm=arm.name, case=case.id, run=k)
            if server is not None:
                server.confirm_answers(f"{case.id} run {k}")
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
            foreign = foreign_answers(raw) if server is not None and server.nonce else 0
            if foreign and server is not None:
                row["status"] = "FAILED"
                row["reason"] = (
                    f"{foreign} request(s) got HTTP 404 for this launch's nonce {server.nonce!r}: a server that does "
                    f"not serve it answered them, i.e. another server shares port {server.spec.port}; stop it or "
                    "pick another port"
                )
                failures.append(f"launch {launch} {arm.name} {case.id} run {k}: {row['reason']}")
            elif m["completed"] != case.num_requests:
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
            if foreign:  # not a measurement of this arm: stop the trial
                raise LaunchError(row["reason"])
            emit("ran", row=row)
