"""``RunIdentity``: which study a run folder belongs to, recorded in it before its first boot.

    <run_dir>/identity.json     RunIdentity: kind (study or comparison), name, space, traffic, setup, arms

A run folder holds one study's boots: a study (or ``compare``) pointed at a folder another one owns would reuse boots
measured on other traffic, another space or another setup, and overwrite that study's results. ``check_owner`` refuses
it with a paragraph naming what differs, before anything is written; ``claim`` writes the record under the run lock.
A folder written before this record existed is identified from what it holds (``study.json``, ``study.log``,
``compare.log``), as far as they say. ``refuse_finished`` keeps a finished study as it is: running it again would
replay it over its own result.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elsa_tune.durable_file import read_json, write_json
from elsa_tune.errors import ConfigError, HistoryError
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.study_record import StudyRecord, StudyStatus

IDENTITY_FILE = "identity.json"
SCHEMA_VERSION = 1
# schema history: 1 — first version.


class RunKind(enum.Enum):
    STUDY = "study"
    COMPARISON = "comparison"


@dataclass(frozen=True)
class RunIdentity:
    """What makes two runs one study. ``None``: not known (a folder written before this record)."""

    kind: RunKind
    name: str | None = None
    space: str | None = None            # the space's name and the sha256 of its file
    space_digest: str | None = None
    traffic: str | None = None          # as given (``demo`` or a path) and the sha256 of the trace's bytes
    traffic_digest: str | None = None
    setup: str | None = None            # ``Fingerprint.key()`` and ``describe()``
    setup_text: str | None = None
    arms: tuple[str, ...] = ()          # a comparison's candidate keys, A then B
    schema_version: int = SCHEMA_VERSION

    def differences(self, other: RunIdentity) -> list[str]:
        """What differs, as ``"name: stored → given"``, over the parts both records know."""
        out: list[str] = []
        if self.kind is not other.kind:
            out.append(f"kind: {self.kind.value} → {other.kind.value}")
        if self.name is not None and other.name is not None and self.name != other.name:
            out.append(f"study name: {self.name} → {other.name}")
        if _differ(self.space_digest, other.space_digest):
            out.append(f"space: {_named(self.space, self.space_digest)} → {_named(other.space, other.space_digest)}")
        if _differ(self.traffic_digest, other.traffic_digest) or (
                None in (self.traffic_digest, other.traffic_digest) and _differ(_base(self.traffic),
                                                                                _base(other.traffic))):
            out.append(f"traffic: {_named(self.traffic, self.traffic_digest)} → "
                       f"{_named(other.traffic, other.traffic_digest)}")
        if _differ(self.setup, other.setup):
            out.append(f"setup: {self.setup_text or self.setup} → {other.setup_text or other.setup}")
        if self.arms and other.arms and self.arms != other.arms:
            out.append(f"flag files: A/B {'/'.join(self.arms)} → {'/'.join(other.arms)}")
        return out

    def describe(self) -> str:
        what = "a comparison" if self.kind is RunKind.COMPARISON else "a study"
        return f"{what} ({self.name})" if self.name else what

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data.update(kind=self.kind.value, arms=list(self.arms))
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunIdentity:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs.update(kind=RunKind(data["kind"]), arms=tuple(str(a) for a in data.get("arms", ())))
        identity = cls(**kwargs)
        texts = (identity.name, identity.space, identity.space_digest, identity.traffic, identity.traffic_digest,
                 identity.setup, identity.setup_text)
        if not all(t is None or isinstance(t, str) for t in texts):
            raise TypeError("the name, space, traffic and setup are strings")
        return identity


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (16 hex digits), read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def read_identity(run_dir: Path) -> RunIdentity | None:
    """The folder's owner: ``identity.json``, else what an older folder's files say, else ``None`` (no run)."""
    path = run_dir / IDENTITY_FILE
    if path.exists():
        try:
            return RunIdentity.from_dict(read_json(path))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise HistoryError(f"{path}: not a valid run identity: {exc}",
                               remedy="restore the file from a backup, or give --out a fresh folder") from exc
    study = RunDir(run_dir).read_study()
    if study is not None:
        return _legacy(study)
    if (run_dir / "compare.log").exists() or (run_dir / "compare.json").exists():
        return RunIdentity(RunKind.COMPARISON)
    if (run_dir / "study.log").exists():
        return RunIdentity(RunKind.STUDY)
    return None


def check_owner(run_dir: Path, wanted: RunIdentity, *, flag: str = "--out") -> None:
    """Refuse a folder another study or comparison owns, naming what differs; create nothing."""
    if not run_dir.is_dir():
        return
    stored = read_identity(run_dir)
    if stored is None:
        return
    if stored.kind is not wanted.kind:
        raise ConfigError(f"{flag} {run_dir} holds {stored.describe()}, not {wanted.describe()}: its boots would be "
                          "mixed with this one's and its results overwritten",
                          remedy=f"give {flag} a fresh folder")
    changes = stored.differences(wanted)
    if changes:
        raise ConfigError(f"{flag} {run_dir} holds {stored.describe()}, which differs from this one "
                          f"({'; '.join(changes)}): its boots would be mixed with this one's and its results "
                          "overwritten",
                          remedy=f"give {flag} a fresh folder for this {wanted.kind.value} (the ledger beside it is "
                                 f"shared), or rerun that {stored.kind.value}'s own command to continue it")


def claim(run_dir: Path, identity: RunIdentity, *, flag: str = "--out") -> None:
    """``check_owner``, then record ``identity`` in the folder when it holds none (call it holding the run lock)."""
    check_owner(run_dir, identity, flag=flag)
    if not (run_dir / IDENTITY_FILE).exists():
        write_json(run_dir / IDENTITY_FILE, identity.to_dict())


def refuse_finished(run_dir: Path, *, flag: str = "--out") -> None:
    """A finished study is a result: running it again would replay it over itself, so it is refused untouched."""
    study = RunDir(run_dir).read_study() if run_dir.is_dir() else None
    if study is None or study.status is not StudyStatus.FINISHED:
        return
    raise ConfigError(f"{flag} {run_dir} holds study {study.name}, which has finished (recommended: "
                      f"{study.incumbent.label or study.incumbent.key()}); running it again would replay it over its "
                      "own result, so nothing was run",
                      remedy=f"read its result (elsa-tune report {run_dir}, {run_dir / 'best'}); add --extend 2h "
                             f"(any duration) to continue it with more budget; or give {flag} a fresh folder to run "
                             "another study (the ledger beside it carries this one's rejections)")


def _legacy(study: StudyRecord) -> RunIdentity:
    digest, space = study.space_digest, study.settings.get("space")
    return RunIdentity(RunKind.STUDY, study.name, space=str(space) if space else None,
                       space_digest=_short(digest) if digest else None,
                       traffic=study.traffic or None, setup=study.fingerprint.key(),
                       setup_text=study.fingerprint.describe())


def _short(digest: str) -> str:
    return digest[:16]


def _differ(mine: str | None, theirs: str | None) -> bool:
    return mine is not None and theirs is not None and mine != theirs


def _base(traffic: str | None) -> str | None:
    """A traffic as an older record gave it, without its folder (the same file given by another relative path)."""
    return Path(traffic).name if traffic else None


def _named(name: str | None, digest: str | None) -> str:
    return f"{name or '?'} (sha256 {digest[:8]})" if digest else (name or "?")
