"""Server leases: who started which server, so that a killed tuner's server is found and stopped.

Each server runs in its own session (``runtime/process_group.py``), so a tuner or worker that is SIGKILLed
(the OOM killer, a scheduler, ``kill -9``) leaves its server running and holding the GPU. When a runtime starts
a server it writes a ``ServerLease`` (its ``Owner``: host, kernel boot, pid and start time; the server's pid,
process group and start time; GPU UUID or simulated card; port; run folder; command) atomically into the lease
folder, and removes it after the stop. ``LeaseBook.reap`` (called by preflight for its GPU, and by the worker
pool when a worker dies by a signal) stops the servers of leases whose owner is dead — pid gone, or the pid
reused by another process (its start time differs) — the way ``stop`` does, and only when the group's leader
is provably the leased server (``leader_mismatch``: this user's process with the lease's start time and command
line; otherwise the lease is dropped and nothing is signalled): SIGTERM the group, SIGKILL after the timeout,
then wait until the GPU no longer lists the server's processes. A live owner's lease is never touched; a lease
of another host is not judged here; a lease from an earlier kernel boot names no process and is dropped without
a signal. Docker containers carry the same ``Owner`` as labels instead
(``SGLangDocker.reap_orphans``).

The folder: ``$ELSA_LEASE_DIR``, else ``$XDG_RUNTIME_DIR/elsa-tune/leases``, else ``~/.cache/elsa-tune/leases``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from elsa_tune.durable_file import write_atomic
from elsa_tune.input_file import input_problem
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.host_memory import HOST_UUID_PREFIX
from elsa_tune.runtime.process_group import ProcessGroup, boot_id, is_running, start_time

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ENV_LEASE_DIR = "ELSA_LEASE_DIR"
_SUFFIX = ".lease.json"
_MAX_LEASE_BYTES = 1 << 20   # a lease is a few hundred bytes; anything larger is not one


def lease_dir() -> Path:
    """``$ELSA_LEASE_DIR``, else ``$XDG_RUNTIME_DIR/elsa-tune/leases``, else ``~/.cache/elsa-tune/leases``."""
    explicit = os.environ.get(ENV_LEASE_DIR)
    if explicit:
        return Path(explicit)
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and Path(runtime_dir).is_dir():
        return Path(runtime_dir) / "elsa-tune" / "leases"
    return Path.home() / ".cache" / "elsa-tune" / "leases"


@dataclass(frozen=True)
class Owner:
    """The process that started a server: it alone may stop it while it lives."""

    host: str
    boot_id: str | None
    pid: int
    start: int | None   # clock ticks since boot (/proc/<pid>/stat), None where /proc is absent

    @classmethod
    def me(cls) -> Owner:
        pid = os.getpid()
        return cls(host=socket.gethostname(), boot_id=boot_id(), pid=pid, start=start_time(pid))

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def from_earlier_boot(self) -> bool:
        """Recorded before this kernel booted: its pids and start times name nothing now."""
        now = boot_id()
        return self.boot_id is not None and now is not None and self.boot_id != now

    def is_dead(self) -> bool:
        """Gone on this host: pid gone, a zombie, a pid reused by another process, or an earlier boot.

        ``False`` for another host's owner: nothing here can tell whether it lives.
        """
        if not self.on_this_host():
            return False
        return self.from_earlier_boot() or not is_running(self.pid, self.start)

    def labels(self, prefix: str = "elsa-tune.owner") -> dict[str, str]:
        """The owner as container labels (strings only)."""
        return {f"{prefix}-host": self.host, f"{prefix}-boot": self.boot_id or "", f"{prefix}-pid": str(self.pid),
                f"{prefix}-start": "" if self.start is None else str(self.start)}

    @classmethod
    def from_labels(cls, labels: Mapping[str, str], prefix: str = "elsa-tune.owner") -> Owner | None:
        """The owner recorded by ``labels``, or ``None`` when the labels are not a complete owner."""
        try:
            pid = int(labels[f"{prefix}-pid"])
            start = labels.get(f"{prefix}-start") or None
            return cls(host=labels[f"{prefix}-host"], boot_id=labels.get(f"{prefix}-boot") or None, pid=pid,
                       start=int(start) if start is not None else None)
        except (KeyError, ValueError):
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


@dataclass(frozen=True)
class ServerLease:
    """One local server and its owner, as written to ``<lease dir>/<host>-<pgid>.lease.json``."""

    owner: Owner
    server_pid: int
    server_pgid: int
    server_start: int | None
    gpu_uuid: str | None
    port: int
    run_dir: str
    command: tuple[str, ...]
    card_dir: str | None = None    # the simulated card's folder, when the GPU is simulated
    created_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def for_server(cls, pid: int, *, gpu_uuid: str | None, port: int, run_dir: Path, command: Sequence[str],
                   card_dir: Path | None = None) -> ServerLease:
        """The lease of the server ``pid`` (leader of its own process group) this process just started."""
        return cls(owner=Owner.me(), server_pid=pid, server_pgid=pid, server_start=start_time(pid),
                   gpu_uuid=gpu_uuid, port=port, run_dir=str(run_dir), command=tuple(command),
                   card_dir=str(card_dir) if card_dir is not None else None)

    @property
    def name(self) -> str:
        return f"{self.owner.host}-{self.server_pgid}{_SUFFIX}"

    def describe(self) -> str:
        where = f"simulated card {self.card_dir}" if self.card_dir else f"GPU {self.gpu_uuid or '?'}"
        return (f"lease {self.name}: server pid {self.server_pid} (group {self.server_pgid}) on {where}, "
                f"port {self.port}, run folder {self.run_dir}, started by {self.owner.describe()}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["command"] = list(self.command)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerLease:
        owner = data["owner"]
        return cls(owner=Owner(host=str(owner["host"]), boot_id=owner.get("boot_id"), pid=int(owner["pid"]),
                               start=owner.get("start")),
                   server_pid=int(data["server_pid"]), server_pgid=int(data["server_pgid"]),
                   server_start=data.get("server_start"), gpu_uuid=data.get("gpu_uuid"), port=int(data["port"]),
                   run_dir=str(data["run_dir"]), command=tuple(str(a) for a in data["command"]),
                   card_dir=data.get("card_dir"), created_at=float(data.get("created_at", 0.0)),
                   schema_version=int(data["schema_version"]))

    def on_gpu(self, gpu_uuid: str | None) -> bool:
        return gpu_uuid is None or self.gpu_uuid == gpu_uuid


@dataclass(frozen=True)
class Reaped:
    """An orphan that was stopped (or a stale lease that was dropped): what the warning said.

    ``name`` is the lease file or the container; ``stopped`` the pids or container id that were stopped
    (empty when the lease was only dropped).
    """

    name: str
    owner: Owner
    gpu_uuid: str | None
    stopped: tuple[str, ...]
    killed: bool                  # SIGKILL was needed
    gpu_memory_released: bool
    detail: str


class CardView(Protocol):
    """The processes a simulated card lists, read from its folder (``runtime/sim/card.py``'s ``SimulatedCards``).

    A reaper without a ``GpuView`` watches a simulated server's memory release through it.
    """

    def pids(self, card_dir: Path) -> set[int]: ...


@runtime_checkable
class OrphanReaper(Protocol):
    """A runtime that can find and stop the servers its killed predecessors left on its GPU."""

    def reap_orphans(self) -> list[Reaped]: ...


class LeaseBook:
    """The lease folder: write, remove, list, and reap the leases whose owner is dead."""

    def __init__(self, directory: Path | None = None, *, stop_timeout_s: float = 30.0,
                 memory_release_timeout_s: float = 60.0, cards: CardView | None = None) -> None:
        self.directory = Path(directory) if directory is not None else lease_dir()
        self.stop_timeout_s = stop_timeout_s
        self.memory_release_timeout_s = memory_release_timeout_s
        self.cards = cards

    def write(self, lease: ServerLease) -> Path:
        """Write durably (``write_atomic``): a reader never sees half a lease."""
        path = self.directory / lease.name
        write_atomic(path, json.dumps(lease.to_dict(), indent=2))
        return path

    def remove(self, lease: ServerLease) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / lease.name).unlink()

    def leases(self) -> list[ServerLease]:
        """Every readable lease; a file that cannot be read (another schema, half-deleted) is skipped."""
        found: list[ServerLease] = []
        try:
            paths = sorted(self.directory.glob(f"*{_SUFFIX}"))
        except OSError:
            return found
        for path in paths:
            try:
                if input_problem(path) is not None or path.stat().st_size > _MAX_LEASE_BYTES:
                    log.warning("skipping %s: not a lease file (a special file, or larger than a lease)", path)
                    continue
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise TypeError("not a JSON object")
                if data.get("schema_version") != SCHEMA_VERSION:
                    log.warning("skipping %s: lease schema %s, this elsa-tune reads %d", path,
                                data.get("schema_version"), SCHEMA_VERSION)
                    continue
                found.append(ServerLease.from_dict(data))
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                log.debug("skipping unreadable lease %s: %s", path, exc)
        return found

    def orphans(self, *, gpu_uuid: str | None = None, owner_pid: int | None = None) -> list[ServerLease]:
        """Leases on ``gpu_uuid`` (every GPU when ``None``) whose owner is dead, optionally of one owner pid."""
        return [lease for lease in self.leases()
                if lease.on_gpu(gpu_uuid) and (owner_pid is None or lease.owner.pid == owner_pid)
                and lease.owner.is_dead()]

    def reap(self, *, gpu: GpuView | None = None, gpu_uuid: str | None = None,
             owner_pid: int | None = None) -> list[Reaped]:
        """Stop the server of every orphaned lease on ``gpu`` (or ``gpu_uuid``; every GPU when neither).

        Each stop is logged as a warning naming the lease. ``gpu`` (when given) is watched until it no longer
        lists the server's processes; without it a simulated card's folder is watched through ``cards``.
        """
        uuid = gpu.uuid if gpu is not None else gpu_uuid
        return [self._reap(lease, gpu) for lease in self.orphans(gpu_uuid=uuid, owner_pid=owner_pid)]

    def _reap(self, lease: ServerLease, gpu: GpuView | None) -> Reaped:
        began = time.monotonic()
        if lease.owner.from_earlier_boot():
            return self._drop(lease, "recorded before the last reboot: no process of it can be running")
        group = ProcessGroup(lease.server_pgid)
        pids = tuple(group.members())
        if not pids:
            return self._drop(lease, "the server had already exited")
        refusal = leader_mismatch(lease)
        if refusal:
            # only a group whose leader is provably the leased server (same start, same command, our user) is ours
            return self._drop(lease, f"{refusal}; nothing stopped")
        killed = group.stop(self.stop_timeout_s)
        released, detail = _wait_gpu_free(pids, gpu, lease, self.memory_release_timeout_s, self.cards)
        self.remove(lease)
        reaped = Reaped(lease.name, lease.owner, lease.gpu_uuid, tuple(map(str, pids)), killed, released, detail)
        log.warning("stopped an orphaned server whose owner is dead: %s; processes %s %s in %.1f s; %s",
                    lease.describe(), ", ".join(map(str, pids)), "killed" if killed else "terminated",
                    time.monotonic() - began, detail)
        return reaped

    def _drop(self, lease: ServerLease, detail: str) -> Reaped:
        self.remove(lease)
        log.warning("dropped the lease of a dead owner: %s (%s)", lease.describe(), detail)
        return Reaped(lease.name, lease.owner, lease.gpu_uuid, (), False, True, detail)


def leader_mismatch(lease: ServerLease) -> str:
    """Why the group's leader is not provably the leased server, or ``""`` when it is.

    The leader must be running under this user, have the start time the lease recorded (a missing one proves
    nothing), and run the leased command line (an interpreter a script's shebang put in front is allowed).
    """
    pid = lease.server_pid
    if lease.server_pgid != pid:
        return f"the lease names group {lease.server_pgid} but leader pid {pid}"
    if lease.server_start is None:
        return f"the lease records no start time for pid {pid}, so it cannot prove the process is its server"
    now = start_time(pid)
    if now is None:
        return f"the leader pid {pid} has exited (its group is left alone: it cannot be proved to be the server)"
    if now != lease.server_start:
        return f"pid {pid} now belongs to another process (started at tick {now}, the lease says {lease.server_start})"
    uid = process_uid(pid)
    if uid is None or uid != os.getuid():
        return f"pid {pid} belongs to user {uid if uid is not None else '?'}, not to this user ({os.getuid()})"
    actual = command_line(pid)
    if actual is None or not same_command(lease.command, actual):
        shown = " ".join(actual) if actual is not None else "unreadable"
        return f"pid {pid} runs another command ({shown[:120]!r}) than the lease's"
    return ""


def process_uid(pid: int) -> int | None:
    """The real user id of ``pid``, or ``None`` when it cannot be read."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def command_line(pid: int) -> tuple[str, ...] | None:
    """``pid``'s argument vector from /proc, or ``None`` when it cannot be read (gone, a kernel thread)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    return tuple(part.decode("utf-8", "surrogateescape") for part in raw.rstrip(b"\0").split(b"\0"))


def same_command(leased: Sequence[str], actual: Sequence[str]) -> bool:
    """``actual`` is ``leased``, or ``leased`` run through an interpreter (``python script.py args``)."""
    leased, actual = tuple(leased), tuple(actual)
    if not leased:
        return False
    if actual == leased:
        return True
    tail = leased[1:]
    head = actual[:len(actual) - len(tail)]
    return (len(head) in (2, 3) and actual[len(head):] == tail
            and os.path.basename(head[-1]) == os.path.basename(leased[0]))


def _wait_gpu_free(pids: Sequence[int], gpu: GpuView | None, lease: ServerLease, timeout_s: float,
                   cards: CardView | None, poll_s: float = 0.2) -> tuple[bool, str]:
    """Wait (bounded) until the GPU lists none of ``pids``; ``(released, detail)``.

    Without ``gpu``: a simulated card's folder is read through ``cards``, a real GPU is opened through NVML by its
    UUID.
    """
    opened: Any = None
    if gpu is not None:
        view = gpu

        def listed() -> set[int]:
            return {p.pid for p in view.state().processes}
    elif lease.card_dir:
        if cards is None:
            return True, f"simulated card {lease.card_dir}: no card view given, memory release not watched"
        card, view_of_cards = Path(lease.card_dir), cards

        def listed() -> set[int]:
            return view_of_cards.pids(card)
    elif lease.gpu_uuid and lease.gpu_uuid.startswith(HOST_UUID_PREFIX):
        return True, "a server on the host's CPU: its memory is the host's, released when its processes are gone"
    elif lease.gpu_uuid:
        from elsa_tune.errors import ElsaTuneError
        from elsa_tune.runtime.nvml import open_gpu

        try:
            opened = open_gpu(lease.gpu_uuid)
        except ElsaTuneError as exc:
            return True, f"GPU {lease.gpu_uuid} cannot be read through NVML ({exc.message}): release not watched"
        nvml = opened

        def listed() -> set[int]:
            return {p.pid for p in nvml.state().processes}
    else:
        return True, "no GPU view: memory release not watched"
    try:
        return _poll_released(listed, set(pids), timeout_s, poll_s)
    finally:
        if opened is not None:
            opened.close()


def _poll_released(listed: Callable[[], set[int]], pids: set[int], timeout_s: float,
                   poll_s: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            holding = listed() & pids
        except Exception as exc:  # NVML can fail (driver reset): report, never hang
            return False, f"GPU processes could not be read: {exc}"
        if not holding:
            return True, "its processes hold no GPU memory any more"
        if time.monotonic() >= deadline:
            return False, (f"processes {', '.join(map(str, sorted(holding)))} still hold GPU memory after "
                           f"{timeout_s:.0f} s")
        time.sleep(poll_s)
