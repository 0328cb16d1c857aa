"""plan.json `effective`: the values beside protocol.toml that a serving run used, and the command
line they came from.

`serve trial` and `serve calibrate` take two values beside the protocol, each recorded twice: in
provenance.json `argv` (the command line as typed) and in plan.json `effective` (what the run then
used: the model path, the client and the tokenizer the client loaded). verify derives each
`effective` value again from the argv and protocol.toml (`argv_problems`), recovers them from the
argv for a run from before `effective` (`recovered`), and the report shows the values given on the
command line that differ from the protocol (`overrides`).

The protocol's folder resolves a relative server.model or server.tokenizer that exists there
(serving/protocol.py); verify reads protocol.toml from the run directory, so a recorded absolute
path is taken as the run's resolution of the relative one written when its last parts are that
relative path's (`resolves`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kerneltrial.serving.protocol import Protocol

COMMANDS = ("trial", "calibrate")  # the `serve` commands that write a serving run directory
FLAGS = {"--model": "model", "--client": "client"}
SERVING_MAIN = "kerneltrial/serving/__main__.py"  # argv[0] of `python -m kerneltrial.serving`  # their options that change what protocol.toml says


@dataclass(frozen=True)
class Effective:
    """What a run used beside protocol.toml: the model path (as resolved, or --model), the client
    (or --client) and the tokenizer the client loaded."""

    model: str | None
    client: str
    tokenizer: str | None

    def record(self) -> dict[str, Any]:
        return asdict(self)


def effective(proto: Protocol) -> Effective:
    """plan.json `effective` of a run of `proto` (the protocol with the command line's values applied)."""
    return Effective(proto.server.model, proto.bench.client, proto.server.effective_tokenizer)


def with_effective(proto: Protocol, recorded: dict[str, Any]) -> Protocol:
    """`proto` (parsed from a run's protocol.toml) with the run's `effective` values applied; a
    recorded tokenizer (since issue 36's hostile review) is the one the client loaded."""
    if recorded.get("model"):
        proto = proto.with_model(str(recorded["model"]))
    if recorded.get("client") and recorded["client"] != proto.bench.client:
        proto = proto.with_client(str(recorded["client"]))
    if "tokenizer" in recorded and recorded["tokenizer"] != proto.server.effective_tokenizer:
        server = proto.server.model_copy(update={"tokenizer": recorded["tokenizer"]})
        proto = proto.model_copy(update={"server": server})
    return proto


@dataclass(frozen=True)
class CommandLine:
    """A `kerneltrial serve trial|calibrate` command line: the command and the values of the options
    that change what protocol.toml says (None: not given)."""

    command: str
    model: str | None = None
    client: str | None = None

    def given(self) -> str:
        shown = [f"{flag} {getattr(self, key)}" for flag, key in FLAGS.items() if getattr(self, key) is not None]
        return f"`serve {self.command}" + "".join(f" {s}" for s in shown) + "`"


def command_line(argv: object) -> CommandLine | None:
    """The serve command of provenance.json `argv` (None: not a list of strings holding `serve trial`
    or `serve calibrate`, or `trial`/`calibrate` after kerneltrial/serving/__main__.py); an option
    given twice takes its last value, as the command line does."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    at = next((i for i in range(len(argv) - 1) if argv[i] == "serve" and argv[i + 1] in COMMANDS), None)
    if at is None and len(argv) > 1 and Path(argv[0]).as_posix().endswith(SERVING_MAIN) and argv[1] in COMMANDS:
        at = 0  # `python -m kerneltrial.serving trial ...`: sys.argv[0] is the package's __main__.py
    if at is None:
        return None
    values: dict[str, str] = {}
    rest = argv[at + 2 :]
    for i, token in enumerate(rest):
        flag, eq, value = token.partition("=")
        if flag in FLAGS and eq:
            values[FLAGS[flag]] = value
        elif token in FLAGS and i + 1 < len(rest):
            values[FLAGS[token]] = rest[i + 1]
    return CommandLine(argv[at + 1], values.get("model"), values.get("client"))


@dataclass(frozen=True)
class Written:
    """server.model and server.tokenizer as protocol.toml writes them (before the protocol's folder
    resolves a relative path), and the protocol's client."""

    model: str | None
    tokenizer: str | None
    client: str


def written(text: str, proto: Protocol) -> Written:
    """The values of a protocol's text that the command line can change (`proto` is its parse)."""
    server = tomllib.loads(text).get("server")
    server = server if isinstance(server, dict) else {}
    model, tokenizer = server.get("model"), server.get("tokenizer")
    return Written(
        model if isinstance(model, str) else None,
        tokenizer if isinstance(tokenizer, str) else None,
        proto.bench.client,
    )


def resolves(written_path: str | None, recorded: str | None) -> bool:
    """Whether `recorded` is `written_path` itself or, for a relative path, an absolute path ending in
    it (the protocol's folder resolved it)."""
    if written_path == recorded:
        return True
    if not written_path or not recorded or Path(written_path).is_absolute() or not Path(recorded).is_absolute():
        return False
    tail = [p for p in Path(os.path.normpath(written_path)).parts if p not in (".", "..")]
    return bool(tail) and list(Path(recorded).parts[-len(tail) :]) == tail


def _follows(w: Written) -> bool:
    """Whether the protocol's tokenizer follows a --model (unset, or the model's own path)."""
    if w.tokenizer is None or w.tokenizer == w.model:
        return True
    return (
        bool(w.model)
        and not Path(w.tokenizer).is_absolute()
        and os.path.normpath(w.tokenizer) == os.path.normpath(w.model)
    )


def argv_problems(recorded: dict[str, Any], w: Written, cmd: CommandLine | None) -> list[str]:
    """Each plan.json `effective` value that the command line of provenance.json `argv` and
    protocol.toml do not give (a command line that is not a serve command gives protocol.toml's
    values: nothing was given beside it)."""
    given = cmd.given() if cmd else "no serve command line (protocol.toml's values)"
    source = f"provenance.json argv ({given}) with protocol.toml"
    problems = []
    model = recorded.get("model")
    by_flag = cmd is not None and cmd.model is not None
    want_model = cmd.model if cmd is not None and cmd.model is not None else w.model
    if not (model == want_model if by_flag else resolves(want_model, model)):
        problems.append(f"plan.json effective model is {model!r}; {source} give {want_model!r}")
    want_client = cmd.client if cmd and cmd.client is not None else w.client
    if recorded.get("client") != want_client:
        problems.append(f"plan.json effective client is {recorded.get('client')!r}; {source} give {want_client!r}")
    if "tokenizer" in recorded and not _tokenizer_given(recorded["tokenizer"], model, w, cmd):
        want = _tokenizer_wanted(w, cmd, model)
        problems.append(f"plan.json effective tokenizer is {recorded['tokenizer']!r}; {source} give {want!r}")
    return problems


def _tokenizer_wanted(w: Written, cmd: CommandLine | None, model: Any) -> str | None:
    if cmd is not None and cmd.model is not None and _follows(w):
        return cmd.model
    return w.tokenizer or (model if isinstance(model, str) else None)


def _tokenizer_given(tokenizer: Any, model: Any, w: Written, cmd: CommandLine | None) -> bool:
    """The recorded tokenizer is the protocol's (as its folder resolves it), or the model it follows."""
    want = _tokenizer_wanted(w, cmd, model)
    if want is not None and want == w.tokenizer:
        return resolves(w.tokenizer, tokenizer)
    return tokenizer == want


def recovered(w: Written, cmd: CommandLine | None, plan_tokenizer: Any) -> dict[str, Any]:
    """`effective` of a run from before it, from its command line and protocol.toml: --model, else
    the protocol's model (as the run's folder resolved it, where the plan's tokenizer followed it);
    --client, else the protocol's client."""
    model = cmd.model if cmd and cmd.model is not None else w.model
    if model == w.model and w.tokenizer is None and isinstance(plan_tokenizer, str) and resolves(model, plan_tokenizer):
        model = plan_tokenizer
    return {"model": model, "client": cmd.client if cmd and cmd.client is not None else w.client}


@dataclass(frozen=True)
class Override:
    """A value given on the command line that differs from protocol.toml's."""

    flag: str
    given: str
    protocol: str | None

    def __str__(self) -> str:
        return f"{self.flag} {self.given} (protocol.toml: {self.protocol or 'unset'})"


def overrides(w: Written, cmd: CommandLine | None) -> list[Override]:
    """The command line's values that replace protocol.toml's (none for a command line that is not a
    serve command)."""
    if cmd is None:
        return []
    out = []
    if cmd.model is not None and not resolves(w.model, cmd.model):
        out.append(Override("--model", cmd.model, w.model))
    if cmd.client is not None and cmd.client != w.client:
        out.append(Override("--client", cmd.client, w.client))
    return out
