"""The numeric search: incumbent first, derived flags and rules before sampling, failures as constraints."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from elsa_tune.history.store import StudyStore, constraint_values
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.loader import load_space
from elsa_tune.tuner.search.optuna_search import NumericSearch, distribution, proposal_key

SPACE = "qwen3.8-27b-nvfp4-rtx5090"


@pytest.fixture()
def search(tmp_path: Path) -> NumericSearch:
    store = StudyStore(tmp_path / "run", name="t", heartbeat_interval=None)
    return NumericSearch(load_space(SPACE), store, study_name="t", seed=3, n_startup_trials=3)


def test_the_incumbent_is_the_first_trial(search: NumericSearch) -> None:
    values = {**search.space.baseline_values(), "mem-fraction-static": 0.95}
    search.enqueue(values)
    first = search.ask()
    assert first.values == values
    assert first.candidate is not None and first.candidate.flags["mem-fraction-static"] == 0.95


def test_proposals_carry_derived_flags_and_obey_the_rules(search: NumericSearch) -> None:
    for _ in range(8):
        proposal = search.ask()
        if proposal.candidate is None:
            assert proposal.refused
            search.tell(proposal, None, constraint=1.0)
            continue
        flags = proposal.candidate.flags
        assert flags["speculative-num-draft-tokens"] == flags["speculative-num-steps"] + 1
        assert flags["max-mamba-cache-size"] == 8 * flags["max-running-requests"]
        assert search.space.check(proposal.candidate) == []
        search.tell(proposal, [100.0 + proposal.values["speculative-num-steps"]])


def test_a_crash_is_a_constraint_violation_not_a_failed_trial(search: NumericSearch) -> None:
    good = search.ask()
    search.tell(good, [150.0])
    bad = search.ask()
    search.tell(bad, None, failure=Failure(FailureKind.OOM_UNDER_LOAD, "CUDA out of memory", "lower the fraction"))
    trials = search.study.get_trials(deepcopy=False)
    crashed = next(t for t in trials if t.number == bad.trial.number)
    assert crashed.state is optuna.trial.TrialState.COMPLETE      # the sampler sees it ...
    assert constraint_values(crashed)[0] > 0                       # ... as infeasible
    assert crashed.values == [-math.inf]                           # unreachable, never a made-up measurement
    best = search.best_feasible()
    assert best is not None and best.number == good.trial.number


def test_resume_continues_the_same_optuna_study(tmp_path: Path) -> None:
    space = load_space(SPACE)
    first = NumericSearch(space, StudyStore(tmp_path / "run", name="t", heartbeat_interval=None), study_name="t",
                          seed=1)
    p = first.ask()
    first.tell(p, [123.0])
    again = NumericSearch(space, StudyStore(tmp_path / "run", name="t", heartbeat_interval=None), study_name="t",
                          seed=1)
    again.enqueue(space.baseline_values())          # ignored: the study already has trials
    assert again.trials_done() == 1
    assert proposal_key(p.values) in again.seen_keys()


def test_every_parameter_has_a_distribution() -> None:
    for p in load_space(SPACE).parameters:
        dist = distribution(p)
        assert dist.single() is False


def test_the_search_looks_one_move_away_along_every_parameter_before_it_samples(search: NumericSearch) -> None:
    """After the incumbent, each trial changes exactly one parameter to a neighbouring value, until every such move
    was asked; a second ``enqueue_around`` on a study with trials queues nothing (resume)."""
    start = search.space.baseline_values()
    queued = search.enqueue_around(start, seed=4)
    expected = {(p.name, repr(v)) for p in search.space.parameters for v in p.neighbours(start[p.name])}
    assert queued == 1 + len(expected) and len(expected) >= len(search.space.parameters)
    first = search.ask()
    assert first.values == start
    search.tell(first, [1.0])
    seen = set()
    for _ in range(len(expected)):
        proposal = search.ask()
        changed = [(k, repr(v)) for k, v in proposal.values.items() if v != start[k]]
        assert len(changed) == 1, changed
        seen.add(changed[0])
        search.tell(proposal, [1.0] if proposal.candidate is not None else None,
                    constraint=0.0 if proposal.candidate is not None else 1.0)
    assert seen == expected
    assert search.enqueue_around(start, seed=4) == 0


def test_a_parameters_neighbours_are_the_next_values_on_its_grid() -> None:
    from elsa_tune.search_spaces.parameter import Parameter, ParameterKind

    lattice = Parameter(name="m", kind=ParameterKind.FLOAT, baseline=0.9, low=0.86, high=0.94, step=0.04,
                        flag="mem-fraction-static")
    assert lattice.neighbours(0.9) == (0.86, 0.94) and lattice.neighbours(0.86) == (0.9,)
    slots = Parameter(name="r", kind=ParameterKind.INT, baseline=16, low=8, high=64, log=True,
                      flag="max-running-requests")
    below, above = slots.neighbours(16)
    assert 8 <= below < 16 < above <= 64
    choice = Parameter(name="c", kind=ParameterKind.CATEGORICAL, baseline=8192, choices=(1024, 4096, 8192),
                       flag="chunked-prefill-size")
    assert choice.neighbours(8192) == (1024, 4096)
