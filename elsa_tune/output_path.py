"""``OutputPath``: a file a command is asked to write, refused before anything is written when it cannot be.

A command checks every output before it reads a byte of input, queries a server or creates a file: an output that
names one of the command's inputs (the same file, whatever path names it), an existing folder, anything but a regular
file (a FIFO, a device node, a socket: replacing one would replace what another program reads or writes), a symbolic
link that loops, a name that is not UTF-8, a path under ``/proc``, ``/sys`` or ``/dev``, or a parent that is not a
writable folder is a ``ConfigError`` naming the flag and the remedy. Checking first means a refused command leaves
nothing behind.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elsa_tune.errors import ConfigError

_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))


@dataclass(frozen=True)
class OutputPath:
    """``path`` as given to ``flag`` (e.g. ``-o``), to be written as a file (or a folder with ``folder=True``)."""

    path: Path
    flag: str
    folder: bool = False

    def check(self, inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
        """``path`` when it can be written without destroying an input; raises ``ConfigError`` otherwise."""
        path = Path(self.path)
        what = "folder" if self.folder else "file"
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:    # bytes that are not UTF-8 (a Latin-1 name): records and reports name it
            raise ConfigError(f"{self.flag} {str(path).encode('utf-8', 'surrogateescape')!r} is not UTF-8 text",
                              remedy=f"give {self.flag} a name of UTF-8 characters") from None
        for given in inputs:
            if given is not None and _same_file(path, Path(given)):
                raise ConfigError(f"{self.flag} {path} is also an input of this command: writing it would destroy "
                                  "what is being read",
                                  remedy=f"give {self.flag} another path")
        try:
            resolved = path.resolve()
            status = path.stat() if os.path.lexists(path) else None
        except (OSError, RuntimeError) as exc:    # RuntimeError: a symbolic link loop (Python < 3.13)
            raise ConfigError(f"{self.flag} {path} cannot be followed: {getattr(exc, 'strerror', None) or exc}",
                              remedy=f"give {self.flag} a path that is not a looping or broken symbolic link") from exc
        pseudo = next((p for p in _PSEUDO if resolved == p or p in resolved.parents), None)
        if pseudo is not None:
            raise ConfigError(f"{self.flag} {path} is inside {pseudo}, a kernel file system that holds no files",
                              remedy=f"give {self.flag} a path on a real file system")
        if status is not None and self.folder and not stat.S_ISDIR(status.st_mode):
            raise ConfigError(f"{self.flag} {path} is {_kind(status.st_mode)}, not a folder",
                              remedy=f"give {self.flag} a folder (it is created when missing)")
        if status is not None and not self.folder and stat.S_ISDIR(status.st_mode):
            raise ConfigError(f"{self.flag} {path} is a folder, not a file",
                              remedy=f"give {self.flag} a file name, e.g. {path / 'out'}")
        if status is not None and not self.folder and not stat.S_ISREG(status.st_mode):
            raise ConfigError(f"{self.flag} {path} is {_kind(status.st_mode)}, not a regular file: writing the output "
                              "would replace it", remedy=f"give {self.flag} the name of a regular file or a new one")
        parent = _existing_ancestor(resolved.parent)
        if not parent.is_dir():
            raise ConfigError(f"{self.flag} {path}: {parent} is a file, so the {what} cannot be created",
                              remedy=f"give {self.flag} a path under a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{self.flag} {path}: {parent} is not writable",
                              remedy=f"give {self.flag} a path you can write to")
        return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _same_file(output: Path, given: Path) -> bool:
    """Both exist and are one file (a link or another spelling of the path included)."""
    try:
        return output.exists() and given.exists() and os.path.samefile(output, given)
    except OSError:
        return False


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
