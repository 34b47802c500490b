"""``RunLock``: one study at a time in a run folder, by an advisory lock the kernel drops when its holder dies.

The lock is ``flock`` on ``<run_dir>/.elsa-tune.lock``; the file holds the holder's pid, host and command line,
so a refused second study names who has the folder. A holder killed by SIGKILL releases it with its last file
descriptor: nothing stale is left to clean by hand. The file itself stays (it is the folder's lock, not a
sign of a live holder).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from types import TracebackType

from elsa_tune.errors import ConfigError, HistoryError

LOCK_FILE = ".elsa-tune.lock"
_REMEDY = ("wait for that study to finish (or stop it), or give this one another --out; two studies in one folder "
           "would overwrite each other's records")


class RunLock:
    """Exclusive, non-blocking hold of a run folder for as long as the ``with`` block (or ``release``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise ``ConfigError`` naming the holder's pid and command (held already: a no-op)."""
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise HistoryError(f"cannot open the run folder's lock {self.path}: {exc.strerror or exc}",
                               remedy="point --out at a folder you can write to") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ConfigError(f"the run folder {self.run_dir} is in use by {holder}", remedy=_REMEDY) from None
        except OSError as exc:
            os.close(fd)
            raise HistoryError(f"cannot lock the run folder {self.run_dir}: {exc.strerror or exc}",
                               remedy="use a run folder on a local file system (--out)") from exc
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def check_free(self) -> None:
        """Raise the refusal ``acquire`` would raise if another process holds the folder; create nothing.

        For a check before the study's first file: an existing lock file is tried and let go at once.
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return   # no lock file (or none readable): nobody holds the folder through it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            raise ConfigError(f"the run folder {self.run_dir} is in use by {holder}", remedy=_REMEDY) from None
        except OSError:
            return
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """The holder as the lock file says it: 'pid N on HOST (command …)', or 'another process' when unreadable."""
    try:
        data = json.loads(os.pread(fd, 65536, 0) or b"{}")
        pid, host, command = int(data["pid"]), str(data["host"]), [str(a) for a in data["command"]]
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its lock record is unreadable)"
    shown = " ".join(command)
    return f"pid {pid} on {host} ({shown[:200]})"
