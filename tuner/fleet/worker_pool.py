"""``WorkerPool``: ``--gpu 0,1`` on one host — one worker process per GPU, owned from start to stop.

Each GPU gets its own ``elsa-tune worker --gpu N`` process (its own runtime, ``GpuView`` and run folder),
so a worker that crashes or is killed takes nothing down with it, and the load generators of two GPUs do
not share one interpreter. The children join the same shared study (the storage URL); the pool only starts
them in their own process groups, forwards a stop, waits with a deadline and kills what is left in
``finally``. A child's exit code is its own; the pool's is the worst of them. The pool's first SIGINT/SIGTERM
is forwarded (each worker finishes its boot and writes its outputs); a second stops them now. A worker stops
its runtime's servers itself (they run in their own sessions); the server of a worker that dies by a signal
(the OOM killer, ``kill -9``) is found by its lease and stopped by the pool (``runtime/lease.py``).
A SIGKILLed pool leaves no worker running: each child gets SIGTERM when the pool's process dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elsa_tune.errors import ConfigError
from elsa_tune.runtime.lease import LeaseBook
from elsa_tune.tuner.flow.signals import Interrupts

log = logging.getLogger(__name__)


def parse_gpus(text: str) -> list[str]:
    """``"0,1"`` → ``["0", "1"]``; refuses duplicates (two workers on one card would measure each other)."""
    gpus = [g.strip() for g in text.split(",") if g.strip()]
    if not gpus:
        raise ConfigError(f"--gpu {text!r} names no GPU", remedy="pass e.g. --gpu 0 or --gpu 0,1")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"--gpu {text!r} names a GPU twice", remedy="one worker per GPU: --gpu 0,1")
    return gpus


@dataclass
class WorkerProcess:
    gpu: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid


class WorkerPool:
    """Start ``argv_for(gpu)`` for every GPU, wait for all of them (``timeout_s``), clean up in ``finally``."""

    def __init__(self, gpus: Sequence[str], argv: Sequence[str], *, log_dir: Path, timeout_s: float,
                 stop_grace_s: float = 30.0, interrupts: Interrupts | None = None,
                 on_started: Callable[[Sequence[WorkerProcess]], None] | None = None) -> None:
        """``interrupts``: an ``Interrupts`` the caller already entered (a study running the pool as one of its
        phases); the pool reads it instead of installing its own handlers. ``on_started`` sees every child once
        all are started (a study records their pids, to wait for them when it resumes)."""
        self.gpus = list(gpus)
        self.argv = list(argv)
        self.log_dir = Path(log_dir)
        self.timeout_s = timeout_s
        self.stop_grace_s = stop_grace_s
        self.interrupts = interrupts
        self.on_started = on_started
        self.workers: list[WorkerProcess] = []

    def command(self, gpu: str) -> list[str]:
        return [sys.executable, "-m", "elsa_tune", "worker", *self.argv, "--gpu", gpu]

    def run(self) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for gpu in self.gpus:
                path = self.log_dir / f"worker-gpu{gpu}.log"
                with open(path, "ab") as out:
                    proc = subprocess.Popen(self.command(gpu), stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_stop_with_parent)
                self.workers.append(WorkerProcess(gpu, proc, path))
                log.info("worker for GPU %s started (pid %d, log %s)", gpu, proc.pid, path)
            if self.on_started is not None:
                self.on_started(list(self.workers))
            return self._wait()
        finally:
            self.stop()

    def _wait(self) -> int:
        deadline = time.monotonic() + self.timeout_s
        codes: dict[str, int] = {}
        with (contextlib.nullcontext(self.interrupts) if self.interrupts else Interrupts()) as interrupts:
            forwarded = False
            while len(codes) < len(self.workers):
                if interrupts.requested and not forwarded:   # each worker finishes its boot and writes outputs
                    forwarded = True
                    for w in self.workers:
                        if w.process.poll() is None:
                            _signal_group(w.pid, signal.SIGTERM)
                if self._poll(codes):
                    continue
                if time.monotonic() > deadline:
                    log.warning("workers still running after %.0f s: stopping them", self.timeout_s)
                    return 124
                time.sleep(0.2)
        return max(codes.values(), key=abs, default=0)

    def _poll(self, codes: dict[str, int]) -> bool:
        """Collect exit codes; ``True`` when a worker exited just now."""
        changed = False
        for w in self.workers:
            if w.gpu in codes:
                continue
            code = w.process.poll()
            if code is not None:
                codes[w.gpu] = code
                changed = True
                (log.info if code == 0 else log.warning)("worker for GPU %s exited with %d (log %s)", w.gpu, code,
                                                         w.log_path)
                _reap_servers_of(w)
        return changed

    def stop(self) -> None:
        """Stop every live worker: SIGTERM (finish the boot), after ``stop_grace_s`` a second SIGTERM (stop the
        server now, in the worker's ``finally``), after another ``stop_grace_s`` SIGKILL."""
        live = [w for w in self.workers if w.process.poll() is None]
        for attempt in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
            live = [w for w in live if w.process.poll() is None]
            for w in live:
                _signal_group(w.pid, attempt)
            deadline = time.monotonic() + (self.stop_grace_s if attempt is signal.SIGTERM else 10.0)
            for w in live:
                try:
                    w.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    continue
        for w in self.workers:
            _reap_servers_of(w)


def _reap_servers_of(worker: WorkerProcess) -> None:
    """A worker that died by a signal had no ``finally``: stop the servers its leases name."""
    code = worker.process.returncode
    if code is not None and code < 0:
        LeaseBook().reap(owner_pid=worker.pid)


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the pool's process dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``), so a killed pool leaves no worker booting on its GPUs; the worker then finishes
    its boot, writes its outputs and stops its server like on any SIGTERM."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))   # 1 = PR_SET_PDEATHSIG


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
