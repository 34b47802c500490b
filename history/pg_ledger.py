"""``PostgresLedger``: the rejected-technique ledger as a table in the study's database (issue 8).

Workers on several hosts share one Optuna study in PostgreSQL; they share the ledger through the same
database, so a technique rejected by one worker is skipped by every other. One row per entry: the entry as
JSONB (``entry``), its ``LedgerEntry.key()`` under a unique index (``entry_key``), and the columns a
reader filters on (technique, ledger key, study). An append is ``INSERT … ON CONFLICT (entry_key) DO
NOTHING``: two workers recording the same decision (a resumed worker, a retried work item) leave one row,
without a read-then-write race. Creating the table takes a transaction-scoped advisory lock, because
PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe against a concurrent creator.

The same class runs on SQLite (entries as JSON text), which is what a single host with several GPUs uses
when no PostgreSQL URL is given, and what the fast tests use. ``ledger_for`` picks the backend.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from elsa_tune.errors import HistoryError
from elsa_tune.history.ledger import CorruptLine, Ledger, LedgerContents, LedgerEntry

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# schema history: 1 — first version (table elsa_ledger_v1).
TABLE = "elsa_ledger_v1"
#: Advisory-lock id guarding DDL on the ledger table (any constant; 0x656c7361 is "elsa").
_DDL_LOCK = 0x656C7361_0001


def is_shared_url(storage_url: str | None) -> bool:
    """Whether a storage URL names a database server (the ledger then lives there, not in ``ledger.jsonl``)."""
    return bool(storage_url) and not str(storage_url).startswith("sqlite")


class PostgresLedger:
    """A ``LedgerBackend`` over one SQL table; PostgreSQL (JSONB) or SQLite (JSON text).

    ``url`` is an SQLAlchemy URL (``postgresql://…``, ``postgresql+psycopg2://…``, ``sqlite:///…``). The
    table is created on first use. ``append`` is atomic and idempotent per ``LedgerEntry.key()``.
    """

    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.url = url
        try:
            self.engine = engine or _engine(url)
        except (SQLAlchemyError, ImportError) as exc:
            raise HistoryError(f"cannot open the ledger database {_redact(url)}: {exc}",
                               remedy="check the URL, the database server and its permissions") from exc
        self.postgres = self.engine.dialect.name == "postgresql"
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE, meta,
            sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                      autoincrement=True),
            sa.Column("entry_key", sa.String(64), nullable=False, unique=True),
            sa.Column("technique", sa.Text, nullable=False),
            sa.Column("ledger_key", sa.String(32), nullable=False),
            sa.Column("study", sa.Text, nullable=False),
            sa.Column("decision", sa.String(16), nullable=False),
            sa.Column("appended_at", sa.Float, nullable=False),
            sa.Column("entry", postgresql.JSONB().with_variant(sa.Text(), "sqlite"), nullable=False),
        )
        sa.Index(f"{TABLE}_ledger_key", self.table.c.ledger_key, self.table.c.technique)
        self._ensure_table()

    @property
    def source(self) -> str:
        return f"{_redact(self.url)} table {TABLE}"

    def append(self, entry: LedgerEntry) -> None:
        self.append_new(entry)

    def append_new(self, entry: LedgerEntry) -> bool:
        """Insert ``entry`` unless one with the same ``key()`` exists; returns whether a row was added."""
        data = entry.to_dict()
        row: dict[str, Any] = {
            "entry_key": entry.key(), "technique": entry.technique, "ledger_key": entry.fingerprint.ledger_key(),
            "study": entry.evidence.study, "decision": entry.decision.value, "appended_at": time.time(),
            # JSONB takes plain JSON types only: round-trip through the same serialisation as the JSONL ledger.
            "entry": json.loads(json.dumps(data, default=str)) if self.postgres
            else json.dumps(data, sort_keys=True, ensure_ascii=False, default=str),
        }
        if self.postgres:
            stmt: Any = postgresql.insert(self.table).values(**row).on_conflict_do_nothing(
                index_elements=["entry_key"])
        else:
            stmt = sqlite.insert(self.table).values(**row).on_conflict_do_nothing(index_elements=["entry_key"])
        try:
            with self.engine.begin() as conn:
                added = conn.execute(stmt).rowcount
        except SQLAlchemyError as exc:
            raise HistoryError(f"cannot append to the ledger in {self.source}: {exc}",
                               remedy="check the database server; the decision is in the run folder's "
                                      "decisions/ and is appended again when the worker resumes") from exc
        if not added:
            log.debug("ledger entry %s (%s) already recorded", entry.key(), entry.technique)
        return bool(added)

    def read(self) -> LedgerContents:
        query = sa.select(self.table.c.id, self.table.c.entry).order_by(self.table.c.id)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
        except SQLAlchemyError as exc:
            raise HistoryError(f"cannot read the ledger in {self.source}: {exc}",
                               remedy="check the database server and its permissions") from exc
        entries: list[LedgerEntry] = []
        corrupt: list[CorruptLine] = []
        for row_id, raw in rows:
            try:
                data = raw if isinstance(raw, Mapping) else json.loads(raw)
                if not isinstance(data, Mapping):
                    raise TypeError("not a JSON object")
                entries.append(LedgerEntry.from_dict(data))
            except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
                corrupt.append(CorruptLine(int(row_id), str(raw)[:500], f"{type(exc).__name__}: {exc}"))
        return LedgerContents(tuple(entries), tuple(corrupt))

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(self.table)).scalar_one())

    def close(self) -> None:
        self.engine.dispose()

    def _ensure_table(self) -> None:
        try:
            with self.engine.begin() as conn:
                if self.postgres:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": _DDL_LOCK})
                conn.execute(sa.schema.CreateTable(self.table, if_not_exists=True))   # atomic on SQLite too
                for index in self.table.indexes:
                    conn.execute(sa.schema.CreateIndex(index, if_not_exists=True))
        except SQLAlchemyError as exc:
            raise HistoryError(f"cannot create the ledger table in {_redact(self.url)}: {exc}",
                               remedy="give the database user CREATE rights, or create the table once as its owner"
                               ) from exc


def ledger_for(run_dir: str | Path, storage_url: str | None = None) -> Ledger:
    """The ledger a study or worker uses: in the database when ``storage_url`` names a server, else the
    ``ledger.jsonl`` beside ``run_dir`` (shared by the studies of that folder)."""
    if storage_url and is_shared_url(storage_url):
        return Ledger(PostgresLedger(storage_url))
    return Ledger.for_run_dir(run_dir)


def _engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": 60})
    return sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2)


def _redact(url: str) -> str:
    """The URL without its password (it is printed in errors and reports)."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError):
        return url.split("@")[-1]
