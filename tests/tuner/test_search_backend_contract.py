"""The ``SearchBackend`` contract, run against every backend: ``LocalSearch`` (this GPU) and ``FleetSearch`` (one
worker per simulated GPU), on real simulated boots, each through the ``SearchContext`` a ``Night`` builds.

A backend searches around the context's incumbent and returns what it ended with: the night's incumbent (kept
current, so a phase cut short leaves it right), which is the given one or the candidate of one of its KEEP
decisions; its decisions, numbered after the night's earlier ones and stored in the night's history, all of the
search phase; the trials it finished. A space without numeric parameters is searched without a boot. A night whose
budget is spent stops the backend (``StopStudy``) before it boots anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.records import Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.tuner.ab.gate import GatePolicy
from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.fleet.fleet_search import FleetSearch
from elsa_tune.tuner.flow.budget import Budget
from elsa_tune.tuner.flow.night import Night, StopStudy, StudyClock
from elsa_tune.tuner.flow.preflight import Preflight, run_preflight
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.signals import Interrupts
from elsa_tune.tuner.search.context import NightSearch
from elsa_tune.tuner.search.phase import LocalSearch, SearchBackend

SPACE = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"
NO_PARAMETERS = """\
schema_version: 1
name: tiny-fixed
model: {path: tiny-hybrid, hybrid_mamba: true, speculative_head: true, context_target: 1500}
runtime: {command: [python, -m, sglang.launch_server], version: "0.5.23"}
base:
  flags: {speculative-algorithm: EAGLE, speculative-eagle-topk: 1, max-mamba-cache-size: 24,
          speculative-num-steps: 2, speculative-num-draft-tokens: 3}
objectives: [{metric: output_throughput, direction: maximize}]
guardrails: {min_context_tokens: 1500, quality_gate: true}
probes: {headroom_floor_mib: 64, probe_timeout_s: 60, hang_s: 20, boot_timeout_s: 60}
"""

Backends = Callable[[], SearchBackend]
BACKENDS = [pytest.param(LocalSearch, id="local"),
            pytest.param(lambda: FleetSearch(["0", "1"], heartbeat_s=1, grace_s=4, stop_grace_s=10.0), id="fleet")]


def _night(tmp_path: Path, space: Path, **overrides: object) -> Night:
    """A night as ``Study`` builds it, in its search phase, with a gate policy as its baseline would set."""
    values: dict[str, object] = {"gpu": "sim", "sim_profile": "tiny-test", "space": str(space), "traffic": "demo",
                                 "budget_s": 900.0, "out": tmp_path / "runs" / "study", "sim_speedup": 60.0,
                                 "baseline_boots": 3, "seed": 2, "max_trials": 1, "looks": (2,)}
    values.update(overrides)
    pre: Preflight = run_preflight(Settings(**values), card_dir=tmp_path / "card",  # type: ignore[arg-type]
                                   harvest_flags=False)
    clock = StudyClock()
    store = StudyStore(pre.settings.run_dir, name=pre.settings.study_name, heartbeat_interval=None)
    store.reconcile()
    night = Night(pre, store=store, budget=Budget(pre.settings.budget_s, clock=clock.now), clock=clock,
                  view=StudyView(live=False), interrupts=Interrupts(), on_decision=lambda: None)
    night.policy = GatePolicy(looks=(2,))
    night.decision_number = 3                # decisions of the earlier phases
    night.budget.begin("search")
    return night


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_search_returns_the_incumbent_it_kept_and_the_decisions_it_recorded(backend: Backends,
                                                                                tmp_path: Path) -> None:
    night = _night(tmp_path, SPACE, max_trials=4)
    # A baseline measured at a tenth of what the card does: every trial beats it by more than the boot noise, so a
    # backend that promotes on this GPU's numbers (``LocalSearch``) records A/B decisions (trial 0 is the incumbent's
    # own values, never promoted: the next ones are).
    given = night.incumbent = replace(night.incumbent, throughput=50.0)
    search = backend()
    outcome = search.run(NightSearch(night))
    assert outcome.trials >= 1
    assert outcome.decisions or not isinstance(search, LocalSearch)
    assert outcome.incumbent is night.incumbent
    kept = {d.candidate_key for d in outcome.decisions if d.kept is Kept.YES}
    assert outcome.incumbent.candidate.key() in {given.candidate.key(), *kept}
    assert [d.number for d in outcome.decisions] == list(range(4, 4 + len(outcome.decisions)))
    assert all(d.phase is Phase.SEARCH for d in outcome.decisions)
    stored = {(d.number, d.technique, d.candidate_key, d.kept) for d in night.store.load().decisions}
    assert {(d.number, d.technique, d.candidate_key, d.kept) for d in outcome.decisions} <= stored


def test_the_incumbents_own_values_are_never_put_through_an_a_b_against_it(tmp_path: Path) -> None:
    """The search is seeded with the incumbent's values (trial 0): however well its boot does, that is a boot of the
    incumbent, and an A/B of it against itself can only spend the night (a fleet's workers skip it the same way,
    ``Worker._maybe_promote``)."""
    night = _night(tmp_path, SPACE)                  # one trial: the incumbent's values
    night.incumbent = replace(night.incumbent, throughput=50.0)
    outcome = LocalSearch().run(NightSearch(night))
    assert outcome.trials == 1 and outcome.decisions == ()
    assert not [d for d in night.store.load().decisions if d.phase is Phase.SEARCH]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_space_without_parameters_is_searched_without_a_boot(backend: Backends, tmp_path: Path) -> None:
    space = tmp_path / "fixed.yaml"
    space.write_text(NO_PARAMETERS)
    night = _night(tmp_path, space)
    outcome = backend().run(NightSearch(night))
    assert (outcome.incumbent, outcome.decisions, outcome.trials) == (night.incumbent, (), 0)
    assert night.booter.boots == 0 and not (night.store.run_dir / "fleet.json").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_spent_budget_stops_the_search_before_any_boot(backend: Backends, tmp_path: Path) -> None:
    night = _night(tmp_path, SPACE)
    night.clock.advance(night.budget.total_s)
    with pytest.raises(StopStudy):
        backend().run(NightSearch(night))
    assert night.booter.boots == 0 and not list(night.store.run_dir.glob("*-gpu*/boots/*"))


def test_the_context_numbers_adopted_decisions_after_the_nights_and_hands_a_keep_to_the_night(tmp_path: Path) -> None:
    night = _night(tmp_path, SPACE)
    ctx = NightSearch(night)
    worker = DecisionRecord(study="shared", number=1, phase=Phase.SEARCH, technique="search trial 0 (GPU 1)",
                            skipped="already measured", decided_at=1.0)
    adopted = ctx.decide(worker, ledgered=True)    # a worker's decision: numbered and stored, not ledgered again
    assert (adopted.number, adopted.study, night.decision_number) == (4, night.name, 4)
    assert [(d.number, d.technique) for d in night.store.load().decisions] == [(4, "search trial 0 (GPU 1)")]
    assert night.store.ledger.entries() == []
    started = night.incumbent
    kept = replace(started, throughput=123.0)
    ctx.keep(kept)
    assert night.incumbent is kept and ctx.setup.incumbent is started
    night.policy = None
    with pytest.raises(RuntimeError, match="gate policy"):
        NightSearch(night)
