"""``RunDir``: the layout of one study's folder on disk, and reading it back as a ``History``.

    <run_dir>/study.json                    StudyRecord, rewritten atomically after every decision
    <run_dir>/study.db                      the Optuna storage (SQLite by default; see ``store.py``)
    <run_dir>/boots/<nnnn>-<label>/         one folder per boot: server.log, boot.json
    <run_dir>/decisions/<nnnn>-<slug>.json  one DecisionRecord per keep/reject decision
    <run_dir>/trials/<study>-<nnnn>.json    one TrialRecord per numeric-search trial
    <run_dir>/../ledger.jsonl               the ledger, shared by the studies of the parent folder

Files are the source of truth; this module needs no Optuna, so reports render from files alone. A boot
folder without ``boot.json`` is a boot the study was killed during: it is listed, never invented.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from elsa_tune.durable_file import read_json, write_json
from elsa_tune.errors import HistoryError
from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import BootRecord, TrialRecord
from elsa_tune.history.study_record import StudyRecord

BOOT_FILE = "boot.json"
SERVER_LOG = "server.log"
LEDGER_FILE = "ledger.jsonl"
_BOOT_DIR = re.compile(r"^(\d{4,})-")
_MAX_BOOTS = 1_000_000
_T = TypeVar("_T", BootRecord, DecisionRecord, TrialRecord, StudyRecord)


@dataclass(frozen=True)
class BootSlot:
    """A freshly allocated boot folder: hand ``folder`` to ``Runtime.start`` as its ``boot_dir``."""

    boot_id: str
    number: int
    folder: Path
    log_path: Path          # absolute
    log_relpath: str        # relative to the run dir, as stored in ``BootRecord.log_path``


@dataclass(frozen=True)
class History:
    """Everything a study recorded, read from its folder. Reports are a function of this alone."""

    run_dir: Path
    study: StudyRecord | None
    boots: tuple[BootRecord, ...]
    decisions: tuple[DecisionRecord, ...]
    trials: tuple[TrialRecord, ...]
    incomplete_boots: tuple[str, ...]

    def boot(self, boot_id: str) -> BootRecord | None:
        return next((b for b in self.boots if b.boot_id == boot_id), None)

    def boots_of(self, candidate_key: str) -> list[BootRecord]:
        return [b for b in self.boots if b.candidate.key() == candidate_key]


class RunDir:
    """One study's folder. Writes are atomic; numbering is race-free (exclusive ``mkdir``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def study_path(self) -> Path:
        return self.path / "study.json"

    @property
    def boots_dir(self) -> Path:
        return self.path / "boots"

    @property
    def decisions_dir(self) -> Path:
        return self.path / "decisions"

    @property
    def trials_dir(self) -> Path:
        return self.path / "trials"

    # ---- boots -----------------------------------------------------------------------------------

    def new_boot(self, label: str) -> BootSlot:
        """Allocate the next boot folder ``boots/<nnnn>-<label>/`` (never reuses a number, even a killed one's)."""
        self.boots_dir.mkdir(parents=True, exist_ok=True)
        number = max((n for n, _ in self._boot_folders()), default=0) + 1
        slug = slugify(label) or "boot"
        while number < _MAX_BOOTS:
            boot_id = f"{number:04d}-{slug}"
            folder = self.boots_dir / boot_id
            try:
                folder.mkdir()
            except FileExistsError:
                number += 1
                continue
            log = folder / SERVER_LOG
            return BootSlot(boot_id, number, folder, log, str(log.relative_to(self.path)))
        raise HistoryError(f"{self.boots_dir}: no free boot number", remedy="use a fresh run directory")

    def write_boot(self, record: BootRecord) -> Path:
        """Write ``boot.json`` atomically into the boot's folder (created if a caller skipped ``new_boot``)."""
        path: Path = self.boots_dir / record.boot_id / BOOT_FILE
        write_json(path, record.to_dict())
        return path

    def read_boot(self, boot_id: str) -> BootRecord:
        return _parse(BootRecord, self.boots_dir / boot_id / BOOT_FILE)

    def boots(self) -> list[BootRecord]:
        return [self.read_boot(folder.name) for _, folder in self._boot_folders()
                if (folder / BOOT_FILE).exists()]

    def incomplete_boots(self) -> list[str]:
        """Boot folders without a ``boot.json``: boots the study was killed during."""
        return [folder.name for _, folder in self._boot_folders() if not (folder / BOOT_FILE).exists()]

    def log_excerpt(self, boot_id: str, *, lines: int = 20, pattern: str | None = None) -> list[str]:
        """The last ``lines`` lines of a boot's server log (those matching ``pattern`` if given)."""
        log = self.boots_dir / boot_id / SERVER_LOG
        try:
            text = log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        if pattern is not None:
            regex = re.compile(pattern)
            text = [line for line in text if regex.search(line)]
        return text[-lines:]

    def _boot_folders(self) -> Iterator[tuple[int, Path]]:
        if not self.boots_dir.is_dir():
            return iter(())
        found = []
        for folder in self.boots_dir.iterdir():
            match = _BOOT_DIR.match(folder.name)
            if match and folder.is_dir():
                found.append((int(match.group(1)), folder))
        return iter(sorted(found))

    # ---- decisions, trials, the study ------------------------------------------------------------

    def write_decision(self, record: DecisionRecord) -> Path:
        path = self.decisions_dir / f"{record.number:04d}-{slugify(record.technique) or 'decision'}.json"
        for stale in self.decisions_dir.glob(f"{record.number:04d}-*.json"):
            if stale != path:
                stale.unlink()
        write_json(path, record.to_dict())
        return path

    def decisions(self) -> list[DecisionRecord]:
        if not self.decisions_dir.is_dir():
            return []
        records = [_parse(DecisionRecord, p) for p in sorted(self.decisions_dir.glob("*.json"))]
        return sorted(records, key=lambda d: d.number)

    def next_decision_number(self) -> int:
        return max((d.number for d in self.decisions()), default=0) + 1

    def write_trial(self, record: TrialRecord) -> Path:
        path = self.trials_dir / f"{slugify(record.study) or 'study'}-{record.number:04d}.json"
        write_json(path, record.to_dict())
        return path

    def trials(self) -> list[TrialRecord]:
        if not self.trials_dir.is_dir():
            return []
        return [_parse(TrialRecord, p) for p in sorted(self.trials_dir.glob("*.json"))]

    def write_study(self, record: StudyRecord) -> Path:
        write_json(self.study_path, record.to_dict())
        return self.study_path

    def read_study(self) -> StudyRecord | None:
        if not self.study_path.exists():
            return None
        return _parse(StudyRecord, self.study_path)

    def sweep_temp_files(self) -> list[Path]:
        """Delete the temporary files of atomic writes a killed process left behind; returns them."""
        stale = [p for p in self.path.rglob(".*.tmp") if p.is_file()] if self.path.is_dir() else []
        for p in stale:
            p.unlink(missing_ok=True)
        return stale

    def load(self) -> History:
        """Read the whole folder. Raises ``HistoryError`` naming the file if a record is unreadable."""
        if not self.path.is_dir():
            raise HistoryError(f"{self.path}: not a run directory",
                               remedy="pass the folder a study wrote (it holds study.json and boots/)")
        return History(run_dir=self.path, study=self.read_study(), boots=tuple(self.boots()),
                       decisions=tuple(self.decisions()), trials=tuple(self.trials()),
                       incomplete_boots=tuple(self.incomplete_boots()))


def slugify(text: str, *, limit: int = 48) -> str:
    """A file-name-safe slug: ``--enable-mixed-chunk`` → ``enable-mixed-chunk``."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-._")
    return slug[:limit].rstrip("-._")


def _parse(kind: type[_T], path: Path) -> _T:
    data = read_json(path)
    try:
        return kind.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:   # AttributeError: a list where a mapping is
        raise HistoryError(f"{path}: not a valid {kind.__name__}: {exc!r}",
                           remedy="restore the file from a backup or delete it to drop that record") from exc
