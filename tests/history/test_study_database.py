"""``check_study_database``: another application's SQLite file is refused untouched; a study's own database passes,
including one a killed process left with a hot rollback journal (the study must resume, not be refused as damaged).
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from elsa_tune.errors import HistoryError
from elsa_tune.history.study_database import check_study_database


def _digest(*paths: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_a_database_killed_inside_a_transaction_passes_and_is_left_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "study.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO studies (name) VALUES ('s')")
    # a process that dies (no rollback, no close) while it writes: SQLite leaves study.db-journal, a hot journal
    code = (f"import os, sqlite3; c = sqlite3.connect({str(db)!r}); c.execute('BEGIN'); "
            "c.execute(\"INSERT INTO studies (name) VALUES ('t')\"); "
            "c.execute('CREATE TABLE elsa_boots_v1 (x)'); "
            "c.execute(\"UPDATE studies SET name = 'u' WHERE name = 's'\"); c.execute('PRAGMA cache_size = 1'); "
            "[c.execute('INSERT INTO elsa_boots_v1 VALUES (?)', (b'x' * 4000,)) for _ in range(50)]; "
            "os._exit(9)")
    subprocess.run([sys.executable, "-c", code], check=False)
    journal = tmp_path / "study.db-journal"
    assert journal.exists() and journal.stat().st_size > 0
    before = _digest(db, journal)
    check_study_database(db)          # the study's own database: it resumes
    assert _digest(db, journal) == before


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "study.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE invoices (x)")
    before = _digest(db)
    with pytest.raises(HistoryError, match="another application"):
        check_study_database(db)
    assert _digest(db) == before
