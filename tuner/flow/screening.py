"""``Screening``: the techniques of the space, one at a time, against the incumbent.

Every technique the ledger has not rejected for this fingerprint is booted once with the probes and the
quality gate (an OOM or hang gets a second and third attempt). A crash, OOM, hang, quality regression, a pool
below the context target or an adjustment showing a technique flag was silently ignored or clamped rejects it
at once, with that reason; so does a memory technique whose KV pool is no larger than the incumbent's, and a
screening boot more than 3 σ slower than the incumbent, twice. Otherwise the sequential A/B gate decides
against the incumbent, under online false-keep control across the night (each A/B's efficacy boundaries are
calibrated at the level that control gives it, so the gate goes on booting rather than stopping on a crossing the
control would take back); kept techniques stack into the incumbent.

A technique the gate left INCONCLUSIVE although its interval shows it faster (too few boots for the night's
false-keep control, or an unresolved TTFT guardrail) is *promising*: ``retest`` tests it once more, with fresh
boots, as a new test under the night's false-keep control whose p-value combines both stages (the inverse normal
rule of ``multiplicity.py``, for the throughput and for each TTFT guardrail: the fresh boots need only add what
the first test lacked). The study runs the
retests at the start of the search phase, before the numeric search tunes around an incumbent that a kept
technique would change more than any flag value.

When nothing beat the baseline, the night's end goes to the tests it left open: ``resume`` continues, to its cap,
each test an early look stopped to save boots (futility stops are non-binding: the same test, its boots read back,
at its own level), and ``extend`` retests an inconclusive test whose estimate is a gain with a longer test than the
night's, as the second stage of the first.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from scipy import stats

from elsa_tune.errors import ConfigError
from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.reasons import pct, reason_from_verdict
from elsa_tune.history.records import Arm, BootRecord, Phase
from elsa_tune.history.verdict import Decision, Futility, PolicyKind, PoolFacts, Verdict
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import ReasonCategory, Technique, TechniqueKind
from elsa_tune.tuner.ab.boundaries import smallest_level
from elsa_tune.tuner.ab.multiplicity import second_stage_level, with_first_stage
from elsa_tune.tuner.flow.booter import BootPlan, BootResult
from elsa_tune.tuner.flow.budget import BudgetPhase
from elsa_tune.tuner.flow.night import (
    Incumbent,
    Night,
    OpenMove,
    OpenTest,
    OpenWork,
    PausedTest,
    PhaseOver,
    PhaseResult,
    QueuedTechnique,
    arm_mean,
)
from elsa_tune.tuner.search.phase import search_decision

log = logging.getLogger(__name__)

#: Failures worth a second and third attempt before they are the answer (an OOM can be a fluke; three are not).
_RETRIED = (FailureKind.OOM_UNDER_LOAD, FailureKind.HANG)
#: Decisions that say the technique lacked memory: worth one more try once a memory technique is kept.
_FOR_WANT_OF_MEMORY = (ReasonCategory.CONTEXT_DROP, ReasonCategory.OOM)
#: Promising techniques retested at most, the largest estimate first.
RETESTS = 2
#: a longer retest's blocks per arm are at most this many times the night's own (``Screening.extend``)
EXTEND_FACTOR = 3


def one_boot_test(ratio: float, sigma_boot: float, boots: int) -> tuple[float, tuple[float, float]]:
    """The one-sided p that one new boot reading ``ratio`` × the incumbent's mean is no faster, and its 90% interval.

    The incumbent's mean is over ``boots`` boots whose log throughput has standard deviation ``sigma_boot``
    (estimated from them): log(ratio) / (σ·√(1 + 1/n)) is Student's t with n − 1 degrees of freedom when the new
    boot's configuration is the incumbent's.
    """
    scale = sigma_boot * math.sqrt(1.0 + 1.0 / boots)
    t_stat = math.log(ratio) / scale
    half = float(stats.t.isf(0.05, df=boots - 1)) * scale
    return float(stats.t.sf(t_stat, df=boots - 1)), (math.exp(math.log(ratio) - half), math.exp(math.log(ratio) + half))


def one_boot_verdict(ratio: float, sigma_boot: float, boots: int, level: float, *, what: str, against: str,
                     among: int | None = None, held: str = "") -> Verdict:
    """The verdict of a one-boot test when no A/B fits in the night: ``one_boot_test`` of ``what`` (one boot reading
    ``ratio`` × ``against``'s mean over ``boots`` boots) at ``level``, its p multiplied by ``among`` when that boot
    was the best of so many moves; ``held``, when set, says why a passing test is still not a keep."""
    p_value, (ci_low, ci_high) = one_boot_test(ratio, sigma_boot, boots)
    p_selected = p_value if among is None else min(1.0, p_value * among)
    keep = p_selected <= level and not held
    p_text = f"p = {p_value:.2g}" + (f" × {among} moves booted = {p_selected:.2g}" if among is not None else "")
    return Verdict(
        decision=Decision.KEEP if keep else Decision.INCONCLUSIVE,
        reason=(f"no A/B fits in the night: {what} {pct(ratio)} against {against} {boots} boots, {p_text} at level "
                f"{level:.2g}" + (f"; its {held}" if held else " (TTFT guardrails not tested on one boot)")),
        effect=ratio, ci_low=ci_low, ci_high=ci_high, p_value=p_selected, boots_incumbent=boots, boots_candidate=1,
        category=ReasonCategory.KEPT if keep else ReasonCategory.NO_GAIN, final=True)


@dataclass(frozen=True)
class _Probed:
    """A technique that survived its probed screening boot, waiting for the A/B gate."""

    index: int
    technique: Technique
    candidate: Candidate
    boots: tuple[str, ...]
    first: Verdict | None
    after: str | None
    tag: str
    estimate: float | None        # its screening boot's throughput over the incumbent's
    with_: str | None = None      # a memory technique screened together with it (it lacked memory alone)


def _unresolved(verdict: Verdict, min_effect: float) -> bool:
    """An inconclusive test whose estimate is a gain and whose interval still reaches the minimum worthwhile one."""
    return (verdict.decision is Decision.INCONCLUSIVE and verdict.effect is not None and verdict.effect > 1.0
            and verdict.ci_high is not None and verdict.ci_high >= 1.0 + min_effect)


def _priority(probed: _Probed, *, memory_first: bool) -> tuple[int, float]:
    """The A/B order: memory techniques first while a technique waits for the memory they free (``memory_first``),
    after the speed techniques otherwise; within each group the largest screening estimate first."""
    memory = probed.technique.kind is TechniqueKind.MEMORY
    return (0 if memory is memory_first else 1, -(probed.estimate if probed.estimate is not None else 1.0))


class Screening:
    """The screening phase of one night: ``run()`` decides every technique it has time for.

    It starts from the work the night has open (``Night.open``) and keeps its own copy: every entry point returns
    what screening decided so far (``result``), which the study applies to the night (``Night.apply``), also when a
    phase's end or the budget cut it short. A keep is applied at once, as its decision is recorded: the next A/B
    runs against it and the outputs rewritten after the decision show it.
    """

    def __init__(self, night: Night) -> None:
        self.night = night
        work = night.open
        self._unscreened = list(work.unscreened)
        self._lacking = list(work.lacking)
        self._freeing = work.freeing
        self._promising = list(work.promising)
        self._paused = list(work.paused)
        self._unresolved = list(work.unresolved)
        self._moves = list(work.moves)
        self._notes: list[str] = []

    def result(self) -> PhaseResult:
        """What screening decided so far: the incumbent, the work it leaves open, its notes."""
        return PhaseResult(incumbent=self.night.incumbent, notes=tuple(self._notes), open=OpenWork(
            unscreened=tuple(self._unscreened), lacking=tuple(self._lacking), freeing=self._freeing,
            promising=tuple(self._promising), paused=tuple(self._paused), unresolved=tuple(self._unresolved),
            moves=tuple(self._moves)))

    def run(self) -> PhaseResult:
        night = self.night
        here = str(night.store.run_dir)     # this study's own entries (a resumed study) are replayed, not skipped
        rejected = {name: e for name, e in night.store.ledger.rejected_for(night.pre.fingerprint).items()
                    if e.evidence.run_dir != here}
        for name, entry in night.store.ledger.latest_for(night.pre.fingerprint).items():
            if (entry.rejected and name not in rejected and entry.evidence.run_dir != here
                    and any(t.name == name and t.screen for t in night.space.techniques)):
                note = f"{name}: tested again, its last test did not decide ({night.store.ledger.skip_note(entry)})"
                log.info("technique %s", note)
                self._notes.append(note)
        for name, (entry, changes) in night.store.ledger.reopened_for(night.pre.fingerprint).items():
            if any(t.name == name for t in night.space.techniques):
                log.info("technique %s was rejected on another setup (%s); the setup changed (%s): screening it again",
                         name, entry.reason, "; ".join(changes) or "fingerprint")
        todo: list[QueuedTechnique] = []
        for index, technique in enumerate(night.space.techniques):     # what costs no boot is decided first
            if not technique.screen:
                log.info("technique %s is not screened automatically: %s", technique.name,
                         technique.rationale.strip())
                self._notes.append(f"{technique.name}: not screened automatically ({technique.rationale.strip()})")
            elif technique.name in rejected:
                note = night.store.ledger.skip_note(rejected[technique.name])
                log.info("technique %s skipped: %s", technique.name, note)
                night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                            flags_delta=dict(technique.flags), env_delta=dict(technique.env),
                                            skipped=note, decided_at=time.time()))
            else:
                todo.append(QueuedTechnique(index, technique))
        self._screen_all(todo, BudgetPhase.SCREENING)
        return self.result()

    def continue_unscreened(self, phase: BudgetPhase, *, share: float = 0.5) -> PhaseResult:
        """Screen the techniques screening had no time for, in ``share`` of ``phase``'s allowance.

        Techniques change a configuration more than a flag value does, so the numeric search tunes around an
        incumbent that has had every technique tried; the list's order must not decide which are tried at all.
        A technique that lacked memory and has not yet been retried with more pool is retried here too. What the
        search phase has no time for is left open again; when nothing beat the baseline, the confirmation's time
        (``share`` 1) screens and tests it: a screened technique's recorded boot is read back, not booted again.
        """
        todo, self._unscreened = self._unscreened, []
        if not todo and not self._lacking:
            return self.result()
        log.info("screening continues in the %s phase: %d techniques were not reached, %d wait for more memory",
                 phase, len(todo), len(self._lacking))
        self._screen_all(todo, phase, share=share)
        return self.result()

    def _screen_all(self, todo: list[QueuedTechnique], phase: BudgetPhase, *, share: float = 1.0) -> None:
        """Screen ``todo`` while ``phase`` has time (``share`` of what it has now), in two stages.

        1. Every technique gets its probed screening boot: a crash, OOM, hang, silent ignore, quality regression,
           a pool below the context target, no memory gain or a boot far below the incumbent ends it there.
        2. The survivors go through the A/B gate by their screening boot's throughput against the incumbent, the
           most promising first: the list's order never decides which technique the time runs out on. Memory
           techniques go first while a technique waits for the memory they free (it lacked memory at its screening
           boot), after the speed techniques otherwise: a pool gain nothing needs yet buys no throughput, and its
           test's boots are better spent on a speed technique when the night is short or slow.

        A technique rejected for want of memory (context drop, OOM) is screened once more as soon as a memory
        technique's A/B ends: on the larger pool when it was kept, as one change together with it when it grew the
        pool without being kept (no gain shown, or slower on its own). What waits for that when time runs out waits
        in the open work (``OpenWork.lacking``, ``OpenWork.freeing``) and is retried where screening continues.
        """
        night = self.night
        floor = (1.0 - share) * night.budget.allowance(phase)
        survivors: list[_Probed] = []
        stage1 = list(todo)
        try:
            while stage1:
                index, technique = stage1[0].index, stage1[0].technique
                if not self._time(phase, floor, [q.technique for q in stage1] + [p.technique for p in survivors]):
                    if survivors and self._no_room_for_a_test():
                        self._short_test(survivors, phase)
                    return
                probed = self.probe(index, technique)
                stage1.pop(0)
                if isinstance(probed, _Probed):
                    survivors.append(probed)
                elif probed is not None and self._lacked_memory(probed, technique) \
                        and technique.name not in {q.technique.name for q in self._lacking}:
                    self._lacking.append(QueuedTechnique(index, technique))
            survivors.sort(key=partial(_priority, memory_first=bool(self._lacking or self._freeing)))
            if self._freeing:         # a pair waiting from an earlier phase: its partner is known already
                self._retry_lacking(phase, floor, share, with_=self._freeing)
            while survivors:
                # Borrowing another phase's time, an A/B starts only when all it can still take fits in the share.
                need = self._ab_left_s(survivors[0].tag) if share < 1.0 else 0.0
                if not self._time(phase, floor, [p.technique for p in survivors], need=need):
                    if self._no_room_for_a_test():
                        self._short_test(survivors, phase)
                    break
                decision = self.gate(survivors[0])
                probed = survivors.pop(0)
                if probed.technique.kind is not TechniqueKind.MEMORY or decision is None:
                    continue
                if decision.kept is Kept.YES:
                    self._retry_lacking(phase, floor, share, after=probed.technique.name)
                elif decision.category in (ReasonCategory.NO_GAIN, ReasonCategory.SLOWER):
                    # it grew the pool (a memory technique that did not is rejected at its screening boot); slower
                    # alone or not, the pair's own A/B judges what the two do together
                    self._freeing = self._freeing or probed.technique.name
                    self._retry_lacking(phase, floor, share, with_=probed.technique.name)
            if self._freeing:
                self._retry_lacking(phase, floor, share, with_=self._freeing)
        except PhaseOver:
            if survivors and self._no_room_for_a_test():
                self._short_test(survivors, phase)
            if phase == BudgetPhase.SCREENING:     # an unfinished comparison is screened again, from its start
                self._unscreened = sorted({(q.index, q.technique.name): q for q in
                                           [*stage1, *(QueuedTechnique(p.index, p.technique) for p in survivors)]
                                           }.values(), key=lambda q: q.index)
            raise

    def _retry_lacking(self, phase: BudgetPhase, floor: float, share: float, *, after: str | None = None,
                       with_: str | None = None) -> None:
        """Screen each technique that lacked memory once more: ``after`` a memory technique was kept (alone, on
        the larger pool) or ``with_`` one that grew the pool (the pair as one change). Each is retried once."""
        night = self.night
        while self._lacking:
            index, technique = self._lacking[0].index, self._lacking[0].technique
            if technique.name in night.incumbent.techniques:
                self._lacking.pop(0)
                continue
            need = self._ab_left_s(self._tag(technique, after=after, with_=with_)) if share < 1.0 else 0.0
            if not self._time(phase, floor, [technique], need=need, carry=False):
                return
            if with_ is not None:
                log.info("%s grew the pool without being kept: screening %s together with it", with_, technique.name)
            else:
                log.info("%s was kept: retrying %s on the larger pool", after, technique.name)
            self.screen(index, technique, after=after, with_=with_)   # a phase ending mid-A/B leaves it waiting
            self._lacking.pop(0)

    def _tag(self, technique: Technique, *, retest: bool = False, after: str | None = None,
             with_: str | None = None) -> str:
        """The boot tag prefix of one screening of ``technique`` (a rerun reads its recorded boots back by it)."""
        tag = f"screening:{technique.name}" + (":retest" if retest else "") + \
            (f":after-{after}" if after is not None else "") + (f":with-{with_}" if with_ is not None else "")
        if self.night.incumbent.techniques and not retest and after is None and with_ is None:
            tag += ":on-" + "+".join(self.night.incumbent.techniques)
        return tag

    def _ab_left_s(self, tag: str) -> float:
        """Seconds the A/B of the screening ``tag`` can still take: its cap in both arms less the boots it has."""
        night = self.night
        cap = 2 * (night.policy.looks[-1] if night.policy else 6)
        recorded = sum(1 for t in night.booter.reused_tags if t.startswith(f"{tag}:ab:"))
        return max(0, cap - recorded) * night.boot_s()

    def _time(self, phase: BudgetPhase, floor: float, left: list[Technique], *, need: float = 0.0,
              carry: bool = True) -> bool:
        """Whether ``phase`` has time for another screening boot (and ``need`` seconds of work); when not, say which
        techniques were left (``carry``: and leave them to be screened where screening continues)."""
        night = self.night
        night.check()
        if night.budget.allowance(phase) - floor >= max(2 * night.boot_s(), need):
            return True
        names = ", ".join(dict.fromkeys(t.name for t in left))
        log.warning("%s out of time: %s not tried", phase, names)
        if phase in (BudgetPhase.SCREENING, BudgetPhase.SEARCH) and carry:
            index = {t.name: i for i, t in enumerate(night.space.techniques)}
            self._unscreened = [QueuedTechnique(index[t.name], t) for t in dict((t.name, t) for t in left).values()]
            self._notes.append(f"screening ran out of time before {names}: continued in the search phase"
                               if phase == BudgetPhase.SCREENING else
                               f"{phase}: no time left to screen {names}: continued in the confirmation's time if "
                               "nothing beats the baseline")
        elif phase == BudgetPhase.SCREENING:
            self._notes.append(f"screening ran out of time before retrying {names} with more memory: "
                               f"retried in the search phase")
        else:
            self._notes.append(f"{phase}: no time left to screen {names}")
        return False

    def _no_room_for_a_test(self) -> bool:
        """Whether the night has no room left for one A/B to reach its cap: both arms' boots at the cap take
        longer than the study has left before the confirmation's share (a slow model, or a short night's end)."""
        night = self.night
        cap = 2 * (night.policy.looks[-1] if night.policy else 6)
        budget = night.budget
        before_confirmation = budget.left_s - budget.shares.get(BudgetPhase.CONFIRMATION, 0.0) * budget.total_s
        return cap * night.boot_s() > before_confirmation

    def _short_test(self, survivors: list[_Probed], phase: BudgetPhase) -> None:
        """Decide the most promising speed survivor from its screening boot, when no A/B can finish in the night.

        The test is the prediction test of one new boot against the incumbent's: the log ratio of the screening
        boot to the incumbent's mean, over σ_boot·√(1 + 1/n), read on Student's t with n − 1 degrees of freedom
        (n the baseline boots σ_boot came from), one-sided, at the level the night's false-keep control gives the
        next test. It spends a test of that control whatever it decides; a keep stacks into the incumbent. Only the
        first survivor is tested: the others' screening boots were on the incumbent as it was, and a keep changes
        it. A memory technique (a non-inferiority question) or a survivor without an estimate is not tested so.
        """
        night = self.night
        probed = next((p for p in survivors if p.technique.kind is not TechniqueKind.MEMORY
                       and p.estimate is not None and p.after is None and p.with_ is None and p.first is None), None)
        noise, policy = night.noise, night.policy
        if probed is None or probed.estimate is None or noise is None or policy is None or noise.boots < 3:
            return
        sigma, n = policy.sigma_boot, noise.boots
        if not sigma or sigma <= 0 or probed.estimate <= 0:
            return
        level = night.fdr_level()
        if level < smallest_level(policy.replicates):
            return
        verdict = night.fdr.review(one_boot_verdict(probed.estimate, sigma, n, level, what="its screening boot",
                                                    against="the incumbent's"))
        base = {**self._base(probed.technique, None), "candidate_key": probed.candidate.key()}
        decision = self._record(None, verdict=verdict, result=verdict.reason, boots_candidate=probed.boots, **base)
        survivors.remove(probed)
        log.info("%s: a one-boot test, the night has no room for an A/B: %s", probed.technique.name,
                 decision.kept.value)
        if decision.kept is Kept.YES:
            self._keep(probed.technique, None, probed.candidate, night.incumbent.throughput * probed.estimate
                       if night.incumbent.throughput else None)
        if phase == BudgetPhase.SCREENING:
            names = {p.technique.name for p in survivors}
            self._unscreened = [q for q in self._unscreened if q.technique.name in names]
        else:
            self._unscreened = [q for q in self._unscreened if q.technique.name != probed.technique.name]

    @staticmethod
    def _lacked_memory(decision: DecisionRecord, technique: Technique) -> bool:
        return decision.category in _FOR_WANT_OF_MEMORY and technique.kind is not TechniqueKind.MEMORY

    def retest(self, phase: BudgetPhase) -> PhaseResult:
        """Test each promising technique once more (fresh boots, a new test), if ``phase``'s allowance has room.

        A retest runs when its probed boot and the gate's first look in both arms fit in what ``phase`` has left:
        a technique whose interval already showed it faster is a better use of the time than the phase's own work,
        and an A/B the phase's end cuts short is INCONCLUSIVE, never a rejection. A technique first screened
        together with a memory technique is retested with it, or alone once that memory technique was kept. The
        ones there was no time for stay promising, for a later phase.
        """
        night = self.night
        assert night.policy is not None
        promising = sorted(self._promising, key=lambda test: -(test.verdict.effect or 0.0))
        self._promising = []
        for i, test in enumerate(promising[:RETESTS]):
            index, technique, first, with_ = test.index, test.technique, test.verdict, test.with_
            night.check()
            if technique.name in night.incumbent.techniques:
                continue
            if night.budget.allowance(phase) < (1 + night.first_look_boots()) * night.boot_s():
                note = f"no time to retest {technique.name} in the {phase} phase ({reason_from_verdict(first)})"
                log.warning("%s", note)
                self._notes.append(note)
                self._promising = promising[i:RETESTS]
                break
            log.info("retesting %s with fresh boots: the first test was inconclusive at %s", technique.name,
                     reason_from_verdict(first))
            partner = with_ if with_ not in night.incumbent.techniques else None
            self.screen(index, technique, first=first, with_=partner)
        for test in promising[RETESTS:]:
            self._notes.append(f"{test.technique.name} not retested (at most {RETESTS} retests a night): "
                               f"{reason_from_verdict(test.verdict)}")
        return self.result()

    def test_moves(self, phase: BudgetPhase) -> PhaseResult:
        """Decide the search's undecided moves (``OpenWork.moves``), best first, while nothing beat the baseline.

        Each gets the A/B the search phase had no time to finish (its recorded boots read back by tag), at the level
        the night's false-keep control gives the next test: a keep here is recommended without a confirmation after
        it. When ``phase`` has no room left for the A/B's first look, the best move is decided from its one boot
        instead (``_one_boot_move``) and the rest stay undecided.
        """
        night = self.night
        assert night.policy is not None
        while self._moves and night.incumbent.candidate.key() == night.baseline.key():
            night.check()
            move = self._moves.pop(0)
            if night.budget.allowance(phase) < night.first_look_boots() * night.boot_s():
                self._one_boot_move(move)
                break
            level = night.fdr_level()
            if level < smallest_level(night.policy.replicates):
                break
            log.info("search trial %d was left undecided: its A/B continues in the %s phase's time", move.number,
                     phase)
            ab, ids = night.ab(move.candidate, tag=f"search:{move.number}", phase=Phase.SEARCH,
                               technique=move.candidate.label, seed=1000 + move.number, trial=move.number,
                               level=level)
            verdict = night.fdr.review(ab.verdict)
            decision = night.decide(search_decision(
                ab, ids, study=night.name, number=0, technique=f"search trial {move.number}",
                incumbent=night.baseline, candidate=move.candidate, verdict=verdict), trials=(move.number,))
            if decision.kept is Kept.YES:
                self._keep_move(move, arm_mean(ab, Arm.CANDIDATE) or move.throughput)
        return self.result()

    def _one_boot_move(self, move: OpenMove) -> None:
        """Decide ``move`` from its search boot, when no A/B fits in the night: ``one_boot_verdict`` against the
        baseline's boots at the night's next level, its p multiplied by the number of moves the search booted (the
        move is the best of them, and the best of many boots is high by chance). A boot whose TTFT p50 or p99 is over
        the space's margin of the baseline's median is not kept; the TTFT is not otherwise tested on one boot."""
        night = self.night
        noise, policy, base = night.noise, night.policy, night.incumbent.throughput
        if noise is None or policy is None or noise.boots < 3 or not policy.sigma_boot or not base:
            return
        verdict = night.fdr.review(one_boot_verdict(
            move.throughput / base, policy.sigma_boot, noise.boots, night.fdr_level(), what="its search boot",
            against="the baseline's", among=move.among, held=self._ttft_over(move.boot_id)))
        decision = night.decide(DecisionRecord(
            study=night.name, number=0, phase=Phase.SEARCH, technique=f"search trial {move.number}",
            flags_delta={k: v for k, v in move.candidate.flags.items() if night.baseline.flags.get(k) != v},
            incumbent_key=night.baseline.key(), candidate_key=move.candidate.key(), verdict=verdict,
            result=verdict.reason, boots_candidate=(move.boot_id,), decided_at=time.time()), trials=(move.number,))
        log.info("search trial %d: a one-boot test, the night has no room for an A/B: %s", move.number,
                 decision.kept.value)
        if decision.kept is Kept.YES:
            self._keep_move(move, move.throughput)

    def _ttft_over(self, boot_id: str) -> str:
        """Which TTFT of boot ``boot_id`` is over the space's margin of the baseline boots' median ("" when none)."""
        night = self.night
        history = night.store.load()
        boot = history.boot(boot_id)
        baseline = [b for b in history.boots_of(night.baseline.key()) if b.throughput_tok_s]
        margins = night.space.guardrails
        if boot is None or not baseline:
            return ""
        for name, margin, read in (("TTFT p50", margins.ttft_p50_margin, BootRecord.ttft_p50_s),
                                   ("TTFT p99", margins.ttft_p99_margin, BootRecord.ttft_p99_s)):
            mine, theirs = read(boot), [v for v in map(read, baseline) if v is not None]
            if margin is not None and mine is not None and theirs and mine > (1.0 + margin) * statistics.median(theirs):
                return f"{name} on that boot is over the margin +{margin:.0%} of the baseline's"
        return ""

    def _keep_move(self, move: OpenMove, throughput: float | None) -> None:
        """Make ``move`` (the baseline's values moved) the night's incumbent; the other moves were of the baseline."""
        self.night.apply(PhaseResult(incumbent=Incumbent(dict(move.values), [], move.candidate, throughput)))
        self._moves = []

    def resume(self, phase: BudgetPhase) -> PhaseResult:
        """Continue, to its cap, each screening A/B an early look stopped to save boots, if ``phase`` has room.

        The boot-saving futility stop ends a test on its estimate alone, however wide its interval: at the first
        look of two boots per arm that is often an interval that says nothing ([−49%, +86%]). Futility stops are
        non-binding, so the same test may go on: its recorded boots are read back, its efficacy boundaries stay
        calibrated at the level it was run at (no new level of the night's false-keep control is spent), and only
        the interval rule stops it early now. A test continues only against the incumbent it was run against,
        largest estimate first, when its next look fits in what ``phase`` has left; a phase ending mid-test leaves
        the first decision standing.
        """
        night = self.night
        assert night.policy is not None
        paused = sorted(self._paused, key=lambda p: -(p.verdict.effect or 0.0))
        self._paused = []
        for test in paused:
            night.check()
            if test.incumbent_key != night.incumbent.candidate.key():
                continue
            if night.budget.allowance(phase) < self._next_look_s(test):
                self._notes.append(f"no time to continue the test of {test.technique.name} "
                                   f"({reason_from_verdict(test.verdict)})")
                break
            log.info("continuing the A/B of %s: its early look stopped to save boots", test.technique.name)
            ab, ids = night.ab(test.candidate, tag=test.tag, phase=Phase.SCREENING, technique=test.technique.name,
                               kind=PolicyKind.SPEED, seed=test.index, level=test.level,
                               futility=Futility.CI)
            verdict = night.fdr.resume(ab.verdict, test.level)
            sentence = (f"continued to its cap (an early look had stopped it to save boots: "
                        f"{reason_from_verdict(test.verdict)}): {reason_from_verdict(verdict)}")
            base = {**self._base(test.technique, test.with_), "candidate_key": test.candidate.key()}
            decision = self._record(None, verdict=verdict, ab_result=ab.to_dict(), result=sentence,
                                    with_=test.with_, boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                                    boots_candidate=test.boots + tuple(ids[Arm.CANDIDATE]), **base)
            if decision.kept is Kept.YES:
                self._keep(test.technique, test.with_, test.candidate,
                           arm_mean(ab, Arm.CANDIDATE) or night.incumbent.throughput)
            elif _unresolved(verdict, night.policy.min_effect):
                self._unresolved.append(OpenTest(test.index, test.technique, verdict, test.with_))
        return self.result()

    def extend(self, phase: BudgetPhase) -> PhaseResult:
        """Retest the most promising unresolved technique with the longest test ``phase``'s time allows.

        For the end of a night with time nothing else needs (the confirmation phase, when nothing beat the
        baseline): a first test the gate left inconclusive with a positive estimate is retested on fresh boots
        against the same incumbent, its blocks per arm at each look the night's own times the largest factor
        (at most ``EXTEND_FACTOR``) whose cap fits in what ``phase`` has left, as a new test under the night's
        false-keep control whose p-value combines both stages (``multiplicity.with_first_stage``). Largest
        estimate first, one after another while time is left.
        """
        night = self.night
        assert night.policy is not None
        unresolved = sorted(self._unresolved, key=lambda test: -(test.verdict.effect or 0.0))
        self._unresolved = []
        base = night.policy.looks
        for test in unresolved:
            index, technique, first, with_ = test.index, test.technique, test.verdict, test.with_
            night.check()
            if technique.name in night.incumbent.techniques:
                continue
            blocks = self._blocks_that_fit(phase, after=1)
            factor = min(EXTEND_FACTOR, int(blocks // base[-1]))
            if factor < 1:
                self._notes.append(f"no time to retest {technique.name} with a longer test "
                                   f"({reason_from_verdict(first)})")
                break
            if (first.p_value is not None and second_stage_level(first.p_value, night.fdr_level())
                    < smallest_level(night.policy.replicates)):
                self._notes.append(f"{technique.name} not retested: its first test leaves a second no level to be "
                                   f"kept at ({reason_from_verdict(first)})")
                continue
            log.info("retesting %s with a test %d× the night's: the first was inconclusive at %s", technique.name,
                     factor, reason_from_verdict(first))
            partner = with_ if with_ not in night.incumbent.techniques else None
            self.screen(index, technique, first=first, with_=partner,
                        looks=tuple(factor * n for n in base) if factor > 1 else None)
        return self.result()

    def _next_look_s(self, test: PausedTest) -> float:
        """Seconds to the look after the one that stopped ``test``, in both arms."""
        night = self.night
        assert night.policy is not None
        looks = night.policy.looks
        stopped = test.verdict.stopped_at_look or 1
        have = looks[min(stopped, len(looks)) - 1]
        nxt = looks[min(stopped, len(looks) - 1)]
        return 2 * max(1, nxt - have) * night.boot_s()

    def screen(self, index: int, technique: Technique, *, first: Verdict | None = None,
               after: str | None = None, with_: str | None = None,
               looks: tuple[int, ...] | None = None) -> DecisionRecord | None:
        """Decide one technique now: its probed screening boot, then (if it survives) the A/B gate (``looks``: a
        longer test than the night's, for a retest)."""
        probed = self.probe(index, technique, first=first, after=after, with_=with_)
        return self.gate(probed, looks=looks) if isinstance(probed, _Probed) else probed

    def probe(self, index: int, technique: Technique, *, first: Verdict | None = None,
              after: str | None = None, with_: str | None = None) -> _Probed | DecisionRecord | None:
        """The rules and the probed screening boot of ``technique`` on the incumbent; the decision when that ends it.

        ``first``: this is a retest, and that was the first test's verdict (the decision's sentence says so).
        ``after``: a retry on an incumbent that now has this memory technique (its first try lacked memory).
        ``with_``: screened together with this memory technique, as one change.
        """
        night = self.night
        base = self._base(technique, with_)
        try:
            candidate = night.space.candidate(night.incumbent.values, self._stack(technique, with_),
                                              label=technique.name)
        except (RuleViolation, DerivationError) as exc:
            failure = Failure(FailureKind.BAD_FLAG, f"refused by the space's rules: {exc.message}",
                              "change the technique or the rule in the search space", phase="plan")
            return self._record(after, failure=failure, **base)
        except ConfigError as exc:
            # it sets a flag a kept technique sets otherwise: it cannot stack on this incumbent
            if after is not None or first is not None:
                log.info("%s is not retried: %s", technique.name, exc.message)
                return None
            return self._record(None, skipped=f"not applicable on this incumbent: {exc.message}", **base)
        base["candidate_key"] = candidate.key()
        attempts, result = 0, None
        tag = self._tag(technique, retest=first is not None, after=after, with_=with_)
        while attempts < 3:
            attempts += 1
            result = night.boot(BootPlan(tag=f"{tag}:probe{attempts}", candidate=candidate, phase=Phase.SCREENING,
                                         arm=Arm.CANDIDATE, technique=technique.name, probes=True))
            failed = result.sample.failed
            if failed is None or failed.kind not in _RETRIED:
                break
        assert result is not None
        boots: tuple[str, ...] = (result.record.boot_id,)
        if result.sample.failed is not None:
            return self._record(after, failure=_named(result.sample.failed), attempts=attempts,
                                boots_candidate=boots, with_=with_, **base)
        report = result.record.report
        ignored = tuple(a for a in (report.adjustments if report else ())
                        if a.flag in technique.flags or a.flag in _derived_of(technique))
        if ignored:
            return self._record(after, ignored=ignored, boots_candidate=boots, with_=with_, **base)
        immediate = self.immediate_reject(result)
        if immediate is None or immediate.slow_boot_z is not None:
            # A pool is a fact of the configuration, one boot shows it; a slow boot may be the host (rechecked).
            immediate = self.no_memory_gain(technique, result) or immediate
        if immediate is not None and immediate.slow_boot_z is not None:
            # A single slow boot may be the host, not the technique: a second boot must be as slow.
            again = night.boot(BootPlan(tag=f"{tag}:recheck", candidate=candidate, phase=Phase.SCREENING,
                                        arm=Arm.CANDIDATE, technique=technique.name))
            boots += (again.record.boot_id,)
            second = self.immediate_reject(again) if again.sample.failed is None else None
            immediate = second if second is not None and second.slow_boot_z is not None else None
            if immediate is not None:
                immediate = replace(immediate, boots_candidate=2, reason=immediate.reason.replace(
                    "on its screening boot", "on two screening boots (the second shown)"))
        if immediate is not None:
            return self._record(after, verdict=immediate, result=immediate.reason, boots_candidate=boots, with_=with_,
                                **base)
        tput, incumbent = result.record.throughput_tok_s, night.incumbent.throughput
        return _Probed(index=index, technique=technique, candidate=candidate, boots=boots, first=first,
                       after=after, tag=tag, estimate=tput / incumbent if tput and incumbent else None, with_=with_)

    def gate(self, probed: _Probed, *, looks: tuple[int, ...] | None = None) -> DecisionRecord | None:
        """The A/B gate of a technique that survived its screening boot, against the incumbent as it is now.

        When the incumbent changed since the screening boot (a technique was kept meanwhile), the technique is
        booted with the probes again on the new combination first: its quality and pool are facts of that one.
        """
        night = self.night
        assert night.policy is not None
        technique, first, after, with_ = probed.technique, probed.first, probed.after, probed.with_
        current = self._current(technique, with_)
        if current is None or current.key() != probed.candidate.key():
            again = self.probe(probed.index, technique, first=first, after=after, with_=with_)
            if not isinstance(again, _Probed):
                return again
            probed = again
        base = {**self._base(technique, with_), "candidate_key": probed.candidate.key()}
        kind = PolicyKind(technique.kind.value)
        # The gate's boundaries are calibrated at this test's share of the night's false-keep control, so a crossing
        # is a keep under that control too (the review below then only records the level spent); a retest is the
        # second stage of its first test, combined with it (``multiplicity.with_first_stage``).
        level, p_first = night.fdr_level(), first.p_value if first is not None else None
        if p_first is not None:
            level = second_stage_level(p_first, level)
        smallest = smallest_level(night.policy.replicates)
        if level < smallest:
            # the night's false-keep control (or a weak first stage) leaves too small a level to calibrate a test at
            needed = Verdict(decision=Decision.INCONCLUSIVE, reason=(
                f"not tested: a keep would need p ≤ {level:.2g}, below the {smallest:.2g} the gate can calibrate"),
                effect=None, ci_low=None, ci_high=None, p_value=None,
                boots_incumbent=0, boots_candidate=len(probed.boots), not_tested=True,
                category=ReasonCategory.NO_GAIN)
            return self._record(after, verdict=needed, with_=with_, boots_candidate=probed.boots, **base)
        guards = tuple((g.name, g.p_value) for g in (first.guardrails if first is not None else ())
                       if g.p_value is not None)
        ab, ids = night.ab(probed.candidate, tag=probed.tag, phase=Phase.SCREENING, technique=technique.name,
                           kind=kind, seed=probed.index if first is None else 7919 + probed.index, level=level,
                           first_stage_guards=guards, looks=looks, guard_extension=self._guard_blocks(first, looks))
        verdict = night.fdr.review(ab.verdict if p_first is None else with_first_stage(ab.verdict, p_first))
        combined = (f" (both tests combined: p = {verdict.p_value:.2g})" if p_first is not None
                    and verdict.p_value is not None and verdict.decision is Decision.KEEP else "")
        sentence = (f"retest with fresh boots (the first: {reason_from_verdict(first)}): "
                    f"{reason_from_verdict(verdict)}{combined}" if first is not None else "")
        decision = self._record(after, verdict=verdict, ab_result=ab.to_dict(), result=sentence, with_=with_,
                                boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                                boots_candidate=probed.boots + tuple(ids[Arm.CANDIDATE]), **base)
        # faster at the interval's low end (a memory technique: no slower than its non-inferiority margin)
        margin = night.policy.non_inferiority_margin if kind is PolicyKind.MEMORY else 0.0
        if (first is None and decision.kept is Kept.INCONCLUSIVE and verdict.ci_low is not None
                and verdict.ci_low > 1.0 - margin):
            self._promising.append(OpenTest(probed.index, technique, verdict, with_))
        elif first is None and _unresolved(verdict, night.policy.min_effect):
            self._unresolved.append(OpenTest(probed.index, technique, verdict, with_))
        if first is None and after is None and ab.verdict.futility is Futility.BOOT_SAVING:
            self._paused.append(PausedTest(index=probed.index, technique=technique, candidate=probed.candidate,
                                           boots=probed.boots, tag=probed.tag, level=level,
                                           incumbent_key=night.incumbent.candidate.key(), verdict=verdict,
                                           with_=with_))
        if decision.kept is Kept.YES:
            self._keep(technique, with_, probed.candidate, arm_mean(ab, Arm.CANDIDATE) or night.incumbent.throughput)
        return decision

    def _guard_blocks(self, first: Verdict | None, looks: tuple[int, ...] | None) -> int | None:
        """The guardrail extension of a retest (``first``: its first test), in blocks per arm.

        The extension runs only when the retest's gain crossed its boundary at the cap and a TTFT guardrail alone is
        pending: the technique is then decided by that guardrail, and only more boots resolve a TTFT bound that
        straddles its margin (``gate``'s module docstring). A retest gets the longest extension, at most
        ``EXTEND_FACTOR`` times its cap, that fits in the current phase's time after the cap's boots in both arms,
        and never less than the night's own; the guardrails' levels do not depend on its length. ``None`` (the
        night's own) for a first test.
        """
        night = self.night
        assert night.policy is not None
        own = night.policy.guard_extension
        if first is None or not own or night.budget.phase is None:
            return None
        cap = (looks or night.policy.looks)[-1]
        fits = int(self._blocks_that_fit(night.budget.phase, after=2 * cap))
        return max(own, min(EXTEND_FACTOR * cap, fits))

    def _blocks_that_fit(self, phase: BudgetPhase, *, after: int) -> float:
        """Blocks per arm (two boots each) that ``phase``'s time has left after ``after`` more boots."""
        return (self.night.budget.allowance(phase) / self.night.boot_s() - after) / 2

    def _stack(self, technique: Technique, with_: str | None = None) -> list[str]:
        """The incumbent's techniques, then ``with_`` (a memory technique screened alongside), then ``technique``."""
        return [*self.night.incumbent.techniques, *([with_] if with_ else []), technique.name]

    def _keep(self, technique: Technique, with_: str | None, candidate: Candidate, throughput: float | None) -> None:
        """Make ``candidate``, a kept ``technique`` (with ``with_``) stacked on the incumbent, the night's incumbent;
        ``throughput`` is its measured mean."""
        self.night.apply(PhaseResult(incumbent=Incumbent(dict(self.night.incumbent.values),
                                                         self._stack(technique, with_), candidate, throughput)))

    def _base(self, technique: Technique, with_: str | None) -> dict[str, Any]:
        night = self.night
        flags, env = dict(technique.flags), dict(technique.env)
        if with_ is not None:
            partner = night.space.technique(with_)
            flags, env = {**partner.flags, **flags}, {**partner.env, **env}
        return dict(technique=technique.name, flags_delta=flags, env_delta=env,
                    incumbent_key=night.incumbent.candidate.key())

    def _current(self, technique: Technique, with_: str | None = None) -> Candidate | None:
        """The technique on the incumbent as it is now (``None`` when the space's rules refuse the combination)."""
        night = self.night
        try:
            return night.space.candidate(night.incumbent.values, self._stack(technique, with_), label=technique.name)
        except (RuleViolation, DerivationError, ConfigError):
            return None

    def _record(self, after: str | None, *, with_: str | None = None, **fields: Any) -> DecisionRecord:
        """Record one screening decision; a retry after a memory keep, or a pair, says so in its sentence."""
        night = self.night
        decision = DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, decided_at=time.time(),
                                  **fields)
        if after is not None:
            decision = replace(decision, result=f"retried after {after} was kept: {decision.result}")
        if with_ is not None:
            decision = replace(decision, result=f"screened with {with_}, which frees memory: {decision.result}")
        return night.decide(decision)

    def no_memory_gain(self, technique: Technique, result: BootResult) -> Verdict | None:
        """A memory technique whose KV pool is no larger than the incumbent's: rejected without an A/B.

        A memory technique is there to buy KV pool (one that shrinks it, like int8 Mamba checkpoints, has
        nothing to offer); the pool is a property of the configuration, so one boot shows it. Without a recorded
        pool on either side there is nothing to compare and the A/B decides.
        """
        if technique.kind is not TechniqueKind.MEMORY:
            return None
        report = result.record.report
        pool = report.kv_capacity if report else None
        before = self.incumbent_pool()
        if report is None or not pool or not before or pool > before:
            return None
        if report.pool_fixed_by_context:
            reason = (f"{pct(pool / before)} KV capacity ({pool:,.0f} vs {before:,.0f} {report.kv_capacity_unit}), "
                      "no memory gain")
        else:
            reason = f"{pct(pool / before)} KV pool ({pool:,.0f} vs {before:,.0f} tokens), no memory gain"
        return Verdict(decision=Decision.REJECT, reason=reason, effect=None, ci_low=None, ci_high=None, p_value=None,
                       boots_incumbent=0, boots_candidate=1,
                       pool=PoolFacts(kv_pool=_whole(pool), incumbent_kv_pool=_whole(before)),
                       category=ReasonCategory.MEMORY_LOSS)

    def incumbent_pool(self) -> float | None:
        """The incumbent's KV capacity (``BootReport.kv_capacity``), the median over its recorded boots."""
        key = self.night.incumbent.candidate.key()
        pools = [b.report.kv_capacity for b in self.night.store.load().boots
                 if b.candidate.key() == key and b.report is not None and b.report.kv_capacity]
        return statistics.median_low(pools) if pools else None

    def immediate_reject(self, result: BootResult) -> Verdict | None:
        """A quality regression or a pool below the context target: rejected without an A/B."""
        night = self.night
        reason = ""
        quality_failed, facts = False, None
        category = ReasonCategory.SLOWER
        if result.sample.quality_passed is False:
            detail = next((p.detail for p in result.record.probes if not p.passed), "")
            reason = f"answers regressed against the baseline: {detail}" if detail else "failed the quality gate"
            quality_failed, category = True, ReasonCategory.WRONG_ANSWERS
        kv = result.sample.kv_pool_tokens
        if not reason and night.context_target and kv is not None and kv < night.context_target:
            reason = f"context drops to {kv:,} tokens, below the {night.context_target:,}-token target"
            facts, category = PoolFacts(kv_pool=kv, context_target=night.context_target), ReasonCategory.CONTEXT_DROP
        tput, incumbent = result.record.throughput_tok_s, night.incumbent.throughput
        z: float | None = None
        if not reason and tput and incumbent and night.noise is not None:
            # One boot against the incumbent's mean: a drop beyond 3 σ_boot (one-sided p ≈ 0.001) needs no A/B.
            sigma = night.noise.sigma_boot * math.sqrt(1.0 + 1.0 / max(1, night.noise.boots))
            z = math.log(tput / incumbent) / sigma if sigma > 0 else 0.0
            if z < -3.0:
                reason = (f"{tput / incumbent - 1:+.0%} on its screening boot ({tput:,.1f} vs {incumbent:,.1f} tok/s), "
                          f"{-z:.1f} σ below the incumbent's boot-to-boot noise")
            else:
                z = None
        if not reason:
            return None
        return Verdict(decision=Decision.REJECT, reason=reason, effect=None, ci_low=None, ci_high=None, p_value=None,
                       boots_incumbent=0, boots_candidate=1, category=category, quality_failed=quality_failed,
                       slow_boot_z=z, pool=facts)


def _named(failure: Failure) -> Failure:
    """An unclassified crash is named by its own last evidence line (``RuntimeError: … requires SM100``)."""
    if failure.kind is FailureKind.UNKNOWN_CRASH and failure.evidence:
        return replace(failure, summary=failure.evidence[-1].strip()[:200])
    return failure


def _derived_of(technique: Technique) -> set[str]:
    """Flags a technique changes indirectly (steps → draft tokens): their adjustments count against it too."""
    return {"speculative-num-draft-tokens"} if "speculative-num-steps" in technique.flags else set()


def _whole(value: float) -> float | int:
    """A capacity that is a whole number of tokens as an ``int`` (an SGLang pool), other capacities as they are."""
    return int(value) if float(value).is_integer() else value
