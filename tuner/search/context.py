"""``SearchContext``: what a search backend may see of and do to its study; ``NightSearch`` is a night's.

A backend does not get the ``Night``: it gets what it reads as one frozen ``SearchSetup`` (the incumbent to start
from, the gate's policy and the baseline's noise, the study's identity: name, settings, space, store, context
target) and the actions of the phase. It boots and A/Bs through ``boot``/``ab``, records its decisions through
``decide`` (numbered, stored, ledgered; a decision a worker already put in the ledger with ``ledgered=True``), makes
a keep the night's incumbent through ``keep`` as soon as it is decided, so a phase cut short leaves it right, and
charges the clock through ``charge_recorded`` (a killed run's boots it will not replay) and ``charge_s``. ``check``
raises ``StopStudy``/``PhaseOver`` between boots; a backend lets them through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.tuner.ab.dimensioning import NoiseReport
from elsa_tune.tuner.ab.gate import ABResult, GatePolicy
from elsa_tune.tuner.flow.booter import BootPlan, BootResult
from elsa_tune.tuner.flow.budget import BudgetPhase
from elsa_tune.tuner.flow.memory_model import MemoryModel
from elsa_tune.tuner.flow.night import Incumbent, Night, PhaseResult
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.signals import Interrupts


@dataclass(frozen=True)
class SearchSetup:
    """What a search reads of its study, fixed for the phase: its identity (name, settings, space, store, context
    target), the incumbent the phase started from (read it, do not change it: a keep goes through
    ``SearchContext.keep``), the gate's policy and the baseline's noise, the memory model and the interrupts."""

    name: str
    settings: Settings
    space: SearchSpace
    store: StudyStore
    context_target: int | None
    incumbent: Incumbent
    policy: GatePolicy
    noise: NoiseReport | None
    memory: MemoryModel
    interrupts: Interrupts


class SearchContext(Protocol):
    """The search phase's view of one study: what it reads (``setup``), and what it may do."""

    @property
    def setup(self) -> SearchSetup: ...

    def boot(self, plan: BootPlan) -> BootResult: ...

    def ab(self, candidate: Candidate, *, tag: str, phase: Phase, technique: str | None, seed: int = 0,
           trial: int | None = None) -> tuple[ABResult, dict[Arm, list[str]]]:
        """The sequential A/B gate of ``candidate`` against the night's incumbent; the result, boot ids per arm."""
        ...

    def decide(self, decision: DecisionRecord, *, trials: Sequence[int] = (), ledgered: bool = False
               ) -> DecisionRecord:
        """Number and store one decision (and ledger it unless ``ledgered``); returns it numbered."""
        ...

    def keep(self, incumbent: Incumbent) -> None:
        """Make ``incumbent`` the night's."""
        ...

    def check(self) -> None: ...

    def allowance_s(self) -> float:
        """Seconds the search phase may still spend."""
        ...

    def boot_s(self) -> float: ...

    def charge_recorded(self, phase: Phase) -> float: ...

    def charge_s(self, seconds: float) -> None: ...

    def note(self, text: str) -> None:
        """Add a note to the study's report."""
        ...

    def event(self, line: str) -> None:
        """Show ``line`` on the console as the latest event."""
        ...

    def outputs(self) -> None:
        """Have the study's outputs rewritten."""
        ...


class NightSearch:
    """The ``SearchContext`` of a night's search phase: the night's values as the phase starts (the baseline must
    have set its policy), and its actions."""

    def __init__(self, night: Night) -> None:
        if night.policy is None:
            raise RuntimeError("the search phase needs the gate policy the baseline sets")
        self._night = night
        self.setup = SearchSetup(name=night.name, settings=night.settings, space=night.space, store=night.store,
                                 context_target=night.context_target, incumbent=night.incumbent, policy=night.policy,
                                 noise=night.noise, memory=night.memory, interrupts=night.interrupts)

    def boot(self, plan: BootPlan) -> BootResult:
        return self._night.boot(plan)

    def ab(self, candidate: Candidate, *, tag: str, phase: Phase, technique: str | None, seed: int = 0,
           trial: int | None = None) -> tuple[ABResult, dict[Arm, list[str]]]:
        return self._night.ab(candidate, tag=tag, phase=phase, technique=technique, seed=seed, trial=trial)

    def decide(self, decision: DecisionRecord, *, trials: Sequence[int] = (), ledgered: bool = False
               ) -> DecisionRecord:
        return self._night.decide(decision, trials=trials, ledgered=ledgered)

    def keep(self, incumbent: Incumbent) -> None:
        self._night.apply(PhaseResult(incumbent=incumbent))

    def check(self) -> None:
        self._night.check()

    def allowance_s(self) -> float:
        return self._night.budget.allowance(BudgetPhase.SEARCH)

    def boot_s(self) -> float:
        return self._night.boot_s()

    def charge_recorded(self, phase: Phase) -> float:
        return self._night.charge_recorded(phase)

    def charge_s(self, seconds: float) -> None:
        self._night.clock.advance(seconds)

    def note(self, text: str) -> None:
        self._night.apply(PhaseResult(notes=(text,)))

    def event(self, line: str) -> None:
        self._night.view.update(last_event=line)

    def outputs(self) -> None:
        self._night.on_decision()
