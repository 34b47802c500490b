from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from elsa_history_factory import BASELINE, STUDY, HistoryBuilder, fingerprint

from elsa_tune.errors import HistoryError
from elsa_tune.history.records import TrialState
from elsa_tune.history.store import StudyStore, constraint_values
from elsa_tune.runtime.failure import Failure, FailureKind

HERE = Path(__file__).resolve().parent

WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    from elsa_history_factory import HistoryBuilder, BASELINE
    from elsa_tune.history.records import Arm, BootOutcome, Phase
    h = HistoryBuilder(__import__("pathlib").Path({root!r}))
    for i in range(10_000):
        values = [100.0 + j for j in range(400)]
        rec = h.boot(BASELINE, Phase.BASELINE, Arm.INCUMBENT, BootOutcome.MEASURED, values=values)
        print(rec.boot_id, flush=True)
""")

BEATER = textwrap.dedent("""
    import sys, time
    from elsa_tune.history.store import StudyStore
    store = StudyStore({run!r}, heartbeat_interval=1, grace_period=2)
    study = store.create_or_load_study("search", ["maximize"])
    trial = store.ask(study)
    trial.suggest_int("max-running-requests", 1, 16)
    with store.heartbeat(trial):
        print("running", trial.number, flush=True)
        time.sleep(120)
""")


def _spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _kill(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    err = proc.stderr.read() if proc.stderr else ""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return err


def test_store_round_trip_and_registry(history: HistoryBuilder) -> None:
    h = history
    history = h.store.load()
    registered = h.store.registered_boots()
    assert set(registered) == {b.boot_id for b in history.boots}
    assert registered[history.boots[0].boot_id]["fingerprint"] == h.fp.key()
    assert (h.run_dir / "study.db").is_file()


def test_crashed_candidate_is_an_infeasible_complete_trial(history: HistoryBuilder) -> None:
    h = history
    study = h.store.create_or_load_study(f"{STUDY}-search", ["maximize"])
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    measured, crashed = trials
    assert constraint_values(measured) == (0.0,) and constraint_values(crashed) == (1.0,)
    assert crashed.user_attrs["failure_kind"] == "oom_under_load" and crashed.user_attrs["boot_ids"]
    assert crashed.values == [-math.inf]                  # unreachable: no made-up measurement
    assert study.metric_names == ["objective"]
    if hasattr(optuna.trial.Trial, "set_constraint"):
        assert crashed.constraints == {"feasibility": 1.0} and measured.constraints == {"feasibility": 0.0}
    records = {r.number: r for r in h.store.files.trials()}
    assert records[crashed.number].state is TrialState.INFEASIBLE
    assert records[measured.number].state is TrialState.COMPLETE
    # the sampler sees the cliff: the next suggestion is made with both trials, no warning, no error
    trial = h.store.ask(study)
    assert 1 <= trial.suggest_int("max-running-requests", 1, 4) <= 4


def test_every_optuna_study_has_trials_and_metric_names(history: HistoryBuilder) -> None:
    summaries = optuna.get_all_study_summaries(h_url := history.store.storage_url)
    assert [s.study_name for s in summaries] == [f"{STUDY}-search"]       # boots live in elsa_boots_v1
    for summary in summaries:
        study = optuna.load_study(study_name=summary.study_name, storage=h_url)
        assert study.trials and study.metric_names == ["objective"]
    named = history.store.create_or_load_study("named", ["maximize", "minimize"],
                                               metric_names=["output_throughput", "ttft_p99"])
    assert named.metric_names == ["output_throughput", "ttft_p99"]
    with pytest.raises(HistoryError, match="metric names"):
        history.store.create_or_load_study("bad", ["maximize"], metric_names=["a", "b"])


def test_directions_mismatch_is_refused(tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "run", heartbeat_interval=None)
    store.create_or_load_study("s", ["maximize"])
    with pytest.raises(HistoryError, match="directions"):
        store.create_or_load_study("s", ["minimize"])


def test_unreachable_storage_is_a_history_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="cannot open the study storage"):
        StudyStore(tmp_path / "run", storage_url="sqlite:////nonexistent/dir/x.db")


def test_result_written_but_never_told_is_recovered(tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "run", heartbeat_interval=None)
    study = store.create_or_load_study("search", ["maximize"])
    trial = store.ask(study)
    trial.suggest_int("max-running-requests", 1, 16)
    slot = store.new_boot("slots")
    record = store.record_trial_result(study, trial, values=[123.0], boot_ids=[slot.boot_id])
    # simulate a kill between writing trials/ and telling Optuna: a second trial written, never told
    trial2 = store.ask(study)
    trial2.suggest_int("max-running-requests", 1, 16)
    store.files.write_trial(type(record)(study="search", number=trial2.number, params=dict(trial2.params),
                                         state=TrialState.COMPLETE, values=(150.0,), constraint=0.0))
    fresh = StudyStore(tmp_path / "run", heartbeat_interval=None)
    study = fresh.create_or_load_study("search", ["maximize"])
    result = fresh.reconcile(study)
    assert result.recovered_trials == (trial2.number,)
    assert result.incomplete_boots == (slot.boot_id,)
    assert sorted(t.value for t in study.get_trials() if t.value is not None) == [123.0, 150.0]
    assert fresh.reconcile(study).recovered_trials == ()    # idempotent


def test_boots_written_before_a_crash_are_registered_on_resume(history: HistoryBuilder) -> None:
    h = history
    gone = h.store.load().boots[-1].boot_id
    # drop a registry row, as if the process died between boot.json and the database write
    with closing(sqlite3.connect(h.run_dir / "study.db")) as db, db:
        db.execute("DELETE FROM elsa_boots_v1 WHERE study = ? AND boot_id = ?", (STUDY, gone))
    fresh = StudyStore(h.run_dir, name=STUDY, heartbeat_interval=None)
    assert gone not in fresh.registered_boots()
    assert fresh.reconcile().registered_boots == (gone,)
    assert gone in fresh.registered_boots()


@pytest.mark.timeout(120)
def test_sigkill_while_writing_boots_loses_no_finished_boot(tmp_path: Path) -> None:
    proc = _spawn(WRITER.format(here=str(HERE), root=str(tmp_path)))
    finished: list[str] = []
    err = ""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while len(finished) < 6 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            finished.append(line.strip())
        time.sleep(0.05)  # land the kill somewhere inside the next boot's writes
    finally:
        err = _kill(proc)
    assert len(finished) >= 6, err
    store = StudyStore(tmp_path / "runs" / STUDY, name=STUDY, heartbeat_interval=None)
    history = store.load()                       # every boot.json is whole: none raises
    ids = [b.boot_id for b in history.boots]
    assert set(finished) <= set(ids)
    assert all(b.measurements and len(b.measurements) == 400 for b in history.boots)
    store.reconcile()
    assert set(ids) <= set(store.registered_boots())
    assert not list((tmp_path / "runs" / STUDY).rglob(".*.tmp"))
    assert store.new_boot("after").number > max(b.boot_number for b in history.boots)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_trial_is_failed_after_the_grace_period(tmp_path: Path) -> None:
    run = tmp_path / "run"
    StudyStore(run, heartbeat_interval=1, grace_period=2).create_or_load_study("search", ["maximize"])
    proc = _spawn(BEATER.format(run=str(run)))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        time.sleep(1.5)
    finally:
        err = _kill(proc)
    assert line.startswith("running"), err
    number = int(line.split()[1])
    store = StudyStore(run, heartbeat_interval=1, grace_period=2)
    study = store.create_or_load_study("search", ["maximize"])
    assert study.trials[number].state is optuna.trial.TrialState.RUNNING
    deadline = time.monotonic() + 20
    failed: list[int] = []
    while not failed and time.monotonic() < deadline:
        failed = store.fail_stale_trials(study)
        time.sleep(0.5)
    assert failed == [number]
    assert study.trials[number].state is optuna.trial.TrialState.FAIL
    # a live trial with a beating heart is left alone
    with store.trial(study) as trial:
        trial.suggest_int("max-running-requests", 1, 16)
        time.sleep(2.5)
        assert store.fail_stale_trials(study) == []
        store.record_trial_result(study, trial, values=[1.0])
    assert study.trials[-1].state is optuna.trial.TrialState.COMPLETE


def test_baseline_label_used_for_folders(tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "run", heartbeat_interval=None)
    assert store.new_boot(BASELINE.label).boot_id == "0001-baseline"


def test_failure_without_values_is_infeasible(tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "run", heartbeat_interval=None)
    study = store.create_or_load_study("s", ["maximize", "minimize"])
    trial = store.ask(study)
    trial.suggest_float("mem-fraction-static", 0.8, 0.97)
    boom = Failure(FailureKind.NO_ROOM_FOR_KV, "KV pool <= 0", "lower it")
    rec = store.record_trial_result(study, trial, values=None, failure=boom)
    assert rec.state is TrialState.INFEASIBLE and rec.values is None and rec.constraint == 1.0
    assert study.get_trials()[-1].values == [-math.inf, math.inf]
    trial = store.ask(study)
    trial.suggest_float("mem-fraction-static", 0.8, 0.97)
    rec = store.record_trial_result(study, trial, values=None)
    assert rec.state is TrialState.FAILED and study.trials[-1].state is optuna.trial.TrialState.FAIL


def test_a_study_folder_refuses_another_setup(history: HistoryBuilder) -> None:
    h = history
    study = h.store.read_study()
    assert study is not None
    h.store.write_study(study)                      # same setup: fine
    other = fingerprint(h.root / "models" / "qwen", driver="625.01")
    with pytest.raises(HistoryError, match=r"driver: 620\.70 → 625\.01") as caught:
        h.store.write_study(type(study).from_dict({**study.to_dict(), "fingerprint": other.to_dict()}))
    assert "fresh run directory" in caught.value.remedy
    assert h.store.next_decision_number() == len(h.store.load().decisions) + 1


def test_reconcile_sweeps_half_written_temp_files(tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "run", heartbeat_interval=None)
    slot = store.new_boot("candidate")
    torn = slot.folder / ".boot.json.k2j3.tmp"
    torn.write_text('{"study": "s", "boot_')
    result = store.reconcile()
    assert result.removed_temp_files == 1 and not torn.exists()
    assert result.incomplete_boots == (slot.boot_id,)
