"""GPU clocks per sample through NVML (nvidia-ml-py), so throttled samples can be flagged.

`ClockReader.read()` returns (SM MHz, memory MHz) now, or (None, None) where NVML is not
available (a CPU run, or no nvidia-ml-py): the timing rows then carry empty clock fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerneltrial.rundir.provenance import visible_gpu


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
            gpu = visible_gpu()  # NVML numbers every GPU of the machine; torch's cuda:0 is this one
            if gpu and not gpu.isdigit():
                return cls(handle=pynvml.nvmlDeviceGetHandleByUUID(gpu), nvml=pynvml)
            return cls(handle=pynvml.nvmlDeviceGetHandleByIndex(int(gpu or 0)), nvml=pynvml)
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
