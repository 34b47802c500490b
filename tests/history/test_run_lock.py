"""The run folder's advisory lock: a second study is refused naming the holder; a killed holder frees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.history.run_lock import LOCK_FILE, RunLock
from elsa_tune.tuner.cli import main

TS = str(Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml")

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from elsa_tune.history.run_lock import RunLock
    RunLock(Path(sys.argv[1])).acquire()
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_second_hold_is_refused_naming_the_holders_pid_and_command(tmp_path: Path) -> None:
    with RunLock(tmp_path) as first:
        assert first.held
        with pytest.raises(ConfigError, match=rf"in use by pid {os.getpid()} on .*\(.*\)") as refused:
            RunLock(tmp_path).acquire()
        assert "another --out" in refused.value.remedy
        with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).check_free()
    RunLock(tmp_path / "fresh").check_free()   # nothing holds it, and nothing is created
    assert not (tmp_path / "fresh").exists()
    with RunLock(tmp_path):   # released: free again
        pass


def test_a_sigkilled_holder_frees_the_folder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {holder.pid} .*-c"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
    with RunLock(tmp_path) as lock:
        assert lock.held and (tmp_path / LOCK_FILE).exists()


def test_a_second_study_on_one_out_is_refused_before_it_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELSA_SIM_CARD_DIR", str(tmp_path / "card"))
    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):
        before = sorted(p.name for p in run.iterdir())
        code = main(["--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic", "demo", "--budget",
                     "1m", "--out", str(run), "--no-live"])
        err = capsys.readouterr().err
        assert code == 2 and f"is in use by pid {os.getpid()}" in err and "remedy:" in err, err
        assert sorted(p.name for p in run.iterdir()) == before


def test_a_study_takes_the_lock_and_lets_it_go(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a damaged study.db is refused before the lock is taken: its own remedy, the file untouched
    monkeypatch.setenv("ELSA_SIM_CARD_DIR", str(tmp_path / "card"))
    run = tmp_path / "run"
    run.mkdir()
    damaged = bytes(range(256)) * 16
    (run / "study.db").write_bytes(damaged)
    argv = ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic", "demo", "--budget", "1m",
            "--out", str(run), "--no-live", "--virtual"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 5 and "SQLite file is damaged" in err and "Traceback" not in err, err
    assert (run / "study.db").read_bytes() == damaged and sorted(p.name for p in run.iterdir()) == ["study.db"]
    (run / "study.db").unlink()
    assert main(argv) == 0, capsys.readouterr().err   # a study that ran, past the lock
    with RunLock(run) as lock:   # released when the study ended
        assert lock.held
