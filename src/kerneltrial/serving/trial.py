"""The serving runner: launches (interleaved, seeded), throughput runs, accuracy, summary.

Run directory (see docs/serving.md):
    protocol.toml      byte copy of the protocol; sha256 in provenance/plan/summary
    provenance.json    kind "serving", versions, GPU, argv, client, timings, status
    plan.json          arms, cases, launch order, seeds, warm-up rule
    launches.jsonl     one row per launch (command, env, timings, exit, dispatch verdict), appended
    launches/NN-ARM/server.log
    launches/NN-ARM/dispatch/dispatch-PID.json   the plugins' call records (proof of dispatch)
    launches/NN-ARM/dispatch/imports-PID.json    the files each server process imported (pins.imported)
    raw/NN-ARM/CASE/runK.json + runK.log   the `vllm bench serve --save-detailed` result
    benchmark_results/NN-ARM/raw_runs_<timestamp>.csv + summary_<timestamp>.csv   the organisers' CSVs
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerneltrial.plugins import LOG_ENV
from kerneltrial.rundir import layout
from kerneltrial.rundir.documents import write_document
from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import append_jsonl, csv_appender, now, write_json
from kerneltrial.rundir.hashing import sha256_bytes, sha256_file
from kerneltrial.rundir.provenance import git_state, nvidia_smi
from kerneltrial.rundir.serving_summary_doc import ArmAccuracy, Scope, ServingSummary
from kerneltrial.serving import metrics, script_csv
from kerneltrial.serving.accuracy import run_accuracy
from kerneltrial.serving.bench import (
    BenchError,
    Case,
    bench_argv,
    foreign_answers,
    request_rows,
    run_bench,
)
from kerneltrial.serving.completeness import failed_requests_reason, judge_requests
from kerneltrial.serving.crossgrade import GraderSource, evalscope_grader
from kerneltrial.serving.dispatch_proof import Files, check_launch
from kerneltrial.serving.dist_imports import imported_check, not_spawned
from kerneltrial.serving.dist_records import record_evidence
from kerneltrial.serving.fl_policy import FILE_ENVS, Platform
from kerneltrial.serving.launcher import (
    LaunchError,
    Server,
    ServerSpec,
    operator_env,
    probe_versions,
)
from kerneltrial.serving.order import PlannedLaunch, planned_launches
from kerneltrial.serving.pilot import PilotStop
from kerneltrial.serving.pins import devices_record, installed, pin_mismatches, scope, vendor_devices
from kerneltrial.serving.plan import plan_doc
from kerneltrial.serving.preflight import check_inputs
from kerneltrial.serving.protocol import Arm, Protocol
from kerneltrial.serving.served import served_problem
from kerneltrial.serving.summary import LaunchProof, summarise
from kerneltrial.serving.vllm_platform import interpreter_of

Event = Callable[..., None]
Stop = Callable[[list[dict[str, Any]]], str | None]  # asked after each launch: a reason ends the run
# vLLM keys its compiled-model cache on model and config, not on plugins: without this an E1
# launch can load the graph E0 saved and serve it without our ops (docs/serving.md).
COMPILE_CACHE_ENV = "VLLM_DISABLE_COMPILE_CACHE"
SELECTION_DIR = "selection"  # selection/ARM/VAR: copies of the files VLLM_FL_CONFIG / VLLM_FL_OP_CONFIG name
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


def prove_launch(
    out: Path, launch: int, tag: str, arm: Arm, platform: Platform | None = None, files: Files | None = None
) -> LaunchProof:
    """The verdict on a stopped launch's call records (every process has written its last), with the
    platform table and the selection files (their copies in the run directory) the plugin's policy read."""
    records = dispatch_dir(out, tag)
    v = check_launch(records, arm.env, platform, files)
    hashes = {p.name: sha256_file(p) for p in sorted(records.glob("dispatch-*.json"))}
    rel = str(records.relative_to(out))
    return LaunchProof(launch, arm.name, rel, v.valid, v.reason, v.intended, v.processes, v.served, hashes, v.selection)


def copy_selection_files(out: Path, arm: Arm) -> dict[str, dict[str, Any]]:
    """The files the arm's VLLM_FL_CONFIG / VLLM_FL_OP_CONFIG name, copied into the run directory
    (selection/ARM/VAR) at the start: the dispatch proof and verify read these copies. A path that is
    not a file is recorded as such (the plugin then ignores VLLM_FL_CONFIG; VLLM_FL_OP_CONFIG fails)."""
    out_files: dict[str, dict[str, Any]] = {}
    for var in FILE_ENVS:
        path = arm.env.get(var, "").strip()
        if not path:
            continue
        if not Path(path).is_file():
            out_files[var] = {"path": path, "copy": None, "sha256": None}
            continue
        rel = Path(SELECTION_DIR) / arm.name / var
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(Path(path).read_bytes())
        out_files[var] = {"path": path, "copy": str(rel), "sha256": sha256_file(out / rel)}
    return out_files


def selection_texts(out: Path, copies: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """The selection files' text, from their copies (None: not a file where the server ran)."""
    return {var: (out / c["copy"]).read_text() if c.get("copy") else None for var, c in copies.items()}


def prepare_dir(out: Path, protocol_bytes: bytes) -> str:
    if out.exists() and any(out.iterdir()):
        raise RunDirError(
            f"run directory {out} already holds files; a run directory is never overwritten, pick a new --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / layout.PROTOCOL).write_bytes(protocol_bytes)
    return sha256_bytes(protocol_bytes)


def provenance_doc(
    sha: str, vllm: str, argv: list[str] | None, calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """provenance.json at the start; `calibration`: the passed calibration the trial rests on
    (serving/calibration_gate.py: its directory, binding hash and calibration.json's sha256)."""
    return {
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
        "devices": devices_record(vendor_devices()),  # every vendor tool's answer (serving/pins.py)
        "client": {"vllm": vllm, "versions": probe_versions(interpreter_of(vllm))},
        "server_versions": {},
        "environment": operator_env(os.environ),
        "timings": {},
        "calibration": calibration,
    }


def run_protocol(
    proto: Protocol,
    protocol_bytes: bytes,
    out: Path,
    vllm: str,
    argv: list[str] | None = None,
    event: Event | None = None,
    override_pins: bool = False,
    stop: Stop | None = None,
    calibration: dict[str, Any] | None = None,
    cross_grader: GraderSource = evalscope_grader,
) -> ServingSummary:
    """Run every launch of the protocol into `out`; return summary.json's record.
    `override_pins`: a launch whose server environment does not match [pins] runs (recorded).
    `stop`: asked after each launch with the run rows so far; a reason ends the run there, FAILED
    with that reason (PilotStop, after the summary is written: the calibration's pilot).
    `calibration`: the passed calibration the trial rests on, for provenance.json.
    `cross_grader`: where the accuracy cross-grade's grader comes from (serving/crossgrade.py).

    Raises PreflightError before writing anything; LaunchError / BenchError (after writing what
    was measured) or KeyboardInterrupt. provenance.json says "running" until the end, then
    "finished", "failed" (with the error) or "interrupted", with the time and the launch it
    stopped in: a directory still "running" is a run that was killed (verify refuses it).
    """
    check_inputs(proto, vllm)  # bad input is exit 2 before anything is written or launched
    emit = event or (lambda *a, **k: None)
    t, order = start_run(proto, protocol_bytes, out, vllm, argv, emit, override_pins, calibration, cross_grader)
    t.emit("start", total=len(order) * len(proto.bench.cases) * proto.repeats)
    t_all = time.monotonic()
    stopped: BaseException | None = None
    try:
        for planned in order:  # the plan is what remains; a launch that fails ends the trial
            t.launch(planned)
            if stop is not None and (reason := stop(t.runs)):
                raise PilotStop(reason)
    except BaseException as e:  # recorded as the run's ending (run_ending), then raised again
        stopped = e
        raise
    finally:
        summary = t.close(run_ending(stopped), time.monotonic() - t_all)
    assert summary is not None  # every launch ran: a finished run is summarised
    return summary


def start_run(
    proto: Protocol,
    protocol_bytes: bytes,
    out: Path,
    vllm: str,
    argv: list[str] | None,
    emit: Event,
    override_pins: bool,
    calibration: dict[str, Any] | None = None,
    cross_grader: GraderSource = evalscope_grader,
) -> tuple[_Trial, list[PlannedLaunch]]:
    """The run directory before the first launch (protocol, plan, provenance "running", empty run and
    request tables), the trial that fills it and its launches in order."""
    sha = prepare_dir(out, protocol_bytes)
    order = planned_launches(proto.arms, proto.rounds, proto.seed)
    copies = {a.name: copy_selection_files(out, a) for a in proto.arms}
    plan = plan_doc(proto, sha, order, copies) | {"pins": proto.pins.flat(), "override_pins": override_pins}
    write_json(out / layout.PLAN, plan)
    started = provenance_doc(sha, vllm, argv, calibration)
    write_json(out / layout.PROVENANCE, started)
    with csv_appender(out / layout.REQUESTS, REQUEST_FIELDS):
        pass  # the header, before any run: an empty table says no request was made
    (out / layout.RUNS).touch()  # likewise: a trial whose first launch failed still has its (empty) run table
    return _Trial(proto, out, vllm, sha, started, emit, copies, override_pins, cross_grader), order


@dataclass(frozen=True)
class RunEnding:
    """How a run's loop of launches ended: provenance's status and error, and whether summary.json is written."""

    status: str  # finished, failed, interrupted; running: left as a killed run leaves it
    error: str | None = None
    summarised: bool = True


def run_ending(stopped: BaseException | None) -> RunEnding:
    """The ending of a run whose loop `stopped` raised (None: every launch ran)."""
    if stopped is None:
        return RunEnding("finished")
    if isinstance(stopped, KeyboardInterrupt):  # Ctrl-C, and SIGTERM (install_sigterm_as_interrupt)
        return RunEnding("interrupted", summarised=False)
    if isinstance(stopped, (LaunchError, BenchError, PilotStop)):  # a failure the runner knows still gets its summary
        return RunEnding("failed", str(stopped))
    if isinstance(stopped, Exception):  # anything else: recorded as the failure it is, never left "running"
        return RunEnding("failed", f"{type(stopped).__name__}: {stopped}", summarised=False)
    return RunEnding("running")  # SystemExit and the like: the run counts as killed (verify refuses it)


def final_provenance(
    started: dict[str, Any],
    ending: RunEnding,
    stopped_in: dict[str, Any] | None,
    server_versions: dict[str, Any],
    total_s: float,
    scope_record: dict[str, Any],
) -> dict[str, Any]:
    """provenance.json at the end: the one written at the start, with the ending, the servers' versions,
    the launch it stopped in (unless it finished) and its scope."""
    doc = started | {
        "finished_at": now(),
        "status": ending.status,
        "server_versions": server_versions,
        "timings": started["timings"] | {"total_s": total_s},
    }
    if ending.status != "finished" and stopped_in is not None:
        doc["stopped_in"] = stopped_in
    if ending.error is not None:
        doc["error"] = ending.error
    return doc | {"scope": scope_record}


def closed_row(row: dict[str, Any], wall_s: float, server: Server | None, proof: LaunchProof | None) -> dict[str, Any]:
    """A launch's row in launches.jsonl: what the launch recorded, its timings, the server's record and
    the dispatch verdict."""
    end: dict[str, Any] = {"wall_s": wall_s}
    if server is not None:
        end |= {"spawned": server.proc is not None, **server.record, "timings": dict(server.timings)}
    if proof is not None:
        end["dispatch"] = asdict(proof)
    return row | end


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class _Trial:
    """A running trial: what it has measured so far, appended to the run directory as it goes."""

    proto: Protocol
    out: Path
    vllm: str
    sha: str  # the protocol's sha256
    started: dict[str, Any]  # provenance.json as written at the start (final_provenance adds the ending)
    emit: Event
    copies: dict[str, dict[str, dict[str, Any]]]  # arm -> its selection files' copies (copy_selection_files)
    override: bool = False  # --override-pins: a pin mismatch is recorded, not refused
    cross_grader: GraderSource = evalscope_grader  # the accuracy cross-grade's (serving/crossgrade.py)
    server_versions: dict[str, Any] = field(default_factory=dict)  # arm -> its server interpreter's versions
    dist_records: dict[str | None, dict[str, Any]] = field(default_factory=dict)  # interpreter -> its RECORD check
    stopped_in: dict[str, Any] | None = None  # the launch under way (kept in provenance if the run stops there)
    pin_rows: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    acc: dict[str, ArmAccuracy] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    proofs: list[LaunchProof] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)  # launch -> arm, of launches that never spawned
    stamp: str = field(default_factory=script_csv.stamp)  # the start, in the names of the script's CSVs

    def close(self, ending: RunEnding, total_s: float) -> ServingSummary | None:
        """provenance.json's last write and, unless the run broke off, summary.json (returned)."""
        devices = self.started["devices"]
        run_scope = scope(
            self.proto.bench.client, self.proto.pins.flat(), self.pin_rows, devices, imports_required=True
        )
        prov = final_provenance(self.started, ending, self.stopped_in, self.server_versions, total_s, run_scope)
        write_json(self.out / layout.PROVENANCE, prov)
        script_csv.write_run(self.out, self.stamp, self.proto.bench.cases, self.proto.repeats, self.runs)
        if not ending.summarised:
            return None
        summary = summarise(
            self.proto,
            self.runs,
            self.acc,
            self.sha,
            self.failures,
            self.proofs,
            self.refused,
            Scope.model_validate(run_scope),  # official or proxy, with the hardware (serving/pins.py)
        )
        write_document(self.out / layout.SUMMARY, summary)
        self.emit("done", summary=summary)
        return summary

    def pin_record(self, arm: Arm) -> dict[str, Any]:
        """The arm's server interpreter against the protocol's [pins] (serving/pins.py), for the launch's row."""
        if arm.name not in self.server_versions:
            self.server_versions[arm.name] = probe_versions(interpreter_of(self.proto.expand(arm)[0]))
        python = interpreter_of(self.proto.expand(arm)[0])
        if python not in self.dist_records:  # serving/dist_records.py: the pinned distributions' RECORD
            self.dist_records[python] = record_evidence(python)
        pinned = self.proto.pins.flat()
        have = installed(self.server_versions[arm.name])
        wrong = pin_mismatches(pinned, have)
        record = {
            **{"pinned": pinned, "installed": have, "mismatches": wrong, "overridden": bool(wrong) and self.override},
            "records": self.dist_records[python],
        }
        self.pin_rows.append(record)
        return record

    def refuse_pins(self, arm: Arm, record: dict[str, Any]) -> None:
        """LaunchError when a pin does not match and the run has no --override-pins."""
        if record["mismatches"] and not self.override:
            raise LaunchError(
                f"arm {arm.name}'s server environment does not match the protocol's [pins]: "
                f"{'; '.join(record['mismatches'])}; install the pinned versions (docs/serving.md, 'GPU install "
                "recipe') or pass --override-pins (recorded)"
            )

    def server(self, arm: Arm, tag: str) -> Server:
        argv = self.proto.expand(arm)
        s = self.proto.server
        spec = ServerSpec(
            argv,
            s.model_id,
            s.host,
            s.port,
            server_env(arm, dispatch_dir(self.out, tag)),
            s.ready_timeout_s,
            s.stop_grace_s,
            s.port_wait_s,
            s.nonce,
        )
        return Server(spec, self.out / layout.LAUNCH_DIR / tag / "server.log", run_dir=self.out)

    def launch(self, planned: PlannedLaunch) -> None:
        """One launch: start (unless external), bench every case, accuracy once per arm, stop, prove."""
        launch, name = planned.launch, planned.arm
        arm = self.proto.arms[[a.name for a in self.proto.arms].index(name)]
        self.stopped_in = {"launch": launch, "arm": name}  # kept only if the run stops here
        tag = f"{launch:02d}-{name}"
        row: dict[str, Any] = asdict(planned) | {"status": "running"}
        t0 = time.monotonic()
        server: Server | None = None
        proof: LaunchProof | None = None
        try:
            if not arm.external:
                row["pins"] = self.pin_record(arm)
                self.refuse_pins(arm, row["pins"])  # refused here (LaunchError) when a pin does not match
            server = None if arm.external else self.server(arm, tag)
            if server is not None:
                self.emit("launch", launch=launch, arm=name, argv=server.spec.argv)
            with server if server is not None else _Null():
                if server is not None:
                    row["ready_s"] = server.timings.get("ready_s")
                accuracy_s = self.measure(arm, launch, tag, server)
                if accuracy_s is not None:
                    row["accuracy_s"] = accuracy_s
            if server is not None:  # stopped: its processes have written their last records
                proof = self.prove(launch, tag, arm)
            row["status"] = "ok"
        except (LaunchError, BenchError) as e:
            spawned = arm.external or (server is not None and server.proc is not None)
            row["status"] = "error" if spawned else "refused"  # refused: nothing ran, nothing to prove
            row["error"] = str(e)
            self.failures.append(f"launch {launch} ({name}){'' if spawned else ' refused before it started'}: {e}")
            if not spawned:
                self.refused[launch] = name
                row["spawned"] = False
            elif server is not None:
                proof = self.prove(launch, tag, arm)
                if not proof.valid:  # e.g. a plugin that failed to load stopped the server: say why
                    raise type(e)(f"{e}; dispatch proof: {proof.reason}") from e
            raise
        except KeyboardInterrupt:
            row["status"] = "interrupted"
            raise
        finally:
            self.close_launch(row, t0, server, proof)

    def prove(self, launch: int, tag: str, arm: Arm) -> LaunchProof:
        platform = self.proto.server.fl_platform.table if self.proto.server.fl_platform else None
        return prove_launch(self.out, launch, tag, arm, platform, selection_texts(self.out, self.copies[arm.name]))

    def close_launch(self, row: dict[str, Any], t0: float, server: Server | None, proof: LaunchProof | None) -> None:
        """The launch's dispatch verdict kept, and its row (closed_row) appended to launches.jsonl."""
        if "pins" in row:  # serving/dist_imports.py: the files its server imported, against RECORD
            spawned = server is not None and server.proc is not None
            records = dispatch_dir(self.out, f"{row['launch']:02d}-{row['arm']}")
            row["pins"]["imported"] = (
                asdict(imported_check(records, row["pins"]["records"])) if spawned else not_spawned()
            )
        if proof is not None:
            self.proofs.append(proof)
            if not proof.valid:
                self.failures.append(f"launch {row['launch']} ({row['arm']}): dispatch proof invalid: {proof.reason}")
        append_jsonl(self.out / layout.LAUNCHES, closed_row(row, time.monotonic() - t0, server, proof))

    def measure(self, arm: Arm, launch: int, tag: str, server: Server | None) -> float | None:
        """Every case's runs, then (the arm's first launch) the accuracy run; its seconds, when it ran."""
        base_url = server.spec.base_url if server is not None else self.proto.url()
        for case in self.proto.bench.cases:
            for k in range(self.proto.repeats):
                self.bench_run(arm, launch, tag, case, k, base_url, server)
        if server is not None:
            server.confirm_answers("after the last run")
        spec = self.proto.accuracy
        if spec is None or arm.name in self.acc:
            return None
        self.emit("accuracy", arm=arm.name)
        t_acc = time.monotonic()
        model = server.served_name if server is not None else self.proto.server.model_id
        res = run_accuracy(
            base_url, model, spec, self.out / layout.ACCURACY_DIR / arm.name, cross_grader=self.cross_grader
        )
        if server is not None:
            server.check_alive("the accuracy run")
            answered = int(res["n"]) * spec.samples - int(res["errors"])  # each in the server's own ledger
            if (
                server.ledger is not None
                and (late := server.ledger.served(t_acc, time.monotonic(), answered)) < answered
            ):
                raise LaunchError(f"accuracy run: {served_problem(late, answered, late, server.spec.port)}")
        self.acc[arm.name] = ArmAccuracy.model_validate({k: res[k] for k in ArmAccuracy.model_fields})
        return time.monotonic() - t_acc

    def bench_run(
        self, arm: Arm, launch: int, tag: str, case: Case, k: int, base_url: str, server: Server | None
    ) -> None:
        """Run k of a case: the client, its raw file, the run's row and its requests' rows."""
        proto, out = self.proto, self.out
        seed = proto.bench.run_seed(k)
        rdir = out / layout.RAW_DIR / tag / case.id
        argv = bench_argv(
            self.vllm,
            base_url,
            proto.server.model_id,
            proto.server.effective_tokenizer,
            case,
            rdir,
            f"run{k}.json",
            seed,
            proto.bench.percentiles,
            server.served_name if server is not None else None,
            proto.bench.client,
            proto.bench.goodput,
        )
        self.emit("run", launch=launch, arm=arm.name, case=case.id, run=k)
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
            row["window"] = [t0, time.monotonic()]  # the served ledger's window (serving/served.py)
        except (LaunchError, BenchError) as e:
            row.update({"status": "FAILED", "reason": str(e), "wall_s": time.monotonic() - t0})
            if (rdir / f"run{k}.json").is_file():
                row["raw_sha256"] = sha256_file(rdir / f"run{k}.json")
            self.runs.append(row)
            append_jsonl(out / layout.RUNS, row)
            raise
        row["raw_sha256"] = sha256_file(rdir / f"run{k}.json")
        row["wall_s"] = time.monotonic() - t0
        figures, foreign = self.judge_run(raw, case, server, argv, row["window"])
        row.update(figures)
        if row["status"] != "ok":
            self.failures.append(f"launch {launch} {arm.name} {case.id} run {k}: {row['reason']}")
        self.runs.append(row)
        append_jsonl(out / layout.RUNS, row)
        with csv_appender(out / layout.REQUESTS, REQUEST_FIELDS) as append:
            for rq in request_rows(raw):
                cells = {"launch": launch, "arm": arm.name, "case": case.id, "run": k, **rq}
                append([cells.get(f, "") for f in REQUEST_FIELDS])
        if foreign:  # not a measurement of this arm: stop the trial
            raise LaunchError(row["reason"])
        self.emit("ran", row=row)

    def judge_run(
        self, raw: dict[str, Any], case: Case, server: Server | None, argv: list[str], window: list[float] | None
    ) -> tuple[dict[str, Any], bool]:
        """A run's figures and status, and whether another server answered: FAILED when a request
        got another server's 404 (for the launch's nonce), the server's own ledger lacks an answer
        the client completed (served.py: another process answered it), fewer than num_requests
        completed, or a completed request returned other than the output tokens its argv asked for
        (completeness.py)."""
        m = metrics.run_metrics(raw, self.proto.bench.percentiles, self.proto.bench.goodput)
        foreign = foreign_answers(raw) if server is not None and server.nonce else 0
        if foreign and server is not None:
            reason = (
                f"{foreign} request(s) got HTTP 404 for this launch's nonce {server.nonce!r}: a server that does not "
                f"serve it answered them, i.e. another server shares port {server.spec.port}; stop it or pick "
                "another port"
            )
            return {"status": "FAILED", "reason": reason, **m}, True
        complete = judge_requests(raw, argv)
        figures = {**m, "incomplete_requests": len(complete.short)}
        reasons = [complete.reason()] if complete.short else []
        if server is not None and server.ledger is not None and window is not None:
            figures["served"] = server.ledger.served(*window, int(m["completed"]))
            problem = served_problem(figures["served"], int(m["completed"]), case.num_requests, server.spec.port)
            if problem is not None:
                return {"status": "FAILED", "reason": problem, **figures}, True
        if m["completed"] != case.num_requests:
            reasons.insert(0, failed_requests_reason(raw, int(m["completed"]), case.num_requests))
        if reasons:
            return {"status": "FAILED", "reason": "; ".join(reasons), **figures}, False
        return {"status": "ok", **figures}, False
