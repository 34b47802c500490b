"""The simulated card's memory, shared on disk, and ``SimulatedGpu``: the ``GpuView`` that reads it.

A simulated GPU is a directory. Each serving process writes one file there, ``proc-<pid>.json``, with
its pid and the bytes it holds (atomically: ``write_atomic``). A reader sums
the files of live processes, the way NVML sums the memory of the processes on a card. A file whose
process is gone stops counting, except while its ``hold_until`` lies in the future: that is how the
"GPU memory not released after stop" fault keeps a dead server's memory on the card for a while.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elsa_tune.durable_file import write_atomic
from elsa_tune.runtime.gpu import GpuMemory, GpuProcess, GpuState
from elsa_tune.runtime.process_group import is_running

log = logging.getLogger(__name__)

GIB = 1024**3
#: What a real idle card shows as used (driver, display-less context): a few hundred MiB.
IDLE_USED_BYTES = 256 * 1024**2
ENV_CARD_DIR = "ELSA_SIM_CARD_DIR"


@dataclass(frozen=True)
class CardSpec:
    """What the simulated card is: the facts ``GpuState`` reports."""

    name: str
    memory_total: int
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    index: int = 0


@dataclass(frozen=True)
class CardEntry:
    """One process's share of the card, as read from its file."""

    pid: int
    used_bytes: int
    name: str
    hold_until: float | None   # wall-clock seconds; counted after the pid died until then


def default_card_dir(card_name: str, index: int = 0) -> Path:
    """``$ELSA_SIM_CARD_DIR`` or a per-user folder under the temp dir, one per card name and index."""
    root = os.environ.get(ENV_CARD_DIR)
    if root:
        return Path(root)
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in card_name.lower())
    return Path(tempfile.gettempdir()) / f"elsa-sim-cards-{os.getuid()}" / f"{slug}-{index}"


def card_uuid(card_dir: Path) -> str:
    """A stable fake UUID for the card at ``card_dir``, shaped like NVML's (``GPU-sim-xxxxxxxx-…``)."""
    digest = hashlib.sha256(str(Path(card_dir).resolve()).encode()).hexdigest()
    return f"GPU-sim-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:28]}"


class CardLease:
    """A serving process's entry on the card: ``set_used`` as pools are allocated, ``release`` at exit."""

    def __init__(self, card_dir: Path, pid: int | None = None, name: str = "sglang::scheduler") -> None:
        self.card_dir = Path(card_dir)
        self.pid = os.getpid() if pid is None else pid
        self.name = name
        self.path = self.card_dir / f"proc-{self.pid}.json"
        self.used_bytes = 0
        self.card_dir.mkdir(parents=True, exist_ok=True)

    def set_used(self, used_bytes: int, hold_until: float | None = None) -> None:
        self.used_bytes = max(0, int(used_bytes))
        payload = {"pid": self.pid, "used_bytes": self.used_bytes, "name": self.name, "hold_until": hold_until}
        write_atomic(self.path, json.dumps(payload))

    def hold(self, seconds: float) -> None:
        """Keep this process's memory on the card for ``seconds`` after it exits (the not-released fault)."""
        self.set_used(self.used_bytes, hold_until=time.time() + seconds)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def read_entries(card_dir: Path, now: float | None = None) -> list[CardEntry]:
    """The entries that count now; files of dead processes past their hold are removed."""
    now = time.time() if now is None else now
    entries: list[CardEntry] = []
    try:
        paths = sorted(Path(card_dir).glob("proc-*.json"))
    except OSError:
        return entries
    for path in paths:
        data = _read_json(path)
        if data is None:
            continue
        entry = CardEntry(pid=int(data["pid"]), used_bytes=int(data["used_bytes"]), name=str(data.get("name", "")),
                          hold_until=data.get("hold_until"))
        if is_running(entry.pid, None) or (entry.hold_until is not None and entry.hold_until > now):
            entries.append(entry)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return entries


class SimulatedCards:
    """``CardView`` (``runtime/lease.py``) of the simulated cards: the pids whose entries count on a card now."""

    def pids(self, card_dir: Path) -> set[int]:
        return {e.pid for e in read_entries(card_dir)}


class SimulatedGpu:
    """``GpuView`` of a simulated card: NVML's view, read from the card directory.

    Cheap enough for a 10 Hz watcher (a directory listing and a few small files). ``uuid`` is stable
    for a given directory.
    """

    def __init__(self, card_dir: Path, card: CardSpec) -> None:
        self.card_dir = Path(card_dir)
        self.card = card
        self.card_dir.mkdir(parents=True, exist_ok=True)
        self._uuid = card_uuid(self.card_dir)

    @property
    def uuid(self) -> str:
        return self._uuid

    def memory(self) -> GpuMemory:
        used = min(self.card.memory_total, IDLE_USED_BYTES + sum(e.used_bytes for e in read_entries(self.card_dir)))
        return GpuMemory(total=self.card.memory_total, used=used, free=self.card.memory_total - used,
                         at=time.monotonic())

    def state(self) -> GpuState:
        processes = tuple(GpuProcess(pid=e.pid, used_bytes=e.used_bytes, name=e.name)
                          for e in read_entries(self.card_dir))
        return GpuState(index=self.card.index, uuid=self._uuid, name=f"{self.card.name} (simulated)",
                        driver="sim", cuda_driver=None, memory_total=self.card.memory_total,
                        power_limit_w=self.card.power_limit_w, power_default_limit_w=self.card.power_default_limit_w,
                        temperature_c=None, sm_clock_mhz=None, mem_clock_mhz=None, max_sm_clock_mhz=None,
                        persistence_mode=None, processes=processes)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None   # vanished or being replaced between listing and reading
    return data if isinstance(data, dict) and "pid" in data and "used_bytes" in data else None
