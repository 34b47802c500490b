"""``WorkerPool``: a worker killed by a signal leaves its server running; the pool finds it by lease, stops it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from elsa_tune.runtime.lease import LeaseBook
from elsa_tune.runtime.process_group import ProcessGroup
from elsa_tune.runtime.sim.card import read_entries
from elsa_tune.tuner.fleet.worker_pool import WorkerPool

#: A worker that boots one simulated server, writes its pid down, and is SIGKILLed (no ``finally`` runs).
_WORKER = textwrap.dedent("""
    import os, signal, sys
    from dataclasses import replace
    from pathlib import Path
    from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
    from elsa_tune.search_spaces.candidate import Candidate
    root = Path(sys.argv[1])
    runtime = SimulatedSGLang("tiny-test", card_dir=root / "card", speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=60.0))
    server = runtime.start(Candidate(label="orphan"), root / "boot")
    (root / "server.pid").write_text(server.handle)
    os.kill(os.getpid(), signal.SIGKILL)
""")


class KilledWorkers(WorkerPool):
    """The pool, with a worker command that gets itself SIGKILLed after its server is up."""

    def command(self, gpu: str) -> list[str]:
        return [sys.executable, "-c", _WORKER, str(self.log_dir / f"gpu{gpu}")]


def test_a_worker_killed_by_a_signal_has_its_server_stopped_by_the_pool(tmp_path: Path) -> None:
    for gpu in ("0", "1"):
        (tmp_path / f"gpu{gpu}").mkdir()
    pool = KilledWorkers(["0", "1"], [], log_dir=tmp_path, timeout_s=120, stop_grace_s=5)
    pids: list[int] = []
    try:
        assert pool.run() == -9
        pids = [int((tmp_path / f"gpu{gpu}" / "server.pid").read_text()) for gpu in ("0", "1")]
        assert all(ProcessGroup(pid).members() == [] for pid in pids)
        assert LeaseBook().leases() == []
        assert all(read_entries(tmp_path / f"gpu{gpu}" / "card") == [] for gpu in ("0", "1"))
    finally:
        for pid in pids:
            ProcessGroup(pid).stop(1.0)
