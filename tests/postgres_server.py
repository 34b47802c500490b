"""A real, throwaway PostgreSQL server for tests: Debian's binaries, a temp data dir, a free port on 127.0.0.1.

``running_postgres()`` yields an SQLAlchemy URL and stops the server (``-m immediate``) and deletes its
folder in ``finally``; ``fresh_database(url, name)`` creates an empty database on it and returns its URL.
As root, the server runs as the ``postgres`` user (``runuser``), which initdb requires. Skips the test
when the server binaries or psycopg2 are missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def running_postgres(max_connections: int = 100) -> Iterator[str]:
    """Start a PostgreSQL server for the duration of the block; yields its ``postgresql+psycopg2://`` URL."""
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL server binaries are not installed")
    pytest.importorskip("psycopg2")
    root = Path(tempfile.mkdtemp(prefix="elsa-pg-", dir="/tmp"))
    root.chmod(0o755)
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    port = _free_port()
    try:
        subprocess.run(_as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", "postgres"]), check=True,
                       capture_output=True, timeout=120)
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
                                     "-o", f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 "
                                           f"-c max_connections={max_connections}", "start"]),
                       check=True, capture_output=True, timeout=90)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"]),
                           capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(server_url: str, name: str) -> str:
    """Create the empty database ``name`` on the server at ``server_url``; returns its URL."""
    import sqlalchemy as sa

    engine = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return sa.engine.make_url(server_url).set(database=name).render_as_string(hide_password=False)
