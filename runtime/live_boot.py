"""``LiveBoot``: what a runtime keeps about a server it started: the wait until it is ready, its health check,
and the stop that ends every one alike.

The process runtime (a process group) and the Docker runtime (a container) read a server's exit and halt it
differently; what surrounds that is the same and lives here. Ready means the log said so and ``/health``
answered 200; a server that exits first, or is not ready by the boot timeout, is a ``BootFailed`` classified
from its log (or the ``StudyError`` its log names). A server the runtime did not start has nothing to stop; a
second stop returns the first one's ``Exit``; a server that had died on its own is classified from its log as
having died after it was ready; after the halt, the GPU memory is waited for (bounded) until it is back at
its pre-boot level.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from elsa_tune.errors import BootFailed
from elsa_tune.runtime.endpoints import health, unhealthy
from elsa_tune.runtime.failure import Failure, FailureHints
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.protocol import Exit, Health, HealthState, RuntimeTimeouts
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
    """A server a runtime started: its family, its log, the GPU memory used before it, when it started, how it
    ended."""

    family: RuntimeFamily
    tee: LogTee
    baseline_used: int | None
    started: float
    exit: Exit | None = None

    def wait_ready(self, http: httpx.Client, base_url: str, *, exit_code: Callable[[], int | None],
                   halt: Callable[[], object], log_path: Path, timeouts: RuntimeTimeouts) -> None:
        """Return once the log said ready and ``/health`` answers 200.

        ``exit_code`` reads the server's exit status (``None`` while it runs). When it exits first, or is not ready
        ``timeouts.boot_s`` after it started, ``halt`` is called and ``BootFailed`` raised, classified from the log
        (a timeout without the exit status of our own kill); a log that names a study-wide problem raises that.
        """
        deadline = self.started + timeouts.boot_s
        while True:
            code = exit_code()
            if code is not None:
                self.tee.closed.wait(timeout=5.0)
                halt()
                text = self.tee.text()
                stopper = self.family.study_stopper(text)
                if stopper is not None:
                    raise stopper
                failure = self.family.classify(text, FailureHints(exit_code=code,
                                                                  elapsed_s=time.monotonic() - self.started))
                raise BootFailed(failure, log_path=str(log_path))
            if self.tee.ready.is_set() and health(http, base_url, timeouts.health_s)[0]:
                return
            if time.monotonic() >= deadline:
                halt()
                failure = self.family.classify(self.tee.text(), FailureHints(
                    timed_out=True, elapsed_s=time.monotonic() - self.started))
                raise BootFailed(failure, log_path=str(log_path))
            if self.tee.ready.wait(timeout=timeouts.poll_s):
                time.sleep(timeouts.poll_s)        # ready, not healthy yet: ask /health again after a pause

    def check(self, exit_code: Callable[[], int | None], base_url: str, timeout_s: float, *, server: str) -> Health:
        """DEAD once stopped, or once ``exit_code`` reads an exit (classified from the log as died after it was
        ready; ``server`` names it in the detail); otherwise what ``/health`` says."""
        if self.exit is not None:
            return Health(HealthState.DEAD, "stopped")
        code = exit_code()
        if code is not None:
            self.tee.closed.wait(timeout=5.0)
            return Health(HealthState.DEAD, f"{server} exited with {code}", self.died(code))
        return self.health(base_url, timeout_s)

    def health(self, base_url: str, timeout_s: float) -> Health:
        """``/health`` 200 → HEALTHY; anything else → UNHEALTHY (a hang when the log says so)."""
        with httpx.Client(trust_env=False) as http:
            ok, detail = health(http, base_url, timeout_s)
        return Health(HealthState.HEALTHY, detail) if ok else unhealthy(self.family, self.tee.text(), detail)

    def died(self, exit_code: int | None) -> Failure:
        """How the server died on its own after it was ready, classified from its log."""
        return self.family.classify(self.tee.text(), FailureHints(exit_code=exit_code, became_ready=True,
                                                                  elapsed_s=time.monotonic() - self.started))

    def finish(self, halt: Halt, gpu: GpuView | None, *, memory_release_s: float, margin_bytes: int) -> Exit:
        """Halt the server once, then wait for the GPU memory; a second call returns the first ``Exit``."""
        if self.exit is not None:
            return self.exit
        began = time.monotonic()
        returncode, killed, failure = halt()
        released, detail = wait_memory_released(gpu, self.baseline_used, timeout_s=memory_release_s,
                                                margin_bytes=margin_bytes)
        self.exit = Exit(returncode=returncode, killed=killed, gpu_memory_released=released,
                         seconds=round(time.monotonic() - began, 3), failure=failure, detail=detail)
        return self.exit
