"""GPU shared buffers (trial/vmm.py) when the device is short of memory: the driver's out of memory is
tried again once torch's caching allocator has given back what it keeps, and a failure after that
names the size and the device's free memory (a fake driver stands in for cuda.bindings); and an
isolated worker's cache is given back at each new case, not within one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from kerneltrial.trial import vmm

OOM, OK = 2, 0


@dataclass
class FakeDriver:
    """cuMemCreate answers out of memory until torch's cache was emptied (`frees_on_empty`), or always."""

    frees_on_empty: bool
    emptied: list[bool] = field(default_factory=list)
    calls: int = 0

    class CUresult:
        CUDA_ERROR_OUT_OF_MEMORY = OOM

    def cuMemCreate(self, size: int, prop: object, flags: int) -> tuple[int, str | None]:  # noqa: N802
        self.calls += 1
        return (OK, "handle") if self.emptied and self.frees_on_empty else (OOM, None)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    fake = FakeDriver(frees_on_empty=True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: fake.emptied.append(True))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (1 << 30, 80 << 30))
    return fake


def test_out_of_memory_is_tried_again_after_torch_gives_back_its_cache(driver: FakeDriver) -> None:
    assert vmm.created(driver, 4 << 30, object()) == "handle"
    assert driver.calls == 2 and driver.emptied == [True]


def test_out_of_memory_that_stays_names_the_size_and_the_free_memory(driver: FakeDriver) -> None:
    driver.frees_on_empty = False
    with pytest.raises(RuntimeError, match=r"cuMemCreate of 4294967296 bytes failed: 2 \(1073741824 of 85899345920"):
        vmm.created(driver, 4 << 30, object())
    assert driver.calls == 2


def test_a_worker_gives_back_its_cache_at_each_new_case_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """poison.poison_before_call, as the isolated worker calls it before each gate call: the cache is
    emptied when the arguments' sizes change, and blocks of their sizes are then poisoned too."""
    from kerneltrial.trial import poison

    emptied: list[bool] = []
    poisoned: list[list[int]] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(poison, "poison_free_blocks", lambda like: poisoned.append([t.numel() for t in like]))
    gpu, small, large = torch.device("cuda", 0), [torch.zeros(4), torch.zeros(2)], [torch.zeros(8)]
    out = [torch.zeros(3)]  # the last call's output
    sizes = poison.poison_before_call(small, [], gpu, ())
    assert sizes == (16, 8) and len(emptied) == 1 and poisoned[-1] == [4, 2]
    assert poison.poison_before_call(small, out, gpu, sizes) == sizes and len(emptied) == 1  # the same case
    assert poisoned[-1] == [3]  # the last output's size, as before
    assert poison.poison_before_call(large, out, gpu, sizes) == (32,) and len(emptied) == 2
    assert poisoned[-1] == [3, 8]  # emptied: the new arguments' size as well
    assert poison.poison_before_call(large, out, torch.device("cpu"), sizes) == (32,) and len(emptied) == 2
    assert poisoned[-1] == [3]
