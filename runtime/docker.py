"""``SGLangDocker``: boot SGLang in a Docker container through the docker SDK, check it, stop it.

The container gets exactly one GPU, by UUID, as ``DeviceRequest(device_ids=[uuid], capabilities=[["gpu"]])``;
its port 30000 is published on ``127.0.0.1`` only, on a free host port; the model folder and the
Hugging Face cache are bind-mounted (the model read-only); ``shm_size`` is set, ``ipc_mode="host"`` is
optional, and the container is never privileged. Its log is streamed into ``boot_dir/server.log``;
ready means the ready line **and** ``GET /health`` 200. A failed boot and ``stop`` remove the
container; ``stop`` then waits (bounded) through the ``GpuView`` for the memory to come back.

A container carries its owner as labels (``elsa-tune.owner-*``: host, kernel boot, pid and start time of the
process that started it, see ``runtime/lease.py``), its GPU and the GPU memory used before it booted, so
``reap_orphans`` can find the containers of a SIGKILLed tuner on this GPU and stop them.

Tested without a Docker engine: the test suite runs a real ``docker.DockerClient(base_url=...)``
against a fake Docker Engine HTTP API (``tests/runtime/fake_docker_engine.py``) that records every
request and runs a scripted fake SGLang as the "container", asserting the exact create payload
(DeviceRequests, PortBindings, ShmSize, Privileged, Env, Binds) and the full runtime contract.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import requests
from docker.types import DeviceRequest

from elsa_tune.errors import RuntimeUnavailable
from elsa_tune.runtime.failure import Failure
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.flags import FlagSet
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.lease import SCHEMA_VERSION, Owner, Reaped
from elsa_tune.runtime.live_boot import NOTHING_TO_STOP, LiveBoot, wait_memory_released
from elsa_tune.runtime.ports import free_port
from elsa_tune.runtime.process import DEFAULT_LAUNCH
from elsa_tune.runtime.protocol import DEFAULT_TIMEOUTS, Exit, Health, HealthState, RuntimeTimeouts, Server
from elsa_tune.runtime.server_log import LogTee
from elsa_tune.runtime.sglang import SGLANG
from elsa_tune.search_spaces.candidate import Candidate

log = logging.getLogger(__name__)

CONTAINER_PORT = 30000
_NO_ENGINE = "start Docker (or set DOCKER_HOST), or use the process runtime"
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
LEASE_LABEL = "elsa-tune.lease"          # the lease schema version: every container we start has it
GPU_LABEL = "elsa-tune.gpu"
BASELINE_LABEL = "elsa-tune.gpu-used-before"


@dataclass(kw_only=True)
class _Boot(LiveBoot):
    container: Any

    def exit_code(self) -> int | None:
        """The container's exit status as Popen would give it (``None`` while it runs)."""
        self.container.reload()
        return _as_signal_code(_exit_code(self.container))


def _exit_code(container: Any) -> int | None:
    state = container.attrs.get("State", {})
    if state.get("Status") in ("exited", "dead"):
        return int(state.get("ExitCode", 0))
    return None


def _as_signal_code(code: int | None) -> int | None:
    """Docker reports a signal death as 128+N; the classifier speaks Popen's -N."""
    return 128 - code if code is not None and 128 < code < 160 else code


class SGLangDocker:
    """The ``Runtime`` for SGLang in Docker. ``client`` (or ``base_url``) selects the engine."""

    def __init__(self, image: str, gpu: GpuView | None = None, *, client: Any = None, base_url: str | None = None,
                 launch: Sequence[str] = DEFAULT_LAUNCH, model_dir: Path | None = None, model_mount: str = "/model",
                 hf_cache: Path | None = None, hf_cache_mount: str = "/root/.cache/huggingface",
                 volumes: Mapping[str, str] | None = None, shm_size: str = "32g", ipc_host: bool = False,
                 extra_env: Mapping[str, str] | None = None, timeouts: RuntimeTimeouts = DEFAULT_TIMEOUTS,
                 memory_margin_bytes: int = 512 << 20,
                 name_prefix: str = "elsa-tune", family: RuntimeFamily = SGLANG) -> None:
        self._family = family
        self.image = image
        self.gpu = gpu
        self._client = client
        self.base_url = base_url
        self.launch = tuple(launch)
        self.binds: dict[str, dict[str, str]] = {}
        if model_dir is not None:
            self.binds[str(model_dir)] = {"bind": model_mount, "mode": "ro"}
        if hf_cache is not None:
            self.binds[str(hf_cache)] = {"bind": hf_cache_mount, "mode": "rw"}
        for host_path, container_path in (volumes or {}).items():
            self.binds[host_path] = {"bind": container_path, "mode": "rw"}
        self.shm_size = shm_size
        self.ipc_host = ipc_host
        self.extra_env = dict(extra_env or {})
        self.timeouts = timeouts
        self.memory_margin_bytes = memory_margin_bytes
        self.name_prefix = name_prefix
        self._boots: dict[str, _Boot] = {}

    @property
    def family(self) -> RuntimeFamily:
        return self._family

    def flag_set(self) -> FlagSet | None:
        """``None``: the image's flags are known only once it runs (the first boot validates them)."""
        return None

    def client(self) -> Any:
        """The docker client (created on first use); an unreachable engine is ``RuntimeUnavailable``."""
        if self._client is None:
            try:
                self._client = (docker.DockerClient(base_url=self.base_url) if self.base_url
                                else docker.from_env())
            except _ENGINE_ERRORS as exc:
                raise RuntimeUnavailable(f"the Docker engine cannot be reached: {exc}",
                                         remedy=_NO_ENGINE) from exc
        return self._client

    def command(self, candidate: Candidate) -> list[str]:
        """The container's command: launch + candidate flags + the host and port we own."""
        return self._family.argv(self.launch, candidate, "0.0.0.0", CONTAINER_PORT)

    def create_kwargs(self, candidate: Candidate, host_port: int, name: str, *,
                      baseline_used: int | None = None) -> dict[str, Any]:
        """Everything ``containers.create`` gets: no privileged mode, one GPU by UUID, port on 127.0.0.1.

        Its labels say who owns it (this process), on which GPU, and the memory used there before the boot.
        """
        kwargs: dict[str, Any] = {
            "image": self.image, "command": self.command(candidate), "name": name, "detach": True,
            "environment": {**self.extra_env, **candidate.env, "PYTHONUNBUFFERED": "1"},
            "ports": {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", host_port)},
            "volumes": self.binds, "shm_size": self.shm_size, "privileged": False,
            "labels": {"elsa-tune.candidate": candidate.key(), "elsa-tune.label": candidate.label,
                       LEASE_LABEL: str(SCHEMA_VERSION), GPU_LABEL: self.gpu.uuid if self.gpu else "",
                       BASELINE_LABEL: "" if baseline_used is None else str(baseline_used), **Owner.me().labels()},
        }
        if self.gpu is not None:
            kwargs["device_requests"] = [DeviceRequest(device_ids=[self.gpu.uuid], capabilities=[["gpu"]])]
        if self.ipc_host:
            kwargs["ipc_mode"] = "host"
        return kwargs

    # ---- start ------------------------------------------------------------------------------------

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        """Create and start the container; return when ready or raise ``BootFailed`` (container removed)."""
        client = self.client()
        boot_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        name = f"{self.name_prefix}-{candidate.key()}-{port}"
        baseline = self.gpu.memory().used if self.gpu is not None else None
        kwargs = self.create_kwargs(candidate, port, name, baseline_used=baseline)
        (boot_dir / "launch.json").write_text(json.dumps(
            {"image": self.image, "command": kwargs["command"], "env": kwargs["environment"], "port": port,
             "name": name, "gpu_uuid": self.gpu.uuid if self.gpu else None}, indent=2))
        log_path = boot_dir / "server.log"
        log_path.write_text("")
        started_wall, started = time.time(), time.monotonic()
        container = self._create(client, kwargs)
        boot: _Boot | None = None
        ready = False
        try:
            container.start()
            tee = LogTee(self._log_stream(container), log_path, ready_line=self._family.ready_line)
            tee.start()
            boot = _Boot(family=self._family, container=container, tee=tee, baseline_used=baseline, started=started)
            base_url = f"http://127.0.0.1:{port}"
            with httpx.Client(trust_env=False) as http:
                boot.wait_ready(http, base_url, exit_code=boot.exit_code, halt=lambda: None, log_path=log_path,
                                timeouts=self.timeouts)
                info = self._family.server_info(http, base_url, self.timeouts.health_s)
            report = self._family.boot_report(tee.text(), candidate, info)
            (boot_dir / "boot_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
            ready = True
        except _ENGINE_ERRORS as exc:
            raise RuntimeUnavailable(f"the Docker engine failed while booting {name}: {exc}",
                                     remedy="check `docker logs` and the engine; the container was removed") from exc
        finally:
            if not ready:
                self._remove(container)
        assert boot is not None
        self._boots[container.id] = boot
        return Server(candidate=candidate, base_url=base_url, port=port, boot_dir=boot_dir, log_path=log_path,
                      report=report, started_at=started_wall, ready_at=time.time(), handle=container.id,
                      gpu_uuid=self.gpu.uuid if self.gpu else None)

    def _create(self, client: Any, kwargs: Mapping[str, Any]) -> Any:
        try:
            return client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as exc:
            raise RuntimeUnavailable(f"the image {self.image!r} is not available: {exc.explanation or exc}",
                                     remedy=f"docker pull {self.image} (or build it) before the study") from exc
        except docker.errors.APIError as exc:
            remedy = ("install the NVIDIA container toolkit so Docker can pass GPUs" if "gpu" in str(exc).lower()
                      else "check the image, the mounts and the engine (the message above says what failed)")
            raise RuntimeUnavailable(f"Docker refused to create the container: {exc.explanation or exc}",
                                     remedy=remedy) from exc
        except _ENGINE_ERRORS as exc:
            raise RuntimeUnavailable(f"the Docker engine cannot be reached: {exc}", remedy=_NO_ENGINE) from exc

    def _log_stream(self, container: Any) -> Iterable[bytes]:
        try:
            yield from container.logs(stream=True, follow=True)
        except _ENGINE_ERRORS as exc:
            log.debug("log stream of %s ended: %s", container.id[:12], exc)

    # ---- check / stop -----------------------------------------------------------------------------

    def check(self, server: Server) -> Health:
        """Running and ``/health`` 200 → HEALTHY; running but failing → UNHEALTHY; exited → DEAD (classified)."""
        boot = self._boots.get(server.handle)
        if boot is None:
            return Health(HealthState.DEAD, "stopped")
        try:
            return boot.check(boot.exit_code, server.base_url, self.timeouts.health_s, server="the container")
        except docker.errors.NotFound:
            return Health(HealthState.DEAD, "the container is gone")
        except _ENGINE_ERRORS as exc:
            return Health(HealthState.UNHEALTHY, f"the Docker engine did not answer: {exc}")

    def stop(self, server: Server) -> Exit:
        """Stop (SIGTERM, then SIGKILL after the timeout) and remove the container, then wait for the GPU."""
        boot = self._boots.get(server.handle)
        if boot is None:
            return NOTHING_TO_STOP

        def halt() -> tuple[int | None, bool, Failure | None]:
            failure: Failure | None = None
            code: int | None = None
            killed = False
            try:
                boot.container.reload()
                code = _exit_code(boot.container)
                if code is not None:
                    failure = boot.died(_as_signal_code(code))
                else:
                    code, killed = self._stop_container(boot.container)
            except _ENGINE_ERRORS as exc:
                log.warning("stopping %s: %s", server.handle[:12], exc)
            self._remove(boot.container)
            boot.tee.closed.wait(timeout=5.0)
            return code, killed, failure

        return boot.finish(halt, self.gpu, memory_release_s=self.timeouts.memory_release_s,
                           margin_bytes=self.memory_margin_bytes)

    def _stop_container(self, container: Any) -> tuple[int, bool]:
        """The engine's stop (SIGTERM, SIGKILL after the timeout) and its exit code; ``killed`` if it took a SIGKILL."""
        container.stop(timeout=int(self.timeouts.stop_s))
        code = int(container.wait(timeout=self.timeouts.stop_s + 30).get("StatusCode", -1))
        return code, code == 137

    def reap_orphans(self) -> list[Reaped]:
        """Stop and remove the containers on this GPU whose owner (a tuner of this host) is dead.

        A live owner's container, another host's and one of another GPU are left alone. Each stop is logged as
        a warning naming the container; the GPU memory is then waited for like after ``stop``.
        """
        try:
            containers = self.client().containers.list(all=True, filters={"label": LEASE_LABEL})
        except _ENGINE_ERRORS as exc:
            log.warning("cannot list containers to find orphaned servers: %s", exc)
            return []
        reaped = []
        for container in containers:
            labels: dict[str, str] = container.labels or {}
            owner = Owner.from_labels(labels)
            gpu = labels.get(GPU_LABEL) or None
            if owner is None or not owner.is_dead() or (self.gpu is not None and gpu != self.gpu.uuid):
                continue
            reaped.append(self._reap(container, owner, gpu, labels.get(BASELINE_LABEL) or None))
        return reaped

    def _reap(self, container: Any, owner: Owner, gpu: str | None, baseline: str | None) -> Reaped:
        began = time.monotonic()
        code: int | None = None
        killed = False
        try:
            code, killed = self._stop_container(container)
        except _ENGINE_ERRORS as exc:
            log.warning("stopping the orphaned container %s: %s", container.name, exc)
        self._remove(container)
        released, detail = wait_memory_released(self.gpu, int(baseline) if baseline else None,
                                                timeout_s=self.timeouts.memory_release_s,
                                                margin_bytes=self.memory_margin_bytes)
        log.warning("stopped an orphaned server whose owner is dead: container %s (%s) on GPU %s, started by %s; "
                    "exit %s%s in %.1f s; %s", container.name, container.id[:12], gpu or "?", owner.describe(), code,
                    " (killed)" if killed else "", time.monotonic() - began, detail)
        return Reaped(container.name, owner, gpu, (container.id,), killed, released, detail)

    def _remove(self, container: Any) -> None:
        with contextlib.suppress(*_ENGINE_ERRORS):
            container.remove(force=True)
