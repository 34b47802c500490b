"""``WorkerPool`` children die with the pool: a SIGKILLed pool (a killed ``elsa-tune --gpu 0,1``) leaves no
worker running on its GPUs, and a study's own ``Interrupts`` are read, not replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from elsa_tune.tuner.fleet.worker_pool import WorkerPool
from elsa_tune.tuner.flow.signals import Interrupts

CHILD = """
import sys, time
from pathlib import Path
from elsa_tune.tuner.fleet.worker_pool import WorkerPool

class Sleepers(WorkerPool):
    def command(self, gpu):
        return [sys.executable, "-c", "import time; time.sleep(60)"]

def started(workers):
    Path(sys.argv[1]).write_text(" ".join(str(w.pid) for w in workers))

Sleepers(["0", "1"], [], log_dir=Path(sys.argv[2]), timeout_s=60, on_started=started).run()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_children_get_sigterm_when_the_pool_is_killed(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    pool = subprocess.Popen([sys.executable, "-c", CHILD, str(pids_file), str(tmp_path / "logs")])
    children: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not pids_file.exists() or not pids_file.read_text():
            assert time.monotonic() < deadline and pool.poll() is None
            time.sleep(0.05)
        children = [int(p) for p in pids_file.read_text().split()]
        assert len(children) == 2 and all(_alive(p) for p in children)
        pool.send_signal(signal.SIGKILL)
        pool.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in children)
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if pool.poll() is None:
            pool.kill()
            pool.wait(timeout=10)


class _Quick(WorkerPool):
    def command(self, gpu: str) -> list[str]:
        return [sys.executable, "-c", "import signal, time; time.sleep(30)"]


def test_a_requested_stop_of_the_callers_interrupts_is_forwarded(tmp_path: Path) -> None:
    interrupts = Interrupts()
    interrupts.requested = True              # the study's Ctrl-C arrived before the pool's first poll
    started = time.monotonic()
    code = _Quick(["0"], [], log_dir=tmp_path, timeout_s=30, interrupts=interrupts).run()
    assert code == -signal.SIGTERM           # the child got the forwarded SIGTERM
    assert time.monotonic() - started < 20
