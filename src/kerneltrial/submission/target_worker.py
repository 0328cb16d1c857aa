"""The worker of the package interface check: the unpacked archive, imported as a target imports it.

`submission/isolated.py` (the harness) starts a copy of this file through a launcher, as
`python <scratch>/app/<script>` with site enabled (submission/target_env.py says how: the
interpreter, the environment, the parent). It reads its configuration, one JSON object with
the fields of `isolated.WorkerConfig`, as the first line of its standard input; what it writes
back has the fields of `isolated.Hello` and `isolated.Reply`. Its standard input and output are
the channel: it keeps them on descriptors of its own and points 0 at /dev/null and 1 at its log
(standard error), so nothing the module prints reaches the channel and nothing on its command
line or in its environment names the check.
It sets sys.path to what the harness gives (the unpacked archive first, then the target
interpreter's path without anything of kerneltrial), sets torch's thread count when told to
(else torch keeps its default), imports the archive's module by its name, reports which of
its top-level names are callable, the entry point's signature and the thread count it had
before the import, then serves calls until the harness closes the channel: each call reads
the arguments from the request file (torch.save), calls the entry point, synchronises the
current CUDA stream, and writes the returned value and the arguments as the call left them to
the reply file; one line on the channel says each file is ready. It judges nothing: the harness
compares.

This file imports the standard library and, after setting the path, torch; never kerneltrial.
Three of kerneltrial's torch-only files run here as shims, copied into the scratch folder by
the harness (the check needs them; none imports kerneltrial), loaded by path and left out of
sys.modules: the gate's output poisoning (trial/poison.py: torch.empty* poisoned during a CPU
call; on a GPU, free blocks of the previous result's sizes poisoned before a call, as the
warm-up calls of a case precede its checked call), the interpreter's bf16 rounding fix when
TRITON_INTERPRET=1 (ops/interpreter_fix.py, so a CPU run rounds as a GPU does; its marker
attribute is removed) and, with a target, the launch hook (trial/targets.py), whose refused
launches the reply reports.
The worker keeps the previous call's result alive while the harness holds its copy, so a
kernel that hands out one persistent buffer returns the same storage again (reported by address).
"""

import importlib
import importlib.util
import inspect
import json
import os
import sys
from contextlib import ExitStack
from types import ModuleType
from typing import IO, Any


def _shim(name: str, path: str) -> ModuleType:
    """The file at `path` run as a module, then dropped from sys.modules (the module under
    check would see a `poison` module there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _hello(config: dict[str, Any], threads: int) -> tuple[dict[str, Any], Any]:
    """What the harness learns about the module before any call, and the entry point."""
    name = config["module"]
    found = {"error": "", "threads": threads}
    if importlib.util.find_spec(name) is not None:
        return found | {"error": f"the module name {name} is taken by an installed module here; rename {name}.py"}, None
    sys.path.insert(0, config["archive_dir"])
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # a user's module may raise anything at import
        error = f"{name}.py failed to import from the unpacked archive: {type(exc).__name__}: {exc}"
        return found | {"error": error}, None
    callables = sorted(n for n, v in vars(module).items() if callable(v))
    fn = getattr(module, config["op"], None)
    try:
        signature = str(inspect.signature(fn)) if callable(fn) else ""
    except (TypeError, ValueError):
        signature = "(?)"
    return found | {"callables": callables, "signature": signature}, fn


def _sequence(value: Any) -> bool:
    return isinstance(value, (tuple, list))


def _plain(value: Any, torch: ModuleType) -> bool:
    """Whether the harness can read `value` back (a tensor, tensors, a number, None)."""
    if _sequence(value):
        return all(isinstance(t, torch.Tensor) for t in value)
    return value is None or isinstance(value, (torch.Tensor, int, float, bool))


def _serve(config: dict[str, Any], fn: Any, channel: tuple[IO[str], IO[str]], shims: dict[str, Any]) -> None:
    import torch

    inbox, outbox = channel
    poison, limits = shims["poison"], shims.get("launch_limits")
    previous: list[Any] = []  # alive until the next call returns, as the caller holds it in-process
    for line in inbox:
        args = torch.load(config["request"], weights_only=True)["args"]
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        mark = limits.seen() if limits else 0
        returned: Any = None
        raised = ""
        try:
            poison.poison_free_blocks(tuple(t for t in previous if isinstance(t, torch.Tensor)))
            with poison.poisoned_allocations(device):
                returned = fn(*args)
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
        except Exception as exc:  # the harness records what the arm raised
            raised = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        tensors = [returned] if isinstance(returned, torch.Tensor) else list(returned) if _sequence(returned) else []
        reply = {
            "returned": returned if _plain(returned, torch) else None,
            "returned_type": type(returned).__name__,
            "addresses": [t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)],
            "args": args,
            "raised": raised,
            "launch": limits.first_since(mark) if limits else "",
        }
        torch.save(reply, config["reply"])
        previous = tensors
        outbox.write(line)
        outbox.flush()


def _channel() -> tuple[IO[str], IO[str]]:
    """The channel on descriptors of the worker's own; 0 becomes /dev/null, 1 the log."""
    inbox = os.fdopen(os.dup(0), "r")
    outbox = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    return inbox, outbox


def _bf16_rounding(path: str) -> None:
    _shim("bf16_rounding", path).patch()
    from triton.runtime import interpreter

    vars(interpreter._convert_float).pop("kerneltrial_patched", None)


def main() -> None:
    inbox, outbox = _channel()
    config = json.loads(inbox.readline())
    sys.path[:] = config["path"]
    shims = {"poison": _shim("poison", config["shims"]["poison"])}
    if os.environ.get("TRITON_INTERPRET") == "1":
        _bf16_rounding(config["shims"]["bf16_rounding"])
    if config["target"]:
        shims["launch_limits"] = _shim("launch_limits", config["shims"]["launch_limits"])
    import torch

    if config["threads"] is not None:
        torch.set_num_threads(config["threads"])
    hello, fn = _hello(config, torch.get_num_threads())
    with open(config["hello"], "w") as file:
        json.dump(hello, file)
    outbox.write("hello\n")
    outbox.flush()
    if fn is None:
        return
    with ExitStack() as stack:
        if config["target"]:
            limits = shims["launch_limits"]
            target = limits.Target(config["target"]["name"], tuple(config["target"]["max_grid"]), "")
            stack.enter_context(limits.targeting(target))
        _serve(config, fn, (inbox, outbox), shims)


if __name__ == "__main__":
    main()
