"""The study store on PostgreSQL (Optuna's RDB storage): a real temporary server, started and stopped here."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from elsa_tune.history.store import StudyStore

pytestmark = pytest.mark.slow


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
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
                                     "-o", f"-p {port} -k {sock} -c listen_addresses=127.0.0.1", "start"]),
                       check=True, capture_output=True, timeout=90)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"]),
                           capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_store_on_postgres_records_trials_and_fails_stale_ones(postgres_url: str, tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "run", storage_url=postgres_url, name="pg", heartbeat_interval=1, grace_period=2)
    study = store.create_or_load_study("pg-search", ["maximize"])
    trial = store.ask(study)
    trial.suggest_int("max-running-requests", 1, 16)
    store.record_trial_result(study, trial, values=[100.0])
    stale = store.ask(study)
    stale.suggest_int("max-running-requests", 1, 16)
    with store.heartbeat(stale):
        pass                        # one beat, then silence: as if the process died
    deadline = time.monotonic() + 20
    failed: list[int] = []
    while not failed and time.monotonic() < deadline:
        time.sleep(0.5)
        failed = store.fail_stale_trials(study)
    assert failed == [stale.number]
    again = StudyStore(tmp_path / "run", storage_url=postgres_url, name="pg", heartbeat_interval=1, grace_period=2)
    loaded = again.create_or_load_study("pg-search", ["maximize"])
    assert [t.state for t in loaded.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    assert again.reconcile(loaded).failed_stale_trials == ()
