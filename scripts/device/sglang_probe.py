"""Probe SGLang's kernels on the GPU machine before a panel runs them (issue 18).

Usage (repo root, after `. scripts/device/setup.sh`): python3 scripts/device/sglang_probe.py
  [--timeout 180] [--ops rmsnorm,silu_and_mul]

Prints:
- how long `import sglang` (the whole package) and the kernel namespace alone (what the
  adapters import, ops/peers_sglang.py) take and how many modules each pulls in;
- one line per operator with an `sglang` peer: ok / failed / unavailable / timeout, the
  adapter's load time, its first call's time (JIT compile of CUDA kernels included) and the
  correctness gate (trial/gate.py, the anti-cheat calls included) on three of the
  operator's GPU cases (first, middle, last), seed 0.
Each operator runs in its own process with a wall-clock limit (JIT CUDA compiles take up to
a minute; the default limit is 180 s), all at once, so the probe never hangs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPORTS = {
    "whole package": "import sglang",
    "kernel namespace": (
        "from kerneltrial.ops.peers_sglang import kernels_package; kernels_package(); "
        "import sglang.kernels.ops.layernorm.norm, sglang.kernels.ops.activation, "
        "sglang.kernels.ops.layernorm.rmsnorm_fp32, sglang.kernels.ops.layernorm.minimax_m3_rmsnorm, "
        "sglang.kernels.ops.sampling.softcap_row_argmax, sglang.kernels.ops.diffusion.norm.zimage_qk_rmsnorm_triton"
    ),
}


@dataclass
class CaseResult:
    case: str
    passed: bool
    message: str
    max_rel: float


@dataclass
class OpResult:
    op: str
    status: str  # ok | failed | unavailable | timeout | crashed
    reason: str = ""
    load_s: float = 0.0
    first_call_s: float = 0.0
    cases: list[CaseResult] = field(default_factory=list)


def measure_import(statement: str, timeout: float) -> str:
    """Seconds and modules added by `statement` in a fresh interpreter (torch imported first)."""
    code = (
        "import sys, time, torch; n = len(sys.modules); t = time.perf_counter(); "
        f"{statement}; print(f'{{time.perf_counter() - t:.2f}} s, {{len(sys.modules) - n}} modules')"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout:.0f} s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"failed: {lines[-1] if lines else done.returncode}"
    return done.stdout.strip()


def probe_one(op_name: str) -> OpResult:
    """In the child: load the adapter, time its first call, run the gate on three cases."""
    import torch

    from kerneltrial.ops.registry import get_op
    from kerneltrial.trial import gate

    op = get_op(op_name)
    impl = op.impl("sglang")
    start = time.perf_counter()
    fn = impl.resolve()
    load_s = time.perf_counter() - start
    if fn is None:
        return OpResult(op_name, "unavailable", impl.reason, load_s)
    device = torch.device("cuda")
    supported = [c for c in op.gpu_cases if impl.supports(c)]
    picked = list(dict.fromkeys([supported[0], supported[len(supported) // 2], supported[-1]]))
    start = time.perf_counter()
    try:
        fn(*op.make_inputs(picked[0], 1, device).values())
        torch.cuda.synchronize()
    except Exception as exc:  # the first call may fail in any way; report it
        first = str(exc).splitlines()[0] if str(exc) else ""
        return OpResult(op_name, "failed", f"first call raised {type(exc).__name__}: {first}", load_s)
    first_call_s = time.perf_counter() - start
    cases = []
    for case in picked:
        checked = gate.check(op, impl, case, 0, device)
        cases.append(CaseResult(case.id, checked.passed, checked.message, checked.max_rel))
    status = "ok" if all(c.passed for c in cases) else "failed"
    return OpResult(op_name, status, "", load_s, first_call_s, cases)


def run_child(op_name: str, timeout: float) -> OpResult:
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--one", op_name], capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return OpResult(op_name, "timeout", f"no answer within {timeout:.0f} s")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            record = json.loads(line)
            record["cases"] = [CaseResult(**c) for c in record["cases"]]
            return OpResult(**record)
    tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return OpResult(op_name, "crashed", tail)


def render(result: OpResult) -> str:
    head = f"{result.op:26s} {result.status:11s} load {result.load_s:5.1f} s  first call {result.first_call_s:6.1f} s"
    if result.reason:
        return f"{head}  {result.reason}"
    cases = "; ".join(
        f"{c.case} {'ok' if c.passed else 'FAILED ' + c.message} (max_rel {c.max_rel:.3g})" for c in result.cases
    )
    return f"{head}  {cases}"


def sglang_ops() -> list[str]:
    from kerneltrial.ops.registry import all_ops

    return [op.name for op in all_ops() if "sglang" in op.impls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per operator (all run at once)")
    parser.add_argument("--ops", default="", help="comma-separated operators (default: every one with an sglang peer)")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # child mode: one operator, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asdict(probe_one(args.one))), flush=True)
        return
    try:
        from importlib.metadata import version

        print(f"sglang {version('sglang')}, apache-tvm-ffi {version('apache-tvm-ffi')}", flush=True)
    except Exception as exc:  # a missing distribution is a finding, not a crash
        print(f"versions: {type(exc).__name__}: {exc}", flush=True)
    for label, statement in IMPORTS.items():
        print(f"import ({label}): {measure_import(statement, args.timeout)}", flush=True)
    names = [n for n in args.ops.split(",") if n] or sglang_ops()
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        for result in pool.map(lambda n: run_child(n, args.timeout), names):
            print(render(result), flush=True)


if __name__ == "__main__":
    main()
