"""``SearchContext``: what a search backend may see of and do to its study; ``SearchContext.of`` builds it from a night.

A backend does not get the ``Night``: it gets the incumbent to start from (read it, do not change it), the gate's
policy and the baseline's noise, the study's identity (name, settings, space, store, context target) and the
actions of the phase. It boots and A/Bs through ``boot``/``ab``, records its own decisions through ``decide``
(numbered, stored, ledgered) and a worker's through ``adopt`` (numbered and stored; the ledger has them), makes a
keep the night's incumbent through ``keep`` as soon as it is decided, so a phase cut short leaves it right,
and charges the clock through ``charge_recorded`` (a killed run's boots it will not replay) and ``charge_s``.
``check`` raises ``StopStudy``/``PhaseOver`` between boots; a backend lets them through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.tuner.booter import BootPlan, BootResult
from elsa_tune.tuner.dimensioning import NoiseReport
from elsa_tune.tuner.gate import ABResult, GatePolicy
from elsa_tune.tuner.memory_model import MemoryModel
from elsa_tune.tuner.night import Incumbent, Night
from elsa_tune.tuner.schedule import Arm
from elsa_tune.tuner.settings import Settings
from elsa_tune.tuner.signals import Interrupts

SEARCH = "search"


class ABRun(Protocol):
    """The sequential A/B gate of ``candidate`` against the incumbent; the result and the boot ids per arm."""

    def __call__(self, candidate: Candidate, *, tag: str, phase: Phase, technique: str | None, seed: int = 0,
                 trial: int | None = None) -> tuple[ABResult, dict[Arm, list[str]]]: ...


class Decide(Protocol):
    """Number, store and ledger one decision, and have the outputs rewritten; returns it numbered."""

    def __call__(self, decision: DecisionRecord, *, trials: Sequence[int] = ()) -> DecisionRecord: ...


@dataclass(frozen=True)
class SearchContext:
    """The search phase's view of one study: read-only values, and the phase's actions as callables."""

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
    boot: Callable[[BootPlan], BootResult]
    ab: ABRun
    decide: Decide
    adopt: Callable[[DecisionRecord], DecisionRecord]
    keep: Callable[[Incumbent], None]
    check: Callable[[], None]
    allowance_s: Callable[[], float]
    boot_s: Callable[[], float]
    charge_recorded: Callable[[Phase], float]
    charge_s: Callable[[float], None]
    note: Callable[[str], None]
    event: Callable[[str], None]
    model_skipped: Callable[[], None]
    model_error: Callable[[float], None]
    outputs: Callable[[], None]

    def first_look_boots(self) -> int:
        """Boots the gate needs to reach its first look (both arms)."""
        return 2 * self.policy.looks[0]

    @classmethod
    def of(cls, night: Night) -> SearchContext:
        """The context of ``night``'s search phase; the baseline must have set the night's policy."""
        if night.policy is None:
            raise RuntimeError("the search phase needs the gate policy the baseline sets")

        def adopt(decision: DecisionRecord) -> DecisionRecord:
            night.decision_number += 1
            numbered = dataclasses.replace(decision, number=night.decision_number, study=night.name)
            night.store.record_decision(numbered)
            line = f"{numbered.technique}: {numbered.kept.value} — {numbered.result}"
            night.view.update(decisions=(*night.view.status.decisions, line), last_event=line)
            return numbered

        def keep(incumbent: Incumbent) -> None:
            night.incumbent = incumbent

        def model_skipped() -> None:
            night.skipped_by_model += 1

        return cls(name=night.name, settings=night.settings, space=night.space, store=night.store,
                   context_target=night.context_target, incumbent=night.incumbent, policy=night.policy,
                   noise=night.noise, memory=night.memory, interrupts=night.interrupts, boot=night.boot,
                   ab=night.ab, decide=night.decide, adopt=adopt, keep=keep, check=night.check,
                   allowance_s=lambda: night.budget.allowance(SEARCH), boot_s=night.boot_s,
                   charge_recorded=night.charge_recorded, charge_s=night.clock.advance, note=night.notes.append,
                   event=lambda line: night.view.update(last_event=line), model_skipped=model_skipped,
                   model_error=night.memory_errors.append, outputs=night.on_decision)
