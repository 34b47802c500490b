"""``elsa-tune worker --gpu 0,1`` on one host: one worker process per simulated GPU, one SQLite study, stopped
by SIGTERM like a service manager would (each worker finishes its boot and writes its outputs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from elsa_tune.history.run_dir import RunDir

pytestmark = pytest.mark.slow

SPACE = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"


def test_two_gpus_of_one_host_share_a_study_and_stop_cleanly_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    argv = [sys.executable, "-m", "elsa_tune", "worker", "--study", "local", "--gpu", "0,1", "--out", str(root),
            "--runtime", "sim", "--sim-profile", "tiny-test", "--space", str(SPACE), "--traffic", "demo",
            "--sim-speedup", "20", "--budget", "300", "--max-trials", "1000", "--baseline-boots", "3",
            "--no-promote", "--heartbeat", "1", "--grace", "5"]
    pool = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        # Both baselines done and a search boot finished on each GPU.
        while sorted(len(list(d.glob("boots/*/boot.json"))) for d in root.glob("*-gpu*"))[:1] < [4] \
                or len(list(root.glob("*-gpu*"))) < 2:
            assert pool.poll() is None, pool.stdout.read().decode() if pool.stdout else ""
            assert time.monotonic() < deadline, "the workers did not get going"
            time.sleep(0.5)
        started = time.monotonic()
        os.killpg(pool.pid, signal.SIGTERM)
        out, _ = pool.communicate(timeout=120)
        assert pool.returncode == 0, out.decode()[-3000:]
        assert time.monotonic() - started < 90
    finally:
        if pool.poll() is None:
            os.killpg(pool.pid, signal.SIGKILL)
            pool.wait(timeout=30)
    run_dirs = sorted(root.glob("*-gpu*"))
    assert [d.name.rsplit("-", 1)[1] for d in run_dirs] == ["gpu0", "gpu1"]
    for d in run_dirs:
        study = json.loads((d / "study.json").read_text())
        assert study["status"] == "interrupted"                  # stopped by a person, resumable
        assert (d / "report.md").exists() and (d / "shared-study.json").exists()
        assert not RunDir(d).incomplete_boots()                  # the boot in flight was finished and recorded
        assert not list((root / "sim-cards" / d.name.rsplit("-", 1)[1]).glob("proc-*.json"))  # no server left
    loaded = optuna.load_study(study_name="local:search", storage=f"sqlite:///{root / 'study.db'}")
    trials = loaded.get_trials(deepcopy=False)
    assert trials and all(t.state.is_finished() for t in trials)
    workers = json.loads((run_dirs[0] / "shared-study.json").read_text())["boots_by_worker"]
    assert len(workers) == 2                                     # both GPUs measured search candidates
