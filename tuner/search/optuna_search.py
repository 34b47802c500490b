"""``NumericSearch``: Optuna's search over the space's numeric parameters, around the incumbent.

Ask-and-tell around boots, through the study store (``history/store.py``) so every trial survives a
SIGKILL. The incumbent is enqueued first, so the sampler starts from what the earlier phases proved, then (on the
single-GPU search) each of its one-parameter moves (``enqueue_around``).
Derived flags (draft tokens = steps + 1, Mamba slots = requests × 8) are computed by the space, never
sampled, and a sampled point that still breaks a coherence rule is told as infeasible without a boot.
Crashed, OOM and context-missing candidates are told COMPLETE with a positive constraint
(``constraints_func``): Optuna's samplers ignore FAIL trials and would walk off the same cliff again.

One objective → TPE (multivariate, seeded); several objectives in the space → NSGA-II, both constrained.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import ExperimentalWarning

from elsa_tune.errors import ConfigError
from elsa_tune.history.store import StudyStore, constraint_values
from elsa_tune.runtime.failure import Failure
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.parameter import Parameter, ParameterKind
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import Objective, SearchSpace

log = logging.getLogger(__name__)

_NATIVE = hasattr(optuna.trial.Trial, "set_constraint")

#: Objective metric names the study can measure per boot, with the direction that is better.
METRICS: Mapping[str, str] = {
    "output_throughput": "maximize", "output_throughput_tok_s": "maximize",
    "ttft_p50": "minimize", "ttft_p50_s": "minimize", "ttft": "minimize",
    "kv_pool_tokens": "maximize", "max_total_num_tokens": "maximize",
}


def distribution(p: Parameter) -> BaseDistribution:
    """The Optuna distribution of one search-space parameter."""
    if p.kind is ParameterKind.BOOL:
        return CategoricalDistribution((False, True))
    if p.kind is ParameterKind.CATEGORICAL:
        return CategoricalDistribution(tuple(p.choices))
    assert p.low is not None and p.high is not None
    if p.kind is ParameterKind.INT:
        return IntDistribution(int(p.low), int(p.high), log=p.log, step=1 if p.log else int(p.step or 1))
    return FloatDistribution(float(p.low), float(p.high), log=p.log and not p.step,
                             step=None if p.log else p.step)


def directions(objectives: Sequence[Objective]) -> list[str]:
    """Optuna directions for the space's objectives (throughput alone when none is declared)."""
    if not objectives:
        return ["maximize"]
    out = []
    for o in objectives:
        if o.metric not in METRICS:
            raise ConfigError(f"objective metric {o.metric!r} is not something a boot measures",
                              remedy=f"use one of: {', '.join(sorted(METRICS))}")
        out.append(o.direction)
    return out


@dataclass(frozen=True)
class Proposal:
    """A trial's sampled parameter values and its candidate (``None`` with ``refused`` when a rule forbids it)."""

    trial: optuna.Trial
    values: Mapping[str, Any]
    candidate: Candidate | None
    refused: str = ""


class NumericSearch:
    """The Optuna study of one run directory's numeric search (named ``<study>:search``)."""

    def __init__(self, space: SearchSpace, store: StudyStore, *, study_name: str, seed: int,
                 techniques: Sequence[str] = (), n_startup_trials: int = 6) -> None:
        self.space = space
        self.store = store
        self.techniques = tuple(techniques)
        self.params = [p for p in space.parameters]
        self.distributions = {p.name: distribution(p) for p in self.params}
        dirs = directions(space.objectives)
        # Optuna >= 5 reads the constraint the store sets on the trial itself; older versions need the function.
        constrained: dict[str, Any] = {} if _NATIVE else {"constraints_func": constraint_values}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            sampler: optuna.samplers.BaseSampler
            if len(dirs) > 1:
                sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=8, **constrained)
            else:
                sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=n_startup_trials,
                                                     **constrained)
        self.study = store.create_or_load_study(f"{study_name}:search", dirs, sampler,
                                                metric_names=[o.metric for o in self.objectives])
        self.directions = dirs

    @property
    def objectives(self) -> tuple[Objective, ...]:
        return self.space.objectives or (Objective(metric="output_throughput", direction="maximize"),)

    def trials_done(self) -> int:
        return len([t for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()])

    def seen_keys(self) -> set[str]:
        """Parameter sets already finished (a proposal repeating one is told the same result, no boot)."""
        return {_key(t.params) for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}

    def enqueue(self, values: Mapping[str, Any]) -> None:
        """Queue ``values`` (the incumbent) as the next trial, unless the study already has trials (resume)."""
        self._enqueue([self._point(values)])

    def enqueue_around(self, values: Mapping[str, Any], *, seed: int) -> int:
        """Queue ``values`` (the incumbent), then each of its one-parameter moves (``Parameter.neighbours``) in a
        seeded order, unless the study already has trials (resume); returns how many were queued.

        A trial's boot is one noisy sample, so the search first looks one move away along every parameter from what
        the earlier phases proved, where a single change's effect shows alone, before the sampler models the space;
        random joint draws change several parameters at once and rarely isolate the one that pays.
        """
        return self._enqueue(self.around(values, seed=seed))

    def around(self, values: Mapping[str, Any], *, seed: int) -> list[dict[str, Any]]:
        """``values`` (the incumbent's, as far as the search has them) and then each of its one-parameter moves in
        a seeded order: what ``enqueue_around`` queues, computed again alike on resume."""
        start = self._point(values)
        moves = [{**start, p.name: v} for p in self.params if p.name in start for v in p.neighbours(start[p.name])]
        random.Random(seed).shuffle(moves)
        return [start, *moves]

    def _point(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k in self.distributions}

    def _enqueue(self, points: Sequence[Mapping[str, Any]]) -> int:
        """Queue ``points`` in order (a repeated one once), unless the study already has trials; how many queued."""
        if self.study.get_trials(deepcopy=False):
            return 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for point in points:
                self.study.enqueue_trial(dict(point), skip_if_exists=True)
        return len(points)

    def ask(self) -> Proposal:
        trial = self.store.ask(self.study)
        values: dict[str, Any] = {}
        for p in self.params:
            values[p.name] = p.coerce(_suggest(trial, p.name, self.distributions[p.name]))
        try:
            candidate = self.space.candidate(values, self.techniques)
        except (RuleViolation, DerivationError) as exc:
            return Proposal(trial, values, None, refused=str(exc))
        return Proposal(trial, values, candidate)

    def tell(self, proposal: Proposal, values: Sequence[float] | None, *, constraint: float = 0.0,
             failure: Failure | None = None, boot_ids: Sequence[str] = ()) -> None:
        self.store.record_trial_result(self.study, proposal.trial, values=values, constraint=constraint,
                                       failure=failure, boot_ids=boot_ids)

    def withdraw(self, proposal: Proposal, why: str) -> None:
        """End an asked trial that was never booted (its worker is stopping) as FAIL with ``why``; a told one is
        left as it is."""
        running = {t.number for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
        if proposal.trial.number in running:
            proposal.trial.set_user_attr("withdrawn", why)
            self.study.tell(proposal.trial, state=optuna.trial.TrialState.FAIL)

    def best_feasible(self) -> optuna.trial.FrozenTrial | None:
        """The best told trial that satisfied every constraint (first objective for multi-objective)."""
        done = [t for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.values is not None and all(c <= 0 for c in constraint_values(t))]
        if not done:
            return None
        sign = 1.0 if self.directions[0] == "maximize" else -1.0
        best: optuna.trial.FrozenTrial = max(done, key=lambda t: sign * float(t.values[0]))
        return best


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    assert isinstance(dist, CategoricalDistribution)
    return trial.suggest_categorical(name, dist.choices)


def _key(params: Mapping[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in params.items()))


def proposal_key(values: Mapping[str, Any]) -> str:
    return _key(values)
