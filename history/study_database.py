"""Whether a SQLite file is a study database elsa-tune may open: read-only, before Optuna adds a table to it.

Opening a SQLite file through Optuna's storage creates Optuna's tables and the boot registry's in it. In a file that
belongs to another application that is damage done before anything can be refused, so ``check_study_database``
reads the file's table list read-only first (from a copy when
a killed process left a hot journal beside it) and refuses a file that is not a SQLite database or that holds any table
neither Optuna nor elsa-tune creates. A missing or empty file is a new study's.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path
from urllib.parse import quote

from elsa_tune.errors import HistoryError

#: The tables Optuna's RDB storage creates (schema v3), and its schema version's.
OPTUNA_TABLES = frozenset({
    "studies", "version_info", "study_directions", "study_user_attributes", "study_system_attributes", "trials",
    "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values", "trial_intermediate_values",
    "trial_heartbeats", "alembic_version"})
#: elsa-tune's own tables are named ``elsa_<noun>_v<N>`` (boot registry, work claims, ledger).
OWN_PREFIX = "elsa_"


def check_study_database(path: Path, *, what: str = "the study database", remedy: str = "",
                         damaged_remedy: str = "") -> None:
    """Refuse ``path`` unless it is missing, empty or holds only Optuna's and elsa-tune's tables; changes nothing."""
    if not remedy:
        remedy, damaged_remedy = _REMEDY, damaged_remedy or _DAMAGED
    try:
        if not path.exists() or (path.is_file() and path.stat().st_size == 0):
            return
    except OSError as exc:
        raise HistoryError(f"{what} {path} cannot be read: {exc.strerror or exc}",
                           remedy="check that the file and its folder can be read") from exc
    if not path.is_file():
        raise HistoryError(f"{what} {path} is not a file", remedy=remedy)
    try:
        tables = _tables(path)
    except sqlite3.Error as exc:
        raise HistoryError(f"{what} {path} is not a SQLite database elsa-tune can read, or its SQLite file is "
                           f"damaged ({exc}); it was left untouched",
                           remedy=damaged_remedy or remedy) from exc
    foreign = sorted(t for t in tables if t not in OPTUNA_TABLES and not t.startswith((OWN_PREFIX, "sqlite_")))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise HistoryError(f"{what} {path} belongs to another application (it holds the tables {shown}, which neither "
                           "Optuna nor elsa-tune creates); it was left untouched", remedy=remedy)


_DAMAGED = ("move it aside (boots/ and decisions/ keep every measurement) and rerun to start the study's Optuna "
            "storage afresh, or give --out a fresh folder")
_REMEDY = ("move that file out of the run folder, or give --out a fresh folder (a study's database is created there "
           "as study.db)")


def _tables(path: Path) -> set[str]:
    """The tables of ``path``, read without changing it. A process killed inside a transaction leaves a hot
    rollback journal (``study.db-journal``) that a read-only connection cannot roll back: the file and its journal
    are then read from a copy, where SQLite recovers, and the study's own next connection rolls the original back."""
    journal = path.with_name(path.name + "-journal")
    if not journal.exists():
        return _read_tables(f"file:{quote(str(path.resolve()))}?mode=ro")
    with tempfile.TemporaryDirectory(prefix="elsa-db-check-") as scratch:
        copy = Path(scratch) / path.name
        shutil.copyfile(path, copy)
        shutil.copyfile(journal, copy.with_name(copy.name + "-journal"))
        return _read_tables(f"file:{quote(str(copy))}")


def _read_tables(uri: str) -> set[str]:
    connection = sqlite3.connect(uri, uri=True)
    try:
        return {str(row[0]) for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        connection.close()
