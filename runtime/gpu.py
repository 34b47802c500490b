"""The GPU seam: one protocol read by the memory watcher, two implementations.

``NvmlGpu`` (``runtime/nvml.py``) reads a real NVIDIA GPU through pynvml, never CUDA: the tuner
process must not create a CUDA context. ``SimulatedGpu`` (``runtime/sim/``) reads the simulated
card's memory the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GpuMemory:
    """One memory sample in bytes, with its monotonic timestamp."""

    total: int
    used: int
    free: int
    at: float


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    name: str = ""


@dataclass(frozen=True)
class GpuState:
    """What about a GPU affects a measurement: recorded at preflight and with every boot."""

    index: int
    uuid: str
    name: str
    driver: str
    cuda_driver: str | None
    memory_total: int
    power_limit_w: float | None
    power_default_limit_w: float | None
    temperature_c: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    persistence_mode: bool | None
    processes: tuple[GpuProcess, ...] = ()
    schema_version: int = SCHEMA_VERSION


@runtime_checkable
class GpuView(Protocol):
    """Read-only view of one GPU. Every method is cheap enough to call at 10 Hz."""

    @property
    def uuid(self) -> str: ...

    def memory(self) -> GpuMemory: ...

    def state(self) -> GpuState: ...
