"""`served ledger` (issue 36, item 1): every run's answers recounted from its launch's own ledger,
with verify's own code (it imports none of serving/served.py, which the trial uses; the file
name and the endpoints are the ledger's format, which it reads).

With plan.json `ledger` true, every launch whose server was spawned keeps `launches/NN-ARM/served.jsonl`
(plugins/ledger.py: one line per answered request, on the server's monotonic clock), and every run
of it that ran records its `window` (the monotonic clock before the client started and after it
ended) and `served`: the completions answered with HTTP 200 inside the window. verify counts them
again from the file, requires the count the row records, and requires an `ok` run to have at
least its completed requests and at most the requests it sent (an answer another process gave has
no line; requests of its own add some). The file must hold as many lines as the launch record says the trial read
(`served_lines`), so lines cannot be dropped or added without rewriting that record too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LEDGER = "served.jsonl"
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
SHOWN = 5


def _lines(path: Path) -> list[dict[str, Any]] | None:
    if not path.is_file():
        return None
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            rows.append({})
    return rows


def _count(lines: list[dict[str, Any]], window: list[Any]) -> int:
    start, end = float(window[0]), float(window[1])
    return sum(
        1
        for e in lines
        if e.get("path") in ENDPOINTS
        and e.get("status") == 200
        and isinstance(e.get("t0"), int | float)
        and isinstance(e.get("t1"), int | float)
        and start <= e["t0"]
        and e["t1"] <= end
    )


def _run_problems(row: dict[str, Any], lines: list[dict[str, Any]], where: str) -> list[str]:
    window = row.get("window")
    if not (isinstance(window, list) and len(window) == 2 and all(isinstance(v, int | float) for v in window)):
        return [f"{where}: no window (the trial records one for every run it judged against the ledger)"]
    counted = _count(lines, window)
    problems = []
    if row.get("served") != counted:
        problems.append(f"{where}: served = {row.get('served')}, the ledger holds {counted} in its window")
    completed = row.get("completed")
    sent = row.get("num_requests")
    if row.get("status") == "ok" and isinstance(completed, int) and isinstance(sent, int):
        if not completed <= counted <= sent:
            problems.append(
                f"{where}: ok, but the ledger holds {counted} answered completion(s) for {completed} completed of "
                f"{sent} sent: another process answered some, or sent requests of its own"
            )
    return problems


def served_problems(path: Path, plan: dict[str, Any], launches: list[dict[str, Any]], runs: list[dict[str, Any]]):
    """The check's problems, or None when the plan keeps no ledger (before issue 36, or nonce = false)."""
    if not plan.get("ledger"):
        return None
    problems = []
    spawned = {L.get("launch"): L for L in launches if L.get("pid") is not None}
    for launch, record in sorted(spawned.items(), key=lambda kv: str(kv[0])):
        tag = f"{int(launch):02d}-{record.get('arm')}"
        lines = _lines(path / "launches" / tag / LEDGER)
        if lines is None:
            problems.append(f"launch {tag}: launches/{tag}/{LEDGER} is missing")
            continue
        if record.get("served_lines") != len(lines):
            problems.append(
                f"launch {tag}: {LEDGER} has {len(lines)} lines, the trial read {record.get('served_lines')}"
            )
        for row in runs:
            if row.get("launch") == launch and ("served" in row or row.get("status") == "ok"):
                problems += _run_problems(row, lines, f"run {tag}/{row.get('case')}/run{row.get('run')}")
    return problems[:SHOWN] + ([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
