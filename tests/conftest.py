"""Shared test configuration. Fixtures that belong to one layer live in that layer's folder."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import fresh_database, running_postgres

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present beside the checkout")
    return SHARED


@pytest.fixture(autouse=True)
def _own_lease_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own server-lease folder: no test reaps (or leaves) leases in the user's own."""
    directory = tmp_path_factory.mktemp("leases")
    monkeypatch.setenv("ELSA_LEASE_DIR", str(directory))
    return directory


_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One throwaway PostgreSQL server for the whole session (skips when the binaries are missing)."""
    with running_postgres() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's server: no test sees another's tables."""
    return fresh_database(postgres_server, f"test{next(_databases)}")


@pytest.fixture(autouse=True)
def _elsa_logger_restored() -> Iterator[None]:
    """A test that runs the CLI in-process configures the ``elsa_tune`` logger for a terminal (its own handlers, no
    propagation); every test gets the logger back as it was, so ``caplog`` sees the next test's records."""
    logger = logging.getLogger("elsa_tune")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in logger.handlers:
            logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate
