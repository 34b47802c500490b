"""``HostMemory``: the host's memory as the device a CPU server runs on, read through the same ``GpuView``.

A llama.cpp server without a GPU keeps its weights, KV cache and compute buffers in host memory, so the
memory watcher, the headroom rules of the stress probes and the wait for memory after a stop read
``/proc/meminfo`` instead of NVML: ``total`` is ``MemTotal``, ``free`` is ``MemAvailable`` (what a new
allocation can still get without swapping), ``used`` their difference. The state names the CPU model and
the kernel; there are no clocks, power caps or temperatures to record.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from elsa_tune.runtime.gpu import GpuMemory, GpuState

_MEMINFO = Path("/proc/meminfo")
#: The start of the host's ``uuid`` (``host-<machine id>``): no GPU to pin a server to.
HOST_UUID_PREFIX = "host-"


def _meminfo(path: Path = _MEMINFO) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return values


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _machine_id() -> str:
    for path in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text[:12]
    return platform.node() or "unknown"


class HostMemory:
    """The host as a ``GpuView``: ``uuid`` is ``host-<machine id>``, memory from ``/proc/meminfo``."""

    def __init__(self, meminfo: Path = _MEMINFO) -> None:
        self._meminfo = meminfo
        self._uuid = f"{HOST_UUID_PREFIX}{_machine_id()}"
        self._name = f"{_cpu_name()} ({os.cpu_count() or '?'} cores)"

    @property
    def uuid(self) -> str:
        return self._uuid

    def memory(self) -> GpuMemory:
        info = _meminfo(self._meminfo)
        total = info.get("MemTotal", 0)
        free = info.get("MemAvailable", info.get("MemFree", 0))
        return GpuMemory(total=total, used=max(0, total - free), free=free, at=time.monotonic())

    def state(self) -> GpuState:
        return GpuState(index=-1, uuid=self._uuid, name=self._name, driver=f"Linux {platform.release()}",
                        cuda_driver=None, memory_total=self.memory().total, power_limit_w=None,
                        power_default_limit_w=None, temperature_c=None, sm_clock_mhz=None, mem_clock_mhz=None,
                        max_sm_clock_mhz=None, persistence_mode=None)
