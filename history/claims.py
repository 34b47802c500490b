"""``WorkClaims``: who is doing which work item of a shared study, so workers never duplicate a boot.

Optuna's ask on a shared study hands every worker a distinct trial, but two trials may propose the same
candidate, and work that is not an Optuna trial (a GPU's baseline, an A/B comparison of a promising
candidate) has no Optuna lock at all. A work item is a row keyed by (study, phase, item) — the item is a
candidate key, or an A/B's "candidate vs incumbent" key — in a table beside Optuna's, in the same database:

* ``claim`` inserts the row (``ON CONFLICT DO NOTHING``): the inserter owns the item. Otherwise the row
  says DONE (its result is there: reuse it, boot nothing), BUSY (a live worker holds it) or abandoned (its
  holder stopped beating for ``grace_s``, or released it): then a conditional ``UPDATE … WHERE token = <the
  token read>`` takes it over, which exactly one of several racing workers wins. No explicit lock is held
  between statements, so a worker killed at any instant leaves nothing locked.
* the holder beats (``holding``: a thread) while it works, ``finish`` stores the result, ``release`` gives
  the item back after an error that was not the candidate's (the next claimant retries it).

Times are the database server's clock, so workers on hosts whose clocks disagree still agree on staleness.
``compare_and_set`` keeps small shared values (the study's incumbent) with the same atomicity.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from elsa_tune.errors import HistoryError
from elsa_tune.history.sql_transaction import transaction

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# schema history: 1 — first version (table elsa_work_v1).
TABLE = "elsa_work_v1"
_DDL_LOCK = 0x656C7361_0002
_SETUP_LOCK = 0x656C7361_0003
STATE_PHASE = "state"          # the phase of shared values (``compare_and_set``), not of work


class ClaimState(enum.Enum):
    CLAIMED = "claimed"      # this worker owns the item now: do the work
    DONE = "done"            # finished by someone (maybe this worker, before a restart): ``result`` holds it
    BUSY = "busy"            # a live worker holds it: wait, or do something else


@dataclass(frozen=True)
class Claim:
    """The answer of ``claim`` (and ``wait``). ``token`` identifies this holding; ``attempts`` counts holders."""

    phase: str
    item: str
    state: ClaimState
    owner: str
    attempts: int
    token: str = ""
    result: Mapping[str, Any] | None = None
    took_over: str | None = None       # the previous holder, when this claim took an abandoned item over


@dataclass(frozen=True)
class WorkItem:
    """One row, for accounting (tests, the workers' summary)."""

    phase: str
    item: str
    state: str               # "running", "done", "free"
    owner: str
    gpu: str | None
    attempts: int
    result: Mapping[str, Any] | None


class WorkClaims:
    """The claim table of one study, as seen by one worker (``worker``: a name unique per process)."""

    def __init__(self, url: str, study: str, worker: str, *, grace_s: float = 30.0, beat_s: float | None = None,
                 engine: Engine | None = None) -> None:
        self.study = study
        self.worker = worker
        self.grace_s = grace_s
        self.beat_s = beat_s if beat_s is not None else max(0.2, grace_s / 4)
        if self.beat_s * 2 > grace_s:
            raise HistoryError(f"claim beat {self.beat_s} s is too slow for a {grace_s} s grace period",
                               remedy="beat at most every grace/2 seconds")
        try:
            self.engine = engine or (sa.create_engine(url, connect_args={"timeout": 60}) if url.startswith("sqlite")
                                     else sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=3))
        except (SQLAlchemyError, ImportError) as exc:
            raise HistoryError(f"cannot open the work-claim database: {exc}", remedy="check the storage URL") from exc
        self.postgres = self.engine.dialect.name == "postgresql"
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE, meta,
            sa.Column("study", sa.String(255), primary_key=True),
            sa.Column("phase", sa.String(64), primary_key=True),
            sa.Column("item", sa.String(512), primary_key=True),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("owner", sa.String(255), nullable=False),
            sa.Column("gpu", sa.String(128)),
            sa.Column("token", sa.String(64), nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("claimed_at", sa.Float, nullable=False),
            sa.Column("beat_at", sa.Float, nullable=False),
            sa.Column("result_key", sa.String(255)),
            sa.Column("result", sa.Text),
        )
        try:
            with self.engine.begin() as conn:
                if self.postgres:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": _DDL_LOCK})
                conn.execute(sa.schema.CreateTable(self.table, if_not_exists=True))   # atomic on SQLite too
        except SQLAlchemyError as exc:
            raise HistoryError(f"cannot create the work-claim table: {exc}",
                               remedy="give the database user CREATE rights") from exc

    # ---- work items ------------------------------------------------------------------------------------

    def claim(self, phase: str, item: str, *, gpu: str | None = None) -> Claim:
        """Take ``item`` of ``phase`` if nobody has it (or its holder is gone); never blocks."""
        for _ in range(20):      # each round either decides or lost a takeover race to another worker
            token = uuid.uuid4().hex
            with self._begin() as conn:
                now = self._now(conn)
                inserted = conn.execute(self._insert(dict(
                    study=self.study, phase=phase, item=item, state="running", owner=self.worker, gpu=gpu,
                    token=token, attempts=1, claimed_at=now, beat_at=now, result_key=None, result=None))).rowcount
                if inserted:
                    return Claim(phase, item, ClaimState.CLAIMED, self.worker, 1, token)
                row = conn.execute(sa.select(self.table).where(*self._pk(phase, item))).mappings().one()
                if row["state"] == "done":
                    return Claim(phase, item, ClaimState.DONE, row["owner"], row["attempts"], "",
                                 _loads(row["result"]))
                abandoned = row["state"] == "free" or now - float(row["beat_at"]) > self.grace_s
                if not abandoned:
                    return Claim(phase, item, ClaimState.BUSY, row["owner"], row["attempts"])
                taken = conn.execute(sa.update(self.table).where(*self._pk(phase, item),
                                                                 self.table.c.token == row["token"])
                                     .values(state="running", owner=self.worker, gpu=gpu, token=token,
                                             attempts=row["attempts"] + 1, claimed_at=now, beat_at=now)).rowcount
                if taken:
                    log.info("work item %s/%s taken over from %s (%s)", phase, item, row["owner"],
                             "released" if row["state"] == "free" else "stopped beating")
                    return Claim(phase, item, ClaimState.CLAIMED, self.worker, row["attempts"] + 1, token,
                                 took_over=str(row["owner"]))
        raise HistoryError(f"work item {phase}/{item}: lost 20 takeover races in a row",
                           remedy="too many workers restart at once; this is worth a bug report")

    def wait(self, phase: str, item: str, *, timeout_s: float, poll_s: float = 0.5,
             gpu: str | None = None) -> Claim:
        """Poll until the item is DONE or claimable (then claimed); BUSY only when ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.claim(phase, item, gpu=gpu)
            if answer.state is not ClaimState.BUSY or time.monotonic() >= deadline:
                return answer
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def beat(self, claim: Claim) -> bool:
        """Record that the holder is alive; ``False`` when the item is no longer this claim's."""
        with self._begin() as conn:
            return bool(conn.execute(sa.update(self.table).where(*self._mine(claim), self.table.c.state == "running")
                                     .values(beat_at=self._now(conn))).rowcount)

    def finish(self, claim: Claim, result: Mapping[str, Any]) -> bool:
        """Store the item's result; ``False`` when another worker took the item over meanwhile."""
        with self._begin() as conn:
            done = conn.execute(sa.update(self.table).where(*self._mine(claim))
                                .values(state="done", result=_dumps(result), beat_at=self._now(conn))).rowcount
        if not done:
            log.warning("work item %s/%s was taken over while this worker held it; its result is kept in the "
                        "run folder only", claim.phase, claim.item)
        return bool(done)

    def release(self, claim: Claim) -> None:
        """Give the item back unfinished (the next claimant retries it at once, without waiting for staleness)."""
        with self._begin() as conn:
            conn.execute(sa.update(self.table).where(*self._mine(claim), self.table.c.state == "running")
                         .values(state="free"))

    @contextmanager
    def holding(self, claim: Claim) -> Iterator[Claim]:
        """Beat for ``claim`` every ``beat_s`` while the block runs; release it if the block raises."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.beat_s):
                try:
                    if not self.beat(claim):
                        log.warning("work item %s/%s is no longer held by %s", claim.phase, claim.item, self.worker)
                        return
                except SQLAlchemyError:   # a lost beat must not kill the work; the next one may get through
                    log.warning("beat for work item %s/%s failed", claim.phase, claim.item, exc_info=True)

        thread = threading.Thread(target=beat, name=f"claim-{claim.phase}", daemon=True)
        thread.start()
        try:
            yield claim
        except BaseException:
            stop.set()
            thread.join(timeout=self.beat_s + 5)
            try:
                self.release(claim)
            except SQLAlchemyError:
                log.warning("could not release work item %s/%s; it frees itself after %.0f s", claim.phase,
                            claim.item, self.grace_s)
            raise
        finally:
            stop.set()
            thread.join(timeout=self.beat_s + 5)

    def items(self, phase: str | None = None) -> list[WorkItem]:
        query = sa.select(self.table).where(self.table.c.study == self.study, self.table.c.phase != STATE_PHASE)
        if phase is not None:
            query = query.where(self.table.c.phase == phase)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(self.table.c.claimed_at)).mappings().all()
        return [WorkItem(r["phase"], r["item"], r["state"], r["owner"], r["gpu"], r["attempts"], _loads(r["result"]))
                for r in rows]

    # ---- shared values ------------------------------------------------------------------------------

    def get(self, name: str) -> tuple[str | None, Mapping[str, Any] | None]:
        """A shared value and its key (``None, None`` when unset)."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.table.c.result_key, self.table.c.result)
                               .where(*self._pk(STATE_PHASE, name))).first()
        return (None, None) if row is None else (row[0], _loads(row[1]))

    def compare_and_set(self, name: str, expected_key: str | None, key: str, value: Mapping[str, Any]) -> bool:
        """Set ``name`` to ``value`` (identified by ``key``) only if its key is still ``expected_key``."""
        with self._begin() as conn:
            now = self._now(conn)
            if expected_key is None:
                return bool(conn.execute(self._insert(dict(
                    study=self.study, phase=STATE_PHASE, item=name, state="done", owner=self.worker, gpu=None,
                    token=uuid.uuid4().hex, attempts=1, claimed_at=now, beat_at=now, result_key=key,
                    result=_dumps(value)))).rowcount)
            return bool(conn.execute(sa.update(self.table).where(*self._pk(STATE_PHASE, name),
                                                                 self.table.c.result_key == expected_key)
                                     .values(result_key=key, result=_dumps(value), owner=self.worker,
                                             beat_at=now)).rowcount)

    def close(self) -> None:
        self.engine.dispose()

    # ---- internals ------------------------------------------------------------------------------------

    def _begin(self) -> AbstractContextManager[Connection]:
        return transaction(self.engine, what="the work-claim table",
                           remedy="check the database server; the worker can be restarted")

    def _insert(self, values: dict[str, Any]) -> Any:
        dialect = postgresql if self.postgres else sqlite
        return dialect.insert(self.table).values(**values).on_conflict_do_nothing(
            index_elements=["study", "phase", "item"])

    def _pk(self, phase: str, item: str) -> tuple[Any, ...]:
        c = self.table.c
        return c.study == self.study, c.phase == phase, c.item == item

    def _mine(self, claim: Claim) -> tuple[Any, ...]:
        return (*self._pk(claim.phase, claim.item), self.table.c.token == claim.token)

    def _now(self, conn: Connection) -> float:
        """The database server's clock in epoch seconds (one clock for every host)."""
        sql = ("SELECT EXTRACT(EPOCH FROM clock_timestamp())" if self.postgres
               else "SELECT (julianday('now') - 2440587.5) * 86400.0")
        return float(conn.execute(sa.text(sql)).scalar_one())


@contextmanager
def setup_lock(url: str, *, timeout_s: float = 120.0) -> Iterator[None]:
    """Serialise first-time schema creation between workers starting at once on a fresh PostgreSQL database.

    Optuna's ``RDBStorage`` creates its tables and enum types without a lock; two workers starting together
    race on ``CREATE TYPE`` (PostgreSQL) or ``CREATE TABLE`` (SQLite) and one fails. Hold this around opening
    the storage: a session advisory lock on its own connection, or an ``fcntl`` lock beside the SQLite file.
    """
    if url.startswith("sqlite"):
        database = sa.engine.make_url(url).database
        if not database or database == ":memory:":
            yield
            return
        with open(f"{database}.setup-lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SET lock_timeout = :ms"), {"ms": int(timeout_s * 1000)})
            conn.execute(sa.text("SELECT pg_advisory_lock(:lock)"), {"lock": _SETUP_LOCK})
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:lock)"), {"lock": _SETUP_LOCK})
                conn.commit()
    except SQLAlchemyError as exc:
        raise HistoryError(f"cannot lock the shared database for setup: {exc}",
                           remedy="check the database server; another worker may hold the lock") from exc
    finally:
        engine.dispose()


def _dumps(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value), sort_keys=True, default=str)


def _loads(raw: str | None) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    data = json.loads(raw)
    return data if isinstance(data, dict) else None
