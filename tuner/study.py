"""``Study``: one unattended night — baseline, technique screening, numeric search, confirmation, outputs.

The flow (``../shared/design.md``, "The flow of one study"), under one ``Budget``:

- **baseline**: boot the baseline ``baseline_boots`` times (the first with the probes and the quality
  reference); ``dimension`` the noise; the gate's policy follows from it and from the time left.
- **screening**: every technique the ledger has not rejected for this fingerprint is booted once with the
  probes and the quality gate. A crash, OOM, hang, quality regression, a pool below the context target or
  an adjustment showing a technique flag was silently ignored or clamped rejects it at once, with that
  reason. Otherwise the sequential A/B gate decides against the incumbent, under online false-keep control
  across the night; kept techniques stack into the incumbent.
- **search**: ``NumericSearch`` around the incumbent; the ``MemoryModel`` skips candidates predicted to
  miss the context target; failures are constraints; a candidate whose screening boot beats the
  incumbent by more than the boot noise goes through the A/B gate.
- **confirmation**: the final incumbent against the original baseline on fresh boots, then a soak.
- **outputs** (report, ``best/``, ledger, ``study.json``) after every decision.

A resumed study (same ``--out``) replays the same decisions: ``CandidateBooter`` reuses every boot whose tag
already has a record, so nothing finished is booted twice or lost, and the ledger gains nothing twice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from elsa_tune.errors import StudyError
from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.records import Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.history.study_record import NoiseReport as StoredNoise
from elsa_tune.history.study_record import PhaseSpan, StudyRecord, StudyStatus
from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.probes.protocol import ProbeBudget
from elsa_tune.probes.quality import QualityGate
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import Technique
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.tuner.budget import Budget
from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.dimensioning import NoiseReport, dimension
from elsa_tune.tuner.gate import ABResult, GatePolicy, GuardrailPolicy, run_ab
from elsa_tune.tuner.memory_model import MemoryModel, Observation
from elsa_tune.tuner.multiplicity import OnlineFalseKeepControl
from elsa_tune.tuner.preflight import Preflight
from elsa_tune.tuner.sampler import ABSampler, BootContext, BootPlan, BootResult, CandidateBooter
from elsa_tune.tuner.schedule import Arm
from elsa_tune.tuner.search import NumericSearch, proposal_key
from elsa_tune.tuner.signals import Interrupts
from elsa_tune.tuner.statistics import InsufficientData

log = logging.getLogger(__name__)

#: Failures worth a second and third attempt before they are the answer (seed 004: NGRAM "3 attempts, 3 OOM").
_RETRIED = (FailureKind.OOM_UNDER_LOAD, FailureKind.HANG)


class StopStudy(Exception):
    """Raised between boots when the study must end now; outputs are written.

    ``interrupted``: a person asked (Ctrl-C, SIGTERM) — the study is INTERRUPTED and resumable. Otherwise the
    whole budget is spent, which is how a night normally ends: the study is FINISHED with what it decided.
    """

    def __init__(self, reason: str, *, interrupted: bool) -> None:
        super().__init__(reason)
        self.interrupted = interrupted


class PhaseOver(Exception):
    """Raised between boots when the current phase's allowance is spent: the phase ends, the next one starts."""


class StudyClock:
    """Monotonic seconds since the study began; a boot reused on resume advances it by the boot's recorded time,
    so a replayed study spends its budget as the original did."""

    def __init__(self) -> None:
        self._origin = time.monotonic()
        self._offset = 0.0

    def now(self) -> float:
        return time.monotonic() - self._origin + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += max(0.0, seconds)


@dataclass
class Incumbent:
    values: dict[str, Any]
    techniques: list[str]
    candidate: Candidate
    throughput: float | None      # mean per-boot throughput of its measured boots (screening scale)


@dataclass(frozen=True)
class StudyOutcome:
    status: StudyStatus
    incumbent: Candidate
    decisions: int
    boots: int
    run_dir: str


class Study:
    """Runs one study from a finished ``Preflight``. ``run()`` returns when it finished, stopped or ran out."""

    def __init__(self, pre: Preflight, *, view: StudyView | None = None, interrupts: Interrupts | None = None,
                 with_plots: bool = True) -> None:
        self.pre = pre
        self.settings = pre.settings
        self.space = pre.space
        self.view = view or StudyView(live=False)
        self.interrupts = interrupts or Interrupts()
        self.with_plots = with_plots
        self.clock = StudyClock()
        self.budget = Budget(self.settings.budget_s, clock=self.clock.now)
        self.name = self.settings.study_name
        self.store = StudyStore(self.settings.run_dir, name=self.name, heartbeat_interval=10, grace_period=30)
        self.store.check_fingerprint(pre.fingerprint)
        previous = self.store.read_study()
        self.started_at = previous.started_at if previous else time.time()
        self.resumed = previous is not None
        self.reconcile = self.store.reconcile()
        self.context_target = self.space.guardrails.min_context_tokens or self.space.model.context_target
        probe = self.space.probes
        ctx = BootContext(runtime=pre.runtime, gpu=pre.gpu, store=self.store, study=self.name,
                          fingerprint=pre.fingerprint, workload=pre.workload, burst=pre.burst,
                          prompts=PromptSynth(pre.workload.block_size), context_target=self.context_target,
                          probe_budget=self._probe_budget(probe.probe_timeout_s, probe.hang_s,
                                                          probe.headroom_floor_mib),
                          warmup_passes=self.settings.warmup_passes, measured_passes=self.settings.measured_passes,
                          seed=self.settings.seed,
                          quality=QualityGate() if self.space.guardrails.quality_gate else None)
        self.booter = CandidateBooter(ctx, on_boot=self._on_boot, before_boot=self._before_boot)
        self.baseline = self.space.baseline()
        self.incumbent = Incumbent(self.space.baseline_values(), [], self.baseline, None)
        self.noise: NoiseReport | None = None
        self.policy: GatePolicy | None = None
        # About half the screened techniques end at their screening boot (crash, OOM, ignored flag) and never
        # reach the gate; the search adds a few promotions. The online level is spread over that many tests.
        screenable = sum(t.screen for t in self.space.techniques)
        self.fdr = OnlineFalseKeepControl(expected_tests=max(4, screenable // 2 + 2))
        self.decision_number = 0
        self.phases: list[PhaseSpan] = []
        self.boot_seconds: list[float] = []
        self.memory = MemoryModel(numeric=tuple(p.flag for p in self.space.parameters if p.flag and p.is_numeric))
        self.memory_errors: list[float] = []
        self.notes: list[str] = []
        self.skipped_by_model = 0
        self.status = StudyStatus.RUNNING

    # ---- the night -----------------------------------------------------------------------------------

    def run(self) -> StudyOutcome:
        if self.resumed:
            log.info("resuming study %s in %s: %d finished boots will be reused", self.name,
                     self.store.run_dir, len(self.booter.reused_tags))
        self.view.update(study=self.name, phase="preflight", time_left_s=self.budget.left_s)
        for line in self.pre.lines():
            log.info("preflight: %s", line)
        try:
            with self.interrupts:
                self._phase("baseline", self._baseline)
                self._phase("screening", self._screening)
                self._phase("search", self._search)
                self._phase("confirmation", self._confirmation)
            self.status = StudyStatus.FINISHED
        except StopStudy as stop:
            log.warning("study stopped: %s", stop)
            self.status = StudyStatus.INTERRUPTED if stop.interrupted else StudyStatus.FINISHED
            self.notes.append(f"stopped early: {stop}")
        except KeyboardInterrupt:
            self.status = StudyStatus.INTERRUPTED
            self._write(final=True)
            raise
        except StudyError:
            self.status = StudyStatus.FAILED
            self._write(final=True)
            raise
        finally:
            self.budget.end()
        self._write(final=True)
        log.info("study %s %s: incumbent %s; %d decisions, %d boots; outputs in %s", self.name,
                 self.status.value, self.incumbent.candidate.label, self.decision_number, self.booter.boots,
                 self.store.run_dir)
        return StudyOutcome(self.status, self.incumbent.candidate, self.decision_number, self.booter.boots,
                            str(self.store.run_dir))

    def _phase(self, name: str, body: Any) -> None:
        self.budget.begin(name)
        span = PhaseSpan(name=name, started_at=time.time(), budget_s=self.budget.allowance(name))
        self.phases.append(span)
        self.view.update(phase=name, time_left_s=self.budget.left_s)
        before = self.booter.boots
        log.info("phase %s: %.0f s allowed, %.0f s left in the study", name, span.budget_s or 0.0,
                 self.budget.left_s)
        try:
            body()
        except PhaseOver as over:
            log.warning("phase %s: %s; moving on", name, over)
            self.notes.append(f"{name}: {over}")
        finally:
            self.phases[-1] = replace(span, ended_at=time.time(), boots=self.booter.boots - before)
            self.budget.end()

    # ---- baseline ------------------------------------------------------------------------------------

    def _baseline(self) -> None:
        samples = []
        for i in range(self.settings.baseline_boots):
            result = self._boot(BootPlan(tag=f"baseline:{i}", candidate=self.baseline, phase=Phase.BASELINE,
                                         probes=i == 0))
            if result.sample.failed is not None:
                f = result.sample.failed
                raise StudyError(f"the baseline configuration fails on this setup: {f.kind.value}: {f.summary}",
                                 remedy=f"{f.remedy or 'fix the base flags of the search space'}; server log: "
                                        f"{self.store.run_dir / (result.record.log_path or '')}")
            if result.sample.quality_passed is False:
                raise StudyError("the baseline failed its own stress probes", remedy="read the boot's probes")
            samples.append(result.sample)
        try:
            self.noise = dimension(samples, context={"runtime": self.pre.fingerprint.describe()})
        except InsufficientData as exc:
            raise StudyError(f"the baseline boots cannot be dimensioned: {exc}",
                             remedy="give the study more passes per boot (pass_seconds) or a steadier machine") from exc
        measured = [_boot_mean(s.passes) for s in samples]
        self.incumbent.throughput = _geo([m for m in measured if m is not None])
        self.policy = self._policy(self.noise)
        for line in self.noise.summary_lines():
            log.info("noise: %s", line.removeprefix("- "))
        log.info("gate: looks at %s blocks per arm, noise floor %.1f%%, minimum effect %.1f%%",
                 list(self.policy.looks), 100 * self.policy.noise_floor, 100 * self.policy.min_effect)
        self._write()

    def _policy(self, noise: NoiseReport) -> GatePolicy:
        g = self.space.guardrails
        # With a context target the pool is checked against it on every first boot; a pool that shrinks but still
        # holds the target is no reason to reject a faster configuration (memory techniques must still grow it).
        kv_ratio = None if self.context_target else GuardrailPolicy().kv_pool_min_ratio
        guards = GuardrailPolicy(ttft_p50_margin=1.0 + g.ttft_p50_margin if g.ttft_p50_margin is not None else None,
                                 ttft_p99_margin=1.0 + g.ttft_p99_margin if g.ttft_p99_margin is not None else None,
                                 kv_pool_min_ratio=kv_ratio, require_quality=g.quality_gate)
        looks = self.settings.looks or self._looks()
        return GatePolicy.from_dimensioning(noise, looks=looks, guardrails=guards,
                                            measured_passes=self.settings.measured_passes,
                                            warmup_passes=self.settings.warmup_passes, replicates=4000,
                                            max_error_fraction=max(0.005, g.max_error_rate))

    def _looks(self) -> tuple[int, ...]:
        """Blocks per arm at each look, sized so the A/Bs of the techniques fit the screening allowance."""
        boot_s = self._boot_s()
        screenable: list[Technique | None] = [t for t in self.space.techniques if t.screen] or [None]
        per_technique = self.budget.shares["screening"] * self.budget.total_s / len(screenable) / boot_s
        # About half the techniques end at their screening boot; the rest stop at the first or second look. The cap
        # is at least 6 blocks: with fewer boots a real +20% cannot pass the night's false-keep control.
        cap = int(max(6, min(12, per_technique)))
        looks = sorted({max(2, round(cap / 3)), max(3, round(2 * cap / 3)), max(4, cap)})
        return tuple(looks)

    # ---- screening ----------------------------------------------------------------------------------

    def _screening(self) -> None:
        here = str(self.store.run_dir)     # this study's own entries (a resumed study) are replayed, not skipped
        rejected = {name: e for name, e in self.store.ledger.rejected_for(self.pre.fingerprint).items()
                    if e.evidence.run_dir != here}
        for name, (entry, changes) in self.store.ledger.reopened_for(self.pre.fingerprint).items():
            if any(t.name == name for t in self.space.techniques):
                log.info("technique %s was rejected on another setup (%s); the setup changed (%s): screening it again",
                         name, entry.reason, "; ".join(changes) or "fingerprint")
        todo: list[tuple[int, Technique]] = []
        for index, technique in enumerate(self.space.techniques):     # what costs no boot is decided first
            if not technique.screen:
                log.info("technique %s is not screened automatically: %s", technique.name,
                         technique.rationale.strip())
                self.notes.append(f"{technique.name}: not screened automatically ({technique.rationale.strip()})")
            elif technique.name in rejected:
                note = self.store.ledger.skip_note(rejected[technique.name])
                log.info("technique %s skipped: %s", technique.name, note)
                self._decide(DecisionRecord(study=self.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                            flags_delta=dict(technique.flags), env_delta=dict(technique.env),
                                            skipped=note, decided_at=time.time()))
            else:
                todo.append((index, technique))
        for index, technique in todo:
            self._stop_if_requested()
            if self.budget.allowance("screening") < 2 * self._boot_s():
                log.warning("screening out of time: %s and later techniques were not tried", technique.name)
                self.notes.append(f"screening ran out of time before {technique.name}")
                break
            self._screen(index, technique)

    def _screen(self, index: int, technique: Technique) -> None:
        base: dict[str, Any] = dict(flags_delta=dict(technique.flags), env_delta=dict(technique.env),
                    incumbent_key=self.incumbent.candidate.key())
        try:
            candidate = self.space.candidate(self.incumbent.values, [*self.incumbent.techniques, technique.name],
                                             label=technique.name)
        except (RuleViolation, DerivationError) as exc:
            failure = Failure(FailureKind.BAD_FLAG, f"refused by the space's rules: {exc.message}",
                              "change the technique or the rule in the search space", phase="plan")
            self._decide(DecisionRecord(study=self.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        failure=failure, decided_at=time.time(), **base))
            return
        base["candidate_key"] = candidate.key()
        attempts, result = 0, None
        tag = f"screening:{technique.name}"
        while attempts < 3:
            attempts += 1
            result = self._boot(BootPlan(tag=f"{tag}:probe{attempts}", candidate=candidate, phase=Phase.SCREENING,
                                         arm=Arm.CANDIDATE, technique=technique.name, probes=True))
            failed = result.sample.failed
            if failed is None or failed.kind not in _RETRIED:
                break
        assert result is not None
        boots: tuple[str, ...] = (result.record.boot_id,)
        if result.sample.failed is not None:
            self._decide(DecisionRecord(study=self.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        failure=_named(result.sample.failed), attempts=attempts, boots_candidate=boots,
                                        decided_at=time.time(), **base))
            return
        report = result.record.report
        ignored = tuple(a for a in (report.adjustments if report else ())
                        if a.flag in technique.flags or a.flag in _derived_of(technique))
        if ignored:
            self._decide(DecisionRecord(study=self.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        ignored=ignored, boots_candidate=boots, decided_at=time.time(), **base))
            return
        immediate = self._immediate_reject(result)
        if immediate is not None and immediate.extra.get("z") is not None:
            # A single slow boot may be the host, not the technique: a second boot must be as slow.
            again = self._boot(BootPlan(tag=f"{tag}:recheck", candidate=candidate, phase=Phase.SCREENING,
                                        arm=Arm.CANDIDATE, technique=technique.name))
            boots += (again.record.boot_id,)
            second = self._immediate_reject(again) if again.sample.failed is None else None
            immediate = second if second is not None and second.extra.get("z") is not None else None
            if immediate is not None:
                immediate = replace(immediate, boots_candidate=2, reason=immediate.reason.replace(
                    "on its screening boot", "on two screening boots (the second shown)"))
        if immediate is not None:
            self._decide(DecisionRecord(study=self.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        verdict=immediate, result=immediate.reason, boots_candidate=boots,
                                        decided_at=time.time(), **base))
            return
        kind = technique.kind.value if technique.kind.value in ("speed", "memory") else "speed"
        ab, ids = self._ab(candidate, tag=tag, phase=Phase.SCREENING, technique=technique.name, kind=kind,
                           seed=index)
        verdict = self.fdr.review(ab.verdict)
        decision = DecisionRecord(study=self.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                  verdict=verdict, ab_result=ab.to_dict(), decided_at=time.time(),
                                  boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                                  boots_candidate=boots + tuple(ids[Arm.CANDIDATE]), **base)
        self._decide(decision)
        if decision.kept is Kept.YES:
            self.incumbent = Incumbent(dict(self.incumbent.values), [*self.incumbent.techniques, technique.name],
                                       candidate, _arm_mean(ab, Arm.CANDIDATE) or self.incumbent.throughput)

    def _immediate_reject(self, result: BootResult) -> Verdict | None:
        """A quality regression or a pool below the context target: rejected without an A/B."""
        reason = ""
        if result.sample.quality_passed is False:
            detail = next((p.detail for p in result.record.probes if not p.passed), "")
            reason = f"answers regressed against the baseline: {detail}" if detail else "failed the quality gate"
        kv = result.sample.kv_pool_tokens
        if not reason and self.context_target and kv is not None and kv < self.context_target:
            reason = f"context drops to {kv:,} tokens, below the {self.context_target:,}-token target"
        tput, incumbent = result.record.throughput_tok_s, self.incumbent.throughput
        z: float | None = None
        if not reason and tput and incumbent and self.noise is not None:
            # One boot against the incumbent's mean: a drop beyond 3 σ_boot (one-sided p ≈ 0.001) needs no A/B.
            sigma = self.noise.sigma_boot * math.sqrt(1.0 + 1.0 / max(1, self.noise.boots))
            z = math.log(tput / incumbent) / sigma if sigma > 0 else 0.0
            if z < -3.0:
                reason = (f"{tput / incumbent - 1:+.0%} on its screening boot ({tput:,.1f} vs {incumbent:,.1f} tok/s), "
                          f"{-z:.1f} σ below the incumbent's boot-to-boot noise")
            else:
                z = None
        if not reason:
            return None
        return Verdict(decision=Decision.REJECT, reason=reason, effect=None, ci_low=None, ci_high=None, p_value=None,
                       boots_incumbent=0, boots_candidate=1, extra={"z": z} if z is not None else {})

    def _ab(self, candidate: Candidate, *, tag: str, phase: Phase, technique: str | None, kind: str = "speed",
            seed: int = 0, trial: int | None = None, incumbent: Candidate | None = None
            ) -> tuple[ABResult, dict[Arm, list[str]]]:
        assert self.policy is not None
        sampler = ABSampler(self.booter, incumbent=incumbent or self.incumbent.candidate, candidate=candidate,
                            phase=phase, tag=f"{tag}:ab", technique=technique, trial_number=trial)
        policy = self.policy if kind == "speed" else replace(self.policy, kind=kind)
        result = run_ab(sampler, policy, rng_seed=self.settings.seed * 7919 + seed,
                        context={"fingerprint": self.pre.fingerprint.key(), "runtime": self.pre.runtime_name})
        log.info("A/B %s: %s — %s", technique or candidate.label, result.verdict.decision.value, result.verdict.reason)
        return result, sampler.boot_ids

    # ---- numeric search -----------------------------------------------------------------------------

    def _search(self) -> None:
        if not self.space.parameters:
            return
        self.memory.add_boots(self.store.load().boots)
        search = NumericSearch(self.space, self.store, study_name=self.name, seed=self.settings.seed,
                               techniques=self.incumbent.techniques)
        search.enqueue(self.incumbent.values)
        measured: dict[str, list[float] | None] = {}
        sigma = self.noise.sigma_boot if self.noise else 0.1
        while search.trials_done() < self.settings.max_trials:
            self._stop_if_requested()
            if self.budget.allowance("search") < self._boot_s():
                log.info("search: allowance spent after %d trials", search.trials_done())
                break
            proposal = search.ask()
            number = proposal.trial.number
            if proposal.candidate is None:
                log.info("trial %d refused by a coherence rule (no boot): %s", number, proposal.refused)
                search.tell(proposal, None, constraint=1.0)
                continue
            candidate = replace(proposal.candidate, label=f"trial-{number}")
            key = proposal_key(proposal.values)
            if key in measured:
                values = measured[key]
                search.tell(proposal, values, constraint=0.0 if values else 1.0)
                continue
            prediction = self.memory.predict(candidate.flags)
            if prediction.misses(self.context_target):
                self.skipped_by_model += 1
                log.info("trial %d skipped without a boot: predicted KV pool %s < target %s (model error %.1f%%)",
                         number, f"{prediction.kv_tokens:,.0f}", f"{self.context_target:,}",
                         100 * (prediction.relative_error or 0.0))
                gap = (self.context_target or 0) - (prediction.kv_tokens or 0)
                search.tell(proposal, None, constraint=max(1e-3, gap / max(1, self.context_target or 1)))
                continue
            result = self._boot(BootPlan(tag=f"search:{number}", candidate=candidate, phase=Phase.SEARCH,
                                         arm=Arm.CANDIDATE, trial_number=number, probes=True,
                                         technique=None))
            report = result.record.report
            if report and report.max_total_num_tokens:
                if prediction.kv_tokens is not None:
                    self.memory_errors.append(abs(prediction.kv_tokens - report.max_total_num_tokens)
                                              / report.max_total_num_tokens)
                self.memory.add(Observation(candidate.flags, report.max_total_num_tokens,
                                            report.max_running_requests))
            values, constraint, failure = self._trial_values(result)
            measured[key] = values
            search.tell(proposal, values, constraint=constraint, failure=failure,
                        boot_ids=(result.record.boot_id,))
            tput = result.record.throughput_tok_s
            if (values and tput and self.incumbent.throughput
                    and math.log(tput / self.incumbent.throughput) > sigma
                    and self.budget.allowance("search") > self._first_look_boots() * self._boot_s()):
                self._promote(candidate, proposal.values, number)

    def _first_look_boots(self) -> int:
        return 2 * (self.policy.looks[0] if self.policy else 4)

    def _trial_values(self, result: BootResult) -> tuple[list[float] | None, float, Failure | None]:
        sample, record = result.sample, result.record
        if sample.failed is not None:
            return None, 1.0, sample.failed
        if sample.quality_passed is False:
            return None, 1.0, None
        kv = sample.kv_pool_tokens
        if self.context_target and kv is not None and kv < self.context_target:
            return None, (self.context_target - kv) / self.context_target, None
        if record.throughput_tok_s is None:
            return None, 1.0, None
        values = []
        for objective in self.space.objectives or ():
            metric = objective.metric
            if metric.startswith("ttft"):
                ttft = record.ttft_p50_s()
                values.append(ttft if ttft is not None else 1e9)
            elif metric in ("kv_pool_tokens", "max_total_num_tokens"):
                values.append(float(kv or 0))
            else:
                values.append(record.throughput_tok_s)
        return values or [record.throughput_tok_s], 0.0, None

    def _promote(self, candidate: Candidate, values: Mapping[str, Any], number: int) -> None:
        log.info("trial %d beats the incumbent by more than the boot noise: confirming through the A/B gate", number)
        ab, ids = self._ab(candidate, tag=f"search:{number}", phase=Phase.SEARCH, technique=candidate.label,
                           seed=1000 + number, trial=number)
        # Not in the night's false-keep family: a search keep is a step of the search, and the final incumbent
        # must still beat the original baseline on fresh boots in the confirmation A/B before it is recommended.
        verdict = ab.verdict
        changed = {k: v for k, v in candidate.flags.items() if self.incumbent.candidate.flags.get(k) != v}
        decision = DecisionRecord(study=self.name, number=0, phase=Phase.SEARCH, technique=f"search trial {number}",
                                  flags_delta=changed, incumbent_key=self.incumbent.candidate.key(),
                                  candidate_key=candidate.key(), verdict=verdict, ab_result=ab.to_dict(),
                                  boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                                  boots_candidate=tuple(ids[Arm.CANDIDATE]), decided_at=time.time())
        self._decide(decision, trials=(number,))
        if decision.kept is Kept.YES:
            self.incumbent = Incumbent(dict(values), list(self.incumbent.techniques), candidate,
                                       _arm_mean(ab, Arm.CANDIDATE) or self.incumbent.throughput)

    # ---- confirmation -------------------------------------------------------------------------------

    def _confirmation(self) -> None:
        final = self.incumbent.candidate
        if final.key() == self.baseline.key():
            log.info("confirmation: nothing beat the baseline; the baseline stays")
            self.notes.append("no candidate beat the baseline: the baseline is the recommendation")
        elif self.budget.allowance("confirmation") >= self._first_look_boots() * self._boot_s():
            ab, ids = self._ab(final, tag="confirmation", phase=Phase.CONFIRMATION, technique="confirmation",
                          incumbent=self.baseline, seed=99)
            self._decide(DecisionRecord(study=self.name, number=0, phase=Phase.CONFIRMATION,
                                        technique="final vs baseline",
                                        flags_delta={k: v for k, v in final.flags.items()
                                                     if self.baseline.flags.get(k) != v},
                                        incumbent_key=self.baseline.key(), candidate_key=final.key(),
                                        verdict=ab.verdict, ab_result=ab.to_dict(), decided_at=time.time(),
                                        boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                                        boots_candidate=tuple(ids[Arm.CANDIDATE])))
        else:
            self.notes.append("confirmation skipped: the budget was spent")
            return
        soak_s = min(self.settings.soak_s, 0.03 * self.budget.total_s,
                     max(0.0, self.budget.allowance("confirmation") - self._boot_s()))
        if soak_s > 0:
            result = self._boot(BootPlan(tag="confirmation:soak", candidate=final, phase=Phase.CONFIRMATION,
                                         arm=Arm.CANDIDATE, probes=True, soak_s=soak_s))
            if result.sample.failed is not None:
                f = result.sample.failed
                self.notes.append(f"the winner failed its soak: {f.kind.value}: {f.summary}")
                log.warning("the final configuration failed the soak (%s): the baseline is recommended", f.summary)
                self.incumbent = Incumbent(self.space.baseline_values(), [], self.baseline, None)

    # ---- records and outputs --------------------------------------------------------------------------

    def _decide(self, decision: DecisionRecord, *, trials: Sequence[int] = ()) -> None:
        self.decision_number += 1
        decision = dataclasses.replace(decision, number=self.decision_number)
        self.store.record_decision(decision)
        self.store.ledger.record(decision, self.pre.fingerprint, run_dir=self.store.run_dir, trials=trials)
        line = f"{decision.technique}: {decision.kept.value} — {decision.result}"
        log.info("decision %d %s", decision.number, line)
        self.view.update(decisions=(*self.view.status.decisions, line), last_event=line)
        self._write()

    def _write(self, *, final: bool = False) -> None:
        noise = None
        if self.noise is not None:
            n = self.noise
            noise = StoredNoise(sigma_boot=n.sigma_boot, sigma_run=n.sigma_run, warmup_bias=n.first_pass_ratio - 1.0,
                                boots=n.boots, passes_per_boot=float(n.passes_per_boot), mde=n.mde_at_cap)
        extra = {"settings": self.settings.to_dict(), "notes": list(self.notes),
                 "budget": {"total_s": self.budget.total_s, "spent": dict(self.budget.spent),
                            "left_s": self.budget.left_s},
                 "memory_model": {"boots": len(self.memory.observations), "loo_error": self.memory.error(),
                                  "prediction_errors": list(self.memory_errors),
                                  "skipped_candidates": self.skipped_by_model},
                 "policy": self.policy.to_dict() if self.policy else None,
                 "reconcile": dataclasses.asdict(self.reconcile), "space_digest": self.space.digest}
        record = StudyRecord(name=self.name, fingerprint=self.pre.fingerprint, started_at=self.started_at,
                             updated_at=time.time(), baseline=self.baseline, incumbent=self.incumbent.candidate,
                             budget_s=self.budget.total_s, status=self.status, phases=tuple(self.phases),
                             noise=noise, traffic=self.settings.traffic, context_target=self.context_target,
                             image=self.settings.image, note="; ".join(self.notes), extra=extra)
        self.store.write_study(record)
        from elsa_tune.reports.build import write_outputs  # matplotlib: only when rendering

        write_outputs(self.store.run_dir, with_plots=final and self.with_plots)

    # ---- helpers ------------------------------------------------------------------------------------

    def _boot(self, plan: BootPlan) -> BootResult:
        return self.booter.boot(plan)

    def _before_boot(self, plan: BootPlan) -> None:
        self._stop_if_requested()
        self.view.update(candidate=plan.candidate.label or plan.tag, time_left_s=self.budget.left_s)

    def _on_boot(self, result: BootResult) -> None:
        if result.reused:
            self.clock.advance(result.record.seconds)
        self.boot_seconds.append(result.record.seconds)
        best = self.incumbent.throughput
        self.view.update(boots=self.booter.boots, failed_boots=self.booter.failed, best=self.incumbent.candidate.label,
                         best_throughput=best, time_left_s=self.budget.left_s)

    def _stop_if_requested(self) -> None:
        if self.interrupts.requested:
            raise StopStudy("interrupted: the last boot was recorded", interrupted=True)
        if self.budget.expired():
            raise StopStudy(f"the {self.budget.total_s / 60:.0f}-minute budget is spent", interrupted=False)
        phase = self.budget.phase
        if phase is not None and phase != "baseline" and self.budget.allowance(phase) <= 0:
            raise PhaseOver("its time allowance is spent (an unfinished comparison keeps the incumbent)")

    def _boot_s(self) -> float:
        good = [s for s in self.boot_seconds if s > 0]
        return statistics.median(good) if good else 60.0

    @staticmethod
    def _probe_budget(timeout_s: float, hang_s: float, floor_mib: int) -> ProbeBudget:
        return ProbeBudget(deadline_s=timeout_s, request_timeout_s=min(timeout_s, 300.0), hang_s=hang_s,
                           headroom_floor_bytes=floor_mib * 2**20)


def _named(failure: Failure) -> Failure:
    """An unclassified crash is named by its own last evidence line (``RuntimeError: … requires SM100``)."""
    if failure.kind is FailureKind.UNKNOWN_CRASH and failure.evidence:
        return replace(failure, summary=failure.evidence[-1].strip()[:200])
    return failure


def _derived_of(technique: Technique) -> set[str]:
    """Flags a technique changes indirectly (steps → draft tokens): their adjustments count against it too."""
    return {"speculative-num-draft-tokens"} if "speculative-num-steps" in technique.flags else set()


def _boot_mean(passes: Sequence[Any]) -> float | None:
    values = [p.output_throughput_tok_s for p in passes if not p.warmup]
    return statistics.fmean(values) if values else None


def _geo(values: Sequence[float]) -> float | None:
    good = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(statistics.fmean(math.log(v) for v in good)) if good else None


def _arm_mean(result: ABResult, arm: Arm) -> float | None:
    return _geo([m for m in (_boot_mean(s.passes) for s in result.samples if s.arm is arm and s.failed is None)
                 if m is not None])
