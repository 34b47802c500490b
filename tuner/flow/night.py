"""``Night``: what the phases of one study share — the incumbent, the booter, the gate's policy, the decisions.

``Study`` (``tuner/flow/study.py``) builds one ``Night`` and hands it to each phase: screening
(``tuner/flow/screening.py``) and the search (``tuner/search/phase.py``) boot candidates through its booter, A/B them
against its incumbent and record every decision through ``Night.decide``, which numbers it, stores it, adds it to the
ledger and has the outputs rewritten. Nothing in a phase reaches into ``Study``.

What a phase decides for the night (the noise and policy the baseline measured, the incumbent its keeps make, the
tests and techniques it leaves open, its notes, the confirmation's outcome) comes back as a ``PhaseResult`` that
``Night.apply`` applies: the one place those fields of the night change.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import Arm, BootOutcome, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.history.study_record import Confirmation
from elsa_tune.history.verdict import Futility, PolicyKind, Verdict
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.space import Technique
from elsa_tune.traffic.workload import Workload
from elsa_tune.tuner.ab.dimensioning import NoiseReport
from elsa_tune.tuner.ab.gate import ABResult, GatePolicy, run_ab
from elsa_tune.tuner.ab.multiplicity import OnlineFalseKeepControl
from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.flow.booter import ABSampler, BootPlan, BootResult, CandidateBooter
from elsa_tune.tuner.flow.budget import Budget, BudgetPhase
from elsa_tune.tuner.flow.load import ServerLoad
from elsa_tune.tuner.flow.memory_model import MemoryModel
from elsa_tune.tuner.flow.preflight import Preflight
from elsa_tune.tuner.flow.signals import Interrupts

log = logging.getLogger(__name__)


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
    """Seconds since the study began; a boot reused on resume advances it by the boot's recorded time, so a replayed
    study spends its budget as the original did. ``source`` is monotonic wall time; a virtual study's clock has a
    constant source and moves only by ``advance`` (the simulated seconds of each boot)."""

    def __init__(self, source: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._origin = source()
        self._offset = 0.0

    @classmethod
    def simulated(cls) -> StudyClock:
        """A clock that moves only by ``advance``: a virtual study's simulated seconds."""
        return cls(source=lambda: 0.0)

    def now(self) -> float:
        return self._source() - self._origin + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += max(0.0, seconds)


@dataclass(frozen=True)
class Incumbent:
    """The configuration to beat: its numeric values, the techniques stacked into it, and its candidate."""

    values: dict[str, Any]
    techniques: list[str]
    candidate: Candidate
    throughput: float | None      # mean per-boot throughput of its measured boots (screening scale)


@dataclass(frozen=True)
class QueuedTechnique:
    """A technique waiting to be screened: its place in the space (it seeds its tests' schedules) and itself."""

    index: int
    technique: Technique


@dataclass(frozen=True)
class OpenTest:
    """A technique whose first test the gate left undecided, waiting to be tested again.

    ``index`` is its place in the space, ``verdict`` the first test's verdict (its estimate orders the queue, its
    p-value is the first stage of the retest), ``with_`` the memory technique it was screened together with.
    """

    index: int
    technique: Technique
    verdict: Verdict
    with_: str | None = None


@dataclass(frozen=True)
class PausedTest:
    """A screening A/B that an early look stopped to save boots, as it stood: enough to continue the same test.

    ``tag`` names its boots and ``index`` (the technique's place in the space) seeds its schedule, as for any first
    test (continuing reads the recorded boots back); ``level`` is the overall level its efficacy boundaries were
    calibrated at; ``incumbent_key`` the incumbent it was run against (it continues only against that one);
    ``boots`` the candidate's probed screening boots.
    """

    index: int
    technique: Technique
    candidate: Candidate
    boots: tuple[str, ...]
    tag: str
    level: float
    incumbent_key: str
    verdict: Verdict
    with_: str | None = None


@dataclass(frozen=True)
class OpenMove:
    """A numeric search move whose one boot beat the baseline by more than the boot noise and that no A/B decided
    (the search phase ran out of time first): its trial number, values and candidate, that boot's throughput, how
    many moves the search booted (``among``: the move was the best of those, which a one-boot test corrects for) and
    that boot's id."""

    number: int
    values: dict[str, Any]
    candidate: Candidate
    throughput: float
    among: int
    boot_id: str


@dataclass(frozen=True)
class OpenWork:
    """What the phases so far left for a later one to screen or test.

    ``unscreened``: techniques screening had no time for (continued at the start of the search phase);
    ``lacking``: techniques rejected for want of memory (context drop, OOM) not yet retried with more pool;
    ``freeing``: the first memory technique that grew the pool without being kept, a partner for what lacked memory;
    ``promising``: first tests the gate left inconclusive although their interval showed a gain (retested once);
    ``paused``: screening A/Bs an early look stopped to save boots while their interval still reached the minimum
    worthwhile gain (continued to their cap with time nothing else needs); ``unresolved``: first tests left
    inconclusive with a positive estimate and an interval that still reaches the minimum worthwhile gain, though not
    shown faster (a longer retest if the night ends with time nothing else needs); ``moves``: the search's moves
    that beat the baseline on their boot and that no A/B decided, best first (decided in the confirmation's time when
    nothing beat the baseline).
    """

    unscreened: tuple[QueuedTechnique, ...] = ()
    lacking: tuple[QueuedTechnique, ...] = ()
    freeing: str | None = None
    promising: tuple[OpenTest, ...] = ()
    paused: tuple[PausedTest, ...] = ()
    unresolved: tuple[OpenTest, ...] = ()
    moves: tuple[OpenMove, ...] = ()

    def tests(self) -> bool:
        """Whether any test is left open (promising, paused or unresolved), any technique is left unscreened or any
        search move is left undecided."""
        return bool(self.promising or self.paused or self.unresolved or self.unscreened or self.moves)


@dataclass(frozen=True)
class PhaseResult:
    """What a phase (or one step of it) decided for the night; ``Night.apply`` applies it. ``None``: unchanged.

    ``incumbent``: the incumbent it ended with, its keeps stacked in (or the baseline it went back to);
    ``open``: what it left for a later phase; ``notes``: the sentences it adds to the report, in order;
    ``noise`` and ``policy``: the boot noise the baseline measured and the gate's policy that follows from it;
    ``confirmation``: the confirmation's outcome.
    """

    incumbent: Incumbent | None = None
    open: OpenWork | None = None
    notes: tuple[str, ...] = ()
    noise: NoiseReport | None = None
    policy: GatePolicy | None = None
    confirmation: Confirmation | None = None


class Night:
    """The state one study's phases share, and the three things every phase does: boot, A/B, decide.

    ``on_decision`` is called after every recorded decision (the study rewrites its outputs there).
    """

    def __init__(self, pre: Preflight, *, store: StudyStore, budget: Budget, clock: StudyClock, view: StudyView,
                 interrupts: Interrupts, on_decision: Callable[[], None], load: ServerLoad | None = None) -> None:
        self.pre = pre
        self.settings = pre.settings
        self.space = pre.space
        self.name = self.settings.study_name
        self.store = store
        self.budget = budget
        self.clock = clock
        self.view = view
        self.interrupts = interrupts
        self.on_decision = on_decision
        self.context_target = pre.context_target
        self.booter = CandidateBooter(pre.boot_context(store, self.name), on_boot=self._on_boot,
                                      before_boot=self._before_boot, load=load)
        self.baseline = self.space.baseline()
        self.incumbent = Incumbent(self.space.baseline_values(), [], self.baseline, None)
        self.noise: NoiseReport | None = None
        self.policy: GatePolicy | None = None
        # About half the screened techniques end at their screening boot (crash, OOM, ignored flag) and never
        # reach the gate; the search adds a few promotions. The online level is spread over that many tests.
        screenable = sum(t.screen for t in self.space.techniques)
        self.fdr = OnlineFalseKeepControl(expected_tests=max(4, screenable // 2 + 2))
        self.decision_number = 0
        self.boot_seconds: list[float] = []
        self.memory = MemoryModel.for_space(self.space)
        self.notes: list[str] = []
        #: what the phases so far left open for a later one (``OpenWork``)
        self.open = OpenWork()
        #: the confirmation's outcome (``ConfirmationStatus`` and why); ``None`` until the confirmation phase decides
        self.confirmation: Confirmation | None = None
        self._charged: set[str] = set()       # recorded boots charged up front on resume (``charge_recorded``)
        self._seen: set[str] = set()          # boots this run has counted and timed once

    # ---- what every phase does ------------------------------------------------------------------------

    def apply(self, result: PhaseResult) -> None:
        """Make what a phase decided the night's: each field ``result`` sets replaces the night's, its notes are
        added after the night's."""
        if result.incumbent is not None:
            self.incumbent = result.incumbent
        if result.open is not None:
            self.open = result.open
        self.notes.extend(result.notes)
        if result.noise is not None:
            self.noise = result.noise
        if result.policy is not None:
            self.policy = result.policy
        if result.confirmation is not None:
            self.confirmation = result.confirmation

    def boot(self, plan: BootPlan) -> BootResult:
        return self.booter.boot(plan)

    def ab(self, candidate: Candidate, *, tag: str, phase: Phase, technique: str | None,
           kind: PolicyKind = PolicyKind.SPEED, seed: int = 0, trial: int | None = None,
           incumbent: Candidate | None = None, futility: Futility | None = None,
           level: float | None = None, first_stage_guards: tuple[tuple[str, float], ...] = (),
           looks: tuple[int, ...] | None = None, guard_extension: int | None = None
           ) -> tuple[ABResult, dict[Arm, list[str]]]:
        """The sequential A/B gate of ``candidate`` against the incumbent (or ``incumbent``), boot ids per arm.

        ``futility`` overrides the policy's futility rule (the confirmation runs with none: only harm stops it);
        ``level`` calibrates the efficacy boundaries at that overall level (a screening test's share of the night's
        false-keep control, ``fdr_level``) instead of the policy's ``alpha``; ``first_stage_guards`` are a retest's
        first-test guardrail p-values, combined with its own (``GatePolicy.first_stage_guards``); ``looks`` replaces
        the policy's blocks per arm at each look (a longer test than the night's own, its boundaries calibrated
        for it); ``guard_extension`` replaces the blocks a gain that crossed at the cap gets for a pending TTFT
        guardrail (the guardrails' levels do not depend on it).
        """
        assert self.policy is not None
        sampler = ABSampler(self.booter, incumbent=incumbent or self.incumbent.candidate, candidate=candidate,
                            phase=phase, tag=f"{tag}:ab", technique=technique, trial_number=trial)
        policy = self.policy if kind is PolicyKind.SPEED else replace(self.policy, kind=kind)
        if futility is not None:
            policy = replace(policy, futility=futility)
        if level is not None or first_stage_guards:
            policy = replace(policy, level=level, first_stage_guards=first_stage_guards)
        if looks is not None:
            policy = replace(policy, looks=looks)
        if guard_extension is not None:
            policy = replace(policy, guard_extension=guard_extension)
        result = run_ab(sampler, policy, rng_seed=self.settings.seed * 7919 + seed,
                        context={"fingerprint": self.pre.fingerprint.key(), "runtime": self.pre.runtime_name})
        log.info("A/B %s: %s — %s", technique or candidate.label, result.verdict.decision.value, result.verdict.reason)
        return result, sampler.boot_ids

    def fdr_level(self) -> float:
        """The level the next test under the night's false-keep control is run at: its online share, at most the
        gate's ``alpha`` (a test is never run looser than the gate's own level)."""
        assert self.policy is not None
        return min(self.policy.alpha, self.fdr.next_level())

    def decide(self, decision: DecisionRecord, *, trials: Sequence[int] = (), ledgered: bool = False
               ) -> DecisionRecord:
        """Number, store and ledger one decision, show it, and have the outputs rewritten; returns it numbered.

        ``ledgered``: a decision the ledger already has (a search worker's, adopted into this study's history): it is
        numbered, stored under this study's name and shown; the ledger and the outputs are left to the caller.
        """
        self.decision_number += 1
        decision = dataclasses.replace(decision, number=self.decision_number,
                                       study=self.name if ledgered else decision.study)
        self.store.record_decision(decision)
        if not ledgered:
            self.store.ledger.record(decision, self.pre.fingerprint, run_dir=self.store.run_dir, trials=trials)
        line = f"{decision.technique}: {decision.kept.value} — {decision.result}"
        log.info("decision %d %s", decision.number, line)
        self.view.update(decisions=(*self.view.status.decisions, line), last_event=line)
        if not ledgered:
            self.on_decision()
        return decision

    def use_workload(self, workload: Workload) -> None:
        """Measure every later boot on ``workload`` (the baseline shortens a pass that ran far too long)."""
        self.booter.ctx.workload = workload

    def charge_recorded(self, phase: Phase) -> float:
        """Charge the clock, once, with every finished boot of ``phase`` a killed run recorded; returns the seconds.

        On resume, a phase that is not replayed tag by tag (the search: its finished Optuna trials are not asked
        again) would never charge the boots those trials made; a resumed study must spend its budget as the
        original did. A recorded boot charged here and replayed later is not charged a second time.
        """
        seconds = 0.0
        for record in self.store.load().boots:
            if (record.phase is phase and record.tag is not None
                    and record.outcome is not BootOutcome.INTERRUPTED and record.boot_id not in self._charged):
                self._charged.add(record.boot_id)
                seconds += max(0.0, record.seconds)
        if seconds > 0:
            self.clock.advance(seconds)
            log.info("resume: %s boots recorded before the restart charged %.0f s to the budget", phase.value,
                     seconds)
        return seconds

    def check(self) -> None:
        """Raise ``StopStudy`` when interrupted or out of budget, ``PhaseOver`` when the phase's allowance is spent."""
        if self.interrupts.requested:
            raise StopStudy("interrupted: the last boot was recorded", interrupted=True)
        if self.budget.expired():
            raise StopStudy(f"the {self.budget.total_s / 60:.0f}-minute budget is spent", interrupted=False)
        phase = self.budget.phase
        if phase is not None and phase is not BudgetPhase.BASELINE and self.budget.allowance(phase) <= 0:
            raise PhaseOver("its time allowance is spent (an unfinished comparison keeps the incumbent)")

    def boot_s(self) -> float:
        """The typical seconds of one boot this night (60 s before any boot finished)."""
        return typical_boot_s(self.boot_seconds)

    def first_look_boots(self) -> int:
        """Boots the gate needs to reach its first look (both arms)."""
        return (self.policy or GatePolicy()).first_look_boots()

    # ---- the booter's hooks ---------------------------------------------------------------------------

    def _before_boot(self, plan: BootPlan) -> None:
        self.check()
        self.view.update(candidate=plan.candidate.label or plan.tag, time_left_s=self.budget.left_s)

    def _on_boot(self, result: BootResult) -> None:
        boot_id = result.record.boot_id
        if boot_id not in self._seen:       # a boot read back again later in this run (an A/B continued) costs nothing
            self._seen.add(boot_id)
            if result.reused and boot_id not in self._charged:   # a killed run's boot: spent again on resume
                self.clock.advance(result.record.seconds)
            self._charged.add(boot_id)
            self.boot_seconds.append(result.record.seconds)
        self._show()

    def _show(self) -> None:
        best = self.incumbent.throughput
        self.view.update(boots=self.booter.boots, failed_boots=self.booter.failed, best=self.incumbent.candidate.label,
                         best_throughput=best, time_left_s=self.budget.left_s)


def typical_boot_s(seconds: Iterable[float]) -> float:
    """The median of the positive boot durations in ``seconds`` (60 s when there are none)."""
    good = [s for s in seconds if s > 0]
    return statistics.median(good) if good else 60.0


def boot_mean(passes: Sequence[Any]) -> float | None:
    """Mean output throughput of a boot's measured (not warm-up) passes."""
    values = [p.output_throughput_tok_s for p in passes if not p.warmup]
    return statistics.fmean(values) if values else None


def geo(values: Sequence[float]) -> float | None:
    """Geometric mean of the positive, finite values (None when there are none)."""
    good = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(statistics.fmean(math.log(v) for v in good)) if good else None


def arm_mean(result: ABResult, arm: Arm) -> float | None:
    """Geometric mean of one arm's per-boot throughput in an A/B (its failed boots left out)."""
    return geo([m for m in (boot_mean(s.passes) for s in result.samples if s.arm is arm and s.failed is None)
                if m is not None])
