"""The lines of a vLLM log: process prefix, level, wall-clock time, source location, and the message.

vLLM (V1, 0.9 to 0.33) writes ``[(<Proc>[_DP<n>|_TP<n>] pid=<pid>) ]LEVEL MM-DD HH:MM:SS [file.py:line] msg``::

    (APIServer pid=8123) INFO 12-04 17:55:21 [api_server.py:1885] vLLM API server version 0.10.1
    (EngineCore_DP0 pid=8311) INFO 12-04 17:56:40 [kv_cache_utils.py:1149] GPU KV cache size: 425,424 tokens, …

V0 (up to about 0.7.3) writes the location without its opening bracket (``INFO 10-10 12:00:00 llm_engine.py:234]
msg``), with a ``(VllmWorkerProcess pid=N)`` prefix on worker lines only. A message that spans lines repeats the
prefix on each (vLLM's ``NewLineFormatter``); tracebacks and argparse's usage block carry none. Colour codes
(``VLLM_LOGGING_COLOR=1``) are dropped here. Nothing in this module raises on any text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from elsa_tune.runtime.log_lines import ANSI

_PROCESS = re.compile(r"^\((?P<proc>[^()]*?)\s+pid=(?P<pid>\d+)\)\s?")
_PREFIX = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<month>\d\d)-(?P<day>\d\d)\s+"
                     r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.\d+)?\s+"
                     r"(?P<open>\[)?(?P<file>[\w./-]+\.py):(?P<line>\d+)\]\s?")


@dataclass(frozen=True)
class LogLine:
    """One line: ``raw`` as written (colour codes removed), ``text`` after the prefix (the whole line without
    one; a traceback line keeps only its process prefix removed), the ``process`` name (``APIServer``,
    ``EngineCore_DP0``; ``""`` without), the ``level`` word (``""``), ``seconds`` since the start of the line's
    month (``None`` without a level prefix), and whether the prefix had V1's
    ``[file.py:line]`` form (``v1_prefix``)."""

    raw: str
    text: str
    process: str
    level: str
    seconds: float | None
    v1_prefix: bool


def split_lines(log_text: str) -> list[LogLine]:
    """Every line of ``log_text`` with its prefix parsed; tolerant of lines that have none."""
    lines = []
    for original in log_text.splitlines():
        raw = ANSI.sub("", original).replace("\r", "").rstrip()
        process = _PROCESS.match(raw)
        rest = raw[process.end():] if process else raw
        name = process["proc"] if process else ""
        match = _PREFIX.match(rest)
        if match is None:
            lines.append(LogLine(raw, rest.strip(), name, "", None, False))
            continue
        seconds = int(match["day"]) * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + int(match["s"])
        lines.append(LogLine(raw, rest[match.end():].strip(), name, match["level"], float(seconds),
                             match["open"] is not None))
    return lines


def has_vllm_prefix(lines: Sequence[LogLine]) -> bool:
    """Whether any line carries vLLM's prefix (a level, a date and a ``file.py:line]`` location)."""
    return any(line.level for line in lines)
