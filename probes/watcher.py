"""Memory headroom: sample the GPU's free memory through the runtime's ``GpuView`` while load runs.

The minimum free memory is part of every boot record; a candidate whose headroom falls below the
study's floor is rejected even if it survived: a server with 825 MiB free at worst under text can still
crash 144 MiB short on one maximum-size image.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from elsa_tune.runtime.gpu import GpuMemory, GpuView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadroomSummary:
    samples: int
    min_free_bytes: int | None
    max_used_bytes: int | None
    total_bytes: int | None
    errors: int

    def below(self, floor_bytes: int) -> bool | None:
        """``None`` when nothing could be read: unknown headroom never passes silently as fine."""
        if self.min_free_bytes is None:
            return None
        return self.min_free_bytes < floor_bytes


class MemoryWatcher:
    """A background thread reading ``gpu.memory()`` every ``interval_s`` until stopped.

    Use as a context manager around the load; ``summary()`` may be called at any time.
    """

    def __init__(self, gpu: GpuView, interval_s: float = 0.1) -> None:
        self._gpu = gpu
        self._interval = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._samples = 0
        self._errors = 0
        self._min_free: int | None = None
        self._max_used: int | None = None
        self._total: int | None = None

    def __enter__(self) -> MemoryWatcher:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="elsa-memory-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> HeadroomSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self._interval))
            self._thread = None
        self._sample()
        return self.summary()

    def summary(self) -> HeadroomSummary:
        with self._lock:
            return HeadroomSummary(self._samples, self._min_free, self._max_used, self._total, self._errors)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        try:
            reading: GpuMemory = self._gpu.memory()
        except Exception as exc:  # a GPU view that fails must not kill the measurement; it is counted
            with self._lock:
                self._errors += 1
            log.debug("memory sample failed: %s", exc)
            return
        with self._lock:
            self._samples += 1
            self._total = reading.total
            self._min_free = reading.free if self._min_free is None else min(self._min_free, reading.free)
            self._max_used = reading.used if self._max_used is None else max(self._max_used, reading.used)


def wait_for(predicate: object, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``predicate()`` until true or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(interval_s)
    return bool(callable(predicate) and predicate())
