"""GPU clocks per sample through NVML (nvidia-ml-py), so throttled samples can be flagged.

`ClockReader.read()` returns (SM MHz, memory MHz) now, or (None, None) where NVML is not
available (a CPU run, or no nvidia-ml-py): the timing rows then carry empty clock fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ClockReader:
    handle: Any = None
    nvml: Any = None

    @classmethod
    def open(cls, enabled: bool) -> ClockReader:
        if not enabled:
            return cls()
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(handle=pynvml.nvmlDeviceGetHandleByIndex(0), nvml=pynvml)
        except Exception:  # no NVML here: clocks are simply not recorded
            return cls()

    def read(self) -> tuple[int | None, int | None]:
        if self.handle is None:
            return None, None
        n = self.nvml
        return n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM), n.nvmlDeviceGetClockInfo(
            self.handle, n.NVML_CLOCK_MEM
        )

    def max_sm_mhz(self) -> int | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetMaxClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)
