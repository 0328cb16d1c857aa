"""Complete requests only (issue 36, item 3; docs/serving.md, "Benchmark a running server": "Complete requests only").

vLLM's client counts a request as successful once its stream delivered one chunk and nothing
raised (`vllm/benchmarks/lib/endpoint_request_func.py`). A stream the server closed mid-response,
or one that carried an error chunk (`data: {"error": ...}`: neither choices nor usage, so the client
skips it), ends without the usage chunk, and the client then records the tokens of the text it
got as the request's output length: with `--random-output-len 8 --ignore-eos` a run recorded
output lengths [1, 1, 1, 1], was `ok`, and verify passed. Under `--ignore-eos` every request of
the random dataset asks for exactly `--random-output-len` tokens (its range ratio is 0 unless the
argv sets one) and the server must generate them all, so a successful request with any other
count is incomplete, and a run with an incomplete or failed request is FAILED (the official
script's rule, every request successful, with incomplete requests counted as failed). The run's
figures stay vLLM's own (its completed count, recomputed by metrics.py); its status does not.
verify recounts it apart from this module (serving/verify_requests.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kerneltrial.serving.metrics import success_flags

SHOWN = 5  # requests named in a reason; the count says how many more


@dataclass(frozen=True)
class ShortRequest:
    """A request vLLM's client counted as successful with other than the tokens it asked for."""

    request: int  # its index in the run's per-request arrays
    output_len: int  # the output tokens the client recorded for it


@dataclass(frozen=True)
class Completeness:
    """A run's requests against what each asked for."""

    asked: int | None  # the output tokens each request asked for and must get; None: not fixed by the argv
    requests: int  # requests in the run's arrays
    short: tuple[ShortRequest, ...]  # successful by vLLM's rule, with another output length

    def reason(self) -> str:
        """Why the run fails, naming the first requests; empty when every request is complete."""
        if not self.short:
            return ""
        named = ", ".join(f"request {s.request}: {s.output_len} of {self.asked}" for s in self.short[:SHOWN])
        more = f" and {len(self.short) - SHOWN} more" if len(self.short) > SHOWN else ""
        return (
            f"{len(self.short)} of {self.requests} requests returned other than the {self.asked} output tokens they "
            f"asked for under --ignore-eos ({named}{more} tokens): a stream the server closed, or broke with an "
            "error, mid-response (vLLM's client counts such a request as successful; kerneltrial counts it failed)"
        )


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value after `flag` (`--flag V` or `--flag=V`); None when absent."""
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def asked_output_len(argv: Sequence[str]) -> int | None:
    """The output tokens every request of the client's argv asks for and must get: its
    `--random-output-len` under `--ignore-eos` with no range ratio; None when the argv lets a
    request stop at EOS or vary its length (kerneltrial's clients never do)."""
    value, ratio = flag_value(argv, "--random-output-len"), flag_value(argv, "--random-range-ratio")
    if "--ignore-eos" not in argv or value is None or (ratio is not None and float(ratio) != 0.0):
        return None
    return int(value)


def judge_requests(raw: Mapping[str, Any], argv: Sequence[str]) -> Completeness:
    """The requests of a `vllm bench serve --save-detailed` result that vLLM counted as successful
    with another output length than its argv asked for."""
    asked = asked_output_len(argv)
    ok = success_flags(raw)
    lens = raw.get("output_lens") or []
    if len(lens) != len(ok):
        raise ValueError(
            f"bench JSON has {len(lens)} output_lens for {len(ok)} requests; was it saved with --save-detailed?"
        )
    short = tuple(
        ShortRequest(i, int(lens[i])) for i, good in enumerate(ok) if good and asked is not None and lens[i] != asked
    )
    return Completeness(asked, len(ok), short)


def failed_requests_reason(raw: Mapping[str, Any], completed: int, num_requests: int) -> str:
    """`completed C of N requests`, naming the first failed request's error (a traceback's last line)."""
    ok = success_flags(raw)
    first = next((i for i, good in enumerate(ok) if not good), None)
    if first is None:
        return f"completed {completed} of {num_requests} requests (the client recorded {len(ok)})"
    lines = [x.strip() for x in str((raw.get("errors") or [""] * len(ok))[first]).splitlines() if x.strip()]
    error = lines[-1][:200] if lines else f"no error text, latency {raw['latencies'][first]}"
    return f"completed {completed} of {num_requests} requests (request {first}: {error})"
