"""``ServerProcess``: boot a server of any runtime family as a local process tree, check it, stop it and wait
for the GPU; ``SGLangProcess`` is it for SGLang.

The family (``runtime/family.py``) says how a candidate becomes a command line, which log line means ready, how
the log becomes a ``BootReport`` and how a failure is classified; this module owns the process.

Each boot is its own session and process group (``start_new_session=True``) so the whole tree —
launcher, scheduler(s), detokenizer — is signalled together. The GPU is pinned by UUID
(``CUDA_VISIBLE_DEVICES=<uuid>``), the server listens on ``127.0.0.1`` on a free port, and its
output is teed into ``boot_dir/server.log``. Ready means the ready line was printed **and**
``GET /health`` answers 200. Any boot failure kills the tree, classifies the log and raises
``BootFailed``; nothing is left running. ``stop`` sends SIGTERM to the group, SIGKILL after
``timeouts.stop_s``, then waits (bounded) through the ``GpuView`` until the memory used falls back to
the pre-boot level. Every server has a lease (``runtime/lease.py``) from its start to its stop, so that the
server of a tuner killed in between is found and stopped later (``reap_orphans``).

The launch command is configurable so a fork's own virtual environment works, e.g.
``SGLangProcess(("/opt/fork/bin/python", "-m", "sglang.launch_server"), gpu)``, or
``ServerProcess(family(FamilyName.LLAMACPP), ("/opt/llama.cpp/bin/llama-server",), gpu)``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from elsa_tune.errors import BootFailed, RuntimeUnavailable
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.flags import FlagSet, harvest
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.lease import LeaseBook, Reaped, ServerLease
from elsa_tune.runtime.live_boot import NOTHING_TO_STOP, LiveBoot
from elsa_tune.runtime.live_boot import wait_memory_released as wait_memory_released  # re-exported (was defined here)
from elsa_tune.runtime.ports import free_port
from elsa_tune.runtime.process_group import ProcessGroup
from elsa_tune.runtime.protocol import DEFAULT_TIMEOUTS, Exit, Health, HealthState, RuntimeTimeouts, Server
from elsa_tune.runtime.server_log import LogTee
from elsa_tune.runtime.sglang import SGLANG
from elsa_tune.search_spaces.candidate import Candidate

log = logging.getLogger(__name__)

DEFAULT_LAUNCH: tuple[str, ...] = SGLANG.default_launch


@dataclass(kw_only=True)
class _Boot(LiveBoot):
    popen: subprocess.Popen[bytes]
    pgid: int
    lease: ServerLease | None = None


class ServerProcess:
    """The ``Runtime`` for a server of ``family`` as a local process. One server per instance at a time is typical.

    ``gpu`` is the device whose memory is watched (a ``GpuView``: an NVIDIA GPU through NVML, or the host's memory
    for a CPU server); the server is pinned to it by UUID when it is a GPU (``pin_gpu``).
    """

    def __init__(self, family: RuntimeFamily, launch: Sequence[str] | None = None, gpu: GpuView | None = None, *,
                 host: str = "127.0.0.1", timeouts: RuntimeTimeouts = DEFAULT_TIMEOUTS,
                 extra_env: Mapping[str, str] | None = None, ready_line: str | None = None,
                 memory_margin_bytes: int = 512 << 20, port_retries: int = 1,
                 leases: LeaseBook | None = None, pin_gpu: bool = True) -> None:
        launch = tuple(launch) if launch is not None else family.default_launch
        if not launch:
            raise RuntimeUnavailable("empty launch command",
                                     remedy=f"pass e.g. {' '.join(family.default_launch)!r}")
        self._family = family
        self.pin_gpu = pin_gpu
        self.launch = tuple(launch)
        self.gpu = gpu
        self.host = host
        self.timeouts = timeouts
        self.extra_env = dict(extra_env or {})
        self.ready_line = ready_line if ready_line is not None else family.ready_line
        self.memory_margin_bytes = memory_margin_bytes
        self.port_retries = port_retries
        self.leases = leases if leases is not None else LeaseBook()
        #: written into each lease when the GPU is a simulated card (its folder), so a reaper can watch it
        self.lease_card_dir: Path | None = None
        self._boots: dict[str, _Boot] = {}

    @property
    def family(self) -> RuntimeFamily:
        return self._family

    def flag_set(self) -> FlagSet:
        """The launch command's own ``--help`` flag list (bounded: importing a Python runtime takes a while)."""
        self._check_launch()
        return harvest(self.launch, timeout_s=300.0, parse=self._family.parse_help, help_flag=self._family.help_flag,
                       env={**os.environ, **self._family.help_env})

    # ---- start ------------------------------------------------------------------------------------

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        """Boot ``candidate``; return when ready or raise ``BootFailed`` (no process left behind)."""
        self._check_launch()
        boot_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(self.port_retries + 1):
            try:
                return self._start_once(candidate, boot_dir)
            except BootFailed as exc:
                if exc.failure.kind is not FailureKind.PORT_IN_USE or attempt == self.port_retries:
                    raise
                log.warning("port taken between choice and bind; retrying with another port")
                (boot_dir / "server.log").rename(boot_dir / f"server.port-retry-{attempt + 1}.log")
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_launch(self) -> None:
        exe = self.launch[0]
        found = (os.access(exe, os.X_OK) and Path(exe).is_file()) if os.sep in exe else shutil.which(exe) is not None
        if not found:
            raise RuntimeUnavailable(
                f"the launch command {exe!r} does not exist or is not executable",
                remedy=f"install the {self._family.name.value} runtime there, or configure the launch command of its "
                       f"own environment (--launch, or the space's runtime.command), e.g. "
                       f"{' '.join(self._family.default_launch)}")

    def argv(self, candidate: Candidate, port: int) -> list[str]:
        """The exact command line of a boot: launch + candidate flags + the host and port we own."""
        return self._family.argv(self.launch, candidate, self.host, port)

    def _env(self, candidate: Candidate) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(candidate.env)
        env["PYTHONUNBUFFERED"] = "1"
        if self.gpu is not None and self.pin_gpu:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu.uuid
        return env

    def _start_once(self, candidate: Candidate, boot_dir: Path) -> Server:
        port = free_port(self.host)
        argv = self.argv(candidate, port)
        log_path = boot_dir / "server.log"
        log_path.write_text("")
        baseline = self.gpu.memory().used if self.gpu is not None else None
        (boot_dir / "launch.json").write_text(json.dumps(
            {"argv": argv, "env": {**self.extra_env, **candidate.env}, "port": port,
             "gpu_uuid": self.gpu.uuid if self.gpu else None, "gpu_used_before_bytes": baseline}, indent=2))
        started_wall, started = time.time(), time.monotonic()
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=self._env(candidate), start_new_session=True)
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot run {argv[0]!r}: {exc}",
                                     remedy="check the launch command and its permissions") from exc
        assert popen.stdout is not None
        stream = popen.stdout
        tee = LogTee(iter(stream.readline, b""), log_path, ready_line=self.ready_line)
        tee.start()
        boot = _Boot(family=self._family, popen=popen, tee=tee, pgid=popen.pid, baseline_used=baseline, started=started,
                     lease=self._lease(popen.pid, port, boot_dir, argv))
        base_url = f"http://{self.host}:{port}"
        ready = False
        try:
            with httpx.Client(trust_env=False) as client:
                boot.wait_ready(client, base_url, exit_code=boot.popen.poll, halt=lambda: self._terminate(boot),
                                log_path=log_path, timeouts=self.timeouts)
                info = self._family.server_info(client, base_url, self.timeouts.health_s)
            report = self._family.boot_report(tee.text(), candidate, info)
            _write_report(boot_dir, report)
            ready = True
        finally:
            if not ready:
                self._terminate(boot)
        handle = str(popen.pid)
        self._boots[handle] = boot
        return Server(candidate=candidate, base_url=base_url, port=port, boot_dir=boot_dir, log_path=log_path,
                      report=report, started_at=started_wall, ready_at=time.time(), handle=handle,
                      gpu_uuid=self.gpu.uuid if self.gpu else None)

    def _lease(self, pid: int, port: int, boot_dir: Path, argv: Sequence[str]) -> ServerLease | None:
        lease = ServerLease.for_server(pid, gpu_uuid=self.gpu.uuid if self.gpu else None, port=port,
                                       run_dir=boot_dir, command=argv, card_dir=self.lease_card_dir)
        try:
            self.leases.write(lease)
        except OSError as exc:   # the boot goes on; only a later reaper would miss this server
            log.warning("cannot write the server lease into %s: %s (a killed tuner's server would not be found)",
                        self.leases.directory, exc)
            return None
        return lease

    def reap_orphans(self) -> list[Reaped]:
        """Stop the servers that dead owners (killed tuners or workers) left on this runtime's GPU."""
        book = LeaseBook(self.leases.directory, stop_timeout_s=self.timeouts.stop_s,
                         memory_release_timeout_s=self.timeouts.memory_release_s, cards=self.leases.cards)
        return book.reap(gpu=self.gpu) if self.gpu is not None else []

    # ---- check ------------------------------------------------------------------------------------

    def check(self, server: Server) -> Health:
        """Alive and ``/health`` 200 → HEALTHY; alive but failing → UNHEALTHY; gone → DEAD (classified)."""
        boot = self._boots.get(server.handle)
        if boot is None:
            return Health(HealthState.DEAD, "stopped")
        return boot.check(boot.popen.poll, server.base_url, self.timeouts.health_s, server="the server process")

    # ---- stop -------------------------------------------------------------------------------------

    def stop(self, server: Server) -> Exit:
        """Kill the tree, wait for it, wait for the GPU memory. Idempotent; never raises for a dead server."""
        boot = self._boots.get(server.handle)
        if boot is None:
            return NOTHING_TO_STOP

        def halt() -> tuple[int | None, bool, Failure | None]:
            code = boot.popen.poll()
            failure = boot.died(code) if code is not None else None
            returncode, killed = self._terminate(boot)
            return returncode, killed, failure

        return boot.finish(halt, self.gpu, memory_release_s=self.timeouts.memory_release_s,
                           margin_bytes=self.memory_margin_bytes)

    def _terminate(self, boot: _Boot) -> tuple[int | None, bool]:
        """Stop the group (``ProcessGroup.stop``), close the log, drop the lease. Safe to call twice."""
        killed = ProcessGroup(boot.pgid).stop(self.timeouts.stop_s, leader=boot.popen)
        boot.tee.closed.wait(timeout=5.0)
        if boot.popen.stdout is not None and boot.tee.closed.is_set():
            boot.popen.stdout.close()
        if boot.lease is not None:
            self.leases.remove(boot.lease)
        return boot.popen.returncode, killed


def _write_report(boot_dir: Path, report: BootReport) -> None:
    (boot_dir / "boot_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))


class SGLangProcess(ServerProcess):
    """SGLang (or a fork) as a local process: ``ServerProcess`` of the SGLang family."""

    def __init__(self, launch: Sequence[str] = DEFAULT_LAUNCH, gpu: GpuView | None = None, **options: Any) -> None:
        super().__init__(SGLANG, launch, gpu, **options)
