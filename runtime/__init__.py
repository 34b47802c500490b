"""Booting and stopping a runtime for a ``Candidate``: SGLang as a process or a container, the
simulated SGLang, startup-log parsing, failure classification, GPU access through NVML."""

from elsa_tune.runtime.boot_report import Adjustment, BootPhase, BootReport
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.gpu import GpuMemory, GpuState, GpuView
from elsa_tune.runtime.protocol import Exit, Health, HealthState, Runtime, Server

__all__ = ["Adjustment", "BootPhase", "BootReport", "Exit", "Failure", "FailureKind", "GpuMemory",
           "GpuState", "GpuView", "Health", "HealthState", "Runtime", "Server"]
