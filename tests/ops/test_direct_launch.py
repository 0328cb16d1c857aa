"""ops/launch.py Direct: the compiled kernel is reused only where Triton would pick the same one.

On the CPU the JITFunction and its compiled kernel are stand-ins that record their calls (the
interpreter has no compiled kernel); on a GPU every operator's own arms run through the gate while
each reuse is compared with the kernel JITFunction.run itself picks for the same arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kerneltrial.ops import launch
from kerneltrial.ops.registry import Case, all_ops
from kerneltrial.trial.gate import check


class FakeCompiled:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], tuple[Any, ...]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return lambda *args: self.calls.append((grid, args))


class FakeJit:
    """A JITFunction's surface: arg_names, and fn[grid](*args, **meta) returning its compiled kernel."""

    arg_names = ["X", "Y", "n", "eps", "BLOCK", "EVEN"]

    def __init__(self) -> None:
        self.runs: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.compiled: list[FakeCompiled] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., FakeCompiled]:
        def run(*args: Any, **meta: Any) -> FakeCompiled:
            self.runs.append((args, meta))
            self.compiled.append(FakeCompiled())
            return self.compiled[-1]

        return run


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> tuple[launch.Direct, FakeJit]:
    fake = FakeJit()
    kernel = launch.Direct(fake)
    kernel.compiled = True  # as for a JITFunction on a GPU
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return kernel, fake


def test_a_repeated_call_reuses_the_compiled_kernel_with_every_argument_in_signature_order(direct):
    kernel, fake = direct
    x, y = torch.zeros(64), torch.zeros(64)
    for _ in range(3):
        kernel[(5,)](x, y, 64, 1e-6, BLOCK=64, EVEN=True, num_warps=4)
    assert len(fake.runs) == 1
    assert fake.compiled[0].calls == [((5, 1, 1), (x, y, 64, 1e-6, 64, True))] * 2


X = torch.zeros(64, dtype=torch.bfloat16)
# each differs from the first call in one thing Triton specialises on
SPECIALISED = [
    (X, X, 64, 1e-6),
    (X[1:], X, 64, 1e-6),  # a data pointer 2 bytes past a 16-byte boundary
    (X.float(), X, 64, 1e-6),  # another dtype
    (X, X, 1, 1e-6),  # an int of 1 (Triton makes it a constant)
    (X, X, 17, 1e-6),  # not divisible by 16
    (X, X, 2**31 + 16, 1e-6),  # past i32: an i64
    (X, X, 2**63 + 16, 1e-6),  # past i64: a u64
    (X, X, 2**64 + 16, 1e-6),  # past u64: Triton refuses it; keyed by value, never wrapped by a kept launcher
    (X, X, 2**64 + 32, 1e-6),
    (X, X, True, 1e-6),  # a bool, equal to 1 but another type
    (X, X, None, 1e-6),  # None
]


def jit_calls(kernel: launch.Direct, fake: FakeJit, calls: list[tuple[Any, ...]]) -> int:
    before = len(fake.runs)
    for args in calls:
        kernel[(1,)](*args, BLOCK=64, EVEN=True)
    return len(fake.runs) - before


def test_anything_triton_specialises_on_takes_the_jit_path_again(direct, monkeypatch):
    kernel, fake = direct
    assert jit_calls(kernel, fake, SPECIALISED) == len(SPECIALISED)
    kernel[(1,)](X, X, 64, 1e-6, BLOCK=128, EVEN=True)  # another constexpr
    kernel[(1,)](X, X, 64, 1e-6, BLOCK=64, EVEN=True, num_warps=8)  # another option
    monkeypatch.setattr(launch.knobs.runtime, "debug", True)  # Triton's debug setting (its run adds it)
    kernel[(1,)](X, X, 64, 1e-6, BLOCK=64, EVEN=True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # another device
    kernel[(1,)](X, X, 64, 1e-6, BLOCK=64, EVEN=True)
    assert len(fake.runs) == len(SPECIALISED) + 4


def test_what_triton_does_not_specialise_on_reuses_the_kernel(direct):
    kernel, fake = direct
    kernel[(1,)](X, X, 64, 1e-6, BLOCK=64, EVEN=True)
    same = [(X, X, 64, 0.5), (X, X, 4096, 1e-6), (X[8:], X, 48, 1e-6)]  # a float; ints and offsets of one class
    assert jit_calls(kernel, fake, same) == 0


def test_a_key_blind_to_alignment_would_reuse_a_kernel_compiled_for_aligned_pointers(direct, monkeypatch):
    """The planted key: dtypes only. The same calls then take the JIT path less often than Triton
    specialises, which the count in the test above would show."""
    kernel, fake = direct
    monkeypatch.setattr(launch, "specialisation_key", lambda args: tuple(getattr(a, "dtype", a) for a in args))
    assert jit_calls(kernel, fake, SPECIALISED) < len(SPECIALISED)


def test_a_parameter_left_to_its_default_or_a_positional_constexpr_is_refused(direct):
    kernel, _ = direct
    with pytest.raises(TypeError, match=r"pass \['EVEN'\] by keyword"):
        kernel[(1,)](torch.zeros(4), torch.zeros(4), 4, 1e-6, BLOCK=4)
    kernel.positional = 4  # BLOCK and EVEN constexprs, as first_constexpr reads them from a kernel
    with pytest.raises(TypeError, match="pass its constexprs by keyword"):
        kernel[(1,)](torch.zeros(4), torch.zeros(4), 4, 1e-6, 64, EVEN=True)


def test_the_first_constexpr_is_read_from_the_kernels_annotations():
    from kerneltrial.ops import rms_norm

    assert launch.first_constexpr(rms_norm._rms_norm_rows.fn) == rms_norm._rms_norm_rows.fn.arg_names.index(
        "BLOCK_ROWS"
    )


@pytest.mark.skipif(not torch.cuda.is_available() or launch.interpreted(), reason="needs compiled Triton kernels")
def test_every_reuse_on_the_gpu_is_the_kernel_jit_would_pick(monkeypatch):
    original = launch.Direct.launch
    reuses: list[str] = []

    def checked(self: launch.Direct, grid: tuple[int, ...], args: tuple[Any, ...], meta: dict[str, Any]) -> None:
        key = self.key(args, meta)
        kept = self.kernels.get(key)
        if kept is not None:
            picked = self.fn.run(*args, grid=grid, warmup=True, **meta)
            assert picked is kept[0], f"{self.fn.__name__}: reused a kernel JIT would not pick for {key}"
            reuses.append(self.fn.__name__)
        original(self, grid, args, meta)

    monkeypatch.setattr(launch.Direct, "launch", checked)
    device = torch.device("cuda")
    for op in all_ops():
        for impl in op.impls.values():
            if impl.name not in ("control", "kerneltrial"):  # every candidate: 383 s on an H100, session 22
                continue
            for layout in op.layouts:
                for seed, c in enumerate(op.small_cases):
                    case = Case(c.shape, c.dtype, layout)
                    if impl.supports(case):
                        result = check(op, impl, case, seed=seed, device=device, thorough=seed == 0)
                        assert result.passed, f"{op.name}/{impl.name} {case.id}: {result.message}"
    # every kernel the entry points and controls launch more than once per key (a CPU replay of this
    # loop under the interpreter, session 22's review: 11 with exact int values in the key)
    assert len(set(reuses)) >= 10, sorted(set(reuses))
