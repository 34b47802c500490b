"""The numeric search phase: Optuna trials around the incumbent, and promotion of a winner through the A/B gate.

``SearchBackend`` is the seam: ``run(ctx)`` searches around ``ctx.setup.incumbent`` (``tuner/search/context.py``) and
returns the incumbent it ends with and the decisions it recorded. ``LocalSearch`` is the single-GPU backend: a sweep
that boots the incumbent's values and each of its one-parameter moves once, then A/Bs the moves whose boot beat the
incumbent by more than the boot noise (``sweep_reference``), fastest first, then an ask/tell loop of
``NumericSearch`` whose trials are promoted as they come. Its ``MemoryModel`` skips candidates predicted to miss
the context target without a boot; failures are constraints; the incumbent's own values (the search's first trial)
are never A/B-ed, and a keep becomes the incumbent for what follows.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from optuna.trial import FrozenTrial, TrialState

from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.records import Arm, BootRecord, Phase
from elsa_tune.history.store import constraint_values
from elsa_tune.history.verdict import Verdict
from elsa_tune.runtime.failure import Failure
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.tuner.ab.gate import ABResult
from elsa_tune.tuner.flow.booter import BootPlan, BootResult
from elsa_tune.tuner.flow.memory_model import MemoryModel, Observation, Prediction
from elsa_tune.tuner.flow.night import Incumbent, OpenMove, arm_mean
from elsa_tune.tuner.search.context import SearchContext, SearchSetup
from elsa_tune.tuner.search.optuna_search import NumericSearch, Proposal, proposal_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchOutcome:
    """What a search phase ended with: the incumbent, the decisions it recorded (numbered), trials it finished."""

    incumbent: Incumbent
    decisions: tuple[DecisionRecord, ...]
    trials: int


class SearchBackend(Protocol):
    """Runs the numeric search phase of one study around ``ctx.setup.incumbent``.

    A backend boots through ``ctx.boot``/``ctx.ab``, records every decision through ``ctx.decide`` (with
    ``ledgered=True`` for a decision a worker already put in the ledger), calls ``ctx.check()`` between boots (it raises
    ``StopStudy``/``PhaseOver``, which a backend lets through), hands every keep to ``ctx.keep`` as it promotes,
    so a phase cut short leaves the night's incumbent right, and on resume charges the budget with recorded boots
    it will not replay (``ctx.charge_recorded``). It returns the incumbent it ended with: ``ctx.setup.incumbent`` or the
    candidate of one of its KEEP decisions.
    """

    def run(self, ctx: SearchContext) -> SearchOutcome: ...


#: The share of the search's allowance its one-move sweep may spend before the sweep's winners are promoted.
SWEEP_SHARE = 0.5
#: The Optuna study attribute that records how many trials the sweep ended with (a resumed search reads it).
SWEEP_ATTR = "sweep_trials"


@dataclass(frozen=True)
class Booted:
    """A search trial whose boot measured a throughput: its number, values and candidate, and that throughput."""

    number: int
    values: Mapping[str, Any]
    candidate: Candidate
    throughput: float


class LocalSearch:
    """The single-GPU search: a sweep of the incumbent's one-parameter moves, then an ask → boot → tell loop.

    The sweep boots the incumbent's values and each of its one-parameter moves once (up to ``SWEEP_SHARE`` of the
    phase's allowance) before any A/B, then puts the moves that beat the incumbent by more than the boot noise
    through the gate best first, each on top of what the ones before it kept: a boot is one noisy sample, and an
    A/B spent on the first lucky move would leave the best one unmeasured. After the sweep the sampler's trials are
    promoted as they come.
    """

    def run(self, ctx: SearchContext) -> SearchOutcome:
        setup = ctx.setup
        if not setup.space.parameters:
            return SearchOutcome(setup.incumbent, (), 0)
        incumbent = setup.incumbent
        # Finished trials are not asked again on resume, so their boots are never replayed: charge them now.
        ctx.charge_recorded(Phase.SEARCH)
        setup.memory.add_boots(setup.store.load().boots)
        search = NumericSearch(setup.space, setup.store, study_name=setup.name, seed=setup.settings.seed,
                               techniques=incumbent.techniques)
        moves = search.around(incumbent.values, seed=setup.settings.seed)
        search.enqueue_around(incumbent.values, seed=setup.settings.seed)
        measured = known_results(search)
        sigma = setup.noise.sigma_boot if setup.noise else 0.1
        swept = search.study.user_attrs.get(SWEEP_ATTR)
        if not isinstance(swept, int):
            reserve = (1.0 - SWEEP_SHARE) * ctx.allowance_s()
            while search.trials_done() < min(len(moves), setup.settings.max_trials):
                ctx.check()
                if ctx.allowance_s() < max(reserve, ctx.boot_s()):
                    log.info("search: the sweep stops after %d trials to leave time for its A/Bs",
                             search.trials_done())
                    break
                next_trial(ctx, search, measured)
            swept = search.trials_done()
            search.study.set_user_attr(SWEEP_ATTR, swept)
        # the sweep's boots and, on resume, the A/B boots a killed run recorded, by tag
        boots = {b.tag: b for b in setup.store.load().boots if b.phase is Phase.SEARCH and b.tag is not None}
        decisions, incumbent = promote_sweep(ctx, search, incumbent, swept, sigma, boots)
        replayed, incumbent = replay_finished(ctx, search, incumbent, boots, after=swept)
        decisions += replayed
        while search.trials_done() < setup.settings.max_trials:
            ctx.check()
            if ctx.allowance_s() < ctx.boot_s():
                log.info("search: allowance spent after %d trials", search.trials_done())
                break
            booted = next_trial(ctx, search, measured)
            if (booted is not None and incumbent.throughput
                    and booted.candidate.key() != incumbent.candidate.key()
                    and math.log(booted.throughput / incumbent.throughput) > sigma
                    and ctx.allowance_s() > setup.policy.first_look_boots() * ctx.boot_s()):
                decision, incumbent = promote(ctx, incumbent, booted.candidate, booted.values, booted.number)
                decisions.append(decision)
        return SearchOutcome(incumbent, tuple(decisions), search.trials_done())


def next_trial(ctx: SearchContext, search: NumericSearch, measured: dict[str, list[float] | None]) -> Booted | None:
    """Ask the search for its next trial, boot it (unless a rule refuses it, the memory model predicts it misses
    the context target, or the same values were measured already) and tell the result; the boot when it measured a
    throughput on a feasible candidate."""
    proposal = search.ask()
    number = proposal.trial.number
    if proposal.candidate is None:
        log.info("trial %d refused by a coherence rule (no boot): %s", number, proposal.refused)
        search.tell(proposal, None, constraint=1.0)
        return None
    candidate = replace(proposal.candidate, label=f"trial-{number}")
    key = proposal_key(proposal.values)
    if key in measured:
        values = measured[key]
        search.tell(proposal, values, constraint=0.0 if values else 1.0)
        return None
    trial = boot_trial(ctx.boot, ctx.setup.memory, search, proposal, candidate, tag=f"search:{number}",
                       space=ctx.setup.space, context_target=ctx.setup.context_target)
    prediction, result = trial.prediction, trial.result
    if result is None:
        log.info("trial %d skipped without a boot: predicted KV pool %s < target %s (model error %.1f%%)",
                 number, f"{prediction.kv_tokens:,.0f}", f"{ctx.setup.context_target:,}",
                 100 * (prediction.relative_error or 0.0))
        return None
    measured[key] = trial.values
    tput = result.record.throughput_tok_s
    return Booted(number, dict(proposal.values), candidate, tput) if trial.values and tput else None


@dataclass(frozen=True)
class TrialBoot:
    """What one search trial's boot told the search: its objective values (``None`` when infeasible), constraint
    and failure, the boot (``None`` when the memory model skipped it), and the memory model's prediction before it."""

    values: list[float] | None
    constraint: float
    failure: Failure | None
    result: BootResult | None
    prediction: Prediction


def boot_trial(boot: Callable[[BootPlan], BootResult], memory: MemoryModel, search: NumericSearch,
               proposal: Proposal, candidate: Candidate, *, tag: str, space: SearchSpace,
               context_target: int | None) -> TrialBoot:
    """The trial step the single-GPU search and a worker share: skip ``candidate`` without a boot when ``memory``
    predicts its pool misses the context target (told infeasible by the predicted shortfall), else boot it with the
    probes, teach ``memory`` the pool it got (and how far its prediction was), and tell the search its values
    (``trial_values``)."""
    number = proposal.trial.number
    prediction = memory.predict(candidate.flags)
    if prediction.misses(context_target):
        memory.skipped += 1
        gap = (context_target or 0) - (prediction.kv_tokens or 0)
        constraint = max(1e-3, gap / max(1, context_target or 1))
        search.tell(proposal, None, constraint=constraint)
        return TrialBoot(None, constraint, None, None, prediction)
    result = boot(BootPlan(tag=tag, candidate=candidate, phase=Phase.SEARCH, arm=Arm.CANDIDATE, trial_number=number,
                           probes=True))
    report = result.record.report
    if report and report.max_total_num_tokens:
        if prediction.kv_tokens is not None:
            memory.prediction_errors.append(abs(prediction.kv_tokens - report.max_total_num_tokens)
                                            / report.max_total_num_tokens)
        memory.add(Observation(candidate.flags, report.max_total_num_tokens, report.max_running_requests))
    values, constraint, failure = trial_values(result, space=space, context_target=context_target)
    search.tell(proposal, values, constraint=constraint, failure=failure, boot_ids=(result.record.boot_id,))
    return TrialBoot(values, constraint, failure, result, prediction)

def told(search: NumericSearch, trial: FrozenTrial) -> tuple[dict[str, Any], bool]:
    """A finished trial's parameter values as the space reads them, and whether it was told feasible."""
    values = {p.name: p.coerce(trial.params[p.name]) for p in search.params if p.name in trial.params}
    return values, all(c <= 0 for c in constraint_values(trial)) and not trial.user_attrs.get("penalty_values")


def known_results(search: NumericSearch) -> dict[str, list[float] | None]:
    """Each finished trial's objective values by parameter set (None when infeasible): a later proposal repeating
    one is told the same result without a boot."""
    measured: dict[str, list[float] | None] = {}
    for trial in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.values is None:
            continue
        values, feasible = told(search, trial)
        measured[proposal_key(values)] = list(trial.values) if feasible else None
    return measured


def sweep_reference(incumbent: Incumbent, baseline: Candidate, sigma: float,
                    boots: Mapping[str, BootRecord]) -> tuple[float | None, float]:
    """What the sweep's moves must beat, and by how much (log): the incumbent's throughput by the boot noise
    ``sigma``; or, when the incumbent was kept by an A/B (its throughput that A/B's winning arm, biased up by the
    keep), the sweep's own boot of the incumbent's values by the noise of a difference of two boots, √2 · σ."""
    own = boots.get("search:0")
    if (incumbent.candidate.key() != baseline.key() and own is not None and own.throughput_tok_s
            and own.candidate.key() == incumbent.candidate.key()):
        return own.throughput_tok_s, math.sqrt(2.0) * sigma
    return incumbent.throughput, sigma


def swept_winners(search: NumericSearch, incumbent: Incumbent, swept: int, sigma: float,
                  boots: Mapping[str, BootRecord], baseline: Candidate) -> list[Booted]:
    """The sweep's feasible trials (numbered below ``swept``, their boots in ``boots`` by tag) whose boot beat the
    ``sweep_reference`` by more than its margin (never the incumbent's own values), fastest first."""
    reference, margin = sweep_reference(incumbent, baseline, sigma, boots)
    if not reference:
        return []
    winners = []
    for trial in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        record = boots.get(f"search:{trial.number}")
        values, feasible = told(search, trial)
        if (trial.number >= swept or record is None or trial.values is None or not record.throughput_tok_s
                or not feasible or record.candidate.key() == incumbent.candidate.key()):
            continue
        if math.log(record.throughput_tok_s / reference) > margin:
            winners.append(Booted(trial.number, values, record.candidate, record.throughput_tok_s))
    return sorted(winners, key=lambda b: (-b.throughput, b.number))


def promote_sweep(ctx: SearchContext, search: NumericSearch, incumbent: Incumbent, swept: int, sigma: float,
                  boots: Mapping[str, BootRecord]) -> tuple[list[DecisionRecord], Incumbent]:
    """A/B the sweep's winners best first, each move applied to the incumbent as it stands (a parameter a kept move
    changed is not moved again); returns the decisions and the incumbent after them. On resume the same order
    replays the recorded A/B boots by tag."""
    start = dict(incumbent.values)
    moved: set[str] = set()
    decisions: list[DecisionRecord] = []
    for winner in swept_winners(search, incumbent, swept, sigma, boots, ctx.setup.space.baseline()):
        change = {k: v for k, v in winner.values.items() if start.get(k) != v}
        if not change or moved & set(change):
            continue
        if ctx.allowance_s() <= ctx.setup.policy.first_look_boots() * ctx.boot_s():
            log.info("search: no time left to A/B the sweep's next winner (trial %d)", winner.number)
            break
        values = {**incumbent.values, **change}
        try:
            candidate = ctx.setup.space.candidate(values, list(incumbent.techniques), label=f"trial-{winner.number}")
        except (RuleViolation, DerivationError) as exc:
            log.info("trial %d's move does not apply to the incumbent: %s", winner.number, exc)
            continue
        decision, incumbent = promote(ctx, incumbent, candidate, values, winner.number)
        decisions.append(decision)
        if decision.kept is Kept.YES:
            moved |= set(change)
    return decisions, incumbent


def replay_finished(ctx: SearchContext, search: NumericSearch, incumbent: Incumbent,
                    boots: Mapping[str, BootRecord], *, after: int) -> tuple[list[DecisionRecord], Incumbent]:
    """On resume: what the sampler's trials (numbered from ``after``) a killed run finished had decided, since
    Optuna does not ask them again.

    A trial the killed run promoted (its A/B has recorded boots) is promoted again: the A/B replays its boots by
    tag and finishes if the kill cut it short, and a keep becomes the incumbent again, as it was before the kill.
    Returns the replayed decisions and the incumbent after them.
    """
    tags = [t for t in boots if isinstance(t, str)]
    decisions = []
    for trial in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        record = boots.get(f"search:{trial.number}")
        if trial.number < after or record is None or trial.values is None:
            continue
        values, feasible = told(search, trial)
        if feasible and any(t.startswith(f"search:{trial.number}:ab:") for t in tags):
            log.info("trial %d was promoted before the restart: replaying its A/B", trial.number)
            candidate = replace(record.candidate, label=f"trial-{trial.number}")
            decision, incumbent = promote(ctx, incumbent, candidate, values, trial.number)
            decisions.append(decision)
    return decisions, incumbent


def trial_values(result: BootResult, *, space: SearchSpace, context_target: int | None
                 ) -> tuple[list[float] | None, float, Failure | None]:
    """A search boot's objective values (None when infeasible), its constraint value and its failure.

    The constraint is 0 for a feasible boot, the KV pool's shortfall as a fraction of ``context_target`` when the
    pool misses it, and 1 for a failed boot, a quality regression or a boot without a throughput.
    """
    sample, record = result.sample, result.record
    if sample.failed is not None:
        return None, 1.0, sample.failed
    if sample.quality_passed is False:
        return None, 1.0, None
    kv = sample.kv_pool_tokens
    if context_target and kv is not None and kv < context_target:
        return None, (context_target - kv) / context_target, None
    if record.throughput_tok_s is None:
        return None, 1.0, None
    values = []
    for objective in space.objectives or ():
        metric = objective.metric
        if metric.startswith("ttft"):
            ttft = record.ttft_p50_s()
            values.append(ttft if ttft is not None else 1e9)
        elif metric in ("kv_pool_tokens", "max_total_num_tokens"):
            values.append(float(kv or 0))
        else:
            values.append(record.throughput_tok_s)
    return values or [record.throughput_tok_s], 0.0, None


def promote(ctx: SearchContext, incumbent: Incumbent, candidate: Candidate, values: Mapping[str, Any],
            number: int) -> tuple[DecisionRecord, Incumbent]:
    """A/B a search trial that beat the incumbent's boot noise; returns the decision and the incumbent after it
    (the candidate when kept, handed to ``ctx.keep`` at once)."""
    log.info("trial %d beats the incumbent by more than the boot noise: confirming through the A/B gate", number)
    ab, ids = ctx.ab(candidate, tag=f"search:{number}", phase=Phase.SEARCH, technique=candidate.label,
                     seed=1000 + number, trial=number)
    # Not in the night's false-keep family: a search keep is a step of the search, and the final incumbent
    # must still beat the original baseline on fresh boots in the confirmation A/B before it is recommended.
    decision = search_decision(ab, ids, study=ctx.setup.name, number=0, technique=f"search trial {number}",
                               incumbent=incumbent.candidate, candidate=candidate)
    recorded = ctx.decide(decision, trials=(number,))
    if recorded.kept is Kept.YES:
        incumbent = Incumbent(dict(values), list(incumbent.techniques), candidate,
                              arm_mean(ab, Arm.CANDIDATE) or incumbent.throughput)
        ctx.keep(incumbent)
    return recorded, incumbent


def search_decision(ab: ABResult, ids: Mapping[Arm, Sequence[str]], *, study: str, number: int, technique: str,
                    incumbent: Candidate, candidate: Candidate, verdict: Verdict | None = None) -> DecisionRecord:
    """The search phase's record of one A/B of ``candidate`` against ``incumbent`` (its flags' change, verdict,
    result and boots per arm), decided now; ``verdict`` replaces the A/B's own (as the night's false-keep control
    reviewed it)."""
    return DecisionRecord(study=study, number=number, phase=Phase.SEARCH, technique=technique,
                          flags_delta={k: v for k, v in candidate.flags.items() if incumbent.flags.get(k) != v},
                          incumbent_key=incumbent.key(), candidate_key=candidate.key(),
                          verdict=verdict or ab.verdict,
                          ab_result=ab.to_dict(), boots_incumbent=tuple(ids[Arm.INCUMBENT]),
                          boots_candidate=tuple(ids[Arm.CANDIDATE]), decided_at=time.time())


def undecided_moves(setup: SearchSetup) -> tuple[OpenMove, ...]:
    """The search's moves no A/B decided: the ``swept_winners`` among all its finished trials (a boot that beat
    ``sweep_reference``) that no decision of the study judged (a phase that ran out of time mid-A/B, or before it),
    best first. Each carries how many moves the search booted (feasible, other than the incumbent's values), the
    field it was the best of."""
    incumbent = setup.incumbent
    history = setup.store.load()
    boots = {b.tag: b for b in history.boots if b.phase is Phase.SEARCH and b.tag is not None}
    if not setup.space.parameters or not incumbent.throughput or not any(t.startswith("search:") for t in boots):
        return ()
    search = NumericSearch(setup.space, setup.store, study_name=setup.name, seed=setup.settings.seed,
                           techniques=incumbent.techniques)
    sigma = setup.noise.sigma_boot if setup.noise else 0.1
    trials = search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    booted = {record.candidate.key() for trial in trials if (record := boots.get(f"search:{trial.number}"))
              and trial.values is not None and record.throughput_tok_s and told(search, trial)[1]
              and record.candidate.key() != incumbent.candidate.key()}
    decided = {d.candidate_key for d in history.decisions}
    winners = swept_winners(search, incumbent, len(search.study.trials), sigma, boots, setup.space.baseline())
    return tuple(OpenMove(w.number, dict(w.values), replace(w.candidate, label=f"trial-{w.number}"), w.throughput,
                          len(booted), boots[f"search:{w.number}"].boot_id)
                 for w in winners if w.candidate.key() not in decided)
