"""The adapter from sim-model's scheduling core (``engine.py``) to the serving loop's ``StepSource``.

The engine is a deterministic discrete-event core independent of wall time; the serving loop paces it. This
module translates requests and crashes between the two vocabularies (``SimRequest``/``EngineCrash`` on one side,
``JobSpec``/``StepCrash`` on the other); steps are the engine's ``StepResult`` on both sides.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.engine import Engine, EngineCrash, RequestRejected, SimRequest, StepResult
from elsa_tune.runtime.sim.faults import Crash
from elsa_tune.runtime.sim.memory import MemoryPlan, SimCrash
from elsa_tune.runtime.sim.performance import PerformanceModel
from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.runtime.sim.serving import JobRejected, JobSpec, StepCrash
from elsa_tune.search_spaces.candidate import FlagValue

#: Prefix-cache granularity of the server's block hashes (tokens per block).
BLOCK_TOKENS = 64
_PHASE_OF_KIND = {FailureKind.WEIGHTS_OOM: "weights", FailureKind.CUDA_GRAPH_FAILED: "graph",
                  FailureKind.GPU_BUSY: "weights"}


class EngineSource:
    """``StepSource`` over ``engine.Engine``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def submit(self, job: JobSpec) -> None:
        try:
            self.engine.submit(SimRequest(rid=job.rid, input_tokens=job.input_tokens, output_tokens=job.output_tokens,
                                          regime=job.regime, block_hashes=job.block_hashes,
                                          arrival_s=max(self.engine.now, job.arrival_s or 0.0)))
        except RequestRejected as exc:
            raise JobRejected(str(exc)) from exc

    def abort(self, rid: str) -> None:
        self.engine.abort(rid)

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    @property
    def now(self) -> float:
        return self.engine.now

    def next_arrival(self) -> float | None:
        return self.engine.next_event

    def pool_state(self) -> StepResult:
        return self.engine.pool_state()

    def advance_to(self, t: float) -> None:
        self.engine.advance_to(t)

    def step(self, slowdown: float = 1.0) -> StepResult | None:
        self.engine.slowdown = slowdown
        try:
            return self.engine.step()
        except EngineCrash as exc:
            raise StepCrash(crash_of(exc.crash)) from exc


def engine_source(profile: SimProfile, plan: MemoryPlan, flags: Mapping[str, FlagValue], env: Mapping[str, str],
                  rng: random.Random) -> EngineSource:
    """Build the real scheduling core for a boot (``flags`` as given, Candidate style) and wrap it."""
    perf = PerformanceModel(profile, plan, {**profile.base_flags, **flags}, env)
    return EngineSource(Engine(profile, plan, perf, rng, block_size=BLOCK_TOKENS))


def crash_of(sim: SimCrash) -> Crash:
    """A plan's or the engine's ``SimCrash`` as the server prints it (boot phase from the failure kind)."""
    if sim.kind is FailureKind.HOST_OOM_KILLED:
        return Crash(sim.kind, "kv" if sim.phase == "boot" else "serve", (), traceback=False)
    if sim.kind is FailureKind.HANG:
        return Crash(sim.kind, "serve", tuple(sim.lines), plain=True)
    phase = _PHASE_OF_KIND.get(sim.kind, "kv") if sim.phase == "boot" else "serve"
    return Crash(sim.kind, phase, tuple(sim.lines))
