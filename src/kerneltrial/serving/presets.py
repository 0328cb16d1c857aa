"""Built-in serving presets: the public serving command of a model on one vendor, flag for flag.

The data is presets.toml (package data), each table citing its source; this module reads it into
frozen records and builds the server argv: `vllm serve MODEL`, the source's flags, PLUMBING, then
the user's extra arguments. An extra argument that sets a flag the preset already sets is refused
unless the user names it in `overrides` (`--override NAME` on the command line): the departure from
the official command is then explicit, and recorded with the argv. The model path is always supplied
by the user.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kerneltrial.serving.bench import Case, parse_cases

DATA_FILE = "presets.toml"
# Where the server listens and the model id it lists: kerneltrial's launch gates need them (the
# ready check polls host:port for model_id). The sources set them too, to their own values.
PLUMBING: tuple[str, ...] = ("--host", "{host}", "--port", "{port}", "--served-model-name", "{model_id}")
_PLUMBING_HELP = {"--host": "--host", "--port": "--port", "--served-model-name": "--model-id"}


class PresetError(ValueError):
    """A preset name or its extra arguments are wrong; the message names the value and the fix."""


@dataclass(frozen=True)
class Omitted:
    """A flag of the source that the preset leaves out, and why."""

    flag: str
    value: str
    reason: str


@dataclass(frozen=True)
class Preset:
    name: str
    vendor: str
    model_id: str
    description: str
    source: str  # where every flag in args and env comes from
    args: tuple[str, ...]  # the source's flags after `vllm serve MODEL`
    env: Mapping[str, str]  # the source's environment variables for the server
    omitted: tuple[Omitted, ...]
    cases: tuple[Case, ...]

    def command(self, extra: Sequence[str] = (), overrides: Iterable[str] = ()) -> list[str]:
        """The flags after `vllm serve MODEL` with placeholders ({host}, {port}, {model_id}):
        the source's, PLUMBING, then `extra`; an extra flag the preset sets needs its name in `overrides`."""
        mine = _options(self.args)
        extra_opts = _options(extra)
        wanted = {_name("--" + o.lstrip("-")) for o in overrides}
        for name in wanted:
            if name in _PLUMBING_HELP:
                raise PresetError(
                    f"--override {name.lstrip('-')}: kerneltrial sets {name} itself; use its {_PLUMBING_HELP[name]} option"
                )
            if name not in mine:
                raise PresetError(
                    f"--override {name.lstrip('-')}: preset {self.name} does not set {name}; "
                    "an argument it does not set needs no override"
                )
            if name not in extra_opts:
                raise PresetError(
                    f"--override {name.lstrip('-')} but no {name} among the extra server arguments; give its new value after `--`"
                )
        for name, tokens in extra_opts.items():
            if name in _PLUMBING_HELP:
                raise PresetError(
                    f"extra server argument {name}: kerneltrial sets {name} itself; use its {_PLUMBING_HELP[name]} option"
                )
            if name in mine and name not in wanted:
                raise PresetError(
                    f"extra server argument {' '.join(tokens)} contradicts preset {self.name}, which sets "
                    f"{' '.join(mine[name])} as its source does; pass --override {name.lstrip('-')} to replace "
                    "it (recorded as a departure from the official command)"
                )
        kept = [t for name, tokens in mine.items() if name not in wanted for t in tokens]
        return [*kept, *PLUMBING, *extra]

    def argv(
        self,
        vllm: str,
        model: str,
        port: int,
        host: str = "127.0.0.1",
        extra: Sequence[str] = (),
        overrides: Iterable[str] = (),
    ) -> list[str]:
        """The full server argv, placeholders filled."""
        subs = {"{host}": host, "{port}": str(port), "{model_id}": self.model_id}
        tail = [subs.get(a, a) for a in self.command(extra, overrides)]
        return [vllm, "serve", model, *tail]


def _name(token: str) -> str:
    """The flag a token sets: --opt=value, --opt_name and --no-opt all set --opt (vLLM's parser takes
    - and _ alike, and its boolean flags have a --no- form)."""
    name = token.partition("=")[0].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


def _options(args: Sequence[str]) -> dict[str, list[str]]:
    """Option name -> its tokens (the option and the values after it); refuses short options and loose values."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for token in args:
        if token.startswith("--"):
            current = _name(token)
            if current in out:
                raise PresetError(f"server argument {current} is given twice; give it once")
            out[current] = [token]
        elif token.startswith("-") and len(token) > 1 and not token[1].isdigit():
            raise PresetError(
                f"server argument {token}: write the long form (e.g. --tensor-parallel-size, not -tp) so that it "
                "can be checked against the preset"
            )
        elif current is None:
            raise PresetError(f"server argument {token!r} comes before any option; extra arguments are options")
        else:
            out[current].append(token)
    return out


_KEYS = ("vendor", "model_id", "description", "source", "args", "env", "omitted", "cases")


def _preset(name: str, table: dict[str, Any]) -> Preset:
    if set(table) != set(_KEYS):
        raise ValueError(f"{DATA_FILE} [{name}]: keys {sorted(table)}, expected {sorted(_KEYS)}; fix the data file")
    return Preset(
        name=name,
        vendor=table["vendor"],
        model_id=table["model_id"],
        description=table["description"],
        source=table["source"],
        args=tuple(table["args"]),
        env=dict(table["env"]),
        omitted=tuple(Omitted(**o) for o in table["omitted"]),
        cases=tuple(parse_cases(table["cases"])),
    )


@functools.cache
def presets() -> dict[str, Preset]:
    """Every built-in preset, read once from the package's presets.toml."""
    text = resources.files("kerneltrial.serving").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return {name: _preset(name, table) for name, table in tomllib.loads(text).items()}


def get_preset(name: str) -> Preset:
    try:
        return presets()[name]
    except KeyError:
        raise PresetError(f"unknown preset {name!r}; known: {', '.join(sorted(presets()))}") from None
