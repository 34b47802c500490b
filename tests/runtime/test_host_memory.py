"""``HostMemory``: the host's memory through the ``GpuView`` seam, for servers without a GPU."""

from __future__ import annotations

from pathlib import Path

from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.host_memory import HostMemory


def test_reads_total_and_available_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"
                       "HugePages_Total:       0\n")
    host = HostMemory(meminfo)
    memory = host.memory()
    assert memory.total == 24_000_000 * 1024
    assert memory.free == 20_000_000 * 1024
    assert memory.used == 4_000_000 * 1024


def test_is_a_gpu_view_with_a_stable_host_identity() -> None:
    host = HostMemory()
    assert isinstance(host, GpuView)
    assert host.uuid.startswith("host-") and host.uuid == HostMemory().uuid
    state = host.state()
    assert state.uuid == host.uuid and state.memory_total > 0 and state.processes == ()
    assert state.power_limit_w is None and state.sm_clock_mhz is None
