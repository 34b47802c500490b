from __future__ import annotations

import threading
import time

from elsa_tune.probes.watcher import MemoryWatcher
from elsa_tune.runtime.gpu import GpuMemory, GpuState


class ScriptedGpu:
    """A GpuView whose used memory follows a script; stands in for NVML in this unit test only."""

    def __init__(self, total: int, used: list[int], fail_every: int = 0) -> None:
        self._total = total
        self._used = used
        self._i = 0
        self._fail_every = fail_every
        self._lock = threading.Lock()

    @property
    def uuid(self) -> str:
        return "GPU-test"

    def memory(self) -> GpuMemory:
        with self._lock:
            self._i += 1
            if self._fail_every and self._i % self._fail_every == 0:
                raise RuntimeError("NVML hiccup")
            used = self._used[min(self._i - 1, len(self._used) - 1)]
        return GpuMemory(total=self._total, used=used, free=self._total - used, at=time.monotonic())

    def state(self) -> GpuState:  # pragma: no cover - not used here
        raise NotImplementedError


def test_watcher_keeps_minimum_free_and_counts_errors() -> None:
    gpu = ScriptedGpu(total=1000, used=[100, 500, 950, 400, 300], fail_every=4)
    with MemoryWatcher(gpu, interval_s=0.01) as watcher:
        time.sleep(0.2)
    summary = watcher.summary()
    assert summary.min_free_bytes == 50
    assert summary.max_used_bytes == 950
    assert summary.errors >= 1
    assert summary.below(100) is True
    assert summary.below(10) is False


def test_unknown_headroom_is_not_fine() -> None:
    gpu = ScriptedGpu(total=1000, used=[0], fail_every=1)
    with MemoryWatcher(gpu, interval_s=0.01) as watcher:
        time.sleep(0.05)
    assert watcher.summary().below(1) is None
