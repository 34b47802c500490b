"""``input_problem`` and ``read_input``: a file a command reads, refused before it is opened when it cannot be one.

A FIFO, a device node or a socket given as an input would block the command until another program writes to it, or
feed it without end (``/dev/zero``); a file larger than the command's bound would be parsed for minutes. Both are
refused as one ``ConfigError`` naming the flag (or argument) and the remedy, before the first byte is read. A missing
file, a folder and an unreadable one are left to the caller's own messages (``input_problem`` says nothing of them).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from elsa_tune.errors import ConfigError


def input_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as an input file: a FIFO, device or socket (``None`` for anything else)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
    return f"is {kind}, not a regular file"


def check_input(path: str | os.PathLike[str], what: str) -> None:
    """Raise ``ConfigError`` when ``path`` (``what``: e.g. ``--traffic`` or ``the log``) is a FIFO, device or socket."""
    problem = input_problem(path)
    if problem is not None:
        raise ConfigError(f"{what} {path} {problem}: reading it could block or never end",
                          remedy="save what it holds to a regular file and give that file")


def read_input(path: str | os.PathLike[str], what: str, *, limit: int) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them; raises ``ConfigError`` for a special file or a larger one.

    ``OSError`` (missing, a folder, no permission) propagates for the caller to word.
    """
    check_input(path, what)
    with open(path, "rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise ConfigError(f"{what} {path} is larger than {_size(limit)}, more than such a file ever holds",
                          remedy=f"check that {Path(path).name} is the file you meant")
    return raw


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"
