"""``NvmlGpu`` without a GPU: the real NVML failing here, and a stand-in NVML library for the mapping.

The stand-in is used only where the real thing cannot run (no NVIDIA driver on the test machine); the
real GPU is covered by ``test_nvml_gpu.py`` (``-m gpu``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from elsa_tune.errors import EnvironmentError_
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.nvml import list_gpus, open_gpu


def test_without_a_driver_nvml_init_is_an_environment_error_with_a_remedy() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    with pytest.raises(EnvironmentError_) as caught:
        open_gpu(0)
    assert "NVML could not be initialised" in caught.value.message
    assert "--gpus" in caught.value.remedy
    assert caught.value.exit_code == 4


class _NVMLError(Exception):
    pass


class _NotSupported(_NVMLError):
    pass


def fake_nvml(count: int = 2) -> Any:
    """An NVML library of ``count`` H200s: the functions NvmlGpu calls, with NVML's units."""
    calls = {"init": 0, "shutdown": 0}
    uuids = [f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000" for i in range(count)]

    def handle_by_index(i: int) -> int:
        if not 0 <= i < count:
            raise _NVMLError("Invalid Argument")
        return i

    def not_supported(*_: Any) -> Any:
        raise _NotSupported("Not Supported")

    lib = SimpleNamespace(
        NVMLError=_NVMLError, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_FEATURE_ENABLED=1,
        calls=calls,
        nvmlInit=lambda: calls.__setitem__("init", calls["init"] + 1),
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=handle_by_index,
        nvmlDeviceGetHandleByUUID=lambda u: uuids.index(u),
        nvmlDeviceGetUUID=lambda h: uuids[h],
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=150_000 << 20, used=(h + 1) << 30,
                                                          free=(150_000 << 20) - ((h + 1) << 30)),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=1 << 30),
                                                        SimpleNamespace(pid=4243, usedGpuMemory=None)],
        nvmlSystemGetProcessName=lambda pid: b"python3",
        nvmlSystemGetDriverVersion=lambda: "570.86.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 700_000,
        nvmlDeviceGetTemperature=lambda h, kind: 41,
        nvmlDeviceGetClockInfo=lambda h, kind: {1: 1980, 2: 3201}[kind],
        nvmlDeviceGetMaxClockInfo=not_supported,
        nvmlDeviceGetPersistenceMode=lambda h: 1,
    )
    return lib


def test_index_uuid_and_prefix_resolve_to_the_same_gpu() -> None:
    lib = fake_nvml()
    by_index = open_gpu("1", lib=lib)
    by_uuid = open_gpu(by_index.uuid, lib=lib)
    by_prefix = open_gpu(by_index.uuid[:12], lib=lib)
    assert by_index.index == by_uuid.index == by_prefix.index == 1
    assert isinstance(by_index, GpuView)
    assert [g.uuid for g in list_gpus(lib)] == [f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000" for i in range(2)]


def test_missing_gpu_names_the_available_ones_and_releases_nvml() -> None:
    lib = fake_nvml()
    with pytest.raises(EnvironmentError_) as caught:
        open_gpu(7, lib=lib)
    assert "GPU 7 does not exist" in caught.value.message
    assert "0 (NVIDIA H200, GPU-00000000" in caught.value.message and "1 (NVIDIA H200" in caught.value.message
    assert lib.calls["init"] == lib.calls["shutdown"] == 1
    with pytest.raises(EnvironmentError_, match="NVML sees no GPU"):
        open_gpu(0, lib=fake_nvml(count=0))


def test_memory_processes_and_state_units() -> None:
    with open_gpu(0, lib=fake_nvml()) as gpu:
        memory = gpu.memory()
        assert memory.used == 1 << 30 and memory.total == memory.used + memory.free
        procs = gpu.processes()
        assert [(p.pid, p.used_bytes, p.name) for p in procs] == [(4242, 1 << 30, "python3"), (4243, None, "python3")]
        state = gpu.state()
    assert state.uuid == gpu.uuid and state.name == "NVIDIA H200" and state.index == 0
    assert state.driver == "570.86.15" and state.cuda_driver == "12.8"
    assert state.power_limit_w == 700.0 and state.power_default_limit_w == 700.0
    assert (state.temperature_c, state.sm_clock_mhz, state.mem_clock_mhz) == (41, 1980, 3201)
    assert state.max_sm_clock_mhz is None          # NOT_SUPPORTED → None, not a crash
    assert state.persistence_mode is True and len(state.processes) == 2


def test_nvml_failure_mid_study_is_an_environment_error() -> None:
    lib = fake_nvml()
    gpu = open_gpu(0, lib=lib)

    def fallen_off(h: int) -> Any:
        raise _NVMLError("GPU is lost")

    lib.nvmlDeviceGetMemoryInfo = fallen_off
    with pytest.raises(EnvironmentError_, match="GPU is lost"):
        gpu.memory()
    gpu.close()
    gpu.close()
    assert lib.calls["shutdown"] == 1
