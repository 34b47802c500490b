"""The adapter from sim-model's scheduling core (``engine.py``) to the serving loop's ``StepSource``.

The engine is a deterministic discrete-event core independent of wall time; the serving loop paces it. This
module translates between the two vocabularies (``SimRequest``/``StepResult`` on one side, ``JobSpec``/``Step``
on the other) so that neither has to know the other's internals.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from elsa_tune.runtime.sim.memory import MemoryPlan
from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.runtime.sim.serving import JobSpec, Step, StepSource
from elsa_tune.search_spaces.candidate import FlagValue


class EngineSource:
    """``StepSource`` over ``engine.Engine``."""

    def __init__(self, engine: Any, request_type: Any, plan: MemoryPlan) -> None:
        self.engine = engine
        self.request_type = request_type
        self.plan = plan
        self.clock = 0.0

    def submit(self, job: JobSpec) -> None:
        self.engine.submit(self.request_type(
            id=job.rid, input_tokens=job.input_tokens, block_hashes=job.block_hashes,
            max_new_tokens=job.output_tokens, regime=job.regime, ignore_eos=True, arrival_s=self.clock))

    def abort(self, rid: str) -> None:
        abort = getattr(self.engine, "abort", None)
        if abort is not None:
            abort(rid)

    def flush_cache(self) -> bool:
        flush = getattr(self.engine, "flush_cache", None)
        if flush is None:
            return True
        return bool(flush() is not False)

    def step(self) -> Step | None:
        if getattr(self.engine, "idle", False):
            return None
        result = self.engine.step()
        if result is None:
            return None
        self.clock += float(result.duration_s)
        return _to_step(result, self.plan)


def engine_source(profile: SimProfile, plan: MemoryPlan, flags: Mapping[str, FlagValue], env: Mapping[str, str],
                  rng: random.Random) -> StepSource:
    """Build the real scheduling core for a boot (``flags`` as given, Candidate style) and wrap it."""
    from elsa_tune.runtime.sim.engine import Engine, SimRequest
    from elsa_tune.runtime.sim.performance import PerformanceModel

    perf = PerformanceModel(profile, plan, {**profile.base_flags, **flags}, env)
    return EngineSource(Engine(profile, plan, perf, rng), SimRequest, plan)


def _to_step(r: Any, plan: MemoryPlan) -> Step:
    emitted = dict(getattr(r, "emitted", {}) or {})
    verify = int(getattr(r, "verify_calls", 0) or 0)
    return Step(
        duration_s=float(r.duration_s), kind=str(getattr(r, "kind", "decode")), emitted=emitted,
        finished=tuple(getattr(r, "finished", ()) or ()), retracted=tuple(getattr(r, "retracted", ()) or ()),
        cached=dict(getattr(r, "cached_tokens", {}) or {}), new_tokens=int(getattr(r, "prefill_tokens", 0) or 0),
        new_seqs=int(getattr(r, "new_seqs", 0) or 0), running=int(getattr(r, "running", 0) or 0),
        queued=int(getattr(r, "queued", 0) or 0), used_tokens=int(getattr(r, "used_tokens", 0) or 0),
        token_capacity=max(1, plan.kv_tokens), mamba_used=int(getattr(r, "mamba_used", 0) or 0),
        mamba_capacity=plan.mamba_slots, verify_calls=verify,
        accepted_tokens=sum(emitted.values()) if verify else 0, oom=bool(getattr(r, "oom", False)))
