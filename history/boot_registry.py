"""``BootRegistry``: which boots of a study the database knows of, in a table of its own beside Optuna's.

One row per boot (``elsa_boots_v1``: study, boot id, outcome, phase, arm, candidate key, trial number, setup key,
end time), written after the boot's ``boot.json``, so ``StudyStore.reconcile`` finds a boot on disk the database
missed. It lives in the same database as Optuna's tables (SQLite or PostgreSQL) and is no Optuna study, so
optuna-dashboard lists only real studies. ``register`` is an upsert: registering a boot twice is harmless.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from elsa_tune.history.records import BootRecord
from elsa_tune.history.sql_transaction import transaction

SCHEMA_VERSION = 1
# schema history: 1 — first version (table elsa_boots_v1).
TABLE = "elsa_boots_v1"
_DDL_LOCK = 0x656C7361_0004


class BootRegistry:
    """The registered boots of one study in ``engine``'s database."""

    def __init__(self, engine: Engine, study: str) -> None:
        self.engine = engine
        self.study = study
        self.postgres = engine.dialect.name == "postgresql"
        self.table = sa.Table(
            TABLE, sa.MetaData(),
            sa.Column("study", sa.String(255), primary_key=True),
            sa.Column("boot_id", sa.String(255), primary_key=True),
            sa.Column("outcome", sa.String(32), nullable=False),
            sa.Column("phase", sa.String(32), nullable=False),
            sa.Column("arm", sa.String(32), nullable=False),
            sa.Column("candidate", sa.String(64), nullable=False),
            sa.Column("trial", sa.Integer),
            sa.Column("fingerprint", sa.String(64), nullable=False),
            sa.Column("ended_at", sa.Float),
        )
        with self._begin() as conn:
            if self.postgres:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": _DDL_LOCK})
            conn.execute(sa.schema.CreateTable(self.table, if_not_exists=True))

    def register(self, record: BootRecord) -> None:
        row = {"study": self.study, "boot_id": record.boot_id, "outcome": record.outcome.value,
               "phase": record.phase.value, "arm": record.arm.value, "candidate": record.candidate.key(),
               "trial": record.trial_number, "fingerprint": record.fingerprint.key(), "ended_at": record.ended_at}
        dialect = postgresql if self.postgres else sqlite
        statement = dialect.insert(self.table).values(**row)
        statement = statement.on_conflict_do_update(
            index_elements=["study", "boot_id"], set_={k: v for k, v in row.items() if k not in ("study", "boot_id")})
        with self._begin() as conn:
            conn.execute(statement)

    def boots(self) -> dict[str, dict[str, Any]]:
        """Boot id → its row (without the study and boot id columns)."""
        with self._begin() as conn:
            rows = conn.execute(sa.select(self.table).where(self.table.c.study == self.study)).mappings().all()
        return {row["boot_id"]: {k: v for k, v in row.items() if k not in ("study", "boot_id")} for row in rows}

    def forget(self, boot_id: str) -> None:
        """Drop one boot's row (what a process killed between ``boot.json`` and the database leaves behind)."""
        with self._begin() as conn:
            conn.execute(sa.delete(self.table).where(self.table.c.study == self.study,
                                                     self.table.c.boot_id == boot_id))

    def _begin(self) -> AbstractContextManager[Connection]:
        return transaction(self.engine, what=f"the boot registry table {TABLE}",
                           remedy="check the database server and the user's rights (CREATE, INSERT)")
