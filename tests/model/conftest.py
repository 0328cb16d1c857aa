"""Model tests run torch on one CPU thread: the tiny model's GEMMs are a few microseconds of
work, and on a loaded 2-core machine torch's thread pool waited ~35x longer than one thread
computed (a bf16 [8, 64] x [64, 512] linear: 8 ms with 2 threads, 0.23 ms with 1)."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
