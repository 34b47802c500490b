"""``transaction``: one SQL transaction of the shared history tables, its database errors raised as ``HistoryError``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from elsa_tune.errors import HistoryError


@contextmanager
def transaction(engine: Engine, *, what: str, remedy: str) -> Iterator[Connection]:
    """A connection in a transaction on ``engine``, committed when the block ends; a database error becomes a
    ``HistoryError`` saying ``what`` is unreachable, with ``remedy``."""
    try:
        with engine.begin() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise HistoryError(f"{what} is unreachable: {exc}", remedy=remedy) from exc
