"""A study on the live simulated runtime spends its budget in the simulated system's seconds (``SimulatedTestbed``).

The same boots (same candidates, same boot seeds) on the real HTTP-simulated server cost the same simulated seconds
whether the host is idle or slowed down: two busy-looping processes beside it and a wall-clock second of the host's
own before every launch. The wall clock sees the difference; the study's clock does not.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from elsa_tune.history.records import BootOutcome, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.runtime.protocol import Server
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.flow.booter import BootPlan, CandidateBooter
from elsa_tune.tuner.flow.budget import SIMULATED_CLOCK, WALL_CLOCK, Budget
from elsa_tune.tuner.flow.preflight import run_preflight
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.simulated_time import SimulatedTestbed, SimulatedTimeRuntime

TINY_SPACE = Path(__file__).parents[1] / "e2e" / "data" / "tiny-space.yaml"
#: the busy host's own pause before each launch (wall seconds: interpreter start-up, a neighbour's burst)
HOST_PAUSE_S = 1.0


class _SlowHost(SimulatedTimeRuntime):
    """The same runtime on a host that takes a wall-clock second of its own before every launch."""

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        time.sleep(HOST_PAUSE_S)
        return super().start(candidate, boot_dir)


@contextmanager
def _busy_host(processes: int) -> Iterator[None]:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def _boots(root: Path, *, slow: bool) -> tuple[list[float], float, list[BootOutcome]]:
    """Two baseline boots (their passes only) and a boot that crashes at launch: the simulated seconds each charged
    to the study's clock, the wall seconds they took, and their outcomes."""
    pre = run_preflight(Settings(gpu="sim", sim_profile="tiny-test", space=str(TINY_SPACE), traffic="demo",
                                 budget_s=3600.0, sim_speedup=100.0, out=root / "run", live=False,
                                 pass_seconds=0.5, warmup_passes=1, measured_passes=1),
                        card_dir=root / "card")
    bed = SimulatedTestbed.of(pre)
    timed = bed.pre
    if slow:
        inner = timed.runtime
        assert isinstance(inner, SimulatedTimeRuntime)
        timed = replace(timed, runtime=_SlowHost(inner.inner, bed.clock, profile="tiny-test",
                                                 model_path=pre.space.model.path))
    store = StudyStore(root / "run", name="t", heartbeat_interval=None)
    booter = CandidateBooter(timed.boot_context(store, "t"), load=bed.load)
    baseline = pre.space.baseline()
    crash = Candidate({**baseline.flags, "mem-fraction-static": 0.999}, dict(baseline.env), label="crash")
    plans = [BootPlan(tag=f"baseline:{i}", candidate=baseline, phase=Phase.BASELINE) for i in range(2)]
    plans.append(BootPlan(tag="screening:crash", candidate=crash, phase=Phase.SCREENING))
    charged, outcomes = [], []
    started = time.monotonic()
    for plan in plans:
        before = bed.clock.now()
        result = booter.boot(plan)
        charged.append(bed.clock.now() - before)
        outcomes.append(result.record.outcome)
        assert abs(result.record.seconds - charged[-1]) < 1e-6     # the record's seconds are the study clock's
    return charged, time.monotonic() - started, outcomes


def test_the_same_boots_cost_the_same_simulated_seconds_on_an_idle_and_a_busy_host(tmp_path: Path) -> None:
    idle, _, idle_outcomes = _boots(tmp_path / "idle", slow=False)
    with _busy_host(2):
        busy, busy_wall, busy_outcomes = _boots(tmp_path / "busy", slow=True)
    assert idle_outcomes == busy_outcomes
    assert idle_outcomes[:2] == [BootOutcome.MEASURED] * 2 and idle_outcomes[2] is BootOutcome.BOOT_FAILED
    # the host was slower: the busy run's wall time holds its own pause before every launch (compared with the
    # pauses themselves, not with the idle run's wall time, which another load on the machine can stretch as well)
    assert busy_wall >= len(busy) * HOST_PAUSE_S
    for quiet, loaded in zip(idle, busy, strict=True):
        assert quiet > 0 and loaded == pytest.approx(quiet, rel=0.03)     # the simulated system was not
    assert idle[2] < idle[0]          # a crash at launch costs its launch and stop, not passes


def test_the_budget_names_the_clock_it_counts_in() -> None:
    assert Budget(60.0).counts == WALL_CLOCK
    assert Budget(60.0, clock=lambda: 0.0, counts=SIMULATED_CLOCK).counts == SIMULATED_CLOCK
