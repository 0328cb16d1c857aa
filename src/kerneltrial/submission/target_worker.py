"""The worker of the package interface check: the unpacked archive, run as the target runs it.

`submission/isolated.py` (the harness) starts a copy of this file as
`python -I -S worker.py CONFIG` (CONFIG: one JSON object, the fields of `isolated.WorkerConfig`;
what it writes back has the fields of `isolated.Hello` and `isolated.Reply`).
It sets sys.path to what the harness gives (the unpacked archive first, then the harness's
path without anything of kerneltrial), imports the archive's module by its name, reports
which of its top-level names are callable and the entry point's signature, then serves
calls until the harness closes the channel: each call reads the arguments from the request
file (torch.save), calls the entry point, synchronises the current CUDA stream, and writes
the returned value and the arguments as the call left them to the reply file; one line on the
channel says each file is ready. It judges nothing: the harness compares.

This file imports the standard library and, after setting the path, torch; never kerneltrial.
Three of kerneltrial's torch-only files run here as shims, copied beside it by the harness (the
check needs them; none imports kerneltrial): the gate's output poisoning (trial/poison.py:
torch.empty* poisoned during a CPU call; on a GPU, free blocks of the previous result's sizes
poisoned before a call, as the warm-up calls of a case precede its checked call), the
interpreter's bf16 rounding fix when TRITON_INTERPRET=1 (ops/interpreter_fix.py, so a CPU
run rounds as a GPU does) and, with a target, the launch hook (trial/targets.py), whose
refused launches the reply reports.
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
from typing import Any


def _shim(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _hello(config: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """What the harness learns about the module before any call, and the entry point."""
    name = config["module"]
    if importlib.util.find_spec(name) is not None:
        return {"error": f"the module name {name} is taken by an installed module here; rename {name}.py"}, None
    sys.path.insert(0, config["archive_dir"])
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # a user's module may raise anything at import
        return {"error": f"{name}.py failed to import from the unpacked archive: {type(exc).__name__}: {exc}"}, None
    callables = sorted(n for n, v in vars(module).items() if callable(v))
    fn = getattr(module, config["op"], None)
    try:
        signature = str(inspect.signature(fn)) if callable(fn) else ""
    except (TypeError, ValueError):
        signature = "(?)"
    return {"error": "", "callables": callables, "signature": signature}, fn


def _sequence(value: Any) -> bool:
    return isinstance(value, (tuple, list))


def _plain(value: Any, torch: ModuleType) -> bool:
    """Whether the harness can read `value` back (a tensor, tensors, a number, None)."""
    if _sequence(value):
        return all(isinstance(t, torch.Tensor) for t in value)
    return value is None or isinstance(value, (torch.Tensor, int, float, bool))


def _serve(config: dict[str, Any], fn: Any, channel: tuple[Any, Any], shims: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(1)  # this process and the harness take turns (isolated._one_thread)
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


def main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    sys.path[:] = config["path"]
    shims = {"poison": _shim("poison", config["shims"]["poison"])}
    if os.environ.get("TRITON_INTERPRET") == "1":
        _shim("bf16_rounding", config["shims"]["bf16_rounding"]).patch()
    if config["target"]:
        shims["launch_limits"] = _shim("launch_limits", config["shims"]["launch_limits"])
    inbox = os.fdopen(config["channel"][0], "r")
    outbox = os.fdopen(config["channel"][1], "w")
    hello, fn = _hello(config)
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
    main(sys.argv[1:])
