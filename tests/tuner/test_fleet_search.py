"""``tune --gpu 0,1``'s search on several GPUs (``tuner/fleet/fleet_search.py``): what each worker is told, what
the run folder remembers of each start of the workers (resume), and the refusals of the command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elsa_tune.tuner.cli import main
from elsa_tune.tuner.commands import worker as worker_command
from elsa_tune.tuner.commands.worker import worker_argv
from elsa_tune.tuner.fleet.fleet_search import FLEET_DB, FleetLog, FleetSearch, PoolStart, _start_ticks
from elsa_tune.tuner.flow.budget import Budget
from elsa_tune.tuner.flow.settings import Settings


def _parse_worker(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    worker_command.register(parser)
    return parser.parse_args([*argv, "--gpu", "1"])


def test_every_worker_measures_as_the_lead_does(tmp_path: Path) -> None:
    settings = Settings(gpu="0", runtime="sim", sim_profile="tiny-test", space="tiny.yaml", traffic="t.parquet",
                        budget_s=1800.0, seed=3, baseline_boots=3, max_trials=50, sim_speedup=20.0)
    argv = worker_argv(settings, storage=f"sqlite:///{tmp_path / FLEET_DB}", study="night", out=tmp_path,
                       budget=Budget(400.0), techniques=["mixed-chunk", "fp8-kv"], looks=(2, 4, 6),
                       ledger=str(tmp_path / "ledger.jsonl"))
    args = _parse_worker(argv)
    assert args.storage == f"sqlite:///{tmp_path / FLEET_DB}" and args.out == tmp_path and args.study == "night"
    # The pass length is the lead's (its budget's), not one derived from the worker's shorter budget.
    assert float(args.pass_seconds) == settings.pass_s != Settings(budget_s=400.0).pass_s
    # The budget crosses as itself: its seconds, and the wall-clock time they end by.
    assert args.budget_s == "400" and args.deadline == pytest.approx(time.time() + 400.0, abs=5.0)
    handed = Budget.handed_over(float(args.budget_s), args.deadline)
    assert handed.total_s == pytest.approx(400.0, abs=5.0)
    assert Budget.handed_over(400.0, deadline=100.0, now=1000.0).expired()      # past its deadline: nothing left
    assert args.techniques == "mixed-chunk,fp8-kv" and args.looks == "2,4,6" and args.ledger.endswith("ledger.jsonl")
    assert (args.runtime, args.sim_profile, float(args.sim_speedup)) == ("sim", "tiny-test", 20.0)
    assert (args.seed, args.baseline_boots, args.max_trials) == (3, 3, 50)
    bare = _parse_worker(worker_argv(Settings(), storage="sqlite:///s.db", study="s", out=tmp_path,
                                     budget=Budget(60.0), techniques=(), looks=(), ledger=None))
    assert bare.techniques == "" and bare.looks is None and bare.sim_speedup is None and bare.ledger is None
    assert bare.promote and bare.promote_margin == 1.0
    family = _parse_worker(worker_argv(Settings(runtime="llamacpp"), storage="sqlite:///s.db", study="s",
                                       out=tmp_path, budget=Budget(60.0), techniques=(), looks=(), ledger=None,
                                       promote=False, promote_margin=2.0))
    assert family.runtime == "llamacpp" and not family.promote and family.promote_margin == 2.0


def test_the_fleet_log_remembers_each_start_and_what_it_spent(tmp_path: Path) -> None:
    log = FleetLog.read(tmp_path)
    assert log.starts == [] and not log.finished and log.spent_s() == 0.0
    log.starts.append(PoolStart(started_at=100.0, budget_s=50.0, gpus=("0", "1"), ended_at=130.0,
                                outcome="interrupted"))
    # A start the lead never saw end, whose workers recorded no boot yet: nothing to charge beyond its start.
    log.starts.append(PoolStart(started_at=200.0, budget_s=40.0, gpus=("0", "1"), children=((1, 2),)))
    log.write()
    again = FleetLog.read(tmp_path)
    assert again.starts == log.starts and not again.finished
    assert again.spent_s() == pytest.approx(30.0)
    again.starts[-1] = PoolStart(started_at=200.0, budget_s=40.0, gpus=("0", "1"), ended_at=235.0,
                                 outcome="finished")
    assert again.finished and again.spent_s() == pytest.approx(65.0)


def test_a_resumed_study_waits_for_the_workers_of_its_killed_start(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks = _start_ticks(child.pid)
        assert ticks is not None
        log = FleetLog(tmp_path / "fleet.json", [PoolStart(started_at=1.0, budget_s=1.0, gpus=("0", "1"),
                                                           children=((child.pid, ticks),))])
        started = time.monotonic()
        assert log.wait_for_children(0.5) == [child.pid]        # still running: bounded wait, then reported
        assert time.monotonic() - started < 5
        reused = FleetLog(log.path, [PoolStart(started_at=1.0, budget_s=1.0, gpus=("0",),
                                               children=((child.pid, ticks + 1),))])
        assert reused.wait_for_children(5.0) == []              # the pid now belongs to another process
        child.kill()
        child.wait(timeout=10)
        assert log.wait_for_children(5.0) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def test_one_gpu_is_not_a_fleet() -> None:
    with pytest.raises(ValueError):
        FleetSearch(["0"])


def test_tune_refuses_a_gpu_named_twice(tmp_path: Path) -> None:
    code = main(["tune", "--gpu", "0,0", "--runtime", "sim", "--sim-profile", "tiny-test", "--out",
                 str(tmp_path / "run")])
    assert code != 0
    assert not (tmp_path / "run").exists()
