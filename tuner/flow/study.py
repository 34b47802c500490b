"""``Study``: one unattended night — baseline, technique screening, numeric search, confirmation, outputs.

The flow, under one ``Budget``:

- **baseline**: boot the baseline ``baseline_boots`` times (the first with the probes and the quality
  reference) and dimension the noise (``tuner/flow/baseline.py``, the step ``worker`` and ``compare`` share); the
  gate's policy follows from it and from the time left.
- **screening** (``tuner/flow/screening.py``): every technique the ledger has not rejected for this fingerprint is
  booted once with the probes; immediate rejects need no A/B; the rest go through the sequential A/B gate, under
  online false-keep control across the night; kept techniques stack into the incumbent.
- **search** (``tuner/search/phase.py``): a ``SearchBackend`` (``LocalSearch`` by default) around the incumbent;
  a candidate whose screening boot beats the incumbent by more than the boot noise goes through the A/B gate.
- **confirmation**: the final incumbent against the original baseline on fresh boots, then a soak.
- **outputs** (report, ``best/``, ledger, ``study.json``) after every decision.

The phases share one ``Night`` (``tuner/flow/night.py``): the incumbent, the booter, the gate's policy, the decisions.
Each phase's decisions for the night come back as a ``PhaseResult`` that the study applies (``Night.apply``), also
when the phase's allowance or the budget ends it.

A resumed study (same ``--out``) replays the same decisions: ``CandidateBooter`` reuses every boot whose tag
already has a record, so nothing finished is booted twice or lost, and the ledger gains nothing twice.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from elsa_tune.errors import HistoryError, StudyError
from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.reasons import effect_text, pool_text
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.history.study_record import (
    Confirmation,
    ConfirmationStatus,
    Extension,
    PhaseSpan,
    StudyRecord,
    StudyStatus,
)
from elsa_tune.history.verdict import Decision, Futility, PolicyKind
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.space import ReasonCategory, Technique, TechniqueKind
from elsa_tune.traffic.workload import closed_loop
from elsa_tune.tuner.ab.boot_sample import PassMeasurement
from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.flow.baseline import BaselineRequest, measure_baseline
from elsa_tune.tuner.flow.booter import BootPlan
from elsa_tune.tuner.flow.budget import SIMULATED_CLOCK, WALL_CLOCK, Budget, BudgetPhase
from elsa_tune.tuner.flow.load import ServerLoad
from elsa_tune.tuner.flow.night import Incumbent, Night, PhaseOver, PhaseResult, StopStudy, StudyClock
from elsa_tune.tuner.flow.preflight import Preflight
from elsa_tune.tuner.flow.screening import Screening
from elsa_tune.tuner.flow.signals import Interrupts
from elsa_tune.tuner.search.context import NightSearch
from elsa_tune.tuner.search.phase import LocalSearch, SearchBackend, undecided_moves

log = logging.getLogger(__name__)

#: A first pass this many times longer than planned is shortened (``Study._fit_pass``).
PASS_TOLERANCE = 2.0
#: baseline boots added when one of the first stands apart from the others (``dimensioning.outlier_boot``)
EXTRA_BASELINE_BOOTS = 2
#: A shortened pass still sends this many requests per client stream (the traffic's mix needs room to show).
MIN_REQUESTS_PER_STREAM = 2
#: A shortened pass keeps the traffic's prefix reuse: the share of its prompt tokens no earlier request had is at
#: most this many times the whole pass's (``Study._fit_pass``).
FRESH_PROMPT_TOLERANCE = 1.25

__all__ = ["Incumbent", "PhaseOver", "StopStudy", "Study", "StudyClock", "StudyOutcome"]


def _keeping_reuse(curve: Sequence[float], wanted: int) -> int:
    """The fewest of a pass's first requests, from ``wanted``, that keep its prefix reuse.

    ``curve`` is the pass's ``Workload.prefix_reuse_curve``. The first n requests keep it when the share of their
    prompt tokens no earlier request had is at most ``FRESH_PROMPT_TOLERANCE`` times the whole pass's; the whole
    pass's length when no fewer do. Traffic without reuse keeps ``wanted``.
    """
    whole = 1.0 - curve[-1]
    if not math.isfinite(whole):
        return wanted
    return next((n for n in range(wanted, len(curve)) if 1.0 - curve[n - 1] <= FRESH_PROMPT_TOLERANCE * whole),
                len(curve))


@dataclass(frozen=True)
class StudyOutcome:
    status: StudyStatus
    incumbent: Candidate
    decisions: int
    boots: int
    run_dir: str


class Study:
    """Runs one study from a finished ``Preflight``. ``run()`` returns when it finished, stopped or ran out.

    ``search`` runs the numeric search phase (``LocalSearch``, this process's GPU, unless given another backend).
    """

    def __init__(self, pre: Preflight, *, view: StudyView | None = None, interrupts: Interrupts | None = None,
                 with_plots: bool = True, search: SearchBackend | None = None, clock: StudyClock | None = None,
                 load: ServerLoad | None = None, outputs_each_decision: bool = True,
                 extension: Extension | None = None) -> None:
        """``extension``: this run continues a finished study with more budget (``elsa-tune --extend``); it is
        appended to the extensions ``study.json`` records."""
        self.pre = pre
        self.settings = pre.settings
        self.space = pre.space
        self.view = view or StudyView(live=False)
        self.interrupts = interrupts or Interrupts()
        self.with_plots = with_plots
        self.search = search or LocalSearch()
        self.clock = clock or StudyClock()
        self.virtual_time = clock is not None
        self.outputs_each_decision = outputs_each_decision
        self.budget = Budget(self.settings.budget_s, clock=self.clock.now,
                             counts=SIMULATED_CLOCK if self.virtual_time else WALL_CLOCK)
        self.name = self.settings.study_name
        self.store = StudyStore(self.settings.run_dir, name=self.name, heartbeat_interval=10, grace_period=30)
        self.store.check_fingerprint(pre.fingerprint)
        previous = self.store.read_study()
        self.started_at = previous.started_at if previous else time.time()
        self.resumed = previous is not None
        self.extensions: list[Extension] = list(previous.extensions) if previous else []
        if extension is not None:
            self.extensions.append(extension)
            log.info("extending study %s: budget %.0f s + %.0f s", self.name, extension.from_budget_s,
                     extension.added_s)
        self.reconcile = self.store.reconcile()
        self.night = Night(pre, store=self.store, budget=self.budget, clock=self.clock, view=self.view,
                           interrupts=self.interrupts, on_decision=self._write, load=load)
        self.phases: list[PhaseSpan] = []
        self.status = StudyStatus.RUNNING

    def _unix(self) -> float:
        """Now, in unix seconds: the wall clock, or the study's start plus its simulated seconds in virtual time."""
        return self.started_at + self.clock.now() if self.virtual_time else time.time()

    # ---- the night -----------------------------------------------------------------------------------

    def run(self) -> StudyOutcome:
        night = self.night
        if self.resumed:
            log.info("resuming study %s in %s: %d finished boots will be reused", self.name,
                     self.store.run_dir, len(night.booter.reused_tags))
        self.view.update(study=self.name, phase="preflight", time_left_s=self.budget.left_s)
        for line in self.pre.lines():
            log.info("preflight: %s", line)
        log.info("budget: %.0f s (%.1f h) counted in %s", self.budget.total_s, self.budget.total_s / 3600,
                 self.budget.counts)
        try:
            with self.interrupts:
                self._phase(BudgetPhase.BASELINE, self._baseline)
                self._phase(BudgetPhase.SCREENING, self._screening)
                self._phase(BudgetPhase.SEARCH, self._search)
                self._phase(BudgetPhase.CONFIRMATION, self._confirmation)
            self.status = StudyStatus.FINISHED
        except StopStudy as stop:
            log.warning("study stopped: %s", stop)
            self.status = StudyStatus.INTERRUPTED if stop.interrupted else StudyStatus.FINISHED
            night.apply(PhaseResult(notes=(f"stopped early: {stop}",)))
        except KeyboardInterrupt:
            self.status = StudyStatus.INTERRUPTED
            self._write_final()
            raise
        except OSError as exc:      # the run folder could not be written: the records so far stand, as after a kill
            if exc.errno not in STORAGE_ERRNOS:
                raise
            self.status = StudyStatus.INTERRUPTED
            raise unwritable(exc, self.store.run_dir) from exc
        except StudyError:
            self.status = StudyStatus.FAILED
            self._write_final()
            raise
        finally:
            self.budget.end()
        try:
            self._file_memory_in_winner()
        except OSError as exc:
            if exc.errno not in STORAGE_ERRNOS:
                raise
            raise unwritable(exc, self.store.run_dir) from exc
        self._write_final()
        boots = len(self.store.load().boots)    # the boot records the report counts, not this run's boot calls
        log.info("study %s %s: incumbent %s; %d decisions, %d boots; outputs in %s", self.name,
                 self.status.value, night.incumbent.candidate.label, night.decision_number, boots,
                 self.store.run_dir)
        return StudyOutcome(self.status, night.incumbent.candidate, night.decision_number, boots,
                            str(self.store.run_dir))

    def _phase(self, phase: BudgetPhase, body: Callable[[], object]) -> None:
        name = phase.value
        self.budget.begin(phase)
        span = PhaseSpan(name=name, started_at=self._unix(), budget_s=self.budget.allowance(phase))
        self.phases.append(span)
        self.view.update(phase=name, time_left_s=self.budget.left_s)
        before = self.night.booter.boots
        log.info("phase %s: %.0f s allowed, %.0f s left in the study", name, span.budget_s or 0.0,
                 self.budget.left_s)
        try:
            body()
        except PhaseOver as over:
            log.warning("phase %s: %s; moving on", name, over)
            self.night.apply(PhaseResult(notes=(f"{name}: {over}",)))
        finally:
            self.phases[-1] = replace(span, ended_at=self._unix(), boots=self.night.booter.boots - before)
            self.budget.end()

    # ---- baseline ------------------------------------------------------------------------------------

    def _baseline(self) -> None:
        night = self.night
        baseline = measure_baseline(night.boot, BaselineRequest(
            candidate=night.baseline, boots=self.settings.baseline_boots, tag="baseline", phase=Phase.BASELINE,
            what="the baseline configuration", where="on this setup", runner="the study",
            remedy="fix the base flags of the search space", extra_boots=EXTRA_BASELINE_BOOTS,
            noise_context={"runtime": self.pre.fingerprint.describe()}), run_dir=self.store.run_dir,
            fit_pass=self._fit_pass)
        noise = baseline.noise
        policy = baseline.policy(self.space, self.settings, looks=self.settings.looks or self._looks(),
                                 context_target=night.context_target)
        night.apply(PhaseResult(noise=noise, policy=policy,
                                incumbent=replace(night.incumbent, throughput=baseline.throughput)))
        for line in noise.summary_lines():
            log.info("noise: %s", line.removeprefix("- "))
        log.info("gate: looks at %s blocks per arm, noise floor %.1f%%, minimum effect %.1f%%",
                 list(policy.looks), 100 * policy.noise_floor, 100 * policy.min_effect)
        self._write()

    def _fit_pass(self, passes: Sequence[PassMeasurement]) -> bool:
        """Shorten the measured pass when the first baseline boot's passes ran far longer than planned.

        The pass is sized before anything was measured, from a guess of a stream's speed; a slow card or model can
        make it many times longer, and a night of such passes has too few boots to decide anything. Only where a
        pass's duration is in the seconds the budget counts in (a GPU's wall clock, a simulated runtime's simulated
        seconds). The shortened pass is the whole pass's first requests, never so few that they lose the traffic's
        prefix reuse (``_keeping_reuse``): on traffic that reuses prefixes, the first requests of its sessions are
        cold, and a pass of only those measures a prefill-bound server the traffic never meets (its TTFT, and what
        a flag does to it, with it). Returns whether it changed.
        """
        settings, night = self.settings, self.night
        durations = [p.duration_s for p in passes if not p.warmup and p.duration_s]
        if not durations:
            return False
        took, target = statistics.median(durations), settings.pass_s
        current = len(self.pre.workload)
        if took <= PASS_TOLERANCE * target:
            return False
        wanted = max(MIN_REQUESTS_PER_STREAM * self.pre.concurrency, math.floor(current * target / took))
        if wanted >= current:
            return False
        curve = self.pre.workload.prefix_reuse_curve()
        kept = _keeping_reuse(curve, wanted)
        reuse = (f" (the first {kept} have {curve[kept - 1]:.0%} of their prompt tokens reusable from earlier ones, "
                 f"all {current} {curve[-1]:.0%})" if kept > wanted else "")
        if kept >= current:
            note = (f"the measured pass took {took:.0f} s, not the planned {target:.0f} s, but it keeps its {current} "
                    f"requests: the first {wanted} have {curve[wanted - 1]:.0%} of their prompt tokens reusable from "
                    f"earlier ones, all {current} {curve[-1]:.0%} (a shorter pass would measure cold prefills the "
                    "traffic does not have)")
            log.info("baseline: %s", note)
            night.apply(PhaseResult(notes=(note,)))
            return False
        workload = closed_loop(self.pre.trace, concurrency=self.pre.concurrency, n_requests=kept)
        night.use_workload(workload)
        note = (f"the measured pass took {took:.0f} s, not the planned {target:.0f} s: shortened from {current} to "
                f"{kept} requests{reuse}")
        log.info("baseline: %s", note)
        night.apply(PhaseResult(notes=(note,)))
        return True

    def _looks(self) -> tuple[int, ...]:
        """Blocks per arm at each look, sized so the A/Bs of the techniques fit the screening allowance."""
        boot_s = self.night.boot_s()
        screenable: list[Technique | None] = [t for t in self.space.techniques if t.screen] or [None]
        per_technique = self.budget.shares[BudgetPhase.SCREENING] * self.budget.total_s / len(screenable) / boot_s
        # About half the techniques end at their screening boot; the rest stop at the first or second look. The cap
        # is at least 6 blocks: with fewer boots a real +20% cannot pass the night's false-keep control.
        cap = int(max(6, min(12, per_technique)))
        looks = sorted({max(2, round(cap / 3)), max(3, round(2 * cap / 3)), max(4, cap)})
        return tuple(looks)

    # ---- screening ----------------------------------------------------------------------------------

    def _screening(self) -> None:
        screening = Screening(self.night)
        try:
            screening.run()
        finally:        # what it decided before its allowance or the budget ended it stands
            self.night.apply(screening.result())

    # ---- numeric search -----------------------------------------------------------------------------

    def _search(self) -> None:
        """The retests of promising techniques and the techniques screening had no time for, then the search."""
        screening = Screening(self.night)
        try:
            screening.retest(BudgetPhase.SEARCH)
            screening.continue_unscreened(BudgetPhase.SEARCH)
        finally:
            self.night.apply(screening.result())
        try:
            outcome = self.search.run(NightSearch(self.night))
            self.night.apply(PhaseResult(incumbent=outcome.incumbent))
        finally:        # also when its allowance ran out mid-A/B
            self._leave_moves()

    def _leave_moves(self) -> None:
        """While nothing beat the baseline, leave the search's undecided moves to the confirmation's time."""
        night = self.night
        if night.policy is not None and night.incumbent.candidate.key() == night.baseline.key():
            moves = undecided_moves(NightSearch(night).setup)
            if moves:
                night.apply(PhaseResult(open=replace(night.open, moves=moves)))

    # ---- confirmation -------------------------------------------------------------------------------

    def _confirmation(self) -> None:
        """The winner against the original baseline on fresh boots, then a soak.

        Only evidence of harm takes a winner back: a crash or failed probe, a failed quality gate, a guardrail
        confidently worse, or an interval wholly below the baseline's speed. An A/B that ends without a verdict
        (its cap, or the budget) leaves the winner recommended as *unconfirmed*, with what the boots showed. When
        nothing beat the baseline, the phase first runs the retests the search phase had no time for, then screens and
        tests what the search phase left unscreened (``Screening.continue_unscreened``), then decides the search's
        moves no A/B decided (``Screening.test_moves``), then continues the tests an early look stopped to save boots
        (``Screening.resume``).
        """
        night = self.night
        final, baseline = night.incumbent.candidate, night.baseline
        if final.key() == baseline.key() and night.open.tests():
            # Nothing to confirm: the phase's time goes to the retests the search had no time for (an A/B against
            # the incumbent, here the baseline, on fresh boots under the night's false-keep control), then to the
            # techniques the search phase had no time to screen or test, then to the search's moves no A/B decided
            # (an A/B cut short continues from its recorded boots), then to the tests an early look stopped to save
            # boots, continued to their cap; a keep is then confirmed like any winner, as far as the time left
            # allows.
            # until a retest keeps something
            self._confirmed(ConfirmationStatus.NOT_NEEDED, "nothing beat the baseline")
            screening = Screening(night)
            try:
                steps: tuple[Callable[[BudgetPhase], PhaseResult], ...] = (
                    screening.retest, partial(screening.continue_unscreened, share=1.0), screening.test_moves,
                    screening.resume, screening.extend)
                for step in steps:       # each while nothing beat the baseline
                    if night.incumbent.candidate.key() != baseline.key():
                        break
                    step(BudgetPhase.CONFIRMATION)
            finally:       # the budget may end with the retest: a keep is then a winner no A/B has confirmed yet
                night.apply(screening.result())
                if night.incumbent.candidate.key() != baseline.key():
                    self._confirmed(ConfirmationStatus.UNCONFIRMED,
                                    "kept by its retest against the baseline; not confirmed since")
            final = night.incumbent.candidate
        if final.key() == baseline.key():
            log.info("confirmation: nothing beat the baseline; the baseline stays")
            night.apply(PhaseResult(notes=("no candidate beat the baseline: the baseline is the recommendation",)))
            self._confirmed(ConfirmationStatus.NOT_NEEDED, "nothing beat the baseline")
            return
        if self.budget.allowance(BudgetPhase.CONFIRMATION) < night.first_look_boots() * night.boot_s():
            night.apply(PhaseResult(notes=(
                "confirmation skipped: the budget was spent; the winner is recommended unconfirmed",)))
            self._confirmed(ConfirmationStatus.UNCONFIRMED, "no time was left to confirm it against the baseline")
            return
        # until the A/B says more
        self._confirmed(ConfirmationStatus.UNCONFIRMED, "the budget ran out during the confirmation")
        if not self._probe_winner(final):
            return
        ab, ids = night.ab(final, tag="confirmation", phase=Phase.CONFIRMATION, technique="confirmation",
                           incumbent=baseline, seed=99, futility=Futility.NONE)
        decision = DecisionRecord(study=self.name, number=0, phase=Phase.CONFIRMATION,
                                  technique="final vs baseline",
                                  flags_delta={k: v for k, v in final.flags.items() if baseline.flags.get(k) != v},
                                  incumbent_key=baseline.key(), candidate_key=final.key(),
                                  verdict=ab.verdict, ab_result=ab.to_dict(), decided_at=self._unix(),
                                  boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                                  boots_candidate=tuple(ids[Arm.CANDIDATE]))
        night.decide(decision)
        verdict = ab.verdict
        if verdict.decision is Decision.REJECT:
            # evidence of harm on fresh boots (a crash, wrong answers, a guardrail confidently worse): the chain of
            # keeps that led to the winner does not survive, and the baseline is the safe recommendation
            self._recommend_baseline(f"the winner was rejected against the baseline on fresh boots "
                                     f"({decision.result})")
            self._confirmed(ConfirmationStatus.REJECTED, decision.result)
            return
        if verdict.decision is Decision.INCONCLUSIVE and verdict.ci_high is not None and verdict.ci_high < 1.0:
            self._recommend_baseline(f"the winner is slower than the baseline on fresh boots ({decision.result})")
            self._confirmed(ConfirmationStatus.REJECTED, decision.result)
            return
        if verdict.decision is Decision.KEEP:
            self._confirmed(ConfirmationStatus.CONFIRMED, decision.result)
        else:
            night.apply(PhaseResult(notes=(f"the winner is recommended unconfirmed: the confirmation showed no harm "
                                           f"but no demonstrated gain over the baseline ({decision.result})",)))
            self._confirmed(ConfirmationStatus.UNCONFIRMED, decision.result)
        soak_s = min(self.settings.soak_s, 0.03 * self.budget.total_s,
                     max(0.0, self.budget.allowance(BudgetPhase.CONFIRMATION) - night.boot_s()))
        if soak_s > 0:
            result = night.boot(BootPlan(tag="confirmation:soak", candidate=final, phase=Phase.CONFIRMATION,
                                         arm=Arm.CANDIDATE, probes=True, soak_s=soak_s))
            if result.sample.failed is not None:
                f = result.sample.failed
                self._recommend_baseline(f"the winner failed its soak: {f.kind.value}: {f.summary}")
                self._confirmed(ConfirmationStatus.REJECTED, f"the soak failed: {f.kind.value}: {f.summary}")

    def _confirmed(self, status: ConfirmationStatus, detail: str) -> None:
        self.night.apply(PhaseResult(confirmation=Confirmation(status, detail)))

    def _probe_winner(self, final: Candidate) -> bool:
        """The winner's stress probes and quality gate on this GPU, unless this study already ran them here.

        A winner found by another GPU's worker (``--gpu 0,1``), or one whose probed boot was before a resume, has
        no probed boot in this process: the confirmation A/B's quality guardrail needs one, and a configuration
        proven on one card must also survive worst-case load on the card it is confirmed on. ``False`` when it
        does not (the baseline is then recommended).
        """
        night = self.night
        if night.booter.quality.get(final.key()) is not None:
            return True
        result = night.boot(BootPlan(tag="confirmation:probe", candidate=final, phase=Phase.CONFIRMATION,
                                     arm=Arm.CANDIDATE, probes=True))
        failed, quality = result.sample.failed, result.sample.quality_passed
        if failed is None and quality is not False:
            return True
        why = f"{failed.kind.value}: {failed.summary}" if failed is not None else "its answers regressed"
        self._recommend_baseline(f"the winner failed its probes on the confirmation GPU ({why})")
        self._confirmed(ConfirmationStatus.REJECTED, f"its probes failed: {why}")
        return False

    def _recommend_baseline(self, why: str) -> None:
        """The winner did not survive the confirmation: say why, and recommend the baseline."""
        log.warning("%s: the baseline is recommended", why)
        self.night.apply(PhaseResult(notes=(f"{why}: the baseline is recommended",),
                                     incumbent=Incumbent(self.space.baseline_values(), [], self.night.baseline, None)))

    # ---- what the winner's memory techniques bought ----------------------------------------------------

    def _file_memory_in_winner(self) -> None:
        """File each memory technique of the recommendation as kept for memory, where its last decision did not.

        A memory technique that grew the pool without being kept alone is screened as one change with a technique
        that lacked memory; when that pair is kept, the memory technique is in the winner while its own decision
        reads "no gain". The closing decision (``memory_in_winner``) says what it bought. Recorded once: a resumed
        study finds it already filed.
        """
        night = self.night
        decisions = self.store.load().decisions
        for name in night.incumbent.techniques:
            technique = self.space.technique(name)
            if technique.kind is not TechniqueKind.MEMORY:
                continue
            decision = memory_in_winner(technique, decisions, study=self.name, decided_at=self._unix())
            if decision is not None:
                night.decide(decision)

    # ---- outputs ------------------------------------------------------------------------------------

    def _write_final(self) -> None:
        """The run's last ``_write``; a run folder that cannot be written is a ``HistoryError`` (``unwritable``)."""
        try:
            self._write(final=True)
        except OSError as exc:
            if exc.errno not in STORAGE_ERRNOS:
                raise
            raise unwritable(exc, self.store.run_dir) from exc

    def _write(self, *, final: bool = False) -> None:
        if not (final or self.outputs_each_decision):
            return
        night = self.night
        noise = night.noise.record() if night.noise is not None else None
        extra = {"budget": {"total_s": self.budget.total_s, "spent": dict(self.budget.spent),
                            "left_s": self.budget.left_s},
                 "memory_model": {"boots": len(night.memory.observations), "loo_error": night.memory.error(),
                                  "prediction_errors": list(night.memory.prediction_errors),
                                  "skipped_candidates": night.memory.skipped},
                 "policy": night.policy.to_dict() if night.policy else None,
                 "reconcile": dataclasses.asdict(self.reconcile)}
        record = StudyRecord(name=self.name, fingerprint=self.pre.fingerprint, started_at=self.started_at,
                             updated_at=self._unix(), baseline=night.baseline, incumbent=night.incumbent.candidate,
                             budget_s=self.budget.total_s, status=self.status, phases=tuple(self.phases),
                             noise=noise, traffic=self.settings.traffic, context_target=night.context_target,
                             image=self.settings.image, note="; ".join(night.notes), extra=extra,
                             budget_clock=self.budget.counts,
                             settings=self.settings.to_dict(), space_digest=self.space.digest,
                             notes=tuple(night.notes), confirmation=night.confirmation,
                             extensions=tuple(self.extensions))
        self.store.write_study(record)
        from elsa_tune.reports.build import write_outputs  # matplotlib: only when rendering

        write_outputs(self.store.run_dir, with_plots=final and self.with_plots)


#: The errors of a file system that cannot take the study's records (full, over quota, read-only, refused, failing);
#: any other ``OSError`` stays what it is.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                            errno.EFBIG})


def unwritable(exc: OSError, run_dir: Path) -> HistoryError:
    """The paragraph of a study whose run folder could not be written (a full disk, a folder made read-only): the
    records written before it stand, and the same command resumes from them."""
    where = exc.filename or run_dir
    return HistoryError(f"the study could not write {where}: {exc.strerror or exc}; it stopped, and the boots and "
                        f"decisions recorded in {run_dir} before it are kept",
                        remedy="free space on that file system (or make the run folder writable again), then rerun "
                               "the same command: the study resumes from its records")


def memory_in_winner(technique: Technique, decisions: Sequence[DecisionRecord], *, study: str,
                     decided_at: float) -> DecisionRecord | None:
    """The closing decision of a memory technique in the recommendation whose last decision was not a keep.

    Its verdict is the keep that brought it into the winner (the pair screened with it, whose decision's deltas
    carry all of ``technique``'s flags and variables), filed as a memory technique kept for memory, with the
    pools and margin of its own test; its sentence names the pair's keep, the pool it bought and its own speed.
    ``None`` when its last decision already filed it as kept, or no decision of it or keep carrying it is found.
    """
    own = [d for d in decisions if d.technique == technique.name and d.kept is not Kept.SKIPPED]
    if not own or own[-1].kept is Kept.YES or not (technique.flags or technique.env):
        return None
    alone = own[-1].verdict
    pair = next((d for d in reversed(decisions) if d.kept is Kept.YES and d.technique != technique.name
                 and d.verdict is not None
                 and all(d.flags_delta.get(k) == v for k, v in technique.flags.items())
                 and all(d.env_delta.get(k) == v for k, v in technique.env.items())), None)
    if pair is None or pair.verdict is None:
        return None
    pools = alone if alone is not None else pair.verdict
    verdict = replace(pair.verdict, kind=PolicyKind.MEMORY, category=ReasonCategory.KEPT_FOR_MEMORY,
                      kv_pool_incumbent=pools.kv_pool_incumbent, kv_pool_candidate=pools.kv_pool_candidate,
                      speed_margin=pools.speed_margin)
    bought = pool_text(verdict) or "pool not recorded"
    speed = f"; alone, speed {effect_text(alone)}" if alone is not None else ""
    return DecisionRecord(study=study, number=0, phase=Phase.SCREENING, technique=technique.name,
                          flags_delta=dict(technique.flags), env_delta=dict(technique.env),
                          incumbent_key=pair.incumbent_key, candidate_key=pair.candidate_key, verdict=verdict,
                          boots_incumbent=pair.boots_incumbent, boots_candidate=pair.boots_candidate,
                          decided_at=decided_at,
                          result=f"in the winner, kept with {pair.technique} as one change "
                                 f"({effect_text(pair.verdict)}): {bought}{speed}")
