"""The study store on PostgreSQL (Optuna's RDB storage): a real temporary server, started and stopped here."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest

from elsa_tune.history.store import StudyStore

pytestmark = pytest.mark.slow


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
