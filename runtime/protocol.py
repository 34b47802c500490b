"""The ``Runtime`` seam: boot a server for a ``Candidate``, check it, stop it.

Implementations: ``ServerProcess`` (a local process of any runtime family: ``SGLangProcess`` for SGLang,
``llama-server`` for llama.cpp), ``SGLangDocker`` (a container through the docker SDK) and ``SimulatedSGLang``
(``runtime/sim/``, a real HTTP server that behaves like SGLang on a described card). A runtime names the family of
the servers it boots (``runtime/family.py``). ``tests/runtime/contract.py`` is the suite every implementation
must pass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.flags import FlagSet
from elsa_tune.search_spaces.candidate import Candidate


@dataclass(frozen=True)
class RuntimeTimeouts:
    """How long a runtime waits, in seconds: ``boot_s`` for a server to be ready, ``health_s`` for one ``/health``
    answer, ``stop_s`` between SIGTERM and SIGKILL, ``memory_release_s`` for the GPU memory after a stop; and
    ``poll_s`` between looks at a booting server."""

    boot_s: float = 900.0
    health_s: float = 20.0
    stop_s: float = 30.0
    memory_release_s: float = 60.0
    poll_s: float = 0.1


#: The timeouts of a real runtime (a process or a container) unless told otherwise.
DEFAULT_TIMEOUTS = RuntimeTimeouts()


@dataclass(frozen=True)
class Server:
    """A running server: where to reach it and what it reported at boot.

    ``handle`` is implementation-private (a pid, a container id). ``log_path`` is the server log
    teed into the boot folder. ``gpu_uuid`` is the GPU it is pinned to (``None`` for the simulator's
    own card when it has no UUID).
    """

    candidate: Candidate
    base_url: str
    port: int
    boot_dir: Path
    log_path: Path
    report: BootReport
    started_at: float
    ready_at: float
    handle: str = ""
    gpu_uuid: str | None = None


class HealthState(enum.Enum):
    HEALTHY = "healthy"        # process alive, /health answers 200
    UNHEALTHY = "unhealthy"    # process alive, /health failing or timing out (possible hang)
    DEAD = "dead"              # process (tree) gone


@dataclass(frozen=True)
class Health:
    state: HealthState
    detail: str = ""
    failure: Failure | None = None   # classified from the log when the server died

    @property
    def ok(self) -> bool:
        return self.state is HealthState.HEALTHY


@dataclass(frozen=True)
class Exit:
    """How a stop ended: the return code, whether it had to be killed, GPU memory released."""

    returncode: int | None
    killed: bool
    gpu_memory_released: bool
    seconds: float
    failure: Failure | None = None   # set when the server had died on its own before the stop
    detail: str = ""


@runtime_checkable
class Runtime(Protocol):
    """Boot, check and stop servers. One ``Runtime`` may run one server at a time per GPU.

    ``start`` returns only when the server is ready (ready line seen and ``/health`` answers) or
    raises ``BootFailed`` carrying a classified ``Failure``; it never leaves a process behind on
    failure. ``stop`` kills the whole process tree or container, waits for it, and waits (bounded)
    until the GPU memory it held is released; it is idempotent and never raises for a dead server.
    ``boot_dir`` is the folder where the server log and records of this boot are written.
    """

    @property
    def family(self) -> RuntimeFamily:
        """The family of the servers this runtime boots."""
        ...

    def flag_set(self) -> FlagSet | None:
        """The flags the runtime that will boot accepts (from its own ``--help``), or ``None`` when it cannot be
        asked before a boot (a container image not pulled yet)."""
        ...

    def start(self, candidate: Candidate, boot_dir: Path) -> Server: ...

    def check(self, server: Server) -> Health: ...

    def stop(self, server: Server) -> Exit: ...
