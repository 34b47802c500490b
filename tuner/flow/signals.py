"""Ctrl-C and SIGTERM for a run nobody watches: the first finishes the current record, the second stops now.

The first signal only sets ``requested``; the study checks it between boots, writes the outputs and
ends as INTERRUPTED. A second signal raises ``KeyboardInterrupt`` where the study is: every server is
stopped in a ``finally`` and every record is written atomically, so history is never half-written.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)


class Interrupts:
    """Installs the handlers for the duration of a ``with`` block (main thread only; a no-op elsewhere)."""

    def __init__(self) -> None:
        self.requested = False
        self.count = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def request(self, why: str = "requested") -> None:
        """Ask the study to stop after the current record (what the first Ctrl-C does)."""
        self.requested = True
        log.warning("stop %s: finishing the current boot, then writing the outputs (again to stop at once)", why)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.request(f"on {signal.Signals(signum).name}")
            return
        log.warning("second %s: stopping now (the running server is stopped, history stays consistent)",
                    signal.Signals(signum).name)
        raise KeyboardInterrupt
