"""``LiveBoot``: what a runtime keeps about a server it started, and the stop that ends every one alike.

The process runtime (a process group) and the Docker runtime (a container) halt a server differently; what
surrounds the halt is the same and lives here: a server the runtime did not start has nothing to stop; a second
stop returns the first one's ``Exit``; a server that had died on its own is classified from its log as having
died after it was ready; after the halt, the GPU memory is waited for (bounded) until it is back at its
pre-boot level.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from elsa_tune.runtime.classify import classify
from elsa_tune.runtime.failure import Failure, FailureHints
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.protocol import Exit
from elsa_tune.runtime.server_log import LogTee

#: The stop of a server this runtime did not start.
NOTHING_TO_STOP = Exit(returncode=None, killed=False, gpu_memory_released=True, seconds=0.0,
                       detail="not started by this runtime (nothing to stop)")

#: How a runtime halts one server: its return code, whether it took a SIGKILL, and how it had died when it had
#: died on its own before the stop.
Halt = Callable[[], tuple[int | None, bool, Failure | None]]


def wait_memory_released(gpu: GpuView | None, baseline_used: int | None, *, timeout_s: float,
                         margin_bytes: int = 512 << 20, poll_s: float = 0.2) -> tuple[bool, str]:
    """Wait until ``gpu`` uses no more than ``baseline_used + margin_bytes``; ``(released, detail)``.

    Bounded by ``timeout_s``. Without a GPU view there is nothing to wait for: ``(True, reason)``.
    """
    if gpu is None or baseline_used is None:
        return True, "no GPU view: memory release not watched"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            used = gpu.memory().used
        except Exception as exc:  # NVML can fail mid-study (driver reset); report, never hang
            return False, f"GPU memory could not be read: {exc}"
        if used <= baseline_used + margin_bytes:
            return True, f"GPU memory back to {used / 2**20:.0f} MiB (pre-boot {baseline_used / 2**20:.0f} MiB)"
        if time.monotonic() >= deadline:
            return False, (f"GPU memory still {used / 2**20:.0f} MiB after {timeout_s:.0f} s "
                           f"(pre-boot {baseline_used / 2**20:.0f} MiB): another process may hold it")
        time.sleep(poll_s)


@dataclass(kw_only=True)
class LiveBoot:
    """A server a runtime started: its log, the GPU memory used before it, when it started, how it ended."""

    tee: LogTee
    baseline_used: int | None
    started: float
    exit: Exit | None = None

    def died(self, exit_code: int | None) -> Failure:
        """How the server died on its own after it was ready, classified from its log."""
        return classify(self.tee.text(), FailureHints(exit_code=exit_code, became_ready=True,
                                                      elapsed_s=time.monotonic() - self.started))

    def finish(self, halt: Halt, gpu: GpuView | None, *, memory_release_timeout_s: float,
               margin_bytes: int) -> Exit:
        """Halt the server once, then wait for the GPU memory; a second call returns the first ``Exit``."""
        if self.exit is not None:
            return self.exit
        began = time.monotonic()
        returncode, killed, failure = halt()
        released, detail = wait_memory_released(gpu, self.baseline_used, timeout_s=memory_release_timeout_s,
                                                margin_bytes=margin_bytes)
        self.exit = Exit(returncode=returncode, killed=killed, gpu_memory_released=released,
                         seconds=round(time.monotonic() - began, 3), failure=failure, detail=detail)
        return self.exit
