"""The phases of a study on the tiny simulated card: a resumed search spends the budget the killed run spent and
replays the promotions its finished trials made; a memory technique that buys no KV pool is rejected at its
screening boot without an A/B."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import pytest

from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.reasons import pct
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.search_spaces.space import TechniqueKind
from elsa_tune.tuner.ab.gate import GatePolicy
from elsa_tune.tuner.ab.multiplicity import combined_p, second_stage_level
from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.flow.booter import BootPlan
from elsa_tune.tuner.flow.budget import Budget
from elsa_tune.tuner.flow.night import (
    Night,
    OpenTest,
    OpenWork,
    PhaseOver,
    PhaseResult,
    QueuedTechnique,
    StudyClock,
)
from elsa_tune.tuner.flow.preflight import Preflight, run_preflight
from elsa_tune.tuner.flow.screening import Screening
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.signals import Interrupts
from elsa_tune.tuner.search.context import NightSearch
from elsa_tune.tuner.search.phase import LocalSearch

TINY_SPACE = Path(__file__).parents[1] / "e2e" / "data" / "tiny-space.yaml"

MEMORY_TECHNIQUES = """
  smaller-static-pool:
    kind: memory
    rationale: a memory technique that gives KV pool back instead of buying it
    flags: {mem-fraction-static: 0.65}
  larger-static-pool:
    kind: memory
    rationale: a memory technique that buys KV pool
    flags: {mem-fraction-static: 0.7}
"""


def _preflight(tmp_path: Path, space: Path, **overrides: object) -> Preflight:
    values: dict[str, object] = {"gpu": "sim", "sim_profile": "tiny-test", "space": str(space), "traffic": "demo",
                                 "budget_s": 600.0, "out": tmp_path / "runs" / "study", "sim_speedup": 60.0,
                                 "baseline_boots": 3, "seed": 1}
    values.update(overrides)
    return run_preflight(Settings(**values), card_dir=tmp_path / "card")  # type: ignore[arg-type,unused-ignore]


def _night(pre: Preflight) -> Night:
    """A night as ``Study`` builds it (a fresh store, clock and budget over the same run folder)."""
    clock = StudyClock()
    store = StudyStore(pre.settings.run_dir, name=pre.settings.study_name, heartbeat_interval=None)
    store.reconcile()
    return Night(pre, store=store, budget=Budget(pre.settings.budget_s, clock=clock.now), clock=clock,
                 view=StudyView(live=False), interrupts=Interrupts(), on_decision=lambda: None)


def test_a_phase_result_changes_only_what_it_sets_and_adds_its_notes_in_order(tmp_path: Path) -> None:
    from elsa_tune.history.study_record import Confirmation, ConfirmationStatus

    night = _night(_preflight(tmp_path, TINY_SPACE))
    incumbent = night.incumbent
    night.apply(PhaseResult(notes=("first",), open=OpenWork(freeing="larger-static-pool")))
    night.apply(PhaseResult(notes=("second",), policy=GatePolicy(looks=(2,))))
    assert night.notes == ["first", "second"] and night.open == OpenWork(freeing="larger-static-pool")
    assert night.incumbent is incumbent and night.noise is None and night.confirmation is None
    assert night.policy is not None and night.policy.looks == (2,)
    confirmed = Confirmation(ConfirmationStatus.NOT_NEEDED, "nothing beat the baseline")
    night.apply(PhaseResult(confirmation=confirmed, incumbent=replace(incumbent, throughput=2.0)))
    assert night.confirmation == confirmed and night.incumbent.throughput == 2.0
    assert night.open.freeing == "larger-static-pool" and night.notes == ["first", "second"]


def test_a_resumed_search_charges_the_trials_the_killed_run_finished(tmp_path: Path) -> None:
    pre = _preflight(tmp_path, TINY_SPACE, max_trials=1)
    first = _night(pre)
    first.policy = GatePolicy()              # the baseline's, as the search phase always has one
    first.budget.begin("search")
    done = LocalSearch().run(NightSearch(first))
    assert done.trials == 1 and not done.decisions
    recorded = [b for b in first.store.load().boots if b.phase is Phase.SEARCH]
    assert len(recorded) == 1
    spent = sum(b.seconds for b in recorded)
    assert spent > 0

    resumed = _night(pre)            # the killed study restarts: its trial is finished, not asked again
    resumed.policy = GatePolicy()
    resumed.budget.begin("search")
    again = LocalSearch().run(NightSearch(resumed))
    assert again.trials == 1 and resumed.booter.boots == 0
    assert resumed.budget.elapsed_s >= spent
    assert resumed.budget.elapsed_s < spent + 10.0      # charged once, not per phase or per look-up
    # A recorded boot charged up front and replayed later is not charged twice.
    before = resumed.clock.now()
    replay = resumed.boot(BootPlan(tag="search:0", candidate=recorded[0].candidate, phase=Phase.SEARCH,
                                   trial_number=0, probes=True))
    assert replay.reused
    assert resumed.clock.now() - before < recorded[0].seconds


@pytest.fixture()
def memory_space(tmp_path: Path) -> Path:
    text = TINY_SPACE.read_text().replace("\nobjectives:", MEMORY_TECHNIQUES.rstrip("\n") + "\n\nobjectives:", 1)
    path = tmp_path / "tiny-memory.yaml"
    path.write_text(text)
    return path


def test_a_memory_technique_without_memory_gain_is_rejected_at_its_screening_boot(tmp_path: Path,
                                                                                   memory_space: Path) -> None:
    # The incumbent runs at mem-fraction-static 0.7; the technique at 0.65 gives KV pool back.
    pre = _preflight(tmp_path, memory_space)
    night = _night(pre)
    values = {**night.incumbent.values, "mem-fraction-static": 0.7}
    incumbent = replace(night.incumbent, values=values, candidate=night.space.candidate(values, [], label="incumbent"))
    night.apply(PhaseResult(incumbent=incumbent))
    incumbent_boot = night.boot(BootPlan(tag="baseline:0", candidate=night.incumbent.candidate,
                                         phase=Phase.BASELINE, probes=True))
    decisions: list[DecisionRecord] = []
    night.on_decision = lambda: decisions.append(night.store.load().decisions[-1])
    screening = Screening(night)
    techniques = {t.name: (i, t) for i, t in enumerate(night.space.techniques)}
    index, smaller = techniques["smaller-static-pool"]
    assert smaller.kind is TechniqueKind.MEMORY

    screening.screen(index, smaller)
    assert len(decisions) == 1 and night.booter.boots == 2         # the incumbent's boot, one screening boot
    decision = decisions[0]
    assert decision.kept is Kept.NO and decision.verdict is not None and decision.ab_result is None, decision
    assert decision.verdict.pool is not None
    pool, before = decision.verdict.pool.kv_pool, decision.verdict.pool.incumbent_kv_pool
    assert pool < before
    assert decision.result == f"{pct(pool / before)} KV pool ({pool:,} vs {before:,} tokens), no memory gain"
    assert decision.result.startswith("−")

    # Against the smaller pool (now the incumbent, its pool read from its recorded boot) 0.7 is a memory gain:
    # the A/B decides, and speed techniques are never asked about the pool.
    smaller_candidate = night.space.candidate(values, ["smaller-static-pool"], label="smaller")
    night.apply(PhaseResult(incumbent=replace(incumbent, candidate=smaller_candidate)))
    assert screening.incumbent_pool() == pool
    _, larger = techniques["larger-static-pool"]
    assert screening.no_memory_gain(larger, incumbent_boot) is None
    speed = next(t for t in night.space.techniques if t.kind is TechniqueKind.SPEED)
    night.apply(PhaseResult(incumbent=incumbent))
    assert screening.no_memory_gain(speed, incumbent_boot) is None
    assert screening.no_memory_gain(larger, incumbent_boot) is not None     # equal pools: no gain either


@pytest.mark.slow
def test_a_resumed_search_replays_the_promotion_a_finished_trial_made(tmp_path: Path) -> None:
    pre = _preflight(tmp_path, TINY_SPACE, max_trials=4)
    policy = GatePolicy(looks=(2, 3), replicates=2000)

    def night() -> Night:
        n = _night(pre)
        n.policy = policy
        # any measured trial but trial 0 (the incumbent's own values) goes to the A/B
        n.apply(PhaseResult(incumbent=replace(n.incumbent, throughput=1.0)))
        n.budget.begin("search")
        return n

    first = night()
    done = LocalSearch().run(NightSearch(first))
    assert done.decisions and done.decisions[0].technique != "search trial 0"
    number = done.decisions[0].technique.removeprefix("search trial ")
    booted = {b.boot_id for b in first.store.load().boots}
    ab = [b for b in first.store.load().boots if (b.tag or "").startswith(f"search:{number}:ab:")]
    assert len(ab) >= 4

    resumed = night()                        # the restart: the finished trials are not asked again
    again = LocalSearch().run(NightSearch(resumed))
    assert {b.boot_id for b in resumed.store.load().boots} == booted          # every A/B boot replayed, none new
    assert len(again.decisions) == len(done.decisions)
    before, after = done.decisions[0], again.decisions[0]
    assert after.number == before.number and after.kept is before.kept and after.result == before.result
    assert after.boots_incumbent == before.boots_incumbent and after.boots_candidate == before.boots_candidate
    assert again.incumbent.candidate.key() == done.incumbent.candidate.key()


def test_a_winner_never_probed_here_is_probed_before_its_confirmation(tmp_path: Path) -> None:
    """A winner another GPU's worker found (``--gpu 0,1``) has no probed boot in the lead's process: the lead runs
    its probes and quality gate on its own card before the confirmation A/B, and a winner that fails them there
    leaves the baseline as the recommendation."""
    from elsa_tune.tuner.flow.study import Study

    pre = _preflight(tmp_path, TINY_SPACE)
    study = Study(pre, with_plots=False)
    night = study.night
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    winner = pre.space.candidate({**pre.space.baseline_values(), "max-running-requests": 3}, [], label="trial-7")
    assert night.booter.quality.get(winner.key()) is None
    assert study._probe_winner(winner)
    assert night.booter.quality[winner.key()] is True
    probed = [b for b in study.store.load().boots if b.tag == "confirmation:probe"]
    assert len(probed) == 1 and probed[0].probes and probed[0].candidate.key() == winner.key()
    assert study._probe_winner(winner)                        # probed once: not booted again
    assert len([b for b in study.store.load().boots if b.tag == "confirmation:probe"]) == 1


def test_a_resumed_night_knows_what_its_probed_boots_found(tmp_path: Path) -> None:
    """A killed search's trial was probed in its ``search:N`` boot, which the resumed study never replays: its
    replayed A/B boots must still carry that quality verdict, or a keep would become inconclusive on resume."""
    pre = _preflight(tmp_path, TINY_SPACE)
    first = _night(pre)
    first.boot(BootPlan(tag="baseline:0", candidate=first.baseline, phase=Phase.BASELINE, probes=True))
    trial = pre.space.candidate({**pre.space.baseline_values(), "max-running-requests": 3}, [], label="trial-3")
    first.boot(BootPlan(tag="search:3", candidate=trial, phase=Phase.SEARCH, trial_number=3, probes=True))
    assert first.booter.quality[trial.key()] is True
    resumed = _night(pre)
    assert resumed.booter.quality.get(trial.key()) is True and resumed.booter.boots == 0


def _promising(night: Night, name: str) -> OpenTest:
    """A technique as the night files it after an inconclusive first test whose interval showed a gain."""
    from elsa_tune.history.verdict import Decision, NightControl, Verdict

    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == name)
    first = Verdict(decision=Decision.INCONCLUSIVE, reason="+20.0% throughput (p = 0.0200 ≤ 0.0410 at look 3); but "
                    "after false-keep control (lond online, test 9 at level 0.0075) its adjusted p 0.2667 exceeds "
                    "0.10: the incumbent stays", effect=1.20, ci_low=1.08, ci_high=1.33, p_value=0.02,
                    boots_incumbent=6, boots_candidate=6, adjusted_p_value=0.2667,
                    night_control=NightControl(method="lond online, test 9 at level 0.0075", level=0.10, held=True))
    return OpenTest(index, technique, first)


def test_a_promising_inconclusive_technique_is_retested_with_fresh_boots(tmp_path: Path) -> None:
    """The retest is a second, independent test: its own boots (``:retest`` tags), its own level under the night's
    false-keep control, a second decision whose sentence names the first test; the ledger's latest entry is it."""
    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    night.budget.begin("search")
    night.apply(PhaseResult(open=OpenWork(promising=(_promising(night, "fused-qk-norm-rope"),))))
    tests_before = night.fdr.tests
    second_level = second_stage_level(0.02, min(0.05, night.fdr.next_level()))

    night.apply(Screening(night).retest("search"))
    assert night.open.promising == ()
    decisions = night.store.load().decisions
    assert len(decisions) == 1 and decisions[0].technique == "fused-qk-norm-rope"
    sentence = decisions[0].result
    assert sentence.startswith("retest with fresh boots (the first: not kept under the night's false-keep control: "
                               "+20% [+8%, +33%] over 12 boots, adjusted p 0.27 > 0.10): "), sentence
    assert night.fdr.tests == tests_before + 1
    # the second stage of the first test: its boundaries at the level the combination needs, its p the combination
    assert decisions[0].ab_result is not None
    assert decisions[0].ab_result["policy"]["level"] == pytest.approx(second_level)
    stages = decisions[0].verdict.stages if decisions[0].verdict else None
    assert stages is not None and stages.first_p == 0.02
    assert stages.combined_p == pytest.approx(combined_p(0.02, stages.second_p))
    tags = [str(b.tag) for b in night.store.load().boots]
    assert "screening:fused-qk-norm-rope:retest:probe1" in tags
    assert any(t.startswith("screening:fused-qk-norm-rope:retest:ab:") for t in tags)
    entry = night.store.ledger.latest_for(pre.fingerprint)["fused-qk-norm-rope"]
    assert entry.reason == sentence


def test_a_retest_gets_the_longest_guardrail_extension_its_phase_fits(tmp_path: Path) -> None:
    """A retest whose gain crosses at the cap with a TTFT guardrail pending is decided by that guardrail alone: on a
    long night its extension is ``EXTEND_FACTOR`` (3) × its cap of 3 blocks per arm."""
    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.budget = Budget(20000.0, clock=night.clock.now)     # the same passes, a longer night
    night.policy = GatePolicy(looks=(2, 3), replicates=2000, guard_extension=3)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    night.budget.begin("search")
    night.apply(PhaseResult(open=OpenWork(promising=(_promising(night, "fused-qk-norm-rope"),))))
    night.apply(Screening(night).retest("search"))
    (decision,) = night.store.load().decisions
    assert decision.ab_result is not None, decision.result
    assert decision.ab_result["policy"]["guard_extension"] == 9
    assert decision.ab_result["policy"]["looks"] == [2, 3]


@pytest.mark.parametrize(("allowance_boots", "extension", "longer"), [(8, 3, 3), (16, 5, 3), (40, 9, 14)])
def test_a_retests_guardrail_extension_is_what_its_phase_fits_between_the_nights_own_and_three_caps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowance_boots: int, extension: int, longer: int) -> None:
    """After the cap's 2 × 3 boots, the blocks per arm the phase's time has left: never fewer than the night's own
    extension (3), never more than 3 × the cap; a first test (no first stage) keeps the night's own (``None``)."""
    night = _night(_preflight(tmp_path, TINY_SPACE))
    night.policy = GatePolicy(looks=(2, 3), replicates=2000, guard_extension=3)
    night.budget.begin("search")
    monkeypatch.setattr(night, "boot_s", lambda: night.budget.allowance("search") / allowance_boots)
    screening = Screening(night)
    first = _promising(night, "fused-qk-norm-rope").verdict
    assert screening._guard_blocks(None, None) is None
    assert screening._guard_blocks(first, None) == extension
    assert screening._guard_blocks(first, (4, 6)) == longer       # a longer retest (``extend``'s) counts its own cap


def test_a_retest_without_time_is_a_note_not_a_boot(tmp_path: Path) -> None:
    pre = _preflight(tmp_path, TINY_SPACE, budget_s=20.0)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.budget.begin("search")
    night.apply(PhaseResult(open=OpenWork(promising=(_promising(night, "fused-qk-norm-rope"),))))
    night.apply(Screening(night).retest("search"))
    assert night.booter.boots == 0 and not night.store.load().decisions
    assert night.notes[-1].startswith("no time to retest fused-qk-norm-rope in the search phase (not kept under the "
                                      "night's false-keep")
    assert [t.technique.name for t in night.open.promising] == ["fused-qk-norm-rope"]   # for a later phase


def test_a_retest_runs_when_its_first_look_fits_though_its_cap_does_not(tmp_path: Path) -> None:
    """400 s of search allowance and 60 s a boot: the probe and the first look (2 blocks per arm) fit, the cap of 3
    blocks per arm does not; the retest runs instead of waiting for a later phase."""
    pre = _preflight(tmp_path, TINY_SPACE, budget_s=400.0 / 0.85)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.budget.begin("search")
    assert night.boot_s() == 60.0 and 300.0 < night.budget.allowance("search") < 420.0
    night.apply(PhaseResult(open=OpenWork(promising=(_promising(night, "fused-qk-norm-rope"),))))
    screening = Screening(night)
    with contextlib.suppress(PhaseOver):
        screening.retest("search")
    night.apply(screening.result())
    assert night.booter.boots > 0 and not any(n.startswith("no time to retest") for n in night.notes)
    assert night.open.promising == ()


def test_a_screening_a_b_is_run_at_its_share_of_the_nights_false_keep_control(tmp_path: Path) -> None:
    """The gate's efficacy boundaries are calibrated at the level the online control gives the test (at most the
    gate's α), so a crossing is a keep the control does not take back."""
    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    night.budget.begin("screening")
    level = night.fdr_level()
    assert level == pytest.approx(min(0.05, night.fdr.next_level())) and level < 0.05
    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == "fused-qk-norm-rope")
    decision = Screening(night).screen(index, technique)
    assert decision is not None and decision.ab_result is not None, "the technique reached the gate"
    assert decision.ab_result["policy"]["level"] == pytest.approx(level)
    assert not (decision.verdict and decision.verdict.night_control and decision.verdict.night_control.held)


def _first_look(night: Night, name: str, *, level: float) -> tuple[int, object, object, dict[object, list[str]]]:
    """The first look (2 blocks per arm) of ``name``'s screening A/B, as an early futility stop leaves it."""
    from elsa_tune.history.verdict import Decision, Futility, Verdict

    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == name)
    candidate = night.space.candidate(night.incumbent.values, [name], label=name)
    _, ids = night.ab(candidate, tag=f"screening:{name}", phase=Phase.SCREENING, technique=name, seed=index,
                      level=level, looks=(2,))
    stopped = Verdict(decision=Decision.REJECT, reason="futile at look 1: estimate −3.0% is not above +0.0%, too "
                      "little to reach a keep with the remaining boots", effect=0.97, ci_low=0.51, ci_high=1.86,
                      p_value=0.75, boots_incumbent=2, boots_candidate=2, stopped_at_look=1,
                      futility=Futility.BOOT_SAVING)
    return index, technique, (candidate, stopped), ids


def test_a_test_an_early_look_stopped_to_save_boots_is_continued_on_its_recorded_boots(tmp_path: Path) -> None:
    """Futility stops are non-binding: the same test goes on from its recorded boots (read back, not booted again),
    at the level it was calibrated at, spending no new level of the night's false-keep control, with only the
    interval rule to stop it early."""
    from elsa_tune.tuner.flow.night import PausedTest

    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    night.budget.begin("search")
    index, technique, (candidate, stopped), ids = _first_look(night, "fused-qk-norm-rope", level=0.02)
    night.apply(PhaseResult(open=OpenWork(paused=(PausedTest(
        index=index, technique=technique, candidate=candidate, boots=(),  # type: ignore[arg-type]
        tag="screening:fused-qk-norm-rope", level=0.02, incumbent_key=night.incumbent.candidate.key(),
        verdict=stopped),))))  # type: ignore[arg-type]
    boots_before, tests_before = night.booter.boots, night.fdr.tests

    night.apply(Screening(night).resume("search"))
    assert night.open.paused == ()
    (decision,) = night.store.load().decisions
    assert decision.result.startswith("continued to its cap (an early look had stopped it to save boots: no "
                                      "demonstrated benefit (stopped early, futile): "), decision.result
    assert decision.ab_result is not None
    assert decision.ab_result["policy"]["level"] == pytest.approx(0.02)
    assert decision.ab_result["policy"]["futility"] == "ci"
    assert night.fdr.tests == tests_before
    # the first look's boots are the test's first blocks; only the blocks after them were booted
    assert list(decision.boots_incumbent[:2]) == ids[Arm.INCUMBENT]
    assert list(decision.boots_candidate[:2]) == ids[Arm.CANDIDATE]
    assert night.booter.boots - boots_before == len(decision.boots_incumbent) + len(decision.boots_candidate) - 4


def test_a_stopped_test_is_not_continued_against_another_incumbent(tmp_path: Path) -> None:
    from elsa_tune.history.verdict import Decision, Futility, Verdict
    from elsa_tune.tuner.flow.night import PausedTest

    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.budget.begin("search")
    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == "fused-qk-norm-rope")
    stopped = Verdict(decision=Decision.REJECT, reason="futile at look 1", effect=0.97, ci_low=0.51, ci_high=1.86,
                      p_value=0.75, boots_incumbent=2, boots_candidate=2, stopped_at_look=1,
                      futility=Futility.BOOT_SAVING)
    candidate = night.space.candidate(night.incumbent.values, [technique.name], label=technique.name)
    night.apply(PhaseResult(open=OpenWork(paused=(PausedTest(
        index=index, technique=technique, candidate=candidate, boots=(), tag="screening:fused-qk-norm-rope",
        level=0.02, incumbent_key="another incumbent", verdict=stopped),))))
    Screening(night).resume("search")
    assert night.booter.boots == 0 and not night.store.load().decisions


def test_an_unresolved_technique_is_retested_with_the_longest_test_the_time_left_allows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the night's end with time nothing else needs, an inconclusive first test with a positive estimate is
    retested with blocks per arm at each look a multiple of the night's (here the most, held at 2× to keep the test
    short), as a second stage combined with the first under a new level of the night's false-keep control."""
    from elsa_tune.history.verdict import Decision, Verdict
    from elsa_tune.tuner.flow import screening

    monkeypatch.setattr(screening, "EXTEND_FACTOR", 2)
    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.budget = Budget(20000.0, clock=night.clock.now)     # the same passes, a longer night
    night.policy = GatePolicy(looks=(2,), replicates=2000)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    night.budget.begin("search")
    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == "fused-qk-norm-rope")
    first = Verdict(decision=Decision.INCONCLUSIVE, reason="inconclusive at the cap of 3 blocks: +4.0%",
                    effect=1.04, ci_low=0.96, ci_high=1.13, p_value=0.2, boots_incumbent=3, boots_candidate=3)
    night.apply(PhaseResult(open=OpenWork(unresolved=(OpenTest(index, technique, first),))))
    tests_before = night.fdr.tests

    night.apply(Screening(night).extend("search"))
    assert night.open.unresolved == ()
    (decision,) = night.store.load().decisions
    assert decision.ab_result is not None, decision.result
    assert decision.ab_result["policy"]["looks"] == [4]
    assert night.fdr.tests == tests_before + 1
    assert decision.result.startswith("retest with fresh boots (the first: "), decision.result
    assert decision.verdict is not None and decision.verdict.p_value is not None
    stages = decision.verdict.stages
    assert stages is None or stages.first_p == 0.2   # combined when the second stage measured a p


def test_a_longer_retest_without_time_for_the_nights_own_cap_is_a_note(tmp_path: Path) -> None:
    from elsa_tune.history.verdict import Decision, Verdict

    pre = _preflight(tmp_path, TINY_SPACE, budget_s=400.0)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.budget.begin("search")
    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == "fused-qk-norm-rope")
    first = Verdict(decision=Decision.INCONCLUSIVE, reason="inconclusive at the cap of 3 blocks: +4.0%",
                    effect=1.04, ci_low=0.96, ci_high=1.13, p_value=0.2, boots_incumbent=3, boots_candidate=3)
    night.apply(PhaseResult(open=OpenWork(unresolved=(OpenTest(index, technique, first),))))
    night.apply(Screening(night).extend("search"))
    assert night.booter.boots == 0 and not night.store.load().decisions
    assert night.notes[-1].startswith("no time to retest fused-qk-norm-rope with a longer test")


def test_a_test_whose_level_the_gate_cannot_calibrate_is_recorded_not_run(tmp_path: Path) -> None:
    """When the night's false-keep control leaves a test less level than the null sample can place, the technique
    is recorded inconclusive, "not tested", after its screening boot: no A/B boots, no crash."""
    from elsa_tune.tuner.ab.multiplicity import OnlineFalseKeepControl

    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.fdr = OnlineFalseKeepControl(level=1e-4, expected_tests=4)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    night.budget.begin("screening")
    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == "fused-qk-norm-rope")
    decision = Screening(night).screen(index, technique)
    assert decision is not None and decision.kept is Kept.INCONCLUSIVE and decision.ab_result is None
    assert decision.verdict is not None and decision.verdict.reason.startswith("not tested: a keep would need p ≤ ")
    assert decision.result == decision.verdict.reason
    assert not any(str(b.tag).startswith("screening:fused-qk-norm-rope:ab:")
                   for b in night.store.load().boots)


def test_what_the_search_had_no_time_to_test_is_tested_in_the_confirmations_time(tmp_path: Path) -> None:
    """A technique screened in the search phase whose A/B does not fit in the share it may borrow is left open (a
    note says where it goes), not dropped; when nothing beat the baseline, the confirmation's time reads its screening
    boot back (no second probed boot) and runs its A/B. Seen on a real 7-minute H100 night: a draft technique's
    screening boot read +26% and the night ended without testing it while the confirmation's time went unused."""
    # ~60 s of search allowance, half of it for screening: the probed boot (2 boots' time) fits, the A/B's cap (12
    # boots) does not, for any boot between ~2.5 and ~15 s (a loaded machine boots the tiny card slower)
    pre = _preflight(tmp_path, TINY_SPACE, budget_s=80.0)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 6), replicates=2000)
    night.boot(BootPlan(tag="baseline:0", candidate=night.baseline, phase=Phase.BASELINE, probes=True))
    index, technique = next((i, t) for i, t in enumerate(night.space.techniques) if t.name == "fused-qk-norm-rope")
    night.apply(PhaseResult(open=OpenWork(unscreened=(QueuedTechnique(index, technique),))))
    night.budget.begin("search")
    screening = Screening(night)
    with contextlib.suppress(PhaseOver):
        screening.continue_unscreened("search")
    night.apply(screening.result())
    tags = [str(b.tag) for b in night.store.load().boots]
    assert "screening:fused-qk-norm-rope:probe1" in tags and not any(":ab:" in t for t in tags), tags
    assert [q.technique.name for q in night.open.unscreened] == ["fused-qk-norm-rope"] and night.open.tests()
    assert any(n.startswith("search: no time left to screen fused-qk-norm-rope: continued in the confirmation's "
                            "time") for n in night.notes), night.notes

    night.budget.begin("confirmation")
    boots_before = night.booter.boots
    screening = Screening(night)
    with contextlib.suppress(PhaseOver):
        screening.continue_unscreened("confirmation", share=1.0)
    night.apply(screening.result())
    tags = [str(b.tag) for b in night.store.load().boots]
    assert tags.count("screening:fused-qk-norm-rope:probe1") == 1        # read back, not booted again
    assert any(t.startswith("screening:fused-qk-norm-rope:ab:") for t in tags), tags
    assert night.booter.boots > boots_before and night.open.unscreened == ()


def _booted_moves(night: Night, pre: Preflight) -> list[int]:
    """Boot the baseline's values and two one-parameter moves as search trials (told to the search), as the sweep
    does; returns the moves' trial numbers."""
    from elsa_tune.tuner.search.optuna_search import NumericSearch
    from elsa_tune.tuner.search.phase import boot_trial

    search = NumericSearch(pre.space, night.store, study_name=night.name, seed=1)
    base = pre.space.baseline_values()
    search.study.enqueue_trial(base)
    search.study.enqueue_trial({**base, "max-running-requests": 3})
    search.study.enqueue_trial({**base, "max-running-requests": 1})
    numbers = []
    for _ in range(3):
        proposal = search.ask()
        assert proposal.candidate is not None
        number = proposal.trial.number
        boot_trial(night.boot, night.memory, search, proposal,
                   replace(proposal.candidate, label=f"trial-{number}"), tag=f"search:{number}",
                   space=pre.space, context_target=night.context_target)
        numbers.append(number)
    return numbers[1:]


def test_the_searchs_undecided_moves_are_those_that_beat_the_baseline_on_their_boot_and_no_decision_judged(
        tmp_path: Path) -> None:
    """What the search leaves to the confirmation's time: each move whose boot beat the baseline by more than σ_boot
    (never the baseline's own values), best first, with the number of moves booted; a move a decision judged is
    not left again."""
    from elsa_tune.tuner.search.phase import undecided_moves

    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy()
    night.apply(PhaseResult(incumbent=replace(night.incumbent, throughput=1.0)))    # every measured boot beats it
    night.budget.begin("search")
    moves = _booted_moves(night, pre)
    left = undecided_moves(NightSearch(night).setup)
    assert sorted(m.number for m in left) == sorted(moves)
    assert [m.throughput for m in left] == sorted((m.throughput for m in left), reverse=True)
    assert all(m.among == 2 and m.candidate.key() != night.baseline.key() for m in left)
    boots = {b.boot_id: b for b in night.store.load().boots}
    assert all(boots[m.boot_id].tag == f"search:{m.number}" for m in left)

    judged = left[0]
    night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SEARCH, technique=f"search trial "
                                f"{judged.number}", incumbent_key=night.baseline.key(),
                                candidate_key=judged.candidate.key()))
    assert [m.number for m in undecided_moves(NightSearch(night).setup)] == [m.number for m in left[1:]]

    night.apply(PhaseResult(incumbent=replace(night.incumbent, throughput=1e9)))    # no boot beats this one
    assert undecided_moves(NightSearch(night).setup) == ()


def test_a_search_move_left_undecided_is_decided_in_the_confirmations_time(tmp_path: Path) -> None:
    """The move's A/B continues under the night's false-keep control (a keep here is not confirmed again), its
    boots tagged as the search's so a cut-short A/B reads its recorded boots back; its decision is the search
    trial's."""
    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    night.policy = GatePolicy(looks=(2, 3), replicates=2000)
    night.apply(PhaseResult(incumbent=replace(night.incumbent, throughput=1.0)))
    night.budget.begin("search")
    _booted_moves(night, pre)
    from elsa_tune.tuner.search.phase import undecided_moves

    moves = undecided_moves(NightSearch(night).setup)
    night.apply(PhaseResult(open=OpenWork(moves=moves)))
    assert night.open.tests()
    tests_before = night.fdr.tests
    night.budget.begin("confirmation")
    screening = Screening(night)
    with contextlib.suppress(PhaseOver):
        screening.test_moves("confirmation")
    night.apply(screening.result())
    decisions = night.store.load().decisions
    first = moves[0]
    mine = [d for d in decisions if d.technique == f"search trial {first.number}"]
    assert len(mine) == 1 and mine[0].phase is Phase.SEARCH and mine[0].incumbent_key == night.baseline.key()
    assert mine[0].verdict is not None and mine[0].verdict.night_control is not None      # the family's level
    assert night.fdr.tests > tests_before
    assert all(str(b).startswith("search:") for b in
               [r.tag for r in night.store.load().boots if r.boot_id in (*mine[0].boots_candidate,
                                                                          *mine[0].boots_incumbent)])
    if mine[0].kept is Kept.YES:
        assert night.incumbent.candidate.key() == first.candidate.key() and night.open.moves == ()


def test_a_move_without_time_for_an_ab_is_decided_from_its_boot_against_the_moves_booted(tmp_path: Path) -> None:
    """With no room for the A/B's first look, the best move is decided by the one-boot prediction test, its p
    multiplied by the moves the search booted; a boot far above the baseline's noise is kept, one within it is
    not."""
    import numpy as np

    from elsa_tune.tuner.ab.dimensioning import dimension_passes
    from elsa_tune.tuner.flow.night import OpenMove

    pre = _preflight(tmp_path, TINY_SPACE)
    night = _night(pre)
    for i in range(4):
        night.boot(BootPlan(tag=f"baseline:{i}", candidate=night.baseline, phase=Phase.BASELINE, probes=i == 0))
    night.policy = GatePolicy(sigma_boot=0.05, looks=(2, 3), replicates=2000)
    night.noise = replace(dimension_passes(np.asarray([[100.0, 101.0, 99.0]] * 4)), sigma_boot=0.05, boots=4)
    night.apply(PhaseResult(incumbent=replace(night.incumbent, throughput=100.0)))
    night.budget.begin("search")
    moved = pre.space.candidate({**pre.space.baseline_values(), "max-running-requests": 3}, [], label="trial-4")
    boot = night.boot(BootPlan(tag="search:4", candidate=moved, phase=Phase.SEARCH, trial_number=4, probes=True))
    for throughput, kept in ((101.0, Kept.INCONCLUSIVE), (160.0, Kept.YES)):
        move = OpenMove(4, {**pre.space.baseline_values(), "max-running-requests": 3}, moved, throughput, 6,
                        boot.record.boot_id)
        night.apply(PhaseResult(open=OpenWork(moves=(move,))))
        night.budget.begin("confirmation")
        night.budget.total_s = night.budget.elapsed_s + 1.0       # no room for a first look
        screening = Screening(night)
        screening.test_moves("confirmation")
        night.apply(screening.result())
        decision = night.store.load().decisions[-1]
        assert decision.technique == "search trial 4" and decision.kept is kept, decision.result
        assert "× 6 moves booted" in decision.result and decision.boots_candidate == (boot.record.boot_id,)


def test_memory_techniques_are_tested_first_only_while_a_technique_waits_for_the_memory_they_free(
        tmp_path: Path, memory_space: Path) -> None:
    """The A/B order: the most promising screening boot first; memory techniques ahead of speed techniques only while
    a technique rejected for want of memory waits for them, after them otherwise (a pool gain nothing needs yet buys no
    throughput, and its test would hold a short night's boots)."""
    from elsa_tune.tuner.flow.screening import _priority, _Probed

    night = _night(_preflight(tmp_path, memory_space))
    by_name = {t.name: (i, t) for i, t in enumerate(night.space.techniques)}

    def probed(name: str, estimate: float) -> _Probed:
        index, technique = by_name[name]
        return _Probed(index, technique, night.baseline, (), None, None, f"screening:{name}", estimate)

    speed = [t.name for t in night.space.techniques if t.kind is TechniqueKind.SPEED][:2]
    survivors = [probed(speed[0], 1.02), probed("larger-static-pool", 1.10), probed(speed[1], 1.05)]
    order = [p.technique.name for p in sorted(survivors, key=lambda p: _priority(p, memory_first=False))]
    assert order == [speed[1], speed[0], "larger-static-pool"]
    order = [p.technique.name for p in sorted(survivors, key=lambda p: _priority(p, memory_first=True))]
    assert order == ["larger-static-pool", speed[1], speed[0]]


def test_a_shortened_pass_keeps_the_traffics_prefix_reuse() -> None:
    """The fewest first requests, from the ``wanted`` the pass's length asks for, whose share of fresh prompt tokens
    is at most 1.25 × the whole pass's; the whole pass when no fewer do; ``wanted`` on traffic without reuse."""
    from elsa_tune.tuner.flow.study import _keeping_reuse

    sessions = [0.0, 0.5, 0.67, 0.75, 0.8, 0.83, 0.857, 0.875]     # one warm-up request, then reuse
    assert _keeping_reuse(sessions, 2) == 7                          # fresh 14.3% ≤ 1.25 × 12.5%
    assert _keeping_reuse([0.0] * 8, 2) == 2                         # nothing to keep
    assert _keeping_reuse([0.0, 0.2, 0.4, 0.5, 0.9], 2) == 5         # only the whole pass keeps it
    assert _keeping_reuse([float("nan")] * 4, 2) == 2
