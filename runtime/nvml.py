"""``NvmlGpu``: a real NVIDIA GPU read through NVML (``pynvml`` from nvidia-ml-py), never through CUDA.

The tuner process must not create a CUDA context (it would take GPU memory from the server it
measures), so everything here goes through NVML: index ↔ UUID, memory used/free/total, the compute
processes on the GPU, current and maximum clocks, temperature, power limit and its default, driver
and CUDA driver versions, persistence mode.

    gpu = open_gpu(0)                 # or open_gpu("GPU-5d3c…"), EnvironmentError_ if absent
    gpu.memory().used, gpu.state().sm_clock_mhz
    gpu.close()

Errors: NVML that cannot start (no driver, no GPU, container without ``--gpus``) and a GPU that does
not exist raise ``EnvironmentError_`` with a remedy; the latter names the GPUs that do exist.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from elsa_tune.errors import EnvironmentError_
from elsa_tune.runtime.gpu import GpuMemory, GpuProcess, GpuState

_lock = threading.Lock()


def _default_lib() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise EnvironmentError_("pynvml is not installed", remedy="pip install nvidia-ml-py") from exc
    return pynvml


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU as NVML lists it."""

    index: int
    uuid: str
    name: str
    memory_total: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Session:
    """``nvmlInit``/``nvmlShutdown`` around a use; NVML counts the references itself."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        try:
            with _lock:
                lib.nvmlInit()
        except lib.NVMLError as exc:
            raise EnvironmentError_(
                f"NVML could not be initialised ({exc}): no usable NVIDIA driver or GPU here",
                remedy="run on a machine with an NVIDIA GPU and driver (in a container: --gpus / the NVIDIA "
                       "container toolkit), or use the simulated runtime (`elsa-tune sim`)") from exc
        self.open = True

    def close(self) -> None:
        if self.open:
            self.open = False
            try:
                with _lock:
                    self.lib.nvmlShutdown()
            except self.lib.NVMLError:
                pass


def list_gpus(lib: Any = None) -> list[GpuIdentity]:
    """Every GPU NVML sees, by index."""
    nvml = lib or _default_lib()
    session = _Session(nvml)
    try:
        return [_identity(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        session.close()


def _identity(nvml: Any, index: int) -> GpuIdentity:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return GpuIdentity(index, _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle)),
                       int(nvml.nvmlDeviceGetMemoryInfo(handle).total))


def _describe(gpus: list[GpuIdentity]) -> str:
    if not gpus:
        return "NVML sees no GPU"
    return "available: " + ", ".join(f"{g.index} ({g.name}, {g.uuid})" for g in gpus)


class NvmlGpu:
    """A ``GpuView`` of one real GPU, chosen by index or UUID. Cheap enough to poll at 10 Hz."""

    def __init__(self, gpu: int | str, *, lib: Any = None) -> None:
        self._lib = lib or _default_lib()
        self._session = _Session(self._lib)
        try:
            gpus = [_identity(self._lib, i) for i in range(self._lib.nvmlDeviceGetCount())]
            match = [g for g in gpus if (g.index == gpu if isinstance(gpu, int) else g.uuid == gpu
                                         or (len(gpu) >= 8 and g.uuid.startswith(gpu)))]
            if not match:
                raise EnvironmentError_(f"GPU {gpu!r} does not exist; {_describe(gpus)}",
                                        remedy="pass one of the listed GPU indices or UUIDs to --gpu")
            self.identity = match[0]
            self._handle = self._lib.nvmlDeviceGetHandleByUUID(self.identity.uuid)
        except BaseException:
            self._session.close()
            raise

    @property
    def uuid(self) -> str:
        return self.identity.uuid

    @property
    def index(self) -> int:
        return self.identity.index

    def memory(self) -> GpuMemory:
        info = self._call(self._lib.nvmlDeviceGetMemoryInfo)
        return GpuMemory(total=int(info.total), used=int(info.used), free=int(info.free), at=time.monotonic())

    def processes(self) -> tuple[GpuProcess, ...]:
        """Compute processes using this GPU (pids are of the host's pid namespace)."""
        procs = self._call(self._lib.nvmlDeviceGetComputeRunningProcesses)
        result = []
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            result.append(GpuProcess(pid=int(proc.pid), used_bytes=int(used) if used is not None else None,
                                     name=self._process_name(int(proc.pid))))
        return tuple(result)

    def state(self) -> GpuState:
        lib = self._lib
        cuda = self._optional(lib.nvmlSystemGetCudaDriverVersion, system=True)
        power = self._optional(lib.nvmlDeviceGetPowerManagementLimit)
        default_power = self._optional(lib.nvmlDeviceGetPowerManagementDefaultLimit)
        persistence = self._optional(lib.nvmlDeviceGetPersistenceMode)
        return GpuState(
            index=self.index, uuid=self.uuid, name=self.identity.name,
            driver=_text(lib.nvmlSystemGetDriverVersion()),
            cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            memory_total=self.identity.memory_total,
            power_limit_w=power / 1000.0 if power is not None else None,
            power_default_limit_w=default_power / 1000.0 if default_power is not None else None,
            temperature_c=self._optional(lib.nvmlDeviceGetTemperature, lib.NVML_TEMPERATURE_GPU),
            sm_clock_mhz=self._optional(lib.nvmlDeviceGetClockInfo, lib.NVML_CLOCK_SM),
            mem_clock_mhz=self._optional(lib.nvmlDeviceGetClockInfo, lib.NVML_CLOCK_MEM),
            max_sm_clock_mhz=self._optional(lib.nvmlDeviceGetMaxClockInfo, lib.NVML_CLOCK_SM),
            persistence_mode=(persistence == lib.NVML_FEATURE_ENABLED) if persistence is not None else None,
            processes=self.processes(),
        )

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> NvmlGpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._handle, *args)
        except self._lib.NVMLError as exc:
            raise EnvironmentError_(f"NVML failed on GPU {self.index} ({self.uuid}): {exc}",
                                    remedy="check the GPU with nvidia-smi; a driver reset or a fallen-off GPU "
                                           "ends the study") from exc

    def _optional(self, fn: Any, *args: Any, system: bool = False) -> Any:
        """Values some GPUs or drivers do not report (NOT_SUPPORTED) become ``None``."""
        try:
            return fn(*args) if system else fn(self._handle, *args)
        except self._lib.NVMLError:
            return None

    def _process_name(self, pid: int) -> str:
        try:
            return _text(self._lib.nvmlSystemGetProcessName(pid))
        except (self._lib.NVMLError, AttributeError):
            return ""


def open_gpu(gpu: int | str, *, lib: Any = None) -> NvmlGpu:
    """The GPU by index (``0``) or UUID (``"GPU-5d3c…"``, a unique prefix of 8+ characters is enough)."""
    if isinstance(gpu, str) and gpu.isdigit():
        gpu = int(gpu)
    return NvmlGpu(gpu, lib=lib)
