"""Virtual-time studies: the real study on the simulated runtime, with no processes, sockets or wall clock.

``elsa-tune --gpu sim --virtual …`` (and ``run_virtual_study``) runs the same ``Study``: preflight, baseline and
noise dimensioning, technique screening, the numeric search, the A/B gate, the confirmation, the ledger and the
outputs. Only the boots differ: ``VirtualBoots`` is the booter's ``BootExecutor``. Each boot launches the candidate
on ``VirtualSGLang`` (memory plan, boot log, the real boot-report parser and failure classifier), runs the stress
probes and the measured passes on the simulator's scheduling engine, and draws the boot's noise from the profile's
noise model (the boot drift of its family, a run factor and a mean-reverting wander per pass, a cold first pass).
The study's clock is the simulated system's: every boot advances it by the seconds that boot takes on the simulated
card (process start, boot phases, probes, passes, stop), and the budget is spent in those seconds. An 8-hour
what-if takes seconds of CPU.

``VirtualBench`` exposes the same boots one at a time, for benchmarks that compare other search protocols with the
study on equal terms.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import BootOutcome
from elsa_tune.history.run_dir import SERVER_LOG
from elsa_tune.probes.protocol import ProbeResult, ProbeStatus
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.engine import SimRequest
from elsa_tune.runtime.sim.noise import boot_drift
from elsa_tune.runtime.sim.profile import NoiseProfile
from elsa_tune.runtime.sim.truth import Truth, TruthWorkload
from elsa_tune.runtime.sim.virtual import STOP_S, VirtualSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.workload import ReplayMode, Workload
from elsa_tune.tuner.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.night import StudyClock
from elsa_tune.tuner.preflight import Preflight, run_preflight
from elsa_tune.tuner.sampler import BootPlan, BootRun, _seed_of
from elsa_tune.tuner.schedule import Arm
from elsa_tune.tuner.settings import Settings

SCHEMA_VERSION = 1
#: Simulated seconds the quality gate's prompts take (a few dozen short greedy answers and the cache-hit repeats).
QUALITY_S = 60.0
#: Needles the long-context probe asks for, each a full prompt at the context target.
LONG_CONTEXT_NEEDLES = 3


@dataclass(frozen=True)
class Workloads:
    """What a virtual boot serves, as the engine's workloads: the measured pass, the busiest burst, the long prompt."""

    measured: TruthWorkload
    burst: TruthWorkload
    long_context: TruthWorkload | None

    @classmethod
    def of(cls, pre: Preflight, context_target: int | None) -> Workloads:
        long = None
        if context_target:
            long = TruthWorkload(concurrency=1, num_requests=LONG_CONTEXT_NEEDLES, input_tokens=(context_target,),
                                 output_tokens=(32,), regimes=("chat",), name="long-context")
        return cls(measured=truth_workload(pre.workload, "measured"), burst=truth_workload(pre.burst, "burst"),
                   long_context=long)


def truth_workload(workload: Workload, name: str) -> TruthWorkload:
    """A traffic ``Workload`` as the engine replays it: the same requests, prefixes, regimes and replay mode."""
    reqs = workload.requests
    if workload.mode is ReplayMode.OPEN_LOOP:
        first = min(r.arrival_s or 0.0 for r in reqs)
        return TruthWorkload(requests=tuple(
            SimRequest(rid=f"{name}{r.index}", input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                       regime=r.kind or "chat", block_hashes=tuple(r.block_hashes),
                       arrival_s=(r.arrival_s or 0.0) - first) for r in reqs),
            block_size=workload.block_size, name=name)
    return TruthWorkload(concurrency=workload.concurrency or 1, num_requests=len(reqs),
                         input_tokens=tuple(r.input_tokens for r in reqs),
                         output_tokens=tuple(r.output_tokens for r in reqs),
                         regimes=tuple(r.kind or "chat" for r in reqs),
                         block_hashes=tuple(tuple(r.block_hashes) for r in reqs),
                         block_size=workload.block_size, name=name)


class VirtualBoots:
    """The ``BootExecutor`` of a virtual study: boots on ``VirtualSGLang`` under the study's simulated clock."""

    def __init__(self, runtime: VirtualSGLang, clock: StudyClock, workloads: Workloads, *, seed: int,
                 context_target: int | None, quality: bool, warmup_passes: int, measured_passes: int,
                 hang_s: float, epoch: float) -> None:
        self.runtime = runtime
        self.clock = clock
        self.workloads = workloads
        self.seed = seed
        self.context_target = context_target
        self.quality = quality
        self.warmup_passes = warmup_passes
        self.measured_passes = measured_passes
        self.hang_s = hang_s
        self.epoch = epoch
        self.reference_recorded = False

    def use_workload(self, workload: Workload) -> None:
        self.workloads = replace(self.workloads, measured=truth_workload(workload, f"measured-{len(workload)}"))

    def run(self, plan: BootPlan, folder: Path, extra: dict[str, Any]) -> BootRun:
        start = self.clock.now()
        run = self.boot(plan.candidate, _seed_of(self.seed, plan.tag), start, probes=plan.probes,
                        passes=plan.passes, soak_s=plan.soak_s)
        (folder / SERVER_LOG).write_text(self.runtime.launch(plan.candidate).log_text, encoding="utf-8")
        run.extra = {**extra, **run.extra}
        self.clock.advance(run.ended - run.started)
        run.started += self.epoch
        run.ended += self.epoch
        return run

    def boot(self, candidate: Candidate, boot_seed: int, start_s: float, *, probes: bool, passes: bool = True,
             soak_s: float = 0.0, noise: NoiseProfile | None = None) -> BootRun:
        """One boot of ``candidate`` starting ``start_s`` simulated seconds into the study (times in those seconds).

        ``noise`` replaces the profile's noise for this boot (``VirtualBench.boot_seconds``: none at all).
        """
        # keyed like the HTTP simulator's ``ServingNoise``: the profile's own noise seed, then the boot's
        rng = random.Random(f"elsa-virtual:{self.runtime.profile.noise.seed * 1_000_003 + boot_seed}")
        launch = self.runtime.launch(candidate)
        seconds = launch.boot_s
        extra: dict[str, Any] = {"virtual": True}
        if launch.failure is not None or launch.report is None:
            return BootRun(started=start_s, ended=start_s + seconds + STOP_S, outcome=BootOutcome.BOOT_FAILED,
                           failure=launch.failure, extra=extra)
        report = launch.report
        noise = noise or self.runtime.profile.noise
        drift = boot_drift(noise, rng, start_s)
        run = BootRun(started=start_s, ended=start_s, outcome=BootOutcome.READY, report=report, extra=extra,
                      min_free=int(launch.plan.headroom_gb * 2**30) if launch.plan is not None else None)
        pool = report.max_total_num_tokens
        target = self.context_target
        if probes and target and pool is not None and pool < target:
            run.note = f"KV pool {pool:,} tokens < context target {target:,}: not probed or measured"
            run.ended = start_s + seconds + STOP_S
            return run
        if probes:
            seconds += self._probe(candidate, run, drift)
        if run.failure is None and run.quality_passed is not False and passes:
            seconds += self._measure(candidate, run, drift, rng, noise)
        if run.failure is None and run.quality_passed is not False and soak_s > 0:
            seconds += soak_s
            run.probes.append(ProbeResult("soak", ProbeStatus.PASSED, f"{soak_s:.0f} s of the busiest burst",
                                          seconds=soak_s))
        run.ended = start_s + seconds + STOP_S
        return run

    def _probe(self, candidate: Candidate, run: BootRun, drift: float) -> float:
        """The long-context and burst probes, then the quality gate; returns their simulated seconds."""
        seconds = 0.0
        checks = [("long_context", self.workloads.long_context), ("burst", self.workloads.burst)]
        for name, workload in checks:
            if workload is None:
                continue
            served = self.runtime.serve(candidate, workload)
            if served.crashed:
                took = served.makespan_s * drift + (self.hang_s if served.crash_kind == FailureKind.HANG.value
                                                    else 0.0)
                failure = self.runtime.serve_failure(candidate, served)
                run.probes.append(ProbeResult(name, ProbeStatus.FAILED, failure.summary, failure=failure,
                                              seconds=took, evidence=failure.evidence))
                run.failure, run.outcome = failure, BootOutcome.PROBE_FAILED
                run.note = failure.summary
                return seconds + took
            took = served.makespan_s * drift
            seconds += took
            run.probes.append(ProbeResult(name, ProbeStatus.PASSED, _probe_detail(name, served), seconds=took,
                                          metrics={"completed": served.completed}))
        if not self.quality:
            return seconds
        seconds += QUALITY_S
        damage = launch_damage(self.runtime, candidate)
        if not self.reference_recorded:
            self.reference_recorded = True
            run.probes.append(ProbeResult("quality", ProbeStatus.PASSED, "quality reference recorded",
                                          seconds=QUALITY_S))
            run.quality_passed = True
            run.note = "quality reference recorded"
        elif damage:
            run.probes.append(ProbeResult("quality", ProbeStatus.REGRESSED, "; ".join(damage), seconds=QUALITY_S))
            run.quality_passed, run.outcome = False, BootOutcome.PROBE_FAILED
            run.note = f"quality regressed: {'; '.join(damage)}"
        else:
            run.probes.append(ProbeResult("quality", ProbeStatus.PASSED, "answers agree with the reference",
                                          seconds=QUALITY_S))
            run.quality_passed = True
        return seconds

    def _measure(self, candidate: Candidate, run: BootRun, drift: float, rng: random.Random,
                 noise: NoiseProfile) -> float:
        """The warm-up and measured passes with the boot's noise; returns their simulated seconds."""
        served = self.runtime.serve(candidate, self.workloads.measured)
        if served.crashed:
            failure = self.runtime.serve_failure(candidate, served)
            run.failure, run.outcome = failure, BootOutcome.DIED
            return served.makespan_s * drift + (self.hang_s if failure.kind is FailureKind.HANG else 0.0)
        n = max(1, served.completed + served.rejected + served.aborted)
        errors = (served.rejected + served.aborted) / n
        wander = 0.0
        seconds = 0.0
        for i in range(self.warmup_passes + self.measured_passes):
            cold_share = min(1.0, max(0.0, (noise.warm_requests - i * n) / n))
            factor = drift * math.exp(rng.gauss(0.0, noise.run_sigma)) if noise.run_sigma > 0 else drift
            wander = 0.5 * wander + noise.run_sigma / 3 * math.sqrt(0.75) * rng.gauss(0.0, 1.0)
            factor *= math.exp(wander) * (1.0 + noise.first_pass_slowdown * cold_share)
            duration = served.makespan_s * factor
            seconds += duration
            tail = math.exp(rng.gauss(0.0, 2 * noise.run_sigma)) if noise.run_sigma > 0 else 1.0
            warm = i < self.warmup_passes
            p = PassMeasurement(output_throughput_tok_s=(served.output_tokens_per_s or 0.0) / factor,
                                ttft_p50_s=_times(served.ttft_p50_s, factor),
                                ttft_p99_s=_times(served.ttft_p99_s, factor * tail),
                                ttft_p90_s=_times(served.ttft_p90_s, factor * tail), warmup=warm,
                                error_fraction=errors, duration_s=duration, requests_ok=served.completed)
            run.passes.append(p)
            run.measurements.append({"pass_index": i, "warmup": warm,
                                     "output_throughput_tok_s": p.output_throughput_tok_s,
                                     "requests_total": n, "requests_ok": served.completed,
                                     "errors": served.rejected + served.aborted, "window_s": duration,
                                     "ttft_s": {"p50": p.ttft_p50_s, "p99": p.ttft_p99_s},
                                     "cached_token_ratio": served.prefix_cache_hit_rate, "simulated_time": True})
        run.outcome = BootOutcome.MEASURED
        return seconds


def launch_damage(runtime: VirtualSGLang, candidate: Candidate) -> tuple[str, ...]:
    """What the candidate's launch does to the answers (the quality gate's prompts find every kind)."""
    plan = runtime.launch(candidate).plan
    return tuple(plan.quality_damage) if plan is not None else ()


def _times(value: float | None, factor: float) -> float | None:
    return value * factor if value is not None else None


def _probe_detail(name: str, served: Truth) -> str:
    if name == "long_context":
        return f"{served.completed} long prompts answered"
    return f"{served.completed} burst requests served"


# ---- studies ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualStudyResult:
    """A finished virtual study: what it recommends and decided, and what it cost (simulated and CPU seconds)."""

    run_dir: Path
    status: str
    recommended: Candidate
    decisions: tuple[DecisionRecord, ...]
    boots: int
    sim_seconds: float
    cpu_seconds: float
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION


def virtual_executor(pre: Preflight, clock: StudyClock) -> VirtualBoots:
    """The booter's executor for a virtual study on ``pre`` (whose runtime must be ``VirtualSGLang``)."""
    runtime = pre.runtime
    if not isinstance(runtime, VirtualSGLang):
        raise TypeError("a virtual study needs the virtual runtime (Settings.virtual)")
    target = pre.context_target
    s = pre.settings
    return VirtualBoots(runtime, clock, Workloads.of(pre, target), seed=s.seed, context_target=target,
                        quality=pre.space.guardrails.quality_gate, warmup_passes=s.warmup_passes,
                        measured_passes=s.measured_passes, hang_s=pre.space.probes.hang_s, epoch=time.time())


def run_virtual_study(*, profile: str | Path, space: str | Path, out: Path, traffic: str = "demo",
                      budget_s: float = 8 * 3600.0, seed: int = 0, **settings: Any) -> VirtualStudyResult:
    """Run one whole study in virtual time and return what it recommends; its run folder is ``out``."""
    from elsa_tune.history.run_dir import RunDir
    from elsa_tune.tuner.console import StudyView
    from elsa_tune.tuner.study import Study

    cpu = time.process_time()
    s = Settings(gpu="sim", runtime="sim", virtual=True, sim_profile=str(profile), space=str(space), traffic=traffic,
                 budget_s=budget_s, seed=seed, out=Path(out), live=False, **settings)
    pre = run_preflight(s)
    clock = StudyClock.simulated()
    study = Study(pre, view=StudyView(live=False), clock=clock, executor=virtual_executor(pre, clock),
                  with_plots=False, outputs_each_decision=False)
    outcome = study.run()
    history = RunDir(Path(outcome.run_dir)).load()
    return VirtualStudyResult(run_dir=Path(outcome.run_dir), status=outcome.status.value,
                              recommended=outcome.incumbent, decisions=tuple(history.decisions),
                              boots=outcome.boots, sim_seconds=clock.now(), cpu_seconds=time.process_time() - cpu,
                              notes=tuple(study.night.notes))


class VirtualBench:
    """Single virtual boots on the study's own workloads, for benchmarks of other protocols (no run folder).

    ``boot(candidate, boot_index)`` is one noisy boot as the gate sees it (``BootSample``; probes included when
    ``probes``); ``truth(candidate)`` the noiseless worth of the measured pass; ``boot_seconds`` what one measured
    boot costs in simulated seconds.
    """

    def __init__(self, *, profile: str | Path, space: str | Path, traffic: str = "demo",
                 budget_s: float = 8 * 3600.0, seed: int = 0) -> None:
        s = Settings(gpu="sim", runtime="sim", virtual=True, sim_profile=str(profile), space=str(space),
                     traffic=traffic, budget_s=budget_s, seed=seed, live=False)
        self.pre = run_preflight(s)
        self.space = self.pre.space
        self.clock = StudyClock.simulated()
        self.boots = virtual_executor(self.pre, self.clock)
        self.runtime: VirtualSGLang = self.boots.runtime
        self.workload = self.boots.workloads.measured
        self.context_target = self.boots.context_target
        self.seed = seed

    def truth(self, candidate: Candidate) -> Truth | None:
        """The noiseless measured pass of ``candidate`` (``None`` when it never becomes ready)."""
        if self.runtime.launch(candidate).failure is not None:
            return None
        return self.runtime.serve(candidate, self.workload)

    def boot(self, candidate: Candidate, boot_index: int, *, probes: bool = False,
             arm: Arm = Arm.INCUMBENT, block: int = 0, position: int = 0) -> BootSample:
        """One noisy boot of ``candidate``, its drift drawn from ``boot_index`` (and the bench's seed)."""
        start = self.clock.now()
        run = self.boots.boot(candidate, _seed_of(self.seed, f"bench:{boot_index}"), start, probes=probes)
        self.clock.advance(run.ended - run.started)
        return BootSample(arm=arm, block=block, position=position, passes=tuple(run.passes),
                          kv_pool_tokens=run.report.kv_capacity if run.report else None,
                          quality_passed=run.quality_passed, failed=run.failure, candidate_key=candidate.key())

    def boot_seconds(self, candidate: Candidate) -> float:
        """Simulated seconds one measured boot of ``candidate`` costs (launch, passes and stop, no noise)."""
        quiet = replace(self.runtime.profile.noise, boot_sigma=0.0, run_sigma=0.0, family="lognormal")
        run = self.boots.boot(candidate, 0, 0.0, probes=False, noise=quiet)
        return run.ended - run.started

