"""``LogTee``: copy a server's output into the boot folder while watching it for readiness.

A reader thread owns the file: every chunk is written and flushed as it arrives (so a killed study
still leaves the log), lines are re-assembled across chunk boundaries, and two events are set:
``ready`` when the ready line appears (at once when there is none: a runtime whose readiness is its ``/health``
alone, as vLLM 0.33's), ``closed`` when the stream ends (the server's output closed,
usually because it died). Used by the process runtime (a pipe) and the Docker runtime (a log stream).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from elsa_tune.runtime.startup_log import READY_LINE

log = logging.getLogger(__name__)


class LogTee(threading.Thread):
    """Read ``chunks`` to the end, appending them to ``path``; set ``ready`` on ``ready_line`` (at once when it is
    ``None``)."""

    def __init__(self, chunks: Iterable[bytes], path: Path, *, ready_line: str | None = READY_LINE,
                 on_close: Callable[[], None] | None = None) -> None:
        super().__init__(name=f"log-tee:{path.parent.name}", daemon=True)
        self.path = path
        self.ready_line = ready_line
        self.ready = threading.Event()
        self.closed = threading.Event()
        self._chunks = chunks
        self._on_close = on_close
        self._partial = ""
        if ready_line is None:
            self.ready.set()

    def run(self) -> None:
        try:
            with self.path.open("a", encoding="utf-8", errors="replace") as sink:
                for chunk in self._chunks:
                    text = chunk.decode("utf-8", errors="replace") if isinstance(chunk, bytes) else str(chunk)
                    sink.write(text)
                    sink.flush()
                    self._watch(text)
        except (OSError, ValueError) as exc:  # the stream was closed under us (stop) or the disk failed
            log.debug("log tee %s ended: %s", self.path, exc)
        finally:
            if self._partial and self.ready_line is not None and self.ready_line in self._partial:
                self.ready.set()
            self.closed.set()
            if self._on_close is not None:
                self._on_close()

    def _watch(self, text: str) -> None:
        if self.ready_line is None:
            return
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if any(self.ready_line in line for line in lines):
            self.ready.set()
        if len(self._partial) > 1 << 20:  # a line that never ends is not a ready line
            self._partial = self._partial[-len(self.ready_line):]

    def text(self) -> str:
        """Everything written so far."""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
