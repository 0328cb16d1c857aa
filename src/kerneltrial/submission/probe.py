"""The interface check of a submission archive, in a fresh interpreter (`package` starts it as
`python -m kerneltrial.submission.probe ARCHIVE OP [TARGET]`): unpack the archive into a
temporary folder, import the module the way a harness does (that folder on sys.path, then
`import <module>`, so a file missing from the archive fails here), require exactly one entry
point, named OP, with the operator's parameters, and run the correctness gate on it: every
case of the operator's check panel (trial/panel.py: the small CPU panel and a case of 65537 rows
without a GPU, the GPU panel with one), every layout, seeds 0 and 1 under a fresh inputs seed (recorded in the result; ops/inputs.py), with
the target's launch limits when a target is named. Prints one JSON line, a `ProbeResult`; exit
status 0 either way (the result says whether it passed).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

SEEDS = (0, 1)


@dataclass(frozen=True)
class ProbeResult:
    passed: bool
    reason: str  # one line; '' when passed
    checks: int  # gate checks that ran
    device: str
    inputs_seed: int | None = None  # the inputs seed the gate drew from

    @classmethod
    def parse(cls, line: str) -> ProbeResult:
        return cls(**json.loads(line))


def probe(archive: Path, op_name: str, target_name: str | None) -> ProbeResult:
    import kerneltrial.ops  # noqa: F401  (selects the Triton interpreter without a GPU, before the module's kernels)
    from kerneltrial.ops import inputs as inp
    from kerneltrial.ops import launch
    from kerneltrial.ops.registry import Impl, add_impl, all_ops, get_op
    from kerneltrial.submission.interface import mismatch, params_of_callable
    from kerneltrial.trial import gate
    from kerneltrial.trial.panel import check_panel
    from kerneltrial.trial.targets import get_target, targeting

    operator = get_op(op_name)
    device = launch.device()
    inputs_seed = inp.new_inputs_seed()

    def failed(reason: str, checks: int = 0) -> ProbeResult:
        return ProbeResult(False, reason, checks, device.type, inputs_seed)

    with tempfile.TemporaryDirectory() as folder, zipfile.ZipFile(archive) as zipped:
        (module_file,) = [n for n in zipped.namelist() if n.endswith(".py")]  # `inspect` passed: one, flat
        zipped.extractall(folder)
        name = module_file[:-3]
        if importlib.util.find_spec(name) is not None:
            return failed(f"the module name {name} is taken by an installed module here; rename {module_file}")
        sys.path.insert(0, folder)
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a user's module may raise anything at import
            return failed(f"{module_file} failed to import from the unpacked archive: {type(exc).__name__}: {exc}")
        entries = [o.name for o in all_ops() if callable(getattr(module, o.name, None))]
        if entries != [op_name]:
            return failed(f"{module_file} has entry points {entries or 'none'}; it needs exactly one, {op_name}")
        fn = getattr(module, op_name)
        problem = mismatch(operator.signature, params_of_callable(fn))
        if problem:
            return failed(f"entry point: {problem}")
        impl = add_impl(Impl(op=op_name, name=f"submission:{name}", kind="user", loader=lambda: fn))
        checks = 0
        with targeting(get_target(target_name) if target_name else None), inp.drawing(inputs_seed):
            for case in check_panel(operator, device.type == "cuda"):
                for seed in SEEDS:
                    result = gate.check(operator, impl, case, seed, device)
                    checks += 1
                    if not result.passed:
                        return failed(f"gate: {case.id} seed {seed}: {result.message}", checks)
        return ProbeResult(True, "", checks, device.type, inputs_seed)


def main(argv: list[str]) -> None:
    archive, op_name, *target = argv
    print(json.dumps(asdict(probe(Path(archive), op_name, target[0] if target else None))))


if __name__ == "__main__":
    main(sys.argv[1:])
