"""``DirectoryGpu``: a ``GpuView`` whose memory is held by live processes, for tests without a GPU.

A process "holds" memory by writing ``<dir>/<pid>`` containing a byte count; the bytes count as used
while that pid is alive (a zombie counts as gone), exactly as a GPU frees a dead process's memory.
``fake_sglang.py``'s scheduler child does this, so ``stop`` really has to kill the tree to see it fall.
"""

from __future__ import annotations

import time
from pathlib import Path

from elsa_tune.runtime.gpu import GpuMemory, GpuProcess, GpuState

TOTAL = 32 << 30


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


class DirectoryGpu:
    def __init__(self, directory: Path, uuid: str = "GPU-0f0e0d0c-fake-4000-8000-000000000000",
                 base_used: int = 300 << 20) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._uuid = uuid
        self.base_used = base_used

    @property
    def uuid(self) -> str:
        return self._uuid

    def holders(self) -> dict[int, int]:
        held = {}
        for entry in self.directory.iterdir():
            if entry.name.isdigit() and _alive(int(entry.name)):
                try:
                    held[int(entry.name)] = int(entry.read_text() or 0)
                except (OSError, ValueError):
                    continue
        return held

    def memory(self) -> GpuMemory:
        used = self.base_used + sum(self.holders().values())
        return GpuMemory(total=TOTAL, used=used, free=TOTAL - used, at=time.monotonic())

    def state(self) -> GpuState:
        return GpuState(index=0, uuid=self._uuid, name="Fake GPU (directory)", driver="0", cuda_driver=None,
                        memory_total=TOTAL, power_limit_w=None, power_default_limit_w=None, temperature_c=None,
                        sm_clock_mhz=None, mem_clock_mhz=None, max_sm_clock_mhz=None, persistence_mode=None,
                        processes=tuple(GpuProcess(pid, used) for pid, used in self.holders().items()))
