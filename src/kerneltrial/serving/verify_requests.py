"""`complete requests` (issue 36, item 3): every run's status recounted from its raw per-request
arrays, with verify's own code (it imports none of serving/completeness.py, which the trial uses).

A request is failed when vLLM's client recorded an error or no latency, and incomplete when it
recorded neither but another output length than the plan's case asks for: kerneltrial's clients
pass `--ignore-eos` and no `--random-range-ratio`, so each request asks for exactly the case's
`output_len` tokens and the server must generate them all (a stream closed or broken by an error
mid-response ends short, and vLLM's client counts it successful). A run is `ok` only when every
one of the case's `num_requests` requests completed whole; the lengths come from the plan and the
argv, never from the row that is checked.
"""

from __future__ import annotations

from typing import Any

SHOWN = 5


def _value(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        if token == flag:
            return argv[i + 1] if i + 1 < len(argv) else ""
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def argv_problems(row: dict[str, Any], where: str) -> list[str]:
    """The client asked for exactly the case's output length: `--ignore-eos`, no range ratio. A run
    from before the argv was recorded (issue 14) had both (bench.py always passed --ignore-eos)."""
    argv = row.get("client_argv")
    if argv is None:
        return []
    problems = []
    if "--ignore-eos" not in argv:
        problems.append(
            f"{where}: its client argv lacks --ignore-eos, so a request may stop at EOS and its output length "
            "proves nothing about whether it completed; kerneltrial's clients always pass it"
        )
    ratio = _value(argv, "--random-range-ratio")
    if ratio is not None and ratio not in ("0", "0.0"):
        problems.append(
            f"{where}: its client argv passes --random-range-ratio {ratio}, so its requests asked for other "
            "lengths than the case's output_len; kerneltrial's clients pass none"
        )
    return problems


def short_requests(raw: dict[str, Any], asked: int) -> list[tuple[int, int]]:
    """(request, output length) of every request without an error and with a latency whose output
    length is not `asked`."""
    n = len(raw["input_lens"])
    return [
        (i, int(raw["output_lens"][i]))
        for i in range(n)
        if not raw["errors"][i] and raw["latencies"][i] > 0 and raw["output_lens"][i] != asked
    ]


def _named(short: list[tuple[int, int]], asked: int) -> str:
    named = ", ".join(f"request {i}: {n} of {asked}" for i, n in short[:SHOWN])
    return named + (f" and {len(short) - SHOWN} more" if len(short) > SHOWN else "")


def completeness_problems(
    row: dict[str, Any], raw: dict[str, Any], case: dict[str, Any] | None, where: str
) -> list[str]:
    """One run's status and `incomplete_requests` against the recount from its raw arrays."""
    if case is None:
        return [f"{where}: case {row.get('case')!r} is not one of plan.json's cases"]
    asked, wanted = int(case["output_len"]), int(case["num_requests"])
    problems = argv_problems(row, where)
    if row.get("num_requests") != wanted:
        problems.append(
            f"{where}: num_requests is {row.get('num_requests')} in runs.jsonl, the plan's case asks {wanted}"
        )
    n = len(raw["input_lens"])
    done = sum(1 for i in range(n) if not raw["errors"][i] and raw["latencies"][i] > 0)
    short = short_requests(raw, asked)
    if "incomplete_requests" in row and row["incomplete_requests"] != len(short):
        problems.append(
            f"{where}: incomplete_requests is {row['incomplete_requests']} in runs.jsonl, recounted {len(short)}"
        )
    status = row.get("status")
    if status == "ok" and done != wanted:
        problems.append(f"{where}: status ok but completed {done} of {wanted} requests")
    elif status == "ok" and short:
        problems.append(
            f"{where}: status ok but {len(short)} of {n} requests returned other than the {asked} output tokens "
            f"they asked for under --ignore-eos ({_named(short, asked)} tokens): an incomplete request fails its run"
        )
    elif status != "ok" and done == wanted and not short:
        problems.append(
            f"{where}: status {status} but every one of its {wanted} requests completed with its {asked} output tokens"
        )
    return problems
