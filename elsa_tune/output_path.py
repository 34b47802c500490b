"""``OutputPath``: a file a command is asked to write, refused before anything is written when it cannot be.

A command checks every output before it reads a byte of input or creates a file: an output that names one of
the command's inputs (the same file, whatever path names it), an existing folder, a
path under ``/proc`` or ``/sys``, or a parent that is not a writable folder is a ``ConfigError`` naming the
flag and the remedy. Checking first means a refused command leaves nothing behind.
"""

from __future__ import annotations

import os
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
        for given in inputs:
            if given is not None and _same_file(path, Path(given)):
                raise ConfigError(f"{self.flag} {path} is also an input of this command: writing it would destroy "
                                  "what is being read",
                                  remedy=f"give {self.flag} another path")
        resolved = path.resolve()
        pseudo = next((p for p in _PSEUDO if resolved == p or p in resolved.parents), None)
        if pseudo is not None:
            raise ConfigError(f"{self.flag} {path} is inside {pseudo}, a kernel file system that holds no files",
                              remedy=f"give {self.flag} a path on a real file system")
        if self.folder and path.exists() and not path.is_dir():
            raise ConfigError(f"{self.flag} {path} is a file, not a folder",
                              remedy=f"give {self.flag} a folder (it is created when missing)")
        if not self.folder and path.is_dir():
            raise ConfigError(f"{self.flag} {path} is a folder, not a file",
                              remedy=f"give {self.flag} a file name, e.g. {path / 'out'}")
        parent = _existing_ancestor(resolved.parent)
        if not parent.is_dir():
            raise ConfigError(f"{self.flag} {path}: {parent} is a file, so the {what} cannot be created",
                              remedy=f"give {self.flag} a path under a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{self.flag} {path}: {parent} is not writable",
                              remedy=f"give {self.flag} a path you can write to")
        return path


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
