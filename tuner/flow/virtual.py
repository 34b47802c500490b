"""Virtual-time studies: the real study on the simulated runtime, with no processes, sockets or wall clock.

``elsa-tune --gpu sim --virtual …`` (and ``run_virtual_study``) runs the same ``Study`` through the same booter as a
GPU study: preflight, baseline and noise dimensioning, technique screening, the numeric search, the A/B gate, the
confirmation, the ledger and the outputs. Only the runtime and its load differ: ``VirtualSGLang`` boots, checks and
stops servers in simulated time (memory plan, boot log, the real boot-report parser and failure classifier), and
``VirtualLoad`` runs each probe and measured pass on the simulator's scheduling engine, with the boot's noise drawn
from the profile's noise model (the boot drift of its family, a run factor and a mean-reverting wander per pass, a
cold first pass). The study's clock is the runtime's: every boot spends the seconds it takes on the simulated card
(process start, boot phases, probes, passes, stop), and the budget is spent in those seconds. An 8-hour what-if
takes seconds of CPU.

``VirtualBench`` exposes single boots through the same booter, for benchmarks that compare other search protocols
with the study on equal terms.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.probes.plan import ProbeKind, ProbeSpec
from elsa_tune.probes.protocol import ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.probes.quality import QualitySample
from elsa_tune.probes.stress import TEMPLATE_SLACK_TOKENS
from elsa_tune.probes.vision import MAX_IMAGE_PIXELS
from elsa_tune.runtime.protocol import Server
from elsa_tune.runtime.sim.answers import IMAGE_PIXELS_PER_TOKEN
from elsa_tune.runtime.sim.engine import SimRequest
from elsa_tune.runtime.sim.truth import Truth, TruthWorkload
from elsa_tune.runtime.sim.virtual import VirtualSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.workload import ReplayMode, Workload
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.flow.booter import BootPlan, CandidateBooter
from elsa_tune.tuner.flow.load import QUALITY, Passes, QualityCheck
from elsa_tune.tuner.flow.night import StudyClock
from elsa_tune.tuner.flow.preflight import Preflight, run_preflight
from elsa_tune.tuner.flow.settings import Launcher, Settings

SCHEMA_VERSION = 1
#: Simulated seconds the quality gate's prompts take (a few dozen short greedy answers and the cache-hit repeats).
QUALITY_S = 60.0
#: Needles the long-context probe asks for, each a full prompt at the context target.
LONG_CONTEXT_NEEDLES = 3
#: Prompt tokens of each long generation beside the concurrent long-context prompt ("write a long story about …").
GENERATION_PROMPT_TOKENS = 24
#: Tokens of the largest image the vision probe sends (``probes/vision.py``), as the simulated processor counts them.
PROBE_IMAGE_TOKENS = MAX_IMAGE_PIXELS // IMAGE_PIXELS_PER_TOKEN
#: A virtual server's answers have no text: the quality reference only marks that the baseline's boot answered.
VIRTUAL_REFERENCE = QualitySample(greedy=(), arithmetic_correct=(), tools_valid=(), cache_cold=(), cache_warm=(),
                                  accept_length=None)


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


class VirtualLoad:
    """The ``ServerLoad`` of ``VirtualSGLang``'s servers: each probe and pass is the engine's run of the same
    requests on the simulated clock. ``hang_s`` is how long a client waits on a stalled stream before calling it a
    hang (a hang costs that much more simulated time)."""

    def __init__(self, runtime: VirtualSGLang, *, hang_s: float) -> None:
        self.runtime = runtime
        self.hang_s = hang_s
        self._workloads: dict[tuple[str, int], TruthWorkload] = {}

    def now(self) -> float:
        return self.runtime.now()

    # ---- probes ----------------------------------------------------------------------------------------

    def probe(self, server: Server, spec: ProbeSpec, budget: ProbeBudget) -> ProbeResult:
        started = self.runtime.clock.now()
        if spec.kind is ProbeKind.SOAK:
            self.runtime.clock.advance(spec.seconds)
            return ProbeResult(spec.name, ProbeStatus.PASSED, f"{spec.seconds:.0f} s of the busiest burst",
                               seconds=spec.seconds)
        if spec.kind is ProbeKind.VISION:
            return self._vision(server, spec, started)
        served = self.runtime.serve_on(server, self._probe_workload(spec), hang_wait_s=self.hang_s)
        return self._result(server, spec, served, started, _probe_detail(spec, served))

    def _probe_workload(self, spec: ProbeSpec) -> TruthWorkload:
        if spec.kind is ProbeKind.LONG_CONTEXT:
            return TruthWorkload(concurrency=1, num_requests=LONG_CONTEXT_NEEDLES, input_tokens=(spec.target_tokens,),
                                 output_tokens=(32,), regimes=("chat",), name="long-context")
        if spec.kind is ProbeKind.LONG_CONTEXT_CONCURRENT:
            n = spec.generations + 1
            return TruthWorkload(concurrency=n, num_requests=n,
                                 input_tokens=(spec.target_tokens, *(GENERATION_PROMPT_TOKENS,) * spec.generations),
                                 output_tokens=(32, *(spec.output_tokens,) * spec.generations), regimes=("chat",),
                                 name=f"long-context-concurrent-{spec.generations}x{spec.output_tokens}")
        assert spec.workload is not None, f"a {spec.name} probe needs its workload"
        return self._truth(spec.workload, spec.name)

    def _vision(self, server: Server, spec: ProbeSpec, started: float) -> ProbeResult:
        if not self.runtime.vision:
            return ProbeResult(spec.name, ProbeStatus.FAILED, "1 of 1 requests failed: The model does not support "
                               "image input.")
        died = self.runtime.send_image(server, PROBE_IMAGE_TOKENS)
        if died is not None:
            return ProbeResult(spec.name, ProbeStatus.FAILED, f"the maximum-size image alone: {died.summary}",
                               failure=died, evidence=died.evidence)
        report = server.report
        tokens = min([spec.target_tokens, *(limit - TEMPLATE_SLACK_TOKENS for limit in
                                            (report.max_total_num_tokens, report.context_len) if limit)])
        request = TruthWorkload(concurrency=1, num_requests=1, input_tokens=(max(PROBE_IMAGE_TOKENS, tokens),),
                                output_tokens=(32,), regimes=("chat",), name=f"vision-{tokens}")
        served = self.runtime.serve_on(server, request, hang_wait_s=self.hang_s)
        return self._result(server, spec, served, started, f"a {tokens:,}-token request with a maximum-size image "
                            "answered")

    def _result(self, server: Server, spec: ProbeSpec, served: Truth, started: float, detail: str) -> ProbeResult:
        seconds = self.runtime.clock.now() - started
        if served.crashed:
            failure = self.runtime.check(server).failure
            assert failure is not None, "a crashed virtual server has its failure"
            return ProbeResult(spec.name, ProbeStatus.FAILED, failure.summary, failure=failure, seconds=seconds,
                               evidence=failure.evidence)
        return ProbeResult(spec.name, ProbeStatus.PASSED, detail, seconds=seconds,
                           metrics={"completed": served.completed})

    def quality(self, server: Server, budget: ProbeBudget, reference: QualitySample | None) -> QualityCheck:
        """What the candidate's launch does to the answers (the gate's prompts find every kind of damage)."""
        self.runtime.clock.advance(QUALITY_S)
        if reference is None:
            return QualityCheck(ProbeResult(QUALITY, ProbeStatus.PASSED, "quality reference recorded",
                                            seconds=QUALITY_S), VIRTUAL_REFERENCE)
        plan = self.runtime.launch(server.candidate).plan
        damage = tuple(plan.quality_damage) if plan is not None else ()
        if damage:
            return QualityCheck(ProbeResult(QUALITY, ProbeStatus.REGRESSED, "; ".join(damage), seconds=QUALITY_S))
        return QualityCheck(ProbeResult(QUALITY, ProbeStatus.PASSED, "answers agree with the reference",
                                        seconds=QUALITY_S))

    # ---- measured passes -------------------------------------------------------------------------------

    def passes(self, server: Server, workload: Workload, *, warmup: int, measured: int,
               budget: ProbeBudget) -> Passes:
        truth = self._truth(workload, "measured")
        headroom = self.runtime.headroom_bytes(server)
        passes: list[PassMeasurement] = []
        summaries: list[dict[str, Any]] = []
        for i in range(warmup + measured):
            run = self.runtime.run_pass(server, truth, i, hang_wait_s=self.hang_s)
            served, factor = run.truth, run.factor
            if served.crashed:
                return Passes(tuple(passes), tuple(summaries), headroom,
                              stopped=f"the server died in pass {i}: {served.crash_reason}",
                              remedy="read the boot's server log")
            n = max(1, served.completed + served.rejected + served.aborted)
            warm = i < warmup
            p = PassMeasurement(output_throughput_tok_s=(served.output_tokens_per_s or 0.0) / factor,
                                ttft_p50_s=_times(served.ttft_p50_s, factor),
                                ttft_p99_s=_times(served.ttft_p99_s, factor * run.tail),
                                ttft_p90_s=_times(served.ttft_p90_s, factor * run.tail), warmup=warm,
                                error_fraction=(served.rejected + served.aborted) / n, duration_s=run.seconds,
                                requests_ok=served.completed)
            passes.append(p)
            summaries.append({"pass_index": i, "warmup": warm, "output_throughput_tok_s": p.output_throughput_tok_s,
                              "requests_total": n, "requests_ok": served.completed,
                              "errors": served.rejected + served.aborted, "window_s": run.seconds,
                              "ttft_s": {"p50": p.ttft_p50_s, "p99": p.ttft_p99_s},
                              "cached_token_ratio": served.prefix_cache_hit_rate, "simulated_time": True})
        return Passes(tuple(passes), tuple(summaries), headroom)

    def _truth(self, workload: Workload, role: str) -> TruthWorkload:
        """``workload`` as the engine's, named for the runtime's cache: ``burst``; ``measured`` for the first
        measured workload and ``measured-<n requests>`` for one that replaced it."""
        key = (role, id(workload))
        if key not in self._workloads:
            name = role if role != "measured" or not any(r == role for r, _ in self._workloads) else \
                f"measured-{len(workload)}"
            self._workloads[key] = truth_workload(workload, name)
        return self._workloads[key]


def _times(value: float | None, factor: float) -> float | None:
    return value * factor if value is not None else None


def _probe_detail(spec: ProbeSpec, served: Truth) -> str:
    if spec.kind is ProbeKind.LONG_CONTEXT:
        return f"{served.completed} long prompts answered"
    if spec.kind is ProbeKind.LONG_CONTEXT_CONCURRENT:
        return f"a long prompt answered beside {spec.generations} long generations"
    return f"{served.completed} burst requests served"


@dataclass(frozen=True)
class VirtualTestbed:
    """What a virtual study boots through: ``pre`` with the virtual runtime on the study's simulated clock, and
    the load that measures that runtime's servers."""

    pre: Preflight
    runtime: VirtualSGLang
    load: VirtualLoad
    clock: StudyClock

    @classmethod
    def of(cls, pre: Preflight) -> VirtualTestbed:
        """The testbed of a ``--virtual`` preflight: its profile's runtime, spending a fresh simulated clock."""
        profile = pre.settings.sim_profile
        assert profile is not None, "a virtual study names its simulator profile (Settings.virtual)"
        clock = StudyClock.simulated()
        runtime = VirtualSGLang(profile, model_path=pre.space.model.path, clock=clock,
                                family_name=pre.space.runtime.family.value)
        return cls(replace(pre, runtime=runtime, gpu=runtime.gpu), runtime,
                   VirtualLoad(runtime, hang_s=pre.space.probes.hang_s), clock)


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


def run_virtual_study(*, profile: str | Path, space: str | Path, out: Path, traffic: str = "demo",
                      budget_s: float = 8 * 3600.0, seed: int = 0, **settings: Any) -> VirtualStudyResult:
    """Run one whole study in virtual time and return what it recommends; its run folder is ``out``."""
    from elsa_tune.history.run_dir import RunDir
    from elsa_tune.tuner.console import StudyView
    from elsa_tune.tuner.flow.study import Study

    cpu = time.process_time()
    s = Settings(gpu="sim", runtime=Launcher.SIM, virtual=True, sim_profile=str(profile), space=str(space),
                 traffic=traffic, budget_s=budget_s, seed=seed, out=Path(out), live=False, **settings)
    bed = VirtualTestbed.of(run_preflight(s))
    clock = bed.clock
    study = Study(bed.pre, view=StudyView(live=False), clock=clock, load=bed.load, with_plots=False,
                  outputs_each_decision=False)
    outcome = study.run()
    history = RunDir(Path(outcome.run_dir)).load()
    return VirtualStudyResult(run_dir=Path(outcome.run_dir), status=outcome.status.value,
                              recommended=outcome.incumbent, decisions=tuple(history.decisions),
                              boots=outcome.boots, sim_seconds=clock.now(), cpu_seconds=time.process_time() - cpu,
                              notes=tuple(study.night.notes))


class VirtualBench:
    """Single virtual boots on the study's own workloads through the study's booter, for benchmarks of other
    protocols (their records go to a temporary folder).

    ``boot(candidate, boot_index)`` is one noisy boot as the gate sees it (``BootSample``; probes included when
    ``probes``); ``truth(candidate)`` the noiseless worth of the measured pass.
    """

    def __init__(self, *, profile: str | Path, space: str | Path, traffic: str = "demo",
                 budget_s: float = 8 * 3600.0, seed: int = 0) -> None:
        s = Settings(gpu="sim", runtime=Launcher.SIM, virtual=True, sim_profile=str(profile), space=str(space),
                     traffic=traffic, budget_s=budget_s, seed=seed, live=False)
        bed = VirtualTestbed.of(run_preflight(s))
        self.pre = bed.pre
        self.space = bed.pre.space
        self.clock = bed.clock
        self.runtime = bed.runtime
        self.workload = truth_workload(bed.pre.workload, "measured")
        self.context_target = bed.pre.context_target
        self.seed = seed
        folder = Path(tempfile.mkdtemp(prefix="elsa-bench-"))
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        store = StudyStore(folder / "run", name="bench", heartbeat_interval=None)
        self._booter = CandidateBooter(bed.pre.boot_context(store, "bench"), load=bed.load)

    def truth(self, candidate: Candidate) -> Truth | None:
        """The noiseless measured pass of ``candidate`` (``None`` when it never becomes ready)."""
        if self.runtime.launch(candidate).failure is not None:
            return None
        return self.runtime.serve(candidate, self.workload)

    def boot(self, candidate: Candidate, boot_index: int, *, probes: bool = False,
             arm: Arm = Arm.INCUMBENT, block: int = 0, position: int = 0) -> BootSample:
        """One noisy boot of ``candidate``, its drift drawn from ``boot_index`` (and the bench's seed)."""
        plan = BootPlan(tag=f"bench:{boot_index}", candidate=candidate, phase=Phase.SEARCH, arm=arm, block=block,
                        position=position, probes=probes)
        return self._booter.boot(plan).sample
