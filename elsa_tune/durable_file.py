"""Durable files: every record elsa-tune keeps is written whole or not at all.

``replacing`` (and ``write_atomic``, its one-call form) writes a temporary file beside the target, fsyncs
it, renames it over the target and fsyncs the folder, so a process killed at any instant leaves either the
old file or the new one, never a torn one. Readers treat an unreadable file as a ``HistoryError`` that
names the path.
"""

from __future__ import annotations

import enum
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from elsa_tune.errors import HistoryError


@contextmanager
def replacing(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside ``path``; when the block ends without an exception the file is
    fsynced, renamed over ``path`` and the folder fsynced. On an exception ``path`` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (``replacing``: tmp + fsync + rename + fsync of the folder)."""
    with replacing(path, mode=mode) as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


def write_json(path: Path, data: Any) -> None:
    """``write_atomic`` of ``data`` as indented, key-sorted JSON with a trailing newline."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=_jsonable) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON record; an unreadable one raises ``HistoryError`` naming the file."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise HistoryError(f"{path}: missing", remedy="check the run directory path") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HistoryError(f"{path}: unreadable record: {exc}",
                           remedy="restore the file from a backup or delete it to drop that record") from exc


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening a directory; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    # a record must never fail to persist because a runtime put an odd type in server_args
    return repr(value)
