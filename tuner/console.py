"""What a person sees: a log file always, plain log lines off a terminal, a live ``rich`` view on one.

Written for a run nobody watches: nothing animates when stdout is not a TTY or under CI. While the live view
runs, the console's log handler writes through the live view's console, so every log line scrolls above the
view instead of being drawn over; the view's cells never wrap (a long name ends in "…"), and the time left is
floored (50 min left, never "1 h 50 min" for 3,000 s).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

log = logging.getLogger("elsa_tune")


def looks_like_ci() -> bool:
    return any(os.environ.get(name) for name in ("CI", "BUILD_ID", "GITHUB_ACTIONS", "JENKINS_URL"))


def interactive(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not looks_like_ci()


def setup_logging(log_file: Path | None, verbosity: int = 0, *, console: bool = True) -> None:
    """The log file always gets DEBUG; the console follows ``-v``/``-q`` (0 = INFO)."""
    root = logging.getLogger("elsa_tune")
    root.setLevel(logging.DEBUG)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    fmt = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)
    if console:
        stream_handler = logging.StreamHandler(sys.stderr)
        level = logging.INFO - 10 * verbosity
        stream_handler.setLevel(max(logging.DEBUG, min(logging.ERROR, level)))
        stream_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        root.addHandler(stream_handler)
    root.propagate = False


@dataclass(frozen=True)
class StudyStatus:
    """One snapshot of the study for the live view."""

    study: str = ""
    phase: str = "preflight"
    candidate: str = ""
    boots: int = 0
    failed_boots: int = 0
    best: str = ""
    best_throughput: float | None = None
    time_left_s: float | None = None
    last_event: str = ""
    decisions: tuple[str, ...] = field(default_factory=tuple)


class StudyView:
    """Shows ``StudyStatus`` updates: a live table on a terminal, a log line per change elsewhere."""

    def __init__(self, *, live: bool | None = None, stream: TextIO | None = None) -> None:
        self._live_enabled = interactive(stream) if live is None else live
        self._status = StudyStatus()
        self._live: Live | None = None
        self._console = Console(file=stream or sys.stdout)
        self._last_plain = 0.0
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []

    def __enter__(self) -> StudyView:
        if self._live_enabled:
            self._live = Live(self._render(), console=self._console, refresh_per_second=2, transient=False)
            self._live.__enter__()
            self._swapped = _route_console_logs(self._console)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(exc_type, exc, tb)
            self._live = None
            _restore_console_logs(self._swapped)
            self._swapped = []

    @property
    def status(self) -> StudyStatus:
        return self._status

    def update(self, **changes: object) -> None:
        before = self._status
        self._status = replace(before, **changes)  # type: ignore[arg-type]
        if self._live is not None:
            self._live.update(self._render())
        elif (self._status.phase != before.phase or self._status.candidate != before.candidate
              or time.monotonic() - self._last_plain > 60):
            self._last_plain = time.monotonic()
            s = self._status
            left = f"{time_left(s.time_left_s)} left" if s.time_left_s is not None else ""
            log.info("[%s] phase=%s candidate=%s boots=%d best=%s %s", s.study, s.phase, s.candidate or "-",
                     s.boots, s.best or "-", left)

    def _render(self) -> Table:
        s = self._status
        table = Table(title=f"elsa-tune study {s.study}", show_header=False, expand=False)
        table.add_column("what", style="bold", no_wrap=True)
        table.add_column("value", no_wrap=True, overflow="ellipsis")
        table.add_row("phase", s.phase)
        table.add_row("candidate", s.candidate or "-")
        table.add_row("boots", f"{s.boots} ({s.failed_boots} failed)")
        best = s.best or "-"
        if s.best_throughput is not None:
            best += f"  {s.best_throughput:,.1f} tok/s"
        table.add_row("best so far", best)
        if s.time_left_s is not None:
            table.add_row("time left", time_left(s.time_left_s))
        if s.last_event:
            table.add_row("last", s.last_event)
        for line in s.decisions[-6:]:
            table.add_row("", line)
        return table


def time_left(seconds: float) -> str:
    """Floored: ``3000`` → ``"50 min"``, ``3660`` → ``"1 h 01 min"``, ``59`` → ``"0 min"``."""
    minutes = int(max(0.0, seconds) // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


class LiveConsoleHandler(logging.Handler):
    """Writes log records through a ``rich`` console, so a running ``Live`` view prints them above itself."""

    def __init__(self, console: Console, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(Text(self.format(record)), soft_wrap=True)
        except Exception:  # logging must never raise into the study
            self.handleError(record)


def _route_console_logs(console: Console) -> list[tuple[logging.Handler, logging.Handler]]:
    """Replace the elsa_tune logger's terminal stream handlers by ``LiveConsoleHandler``s on ``console``."""
    root = logging.getLogger("elsa_tune")
    swapped: list[tuple[logging.Handler, logging.Handler]] = []
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout,
                                                                        sys.__stderr__, sys.__stdout__):
            live = LiveConsoleHandler(console, handler.level)
            live.setFormatter(handler.formatter)
            root.removeHandler(handler)
            root.addHandler(live)
            swapped.append((handler, live))
    return swapped


def _restore_console_logs(swapped: list[tuple[logging.Handler, logging.Handler]]) -> None:
    root = logging.getLogger("elsa_tune")
    for original, live in swapped:
        root.removeHandler(live)
        root.addHandler(original)
