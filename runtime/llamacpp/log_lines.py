"""The lines of a ``llama-server`` log: prefix, level, time since start, and the text after the prefix.

llama.cpp prefixes each line with ``M.SS.mmm.uuu`` (minutes, seconds, milliseconds and microseconds since
the log started), a level letter (``I``, ``W``, ``E``, ``D``), and for the server's own lines a module tag
(``srv``, ``cmn``, ``slot``, ``spec``) before ``function: message``; the argument parser writes plain lines
(``error: invalid argument: --x``) and some lines carry no prefix. ``--log-colors on`` wraps lines in ANSI
colour codes, which are dropped here. Nothing in this module raises on any text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from elsa_tune.runtime.log_lines import ANSI

_PREFIX = re.compile(r"^(?P<m>\d+)\.(?P<s>\d{2})\.(?P<ms>\d{3})\.(?P<us>\d{3}) (?P<level>[A-Z]) ")

#: The fragment of the line ``llama-server`` prints once its HTTP server listens (after "model loaded"):
#: ``srv  llama_server: listening on http://127.0.0.1:8080`` (older builds: ``server is listening on http://…``).
READY_LINE = "listening on http://"


@dataclass(frozen=True)
class LogLine:
    """One line: ``raw`` as written (colour codes removed), ``text`` after the time and level prefix,
    ``seconds`` since the log started (``None`` without a prefix) and the ``level`` letter (``""``)."""

    raw: str
    text: str
    seconds: float | None
    level: str


def split_lines(log_text: str) -> list[LogLine]:
    """Every line of ``log_text`` with its prefix parsed; tolerant of lines that have none."""
    lines = []
    for original in log_text.splitlines():
        raw = ANSI.sub("", original).rstrip()
        match = _PREFIX.match(raw)
        if match is None:
            lines.append(LogLine(raw, raw.strip(), None, ""))
            continue
        seconds = int(match["m"]) * 60 + int(match["s"]) + int(match["ms"]) / 1e3 + int(match["us"]) / 1e6
        lines.append(LogLine(raw, raw[match.end():].strip(), round(seconds, 6), match["level"]))
    return lines
