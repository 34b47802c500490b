"""A runtime's log line as its parsers read it, and the searches every runtime family's parser runs over lines.

Each family splits its own log (``runtime/vllm/log_lines.py``, ``runtime/llamacpp/log_lines.py``) into lines that
keep the line as written (``raw``, colour codes removed), the text after the family's prefix (``text``) and the
level (``""`` without one); the startup-log parsers and failure classifiers search those lines with ``first`` and
``last``. Nothing in this module raises on any text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

#: the ANSI colour codes a runtime writes with colours on (dropped before any line is parsed)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TextLine(Protocol):
    """A parsed log line: ``raw`` as written, ``text`` after the prefix, and the ``level`` (``""`` without one)."""

    @property
    def raw(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def level(self) -> str: ...


LineT = TypeVar("LineT", bound=TextLine)


def first(lines: Sequence[LineT], pattern: re.Pattern[str]) -> tuple[LineT, re.Match[str]] | None:
    """The first line ``pattern`` matches (searched in ``text``) and its match."""
    for line in lines:
        match = pattern.search(line.text)
        if match:
            return line, match
    return None


def last(lines: Sequence[LineT], pattern: re.Pattern[str]) -> tuple[LineT, re.Match[str]] | None:
    """The last line ``pattern`` matches (searched in ``text``) and its match."""
    return first(lines[::-1], pattern)
