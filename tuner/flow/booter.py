"""``CandidateBooter``: one boot of one candidate, from launch to record, and the gate's ``BootSampler`` on it.

A boot, on every runtime: reserve ``boots/<nnnn>-<label>/`` and write the boot's seed there, read the GPU's state,
``Runtime.start``; on a candidate's first boot run the stress probes that apply (``probes/plan.py``: long context at
the target, the same beside long generations, the busiest burst, a maximum-size image for a vision model) and the
quality gate (the baseline's first boot records the reference); then the warm-up and measured passes of the traffic;
stop the server in ``finally``; write the ``BootRecord`` (BootReport, covariates, probes, measurements, failure,
fingerprint) before anything else is told. The probes and passes go through the ``ServerLoad`` (``tuner/flow/load.py``:
HTTP, or the virtual runtime's engine), the boot, check and stop through the ``Runtime``.

Every boot has a ``tag``, its identity inside the study (``"screening:hierarchical-cache:B0.1"``). A resumed
study replays its decisions; a boot whose tag already has a finished record is not booted again, its record
is read back (no finished boot is lost, none is repeated). The boot's seed is derived from its tag, so on a
simulated runtime a replayed boot and the original drew the same drift.
"""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from elsa_tune.errors import BootFailed
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.records import Arm, BootOutcome, BootRecord, Covariates, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.probes.plan import boot_probes, soak
from elsa_tune.probes.protocol import ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.probes.quality import QualityGate, QualitySample
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.boot_seed import write_boot_seed
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.gpu import GpuState, GpuView
from elsa_tune.runtime.protocol import HealthState, Runtime, Server
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import Workload
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.flow.load import HttpLoad, ServerLoad

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BootPlan:
    """What to boot and why. ``probes``: stress probes and the quality gate run before the passes."""

    tag: str
    candidate: Candidate
    phase: Phase
    arm: Arm = Arm.INCUMBENT
    block: int = 0
    position: int = 0
    technique: str | None = None
    trial_number: int | None = None
    probes: bool = False
    passes: bool = True
    soak_s: float = 0.0


@dataclass(frozen=True)
class BootResult:
    record: BootRecord
    sample: BootSample
    reused: bool = False


@dataclass
class BootContext:
    """What every boot of one study shares. Not frozen: the quality reference is set by the first baseline.

    ``vision``: the space's model takes images (its probed boots run the vision probe).
    """

    runtime: Runtime
    gpu: GpuView | None
    store: StudyStore
    study: str
    fingerprint: Fingerprint
    workload: Workload
    burst: Workload | None
    prompts: PromptSynth
    context_target: int | None
    probe_budget: ProbeBudget
    warmup_passes: int = 1
    measured_passes: int = 2
    seed: int = 0
    quality: QualityGate | None = field(default_factory=QualityGate)
    reference: QualitySample | None = None
    headroom_floor_bytes: int = 512 * 2**20
    check_needles: bool = True
    vision: bool = False


class CandidateBooter:
    """Boots ``BootPlan``s through the runtime, loads them through ``load`` and records them; reuses finished boots
    of a resumed study.

    ``load`` is how the runtime's servers are loaded (``HttpLoad`` over HTTP unless given the virtual runtime's).
    ``on_boot`` is called after every boot (fresh or reused) — the study's live view and clock listen;
    ``before_boot`` before every boot, including those the gate asks for — the study stops there.
    """

    def __init__(self, ctx: BootContext, *, on_boot: Callable[[BootResult], None] | None = None,
                 before_boot: Callable[[BootPlan], None] | None = None, load: ServerLoad | None = None) -> None:
        self.ctx = ctx
        self.load: ServerLoad = load if load is not None else HttpLoad(
            ctx.runtime.check, ctx.gpu, ctx.prompts, seed=ctx.seed, gate=ctx.quality)
        self.on_boot = on_boot
        self.before_boot = before_boot
        self._done: dict[str, BootRecord] = {}
        for record in ctx.store.load().boots:
            if record.tag is not None and record.outcome is not BootOutcome.INTERRUPTED:
                self._done[record.tag] = record
        self.boots = 0
        self.failed = 0
        self._counted: set[str] = set()     # boot ids already counted: a boot reused within this run counts once
        #: the quality gate's outcome per candidate key, from its probed boot: a property of the configuration,
        #: so the gate's later boots of the same candidate (which skip the probes) carry it too.
        self.quality: dict[str, bool] = {}
        for record in self._done.values():       # a resumed study knows what its probed boots found
            quality = _quality_of(record)
            if quality is not None and (record.probes or record.quality_reference):
                self.quality[record.candidate.key()] = quality
        reference = next((r.quality_reference for r in self._done.values() if r.quality_reference), None)
        if reference and ctx.reference is None:
            ctx.reference = QualitySample.from_dict(reference)

    @property
    def reused_tags(self) -> set[str]:
        return set(self._done)

    def boot(self, plan: BootPlan) -> BootResult:
        """Boot ``plan`` (or read back its finished record). ``before_boot`` may raise to stop the study first."""
        if self.before_boot is not None:
            self.before_boot(plan)
        previous = self._done.get(plan.tag)
        if previous is not None and previous.candidate.key() == plan.candidate.key():
            result = BootResult(previous, _sample_of(previous, plan), reused=True)
        else:
            result = self._fresh(plan)
            self._done[plan.tag] = result.record
        if result.sample.quality_passed is not None:
            self.quality[plan.candidate.key()] = result.sample.quality_passed
        if result.record.boot_id not in self._counted:
            self._counted.add(result.record.boot_id)
            self.boots += 1
            self.failed += result.sample.failed is not None
        if self.on_boot is not None:
            self.on_boot(result)
        return result

    # ---- one fresh boot ------------------------------------------------------------------------------

    def _fresh(self, plan: BootPlan) -> BootResult:
        ctx = self.ctx
        slot = ctx.store.new_boot(plan.candidate.label or plan.phase.value)
        write_boot_seed(slot.folder, _seed_of(ctx.seed, plan.tag))
        state = _gpu_state(ctx.gpu)
        started = self.load.now()
        log.info("boot %s [%s] %s: %s", slot.boot_id, plan.tag, plan.candidate.label or plan.candidate.key(),
                 " ".join(plan.candidate.argv()))
        probes: list[ProbeResult] = []
        measurements: list[dict[str, Any]] = []
        passes: list[PassMeasurement] = []
        reference: dict[str, Any] | None = None
        failure: Failure | None = None
        quality_passed: bool | None = None
        min_free: int | None = None
        report = None
        outcome = BootOutcome.READY
        note = ""
        try:
            server = ctx.runtime.start(plan.candidate, slot.folder)
        except BootFailed as exc:
            failure = exc.failure or Failure(FailureKind.UNKNOWN_CRASH, exc.message, exc.remedy)
            outcome = BootOutcome.BOOT_FAILED
            server = None
        if server is not None:
            report = server.report
            pool = report.max_total_num_tokens
            short = bool(plan.probes and ctx.context_target and pool is not None and pool < ctx.context_target)
            if short:
                note = f"KV pool {pool:,} tokens < context target {ctx.context_target:,}: not probed or measured"
            try:
                if plan.probes and not short:
                    failure, quality_passed, note, reference = self._probe(server, probes)
                    if failure is not None or quality_passed is False:
                        outcome = BootOutcome.PROBE_FAILED
                if failure is None and quality_passed is not False and plan.passes and not short:
                    failure, min_free = self._measure(server, passes, measurements)
                    outcome = BootOutcome.DIED if failure is not None else BootOutcome.MEASURED
                if failure is None and quality_passed is not False and plan.soak_s > 0:
                    failure = self._soak(server, plan.soak_s, probes)
                    outcome = BootOutcome.PROBE_FAILED if failure is not None else outcome
            except KeyboardInterrupt:
                outcome, note = BootOutcome.INTERRUPTED, "the study was stopped during this boot"
                raise
            finally:
                exit_ = ctx.runtime.stop(server)
                if exit_.failure is not None and failure is None and outcome is not BootOutcome.INTERRUPTED:
                    failure, outcome = exit_.failure, BootOutcome.DIED
                record = self._record(plan, slot.boot_id, slot.number, slot.log_relpath, started, outcome, report,
                                      failure, state, min_free, probes, measurements, passes, reference, note)
                ctx.store.record_boot(record)
        else:
            record = self._record(plan, slot.boot_id, slot.number, slot.log_relpath, started, outcome, report,
                                  failure, state, min_free, probes, measurements, passes, reference, note)
            ctx.store.record_boot(record)
        if failure is not None:
            log.info("boot %s failed: %s: %s", slot.boot_id, failure.kind.value, failure.summary)
        return BootResult(record, self._sample(plan, passes, report, quality_passed, state, started, min_free,
                                               failure))

    @staticmethod
    def _sample(plan: BootPlan, passes: list[PassMeasurement], report: BootReport | None,
                quality_passed: bool | None, state: GpuState | None, started: float, min_free: int | None,
                failure: Failure | None) -> BootSample:
        return BootSample(arm=plan.arm, block=plan.block, position=plan.position, passes=tuple(passes),
                          kv_pool_tokens=report.kv_capacity if report else None,
                          quality_passed=quality_passed, covariates=_covariates(state, started, min_free),
                          failed=failure, candidate_key=plan.candidate.key())

    def _probe(self, server: Server, probes: list[ProbeResult]
               ) -> tuple[Failure | None, bool | None, str, dict[str, Any] | None]:
        """The stress probes that apply to this boot (``probes/plan.py``), then the quality gate, until one fails;
        with the quality reference this boot recorded (``None`` when it recorded none)."""
        ctx = self.ctx
        budget = ctx.probe_budget
        notes: list[str] = []
        specs = boot_probes(context_target=ctx.context_target, slots=server.report.max_running_requests,
                            burst=ctx.burst, vision=ctx.vision, check_needles=ctx.check_needles)
        for spec in specs:
            result = self.load.probe(server, spec, budget)
            probes.append(result)
            log.info("probe %s: %s — %s", result.name, result.status.value, result.detail)
            if result.status is ProbeStatus.FAILED:
                return result.failure or _probe_failure(result, ctx.runtime, server), None, result.detail, None
            if result.status is ProbeStatus.LOW_HEADROOM:
                notes.append(f"{result.name}: {result.detail}")
            if result.status is ProbeStatus.REGRESSED:
                return None, False, f"{result.name} regressed: {result.detail}", None
        if ctx.quality is None:
            return None, None, "; ".join(notes), None
        check = self.load.quality(server, budget, ctx.reference)
        result = check.result
        probes.append(result)
        log.info("quality: %s — %s", result.status.value, result.detail)
        reference = None
        if check.reference is not None:
            ctx.reference = check.reference
            reference = check.reference.to_dict()
            notes.append(result.detail)
        if result.status is ProbeStatus.FAILED or (result.status is not ProbeStatus.PASSED
                                                   and ctx.runtime.check(server).state is HealthState.DEAD):
            return _probe_failure(result, ctx.runtime, server), None, result.detail, reference
        if result.status is ProbeStatus.REGRESSED:
            return None, False, f"{result.name} regressed: {result.detail}", reference
        return None, result.status is ProbeStatus.PASSED, "; ".join(notes), reference

    def _soak(self, server: Server, seconds: float, probes: list[ProbeResult]) -> Failure | None:
        ctx = self.ctx
        result = self.load.probe(server, soak(ctx.burst or ctx.workload, seconds), ctx.probe_budget)
        probes.append(result)
        log.info("soak %.0f s: %s — %s", seconds, result.status.value, result.detail)
        if result.status is ProbeStatus.FAILED:
            return result.failure or _probe_failure(result, ctx.runtime, server)
        return None

    def _measure(self, server: Server, passes: list[PassMeasurement],
                 measurements: list[dict[str, Any]]) -> tuple[Failure | None, int | None]:
        ctx = self.ctx
        run = self.load.passes(server, ctx.workload, warmup=ctx.warmup_passes, measured=ctx.measured_passes,
                               budget=ctx.probe_budget)
        passes.extend(run.passes)
        measurements.extend(run.summaries)
        failure: Failure | None = None
        if run.stopped is not None:
            health = ctx.runtime.check(server)
            failure = health.failure if health.state is HealthState.DEAD and health.failure else Failure(
                FailureKind.UNKNOWN_CRASH, run.stopped, run.remedy, phase="serve")
        return failure, run.min_free_bytes

    def _record(self, plan: BootPlan, boot_id: str, number: int, log_path: str | None, started: float,
                outcome: BootOutcome, report: Any, failure: Failure | None, state: GpuState | None,
                min_free: int | None, probes: list[ProbeResult], measurements: list[dict[str, Any]],
                passes: list[PassMeasurement], reference: dict[str, Any] | None, note: str) -> BootRecord:
        measured = [p.output_throughput_tok_s for p in passes if not p.warmup]
        tput = statistics.fmean(measured) if measured and all(math.isfinite(x) and x > 0 for x in measured) else None
        return BootRecord(study=self.ctx.study, boot_id=boot_id, boot_number=number, phase=plan.phase,
                          arm=plan.arm,
                          candidate=plan.candidate, fingerprint=self.ctx.fingerprint, started_at=started,
                          ended_at=self.load.now(), outcome=outcome,
                          trial_number=plan.trial_number,
                          technique=plan.technique, report=report, failure=failure,
                          covariates=Covariates.from_gpu_state(state) if state else None,
                          min_free_gpu_bytes=min_free, probes=tuple(probes), measurements=tuple(measurements),
                          throughput_tok_s=tput if failure is None else None, log_path=log_path, note=note,
                          tag=plan.tag, block=plan.block, position=plan.position,
                          gate_passes=tuple(vars(p).copy() for p in passes), quality_reference=reference)


class ABSampler:
    """The gate's ``BootSampler`` for one comparison: fresh boots of ``incumbent`` (A) or ``candidate`` (B).

    The candidate's first boot in the comparison already ran the probes in screening, so A/B boots only
    measure. Boot ids are collected per arm for the decision record.
    """

    def __init__(self, booter: CandidateBooter, *, incumbent: Candidate, candidate: Candidate, phase: Phase,
                 tag: str, technique: str | None = None, trial_number: int | None = None) -> None:
        self.booter = booter
        self.arms = {Arm.INCUMBENT: incumbent, Arm.CANDIDATE: candidate}
        self.phase = phase
        self.tag = tag
        self.technique = technique
        self.trial_number = trial_number
        self.boot_ids: dict[Arm, list[str]] = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}

    def boot(self, arm: Arm, block: int, position: int) -> BootSample:
        plan = BootPlan(tag=f"{self.tag}:{arm.letter}{block}.{position}", candidate=self.arms[arm],
                        phase=self.phase, arm=arm, block=block, position=position, technique=self.technique,
                        trial_number=self.trial_number)
        result = self.booter.boot(plan)
        self.boot_ids[arm].append(result.record.boot_id)
        sample = result.sample
        if sample.quality_passed is None and sample.failed is None:
            sample = replace(sample, quality_passed=self.booter.quality.get(plan.candidate.key()))
        return sample


# ---- helpers --------------------------------------------------------------------------------------


def _seed_of(seed: int, tag: str) -> int:
    return (seed * 1_000_003 + int(hashlib.sha256(tag.encode()).hexdigest()[:8], 16)) % 2**31


def _gpu_state(gpu: GpuView | None) -> GpuState | None:
    if gpu is None:
        return None
    try:
        return gpu.state()
    except Exception as exc:  # NVML errors must not lose a boot: the record says the state is unknown
        log.warning("could not read the GPU state: %s", exc)
        return None


def _covariates(state: GpuState | None, started: float, min_free: int | None) -> Covariates:
    if state is None:
        return Covariates(started_at=started)
    return Covariates.from_gpu_state(state, started_at=started, min_free_bytes=min_free)


def _probe_failure(result: ProbeResult | None, runtime: Runtime, server: Server) -> Failure:
    health = runtime.check(server)
    if health.state is HealthState.DEAD and health.failure is not None:
        return health.failure
    detail = result.detail if result is not None else "the server stopped answering"
    return Failure(FailureKind.UNKNOWN_CRASH, detail, "read the boot's server log", phase="serve",
                   evidence=result.evidence if result is not None else ())


def _quality_of(record: BootRecord) -> bool | None:
    """What a recorded boot's quality gate found (``None``: it did not run the gate)."""
    quality = None
    for probe in record.probes:
        if probe.name == "quality":
            quality = probe.status is ProbeStatus.PASSED
    if record.quality_reference:
        quality = True
    if record.outcome is BootOutcome.PROBE_FAILED and record.failure is None:
        quality = False
    return quality


def _sample_of(record: BootRecord, plan: BootPlan) -> BootSample:
    """The gate's view of a recorded boot (a resumed study reuses it instead of booting again)."""
    passes = tuple(PassMeasurement(**p) for p in record.gate_passes)
    quality = _quality_of(record)
    free = record.min_free_gpu_bytes
    covariates = (Covariates(started_at=record.started_at) if record.covariates is None
                  else replace(record.covariates, started_at=record.started_at,
                               free_memory_mib=free / 2**20 if free is not None else None))
    return BootSample(arm=plan.arm, block=plan.block, position=plan.position, passes=passes,
                      kv_pool_tokens=record.report.kv_capacity if record.report else None,
                      quality_passed=quality, failed=record.failure, candidate_key=record.candidate.key(),
                      covariates=covariates)

