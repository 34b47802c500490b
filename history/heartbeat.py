"""``Heartbeat``: keeps a RUNNING Optuna trial alive while its boot runs, so a killed study is recognised.

Optuna only beats inside ``Study.optimize``; elsa-tune drives trials by ask-and-tell around boots that
take minutes, so it beats itself. A trial whose process died stops beating; once the storage's grace
period has passed, ``StudyStore.fail_stale_trials`` (any later process) marks it FAIL.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Protocol, runtime_checkable

from optuna.storages import BaseStorage

log = logging.getLogger(__name__)


@runtime_checkable
class Beating(Protocol):
    """What a storage with heartbeats offers (Optuna's ``RDBStorage``, through its public methods)."""

    def record_heartbeat(self, trial_id: int) -> None: ...

    def get_heartbeat_interval(self) -> int | None: ...


class Heartbeat:
    """A daemon thread that records a heartbeat for one trial every ``interval`` seconds until closed.

    Use as a context manager around everything a trial does; it does nothing when the storage has no
    heartbeat configured. ``close`` is idempotent and bounded (it waits at most one interval).
    """

    def __init__(self, storage: BaseStorage, trial_id: int) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.enabled = isinstance(storage, Beating) and storage.get_heartbeat_interval() is not None

    def start(self) -> Heartbeat:
        if not self.enabled or self._thread is not None:
            return self
        assert isinstance(self._storage, Beating)
        interval = self._storage.get_heartbeat_interval()
        assert interval is not None
        self._storage.record_heartbeat(self._trial_id)
        self._thread = threading.Thread(target=self._beat, args=(interval,), name=f"heartbeat-{self._trial_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _beat(self, interval: int) -> None:
        assert isinstance(self._storage, Beating)
        while not self._stop.wait(timeout=interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception:  # a lost beat must not kill the study; the next one may get through
                log.warning("heartbeat for trial id %d failed", self._trial_id, exc_info=True)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
