"""A study on the live simulated runtime (``--gpu sim`` without ``--virtual``) in the simulated system's seconds.

The simulated SGLang server runs its system up to ``--sim-speedup`` times faster than the wall clock and slows its
clock when its host is busy, so wall time says how busy the host was, not how long the simulated night lasted. This
testbed puts the study on one simulated clock (``StudyClock.simulated``) and charges it only what the simulated
system spends:

- a launch: the seconds the simulator's boot plan takes for the candidate (``VirtualSGLang.launch``: the same
  memory plan and boot phases the server sleeps through, ready or failed), and a stop's seconds;
- a probe and the quality gate: the server's declared clock (``/sim/clock``) read before and after;
- a measured or warm-up pass: its window in simulated seconds (the load generator converts its readings with the
  server's clock); a pass that failed part-way: the server's clock read before and after.

The host's own time (the tuner's Python, process start-up, a busy neighbour) is not charged, so the same command
spends its budget on the same boots on an idle and on a busy host; it only takes longer on the wall clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from elsa_tune.errors import BootFailed
from elsa_tune.probes.plan import ProbeSpec
from elsa_tune.probes.protocol import ProbeBudget, ProbeResult
from elsa_tune.probes.quality import QualitySample
from elsa_tune.runtime.protocol import Exit, Health, Runtime, Server
from elsa_tune.runtime.sim.virtual import STOP_S, VirtualClock, VirtualSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.sim_time import CLOCK_PATH, SimTime
from elsa_tune.traffic.workload import Workload
from elsa_tune.tuner.flow.load import HttpLoad, Passes, QualityCheck
from elsa_tune.tuner.flow.night import StudyClock
from elsa_tune.tuner.flow.preflight import Preflight

#: what a budget counts in, as the console and the report name it
SIMULATED = "the simulated system's seconds"
WALL = "wall-clock seconds"
#: seconds to wait for the server's clock before charging nothing for an activity whose clock could not be read
CLOCK_READ_S = 5.0


class SimulatedTimeRuntime:
    """The live simulated runtime, charging each launch's and stop's simulated seconds to ``clock``.

    Everything else (``family``, ``flag_set``, ``check`` and any attribute of the wrapped runtime) is the wrapped
    runtime's; a launch that fails is charged like one that becomes ready, then ``BootFailed`` propagates.
    """

    def __init__(self, inner: Runtime, clock: StudyClock, *, profile: str, model_path: str | None) -> None:
        self.inner = inner
        self.clock = clock
        self._plans = VirtualSGLang(profile, model_path=model_path, clock=VirtualClock())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def family(self) -> Any:
        return self.inner.family

    def flag_set(self) -> Any:
        return self.inner.flag_set()

    def launch_seconds(self, candidate: Candidate) -> float:
        """Simulated seconds of ``candidate``'s launch up to ready (or up to its crash), as the simulator plans it."""
        return self._plans.launch(candidate).boot_s

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        seconds = self.launch_seconds(candidate)
        try:
            return self.inner.start(candidate, boot_dir)
        except BootFailed:
            self.clock.advance(STOP_S)       # the dead process is stopped too
            raise
        finally:
            self.clock.advance(seconds)

    def check(self, server: Server) -> Health:
        return self.inner.check(server)

    def stop(self, server: Server) -> Exit:
        exit_ = self.inner.stop(server)
        if exit_.detail != "already stopped":
            self.clock.advance(STOP_S)
        return exit_


class SimulatedTimeLoad:
    """``HttpLoad`` on the live simulated runtime, charging the study's clock each probe's, quality gate's and
    pass's simulated seconds; ``now`` is the study's start plus the clock (unix seconds in simulated time)."""

    def __init__(self, inner: HttpLoad, clock: StudyClock, epoch: float) -> None:
        self.inner = inner
        self.clock = clock
        self.epoch = epoch

    def now(self) -> float:
        return self.epoch + self.clock.now()

    def probe(self, server: Server, spec: ProbeSpec, budget: ProbeBudget) -> ProbeResult:
        before = _server_sim_now(server)
        try:
            return self.inner.probe(server, spec, budget)
        finally:
            self._charge_between(server, before)

    def quality(self, server: Server, budget: ProbeBudget, reference: QualitySample | None) -> QualityCheck:
        before = _server_sim_now(server)
        try:
            return self.inner.quality(server, budget, reference)
        finally:
            self._charge_between(server, before)

    def passes(self, server: Server, workload: Workload, *, warmup: int, measured: int,
               budget: ProbeBudget) -> Passes:
        before = _server_sim_now(server)
        run = self.inner.passes(server, workload, warmup=warmup, measured=measured, budget=budget)
        windows = [p.duration_s for p in run.passes if p.duration_s]
        if run.stopped is None and len(windows) == len(run.passes) == warmup + measured:
            self.clock.advance(sum(windows))
        else:                                   # a pass failed part-way: what the server's clock says it took
            self._charge_between(server, before)
        return run

    def _charge_between(self, server: Server, before: float | None) -> None:
        after = _server_sim_now(server)
        if before is not None and after is not None:
            self.clock.advance(after - before)


def _server_sim_now(server: Server) -> float | None:
    """The simulated instant now on ``server``'s declared clock; ``None`` when it cannot be read (a dead server)."""
    try:
        with httpx.Client(base_url=server.base_url, timeout=CLOCK_READ_S) as client:
            since = time.monotonic()
            response = client.get(CLOCK_PATH, params={"since": since})
            response.raise_for_status()
            clock = SimTime.of_clock(response.json())
    except (httpx.HTTPError, ValueError):
        return None
    return clock.sim(since) if clock is not None else None


@dataclass(frozen=True)
class SimulatedTestbed:
    """What a study on the live simulated runtime boots through: ``pre`` with its runtime charging the study's
    simulated clock, and the load that charges the rest."""

    pre: Preflight
    load: SimulatedTimeLoad
    clock: StudyClock

    @classmethod
    def of(cls, pre: Preflight) -> SimulatedTestbed:
        """The testbed of a ``--gpu sim`` preflight (not ``--virtual``): a fresh simulated clock."""
        profile = pre.settings.sim_profile
        assert profile is not None, "a simulated study names its simulator profile"
        clock = StudyClock.simulated()
        runtime = SimulatedTimeRuntime(pre.runtime, clock, profile=profile, model_path=pre.space.model.path)
        prompts = PromptSynth(pre.workload.block_size, pre.token_source())
        load = SimulatedTimeLoad(HttpLoad(runtime.check, pre.gpu, prompts, seed=pre.settings.seed), clock,
                                 time.time())
        return cls(replace(pre, runtime=runtime), load, clock)
